#include "backends/backend.h"

#include <algorithm>
#include <optional>
#include <tuple>
#include <variant>
#include <vector>

#include "tformers/error.h"

namespace tformers::backends {

namespace {

using graph::Node;
using graph::Op;

struct Leaf {
  std::string name;
  graph::TensorType type;
};

// The step values that no static shape bounds, each read from a host input (by its index in
// leaves(kInput)) before the backend runs.
struct TokenIds {  // an embedding's ids within its vocabulary
  size_t ids;
  int64_t vocab;
};
struct CacheFit {  // a static cache write's start, with its new tokens, within the cache
  size_t start;
  int64_t new_tokens, cache_len;
};
struct BlockTable {  // the blocks a paged op reaches through its table, within the pool
  std::string node;
  size_t table, pos;
  std::optional<size_t> rows;  // the input with each token's table row, when the op has one
  int64_t max_blocks, table_rows, batch, tokens, num_blocks, block_size;
  // What the check reads and against what: equal for two ops, one check covers both.
  auto reach() const {
    return std::tie(table, pos, rows, max_blocks, table_rows, batch, tokens, num_blocks,
                    block_size);
  }
};
using ValueCheck = std::variant<TokenIds, CacheFit, BlockTable>;

}  // namespace

struct Executable::Checks {
  std::vector<Leaf> params, states, inputs;
  std::vector<graph::TensorType> outputs;
  std::vector<ValueCheck> values;  // in node order
};

namespace {

std::vector<Leaf> leaves(const graph::Graph& g, Op kind) {
  std::vector<Leaf> out;
  for (int id : g.leaves(kind)) out.push_back({g.node(id).name, g.node(id).type});
  return out;
}

// The index in leaves(kInput) of the input operand `k` of `n` reads, through reshapes.
size_t input_of(const graph::Graph& g, const Node& n, int k, const char* what) {
  int id = n.inputs[size_t(k)];
  while (g.node(id).op == Op::kReshape) id = g.node(id).inputs[0];
  const std::vector<int> inputs = g.leaves(Op::kInput);
  auto it = std::find(inputs.begin(), inputs.end(), id);
  if (it == inputs.end())
    throw UnsupportedError(
        detail::str_cat(graph::op_name(n.op), " node '", n.name, "': its ", what, " come from a ",
                        graph::op_name(g.node(id).op),
                        " node; they must be a graph input, since runs check them "
                        "on the host before a backend reads them"));
  return size_t(it - inputs.begin());
}

BlockTable block_table(const graph::Graph& g, const Node& n) {
  const bool write = n.op == Op::kPagedCacheWrite;
  const int table_in = write ? 2 : 3;
  const Shape& ts = g.node(n.inputs[table_in]).type.shape;         // (B,MB)
  const Shape& ps = g.node(n.inputs[table_in + 1]).type.shape;     // (B,T)
  const Shape& pool = g.node(n.inputs[write ? 0 : 1]).type.shape;  // (NB, ..., BS, ...)
  // The write's rows are its last operand; the attention's may have its sinks after them.
  const int rows_in = !write ? graph::attention_operands(n).mask_or_rows
                      : int(n.inputs.size()) > table_in + 2 ? table_in + 2
                                                            : -1;
  std::optional<size_t> rows;
  if (rows_in >= 0) rows = input_of(g, n, rows_in, "sequence rows");
  return BlockTable{n.name,
                    input_of(g, n, table_in, "block table entries"),
                    input_of(g, n, table_in + 1, "positions"),
                    rows,
                    ts[1],
                    ts[0],
                    ps[0],
                    ps[1],
                    pool[0],
                    pool[size_t(graph::kv_positions_dim(g.kv_layout()))]};
}

const int32_t* i32(std::span<const Tensor* const> inputs, size_t k) {
  return static_cast<const int32_t*>(inputs[k]->raw());
}

void check_value(const TokenIds& c, std::span<const Tensor* const> inputs) {
  const int32_t* ids = i32(inputs, c.ids);
  const int64_t count = inputs[c.ids]->numel();
  for (int64_t i = 0; i < count; ++i)
    if (ids[i] < 0 || ids[i] >= c.vocab)
      throw InvalidArgumentError(detail::str_cat("token id ", ids[i], " at index ", i,
                                                 " is out of range: the vocabulary has ", c.vocab,
                                                 " entries (ids 0..", c.vocab - 1, ")"));
}

void check_value(const CacheFit& c, std::span<const Tensor* const> inputs) {
  const int32_t start = *i32(inputs, c.start);
  if (start < 0 || start + c.new_tokens > c.cache_len)
    throw InvalidArgumentError(
        detail::str_cat("cache position ", start, " with ", c.new_tokens,
                        " new tokens does not fit the static cache of ", c.cache_len,
                        " positions: allocate a larger cache (max_cache_len)"));
}

// Every token's table row must exist, and every block a paged op reaches through its table
// (each row's blocks up to the largest position of its tokens) must be in the pool.
void check_value(const BlockTable& c, std::span<const Tensor* const> inputs) {
  const int32_t *table = i32(inputs, c.table), *pos = i32(inputs, c.pos);
  const int32_t* rows = c.rows ? i32(inputs, *c.rows) : nullptr;
  std::vector<int64_t> last(size_t(c.table_rows), -1);
  for (int64_t i = 0; i < c.batch * c.tokens; ++i) {
    if (pos[i] < 0) continue;
    const int64_t r = rows ? rows[i] : i / c.tokens;
    if (r < 0 || r >= c.table_rows)
      throw InvalidArgumentError(detail::str_cat(
          c.node, ": token ", i % c.tokens, " of row ", i / c.tokens, " names sequence ", r,
          ", outside the block table's ", c.table_rows, " rows"));
    last[size_t(r)] = std::max<int64_t>(last[size_t(r)], pos[i]);
  }
  for (int64_t b = 0; b < c.table_rows; ++b) {
    if (last[size_t(b)] < 0) continue;
    if (last[size_t(b)] / c.block_size >= c.max_blocks)
      throw InvalidArgumentError(detail::str_cat(
          c.node, ": position ", last[size_t(b)], " of sequence ", b,
          " is past its block table of ", c.max_blocks, " blocks of ", c.block_size, " positions"));
    for (int64_t i = 0; i <= last[size_t(b)] / c.block_size; ++i)
      if (table[b * c.max_blocks + i] < 0 || table[b * c.max_blocks + i] >= c.num_blocks)
        throw InvalidArgumentError(detail::str_cat(
            c.node, ": block table row ", b, " entry ", i, " is ", table[b * c.max_blocks + i],
            ", outside the pool of ", c.num_blocks, " blocks"));
  }
}

}  // namespace

Executable::Executable(const graph::Graph& g) {
  auto c = std::make_unique<Checks>();
  c->params = leaves(g, Op::kParameter);
  c->states = leaves(g, Op::kState);
  c->inputs = leaves(g, Op::kInput);
  for (int id : g.outputs()) c->outputs.push_back(g.node(id).type);
  for (const Node& n : g.nodes()) {
    if (n.op == Op::kEmbedding)
      c->values.push_back(
          TokenIds{input_of(g, n, 1, "ids"), n.attrs_as<graph::EmbeddingAttrs>().vocab});
    else if (n.op == Op::kCacheWrite)
      c->values.push_back(CacheFit{input_of(g, n, 2, "start positions"),
                                   g.node(n.inputs[1]).type.shape[1],
                                   n.type.shape[size_t(graph::kv_positions_dim(g.kv_layout()))]});
    else if (n.op == Op::kPagedCacheWrite || n.op == Op::kPagedAttention) {
      // Every layer's paged ops read the same table, positions and rows over pools of one size:
      // the first one's check covers the others, which a step would otherwise repeat per op.
      BlockTable t = block_table(g, n);
      const bool covered =
          std::any_of(c->values.begin(), c->values.end(), [&](const ValueCheck& v) {
            const auto* o = std::get_if<BlockTable>(&v);
            return o && o->reach() == t.reach();
          });
      if (!covered) c->values.push_back(std::move(t));
    }
  }
  checks_ = std::move(c);
}

Executable::~Executable() = default;

void Executable::run(std::span<Buffer* const> params, std::span<Buffer* const> states,
                     std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs) {
  const Checks& c = *checks_;
  TF_CHECK(params.size() == c.params.size() && states.size() == c.states.size() &&
               inputs.size() == c.inputs.size() && outputs.size() == c.outputs.size(),
           "binding counts do not match the graph");
  for (size_t k = 0; k < params.size(); ++k)
    TF_CHECK(params[k]->type() == c.params[k].type, "parameter ", c.params[k].name, " bound to ",
             params[k]->type().str());
  for (size_t k = 0; k < states.size(); ++k)
    TF_CHECK(states[k]->type() == c.states[k].type, "state ", c.states[k].name);
  for (size_t k = 0; k < inputs.size(); ++k) {
    const graph::TensorType& t = c.inputs[k].type;
    if (inputs[k]->dtype() != t.dtype || inputs[k]->shape() != t.shape)
      throw InvalidArgumentError(detail::str_cat("input '", c.inputs[k].name, "' must be ", t.str(),
                                                 ", got ", dtype_name(inputs[k]->dtype()),
                                                 shape_str(inputs[k]->shape())));
  }
  for (size_t k = 0; k < outputs.size(); ++k)
    TF_CHECK(outputs[k]->dtype() == c.outputs[k].dtype && outputs[k]->shape() == c.outputs[k].shape,
             "output ", k, " must be ", c.outputs[k].str());
  for (const ValueCheck& v : c.values)
    std::visit([&](const auto& check) { check_value(check, inputs); }, v);
  execute(params, states, inputs, outputs);
}

DType Backend::cache_dtype(DType activation) const {
  const std::vector<DType> reads = capabilities().cache_dtypes;
  const bool read =
      reads.empty() || std::find(reads.begin(), reads.end(), activation) != reads.end();
  return read ? activation : DType::f32;
}

PreparedWeight Backend::prepare_linear(const Tensor& w, const std::string& quantize) {
  if (quantize.empty()) return {upload(w), nullptr, nullptr, std::nullopt};
  return prepare_quantized_linear(quantize_on_host(w, quantize));
}

QuantizedLinear Backend::laid_out(const QuantizedLinear&) const {
  throw UnsupportedError("the " + name() +
                         " backend has no quantized weights; load the model without quantize, "
                         "from a float checkpoint");
}

PreparedWeight Backend::prepare_quantized_linear(const QuantizedLinear& given) {
  const QuantizedLinear q = laid_out(given);
  return {upload(q.weight), upload(q.scale), q.zero ? upload(*q.zero) : nullptr, q.attrs()};
}

PreparedWeight Backend::prepare_experts(const Tensor& w, const std::string& quantize) {
  if (quantize.empty()) return {upload(w), nullptr, nullptr, std::nullopt};
  const int64_t E = w.shape()[0], N = w.shape()[1], K = w.shape()[2];
  // An int4 tile holds 8 rows, which must not straddle two experts.
  const std::string scheme = quantize == "int4" && N % graph::kInt4Rows != 0 ? "int8" : quantize;
  // Rows are quantized independently: the (E*N, K) matrix's rows are each expert's, in order.
  return prepare_quantized_experts(quantize_on_host(w.reshape({E * N, K}), scheme), E);
}

PreparedWeight Backend::prepare_quantized_experts(const QuantizedLinear& given, int64_t E) {
  const QuantizedLinear q = laid_out(given);
  auto stacked = [&](const Tensor& t) {
    Shape s = t.shape();
    s[0] /= E;
    s.insert(s.begin(), E);
    return upload(t.reshape(s));
  };
  return {stacked(q.weight), stacked(q.scale), q.zero ? stacked(*q.zero) : nullptr, q.attrs()};
}

double Backend::read_bandwidth_gbs(size_t) {
  throw UnsupportedError("the " + name() +
                         " backend runs nothing, so it cannot measure its memory");
}

}  // namespace tformers::backends
