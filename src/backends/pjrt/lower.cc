#include "backends/pjrt/lower.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "tformers/error.h"

// Values keep the dtypes the graph gives them (the activation dtype for computed values), so
// what a device stores and moves between fused ops is that dtype. Within an op the math runs in
// f32 (elementwise ops, norms, rope, softmax) and dots accumulate in f32, as the CPU backend
// does; XLA fuses the converts into the surrounding ops.
namespace tformers::backends::pjrt {

namespace {

using detail::str_cat;
using graph::Node;
using graph::Op;

// MLIR's name of an element type.
std::string element(DType t) { return t == DType::u8 ? "ui8" : std::string(dtype_short_name(t)); }

std::string join(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out;
}

std::string tensor_type(const std::string& elem, const Shape& shape) {
  std::string t = "tensor<";
  for (int64_t d : shape) t += std::to_string(d) + "x";
  return t + elem + ">";
}

// A value of the module being written: its SSA name and its type.
struct Val {
  std::string ssa;
  std::string elem;  // "f32", "bf16", "i1", "ui8", ...
  Shape shape;

  std::string type() const { return tensor_type(elem, shape); }
  int64_t rank() const { return int64_t(shape.size()); }
};

bool is_float_elem(const std::string& e) { return e == "f32" || e == "bf16" || e == "f16"; }

// A float as MLIR reads it bit-exactly: the hexadecimal bit pattern of its element type.
std::string float_literal(float v, const std::string& elem) {
  char buf[16];
  if (elem == "f32") {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    std::snprintf(buf, sizeof buf, "0x%08X", bits);
  } else {
    const uint16_t bits = elem == "bf16" ? f32_to_bf16(v) : f32_to_f16(v);
    std::snprintf(buf, sizeof buf, "0x%04X", unsigned(bits));
  }
  return buf;
}

// Writes the body of @main one op at a time; each method returns the value it defines, with its
// shape worked out here so that every op's type signature is spelled in full.
class Emitter {
 public:
  const std::string& body() const { return body_; }

  Val def(std::string elem, Shape shape, const std::string& rhs) {
    Val v{"%v" + std::to_string(next_++), std::move(elem), std::move(shape)};
    body_ += "    " + v.ssa + " = " + rhs + "\n";
    return v;
  }

  // A constant of any shape: `value` is a double so that integer constants (row offsets, block
  // counts) stay exact.
  Val splat(double value, const std::string& elem, const Shape& shape) {
    const std::string lit =
        is_float_elem(elem) ? float_literal(float(value), elem) : std::to_string(int64_t(value));
    return def(elem, shape,
               str_cat("stablehlo.constant dense<", lit, "> : ", tensor_type(elem, shape)));
  }
  Val floats(const std::vector<float>& values) {  // a 1-d f32 constant
    std::string lit;
    for (size_t i = 0; i < values.size(); ++i)
      lit += (i ? ", " : "") + float_literal(values[i], "f32");
    const Shape shape = {int64_t(values.size())};
    return def("f32", shape,
               str_cat("stablehlo.constant dense<[", lit, "]> : ", tensor_type("f32", shape)));
  }

  Val convert(const Val& a, const std::string& elem) {
    if (a.elem == elem) return a;
    return def(elem, a.shape,
               str_cat("stablehlo.convert ", a.ssa, " : (", a.type(), ") -> ",
                       tensor_type(elem, a.shape)));
  }
  Val unary(const char* op, const Val& a) {
    return def(a.elem, a.shape, str_cat("stablehlo.", op, " ", a.ssa, " : ", a.type()));
  }
  Val binary(const char* op, const Val& a, const Val& b) {
    TF_CHECK(a.type() == b.type(), "StableHLO lowering: ", op, " of ", a.type(), " and ", b.type());
    return def(a.elem, a.shape,
               str_cat("stablehlo.", op, " ", a.ssa, ", ", b.ssa, " : ", a.type()));
  }
  // a op (scalar constant c), in a's type.
  Val with_constant(const char* op, const Val& a, double c) {
    return binary(op, a, splat(c, a.elem, a.shape));
  }
  Val broadcast(const Val& a, const Shape& shape, const std::vector<int64_t>& dims) {
    if (a.shape == shape) return a;
    return def(a.elem, shape,
               str_cat("stablehlo.broadcast_in_dim ", a.ssa, ", dims = [", join(dims), "] : (",
                       a.type(), ") -> ", tensor_type(a.elem, shape)));
  }
  Val reshape(const Val& a, const Shape& shape) {
    if (a.shape == shape) return a;
    return def(a.elem, shape,
               str_cat("stablehlo.reshape ", a.ssa, " : (", a.type(), ") -> ",
                       tensor_type(a.elem, shape)));
  }
  Val transpose(const Val& a, const std::vector<int64_t>& perm) {
    Shape shape;
    for (int64_t p : perm) shape.push_back(a.shape[size_t(p)]);
    return def(a.elem, shape,
               str_cat("stablehlo.transpose ", a.ssa, ", dims = [", join(perm), "] : (", a.type(),
                       ") -> ", tensor_type(a.elem, shape)));
  }
  // a[begin:end] along dimension `dim`, every other dimension whole.
  Val slice(const Val& a, int64_t dim, int64_t begin, int64_t end) {
    std::string ranges;
    Shape shape = a.shape;
    for (int64_t d = 0; d < a.rank(); ++d) {
      const int64_t lo = d == dim ? begin : 0, hi = d == dim ? end : a.shape[size_t(d)];
      ranges += str_cat(d ? ", " : "", lo, ":", hi);
      shape[size_t(d)] = hi - lo;
    }
    return def(a.elem, shape,
               str_cat("stablehlo.slice ", a.ssa, " [", ranges, "] : (", a.type(), ") -> ",
                       tensor_type(a.elem, shape)));
  }
  Val concatenate(const std::vector<Val>& parts, int64_t dim) {
    Shape shape = parts[0].shape;
    shape[size_t(dim)] = 0;
    std::string operands, types;
    for (const Val& p : parts) {
      shape[size_t(dim)] += p.shape[size_t(dim)];
      operands += (operands.empty() ? "" : ", ") + p.ssa;
      types += (types.empty() ? "" : ", ") + p.type();
    }
    return def(parts[0].elem, shape,
               str_cat("stablehlo.concatenate ", operands, ", dim = ", dim, " : (", types, ") -> ",
                       tensor_type(parts[0].elem, shape)));
  }
  Val iota(int64_t dim, const Shape& shape) {
    return def("i32", shape,
               str_cat("stablehlo.iota dim = ", dim, " : ", tensor_type("i32", shape)));
  }
  // a dir b elementwise ("LE", "GT", ...), as i1.
  Val compare(const char* dir, const Val& a, const Val& b) {
    TF_CHECK(a.type() == b.type(), "StableHLO lowering: compare of ", a.type(), " and ", b.type());
    return def("i1", a.shape,
               str_cat("stablehlo.compare ", dir, ", ", a.ssa, ", ", b.ssa, ", ",
                       is_float_elem(a.elem) ? "FLOAT" : "SIGNED", " : (", a.type(), ", ", b.type(),
                       ") -> ", tensor_type("i1", a.shape)));
  }
  Val select(const Val& pred, const Val& a, const Val& b) {
    return def(a.elem, a.shape,
               str_cat("stablehlo.select ", pred.ssa, ", ", a.ssa, ", ", b.ssa, " : ", pred.type(),
                       ", ", a.type()));
  }
  // Reduces `dims` of a with `op` ("add", "maximum") from `init`.
  Val reduce(const Val& a, const char* op, double init, const std::vector<int64_t>& dims) {
    const Val zero = splat(init, a.elem, {});
    Shape shape;
    for (int64_t d = 0; d < a.rank(); ++d)
      if (std::find(dims.begin(), dims.end(), d) == dims.end()) shape.push_back(a.shape[size_t(d)]);
    return def(a.elem, shape,
               str_cat("stablehlo.reduce(", a.ssa, " init: ", zero.ssa, ") applies stablehlo.", op,
                       " across dimensions = [", join(dims), "] : (", a.type(), ", ", zero.type(),
                       ") -> ", tensor_type(a.elem, shape)));
  }
  // A dot_general accumulating in f32: batch dims, then a's free dims, then b's. Operands of
  // different element types (f32 activations, bf16 weights) both widen to f32, which is exact.
  // f32 operands ask for HIGHEST precision: DEFAULT lets a TPU or GPU round them to bf16 or tf32,
  // where the CPU backend multiplies in full f32.
  Val dot(Val a, Val b, const std::vector<int64_t>& batch_a, const std::vector<int64_t>& batch_b,
          const std::vector<int64_t>& contract_a, const std::vector<int64_t>& contract_b) {
    if (a.elem != b.elem) {
      a = convert(a, "f32");
      b = convert(b, "f32");
    }
    Shape shape;
    for (int64_t d : batch_a) shape.push_back(a.shape[size_t(d)]);
    auto free_dims = [&](const Val& x, const std::vector<int64_t>& batch,
                         const std::vector<int64_t>& contract) {
      for (int64_t d = 0; d < x.rank(); ++d)
        if (std::find(batch.begin(), batch.end(), d) == batch.end() &&
            std::find(contract.begin(), contract.end(), d) == contract.end())
          shape.push_back(x.shape[size_t(d)]);
    };
    free_dims(a, batch_a, contract_a);
    free_dims(b, batch_b, contract_b);
    const char* precision = a.elem == "f32" ? "HIGHEST" : "DEFAULT";
    std::string dims;
    if (!batch_a.empty())
      dims = str_cat("batching_dims = [", join(batch_a), "] x [", join(batch_b), "], ");
    return def(
        "f32", shape,
        str_cat("stablehlo.dot_general ", a.ssa, ", ", b.ssa, ", ", dims, "contracting_dims = [",
                join(contract_a), "] x [", join(contract_b), "], precision = [", precision, ", ",
                precision, "] : (", a.type(), ", ", b.type(), ") -> ", tensor_type("f32", shape)));
  }
  // Rows of table (R, ...) at idx (n) (clamped into range, as XLA's gather does): (n, ...).
  Val gather_rows(const Val& table, const Val& idx) {
    const Val at = reshape(idx, {idx.shape[0], 1});
    Shape shape = table.shape;
    shape[0] = idx.shape[0];
    std::vector<int64_t> offset_dims, sizes = {1};
    for (int64_t d = 1; d < table.rank(); ++d) {
      offset_dims.push_back(d);
      sizes.push_back(table.shape[size_t(d)]);
    }
    return def(
        table.elem, shape,
        str_cat("\"stablehlo.gather\"(", table.ssa, ", ", at.ssa,
                ") {dimension_numbers = #stablehlo.gather<offset_dims = [", join(offset_dims),
                "], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = "
                "1>, indices_are_sorted = false, slice_sizes = array<i64: ",
                join(sizes), ">} : (", table.type(), ", ", at.type(), ") -> ",
                tensor_type(table.elem, shape)));
  }
  Val dynamic_update_slice(const Val& operand, const Val& update, const std::vector<Val>& starts) {
    std::string operands = operand.ssa + ", " + update.ssa,
                types = operand.type() + ", " + update.type();
    for (const Val& s : starts) {
      operands += ", " + s.ssa;
      types += ", " + s.type();
    }
    return def(operand.elem, operand.shape,
               str_cat("stablehlo.dynamic_update_slice ", operands, " : (", types, ") -> ",
                       operand.type()));
  }
  // A 4-d operand with update[i] (2-d) written where dim 0 is block[i] and dim `second` (1 or 2)
  // is offset[i], for each row i of at (n, 2) = (block, offset): [block, :, offset, :] for a
  // pool (NB, H, BS, D), [block, offset, :, :] for (NB, BS, H, D). A row whose block is out of
  // range is skipped: XLA drops scatter updates whose window falls outside the operand
  // (StableHLO leaves it to the implementation), and the paged write relies on that for its
  // padding tokens.
  Val scatter_rows(const Val& operand, const Val& at, const Val& update, int second) {
    const std::string scalar = "tensor<" + operand.elem + ">";
    return def(
        operand.elem, operand.shape,
        str_cat("\"stablehlo.scatter\"(", operand.ssa, ", ", at.ssa, ", ", update.ssa,
                ") ({\n    ^bb0(%old: ", scalar, ", %new: ", scalar,
                "):\n      stablehlo.return %new : ", scalar,
                "\n    }) {scatter_dimension_numbers = #stablehlo.scatter<update_window_dims "
                "= [1, 2], inserted_window_dims = [0, ",
                second, "], scatter_dims_to_operand_dims = [0, ", second,
                "], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false} : (",
                operand.type(), ", ", at.type(), ", ", update.type(), ") -> ", operand.type()));
  }

 private:
  std::string body_;
  int next_ = 0;
};

// How a node is named in errors: "%12 all_reduce  # layers.0.mlp.down_proj".
std::string node_label(const graph::Graph& g, const Node& n) {
  const int id = int(&n - g.nodes().data());
  std::string s = str_cat("%", id, " ", graph::op_name(n.op));
  if (!n.name.empty()) s += "  # " + n.name;
  return s;
}

class Lowering {
 public:
  explicit Lowering(const graph::Graph& g)
      : g_(g),
        act_(element(g.activation_dtype())),
        head_major_(g.kv_layout() == graph::KvLayout::kHeadMajor) {}
  LoweredModule run();

 private:
  const Val& in(const Node& n, size_t k) const { return vals_[size_t(n.inputs[k])]; }
  Val f32(const Node& n, size_t k) { return e_.convert(in(n, k), "f32"); }
  // The node's value from its f32 computation, rounded to the node's dtype.
  Val out(const Node& n, const Val& v) { return e_.convert(v, element(n.type.dtype)); }
  Val lower_node(const Node& n);
  Val embedding(const Node& n);
  Val linear_out(const Node& n, const Val& x, const Val& w, int bias_at);
  Val quant_weight(const Node& n);
  Val rms_norm(const Node& n);
  Val rope(const Node& n);
  Val cache_write(const Node& n);
  Val paged_cache_write(const Node& n);
  Val paged_attention(const Node& n);
  // Attention of q (B,T,Hq,D) over k, v (B,Hkv,S,D) or (B,S,Hkv,D) (the graph's KV layout), query
  // (b,t) at slot qpos[b,t] (i32, B,T) seeing slots j <= qpos within the window where key_valid
  // (B,S) holds (when given); a query that sees no slot gives zeros.
  Val attend(const Node& n, const Val& q, const Val& k, const Val& v, const Val& qpos,
             const Val* key_valid);

  const graph::Graph& g_;
  std::string act_;
  bool head_major_;  // the graph's KV layout (graph.h)
  Emitter e_;
  std::vector<Val> vals_;
};

Val Lowering::embedding(const Node& n) {
  const auto& a = n.attrs_as<graph::EmbeddingAttrs>();
  const Val& table = in(n, 0);  // (V,D)
  const Val& ids = in(n, 1);
  const int64_t count = shape_numel(ids.shape), rows = table.shape[0], d = table.shape[1];
  Val flat = e_.reshape(ids, {count});
  const int64_t row_offset = distributed::rank_offset(a.group, rows);
  const bool shard = row_offset != 0 || rows != a.vocab;
  if (!shard) return out(n, e_.reshape(e_.gather_rows(table, flat), n.type.shape));
  // A vocabulary shard: ids outside [row_offset, row_offset + rows) give zero rows. The rank is
  // a constant of this process's program, as a device's partition id would be.
  const Val local = e_.with_constant("subtract", flat, double(row_offset));
  const Val ok = e_.binary("and", e_.compare("GE", local, e_.splat(0, "i32", {count})),
                           e_.compare("LT", local, e_.splat(double(rows), "i32", {count})));
  const Val looked = e_.gather_rows(table, e_.select(ok, local, e_.splat(0, "i32", {count})));
  const Val zeros = e_.splat(0, table.elem, {count, d});
  const Val kept = e_.select(e_.broadcast(ok, {count, d}, {0}), looked, zeros);
  return out(n, e_.reshape(kept, n.type.shape));
}

// x (..., K) @ w (N, K)^T [+ bias (N)], accumulated in f32; bias_at is the bias's input index.
Val Lowering::linear_out(const Node& n, const Val& x, const Val& w, int bias_at) {
  const int64_t r = x.rank();
  Val y = e_.dot(x, w, {}, {}, {r - 1}, {1});
  if (int(n.inputs.size()) > bias_at)
    y = e_.binary("add", y, e_.broadcast(f32(n, size_t(bias_at)), y.shape, {r - 1}));
  return out(n, y);
}

// A kLinearQuant weight in rows (the layout PjrtBackend prepares) dequantized in the
// activation dtype: scale[n, k / 32] * (code[n,k] - zero), int8 codes with zero 0, or 4-bit
// codes two a byte, the low nibble for even k, with zero 8 where the weight has none.
Val Lowering::quant_weight(const Node& n) {
  const auto& q = n.attrs_as<graph::LinearQuantAttrs>();
  const Val& w = in(n, 1);  // (N,K) i8, or (N, ceil(K / 2)) u8
  const Val& s = in(n, 2);  // (N,nb)
  const int64_t K = in(n, 0).shape.back(), N = w.shape[0], nb = s.shape[1];
  // A per-(row, block) value for every input, (N,K) f32.
  auto per_k = [&](const Val& v) {
    const Val b = e_.broadcast(e_.convert(v, "f32"), {N, nb, graph::kQuantBlock}, {0, 1});
    return e_.slice(e_.reshape(b, {N, nb * graph::kQuantBlock}), 1, 0, K);
  };
  Val codes = w;
  if (q.scheme == graph::QuantScheme::kInt4) {
    const Shape pairs = {N, w.shape[1], 1};
    const Val bytes = e_.reshape(w, pairs);
    const Val low = e_.binary("and", bytes, e_.splat(15, "ui8", pairs));
    const Val high = e_.binary("shift_right_logical", bytes, e_.splat(4, "ui8", pairs));
    codes = e_.slice(e_.reshape(e_.concatenate({low, high}, 2), {N, 2 * w.shape[1]}), 1, 0, K);
  }
  codes = e_.convert(codes, "f32");
  if (q.scheme == graph::QuantScheme::kInt4)
    codes = e_.binary("subtract", codes, q.has_zero ? per_k(in(n, 3)) : e_.splat(8, "f32", {N, K}));
  return e_.convert(e_.binary("multiply", codes, per_k(s)), act_);
}

Val Lowering::rms_norm(const Node& n) {
  const auto& a = n.attrs_as<graph::RMSNormAttrs>();
  const Val x = f32(n, 0);
  const int64_t r = x.rank(), d = x.shape.back();
  const Val ss = e_.reduce(e_.binary("multiply", x, x), "add", 0.0f, {r - 1});
  const Val ms = e_.with_constant("add", e_.with_constant("divide", ss, float(d)), a.eps);
  const Val inv = e_.broadcast(e_.unary("rsqrt", ms), x.shape, [&] {
    std::vector<int64_t> dims(size_t(r - 1));
    std::iota(dims.begin(), dims.end(), 0);
    return dims;
  }());
  Val w = f32(n, 1);
  if (a.unit_offset) w = e_.with_constant("add", w, 1.0f);
  const Val y =
      e_.binary("multiply", e_.binary("multiply", x, inv), e_.broadcast(w, x.shape, {r - 1}));
  return out(n, y);
}

Val Lowering::rope(const Node& n) {
  const auto& a = n.attrs_as<graph::RopeAttrs>();
  const Val x = f32(n, 0);  // (B,T,H,D)
  const int64_t B = x.shape[0], T = x.shape[1], H = x.shape[2], D = x.shape[3];
  const int64_t rd = a.rotary_dim, half = rd / 2;
  // The angle pos * inv_freq rounded to f32, as Transformers computes it.
  const Shape angles = {B, T, half};
  const Val pos = e_.broadcast(e_.convert(in(n, 1), "f32"), angles, {0, 1});
  const Val angle = e_.binary("multiply", pos, e_.broadcast(e_.floats(a.inv_freq), angles, {2}));
  // Pairs (a, b) of features, each (B,T,H,half,1): (i, i + half), or (2i, 2i + 1) interleaved.
  const Shape pair = {B, T, H, half, 1};
  const Val cos = e_.broadcast(e_.unary("cosine", angle), pair, {0, 1, 3});
  const Val sin = e_.broadcast(e_.unary("sine", angle), pair, {0, 1, 3});
  const Val rot = e_.slice(x, 3, 0, rd);
  Val x1, x2;
  if (a.interleaved) {
    const Val pairs = e_.reshape(rot, {B, T, H, half, 2});
    x1 = e_.slice(pairs, 4, 0, 1);
    x2 = e_.slice(pairs, 4, 1, 2);
  } else {
    x1 = e_.reshape(e_.slice(rot, 3, 0, half), pair);
    x2 = e_.reshape(e_.slice(rot, 3, half, rd), pair);
  }
  const Val y1 =
      e_.binary("subtract", e_.binary("multiply", x1, cos), e_.binary("multiply", x2, sin));
  const Val y2 = e_.binary("add", e_.binary("multiply", x2, cos), e_.binary("multiply", x1, sin));
  Val y = e_.concatenate({y1, y2}, a.interleaved ? 4 : 3);  // (B,T,H,half,2) or (B,T,H,rd,1)
  y = e_.reshape(y, {B, T, H, rd});
  if (rd < D) y = e_.concatenate({y, e_.slice(x, 3, rd, D)}, 3);
  return out(n, y);
}

Val Lowering::cache_write(const Node& n) {
  const Val& cache = in(n, 0);  // (B,Hkv,S,D) or (B,S,Hkv,D)
  // The new keys (B,T,Hkv,D) are a token-major block as they come.
  const Val update =
      e_.convert(head_major_ ? e_.transpose(in(n, 1), {0, 2, 1, 3}) : in(n, 1), cache.elem);
  // dynamic_update_slice clamps its start into [0, S - T] instead of failing; a start out of
  // range never gets here, since Executable::run (backends/backend.cc) checks it on the host.
  const Val zero = e_.splat(0, "i32", {});
  const Val& start = in(n, 2);
  return e_.dynamic_update_slice(cache, update,
                                 head_major_ ? std::vector<Val>{zero, zero, start, zero}
                                             : std::vector<Val>{zero, start, zero, zero});
}

// For each new token with a position p >= 0, its (Hkv, D) row goes to offset p % BS of block
// table[b, p / BS]. Padding tokens get block NB, out of range, which XLA's scatter skips.
Val Lowering::paged_cache_write(const Node& n) {
  const Val& pool = in(n, 0);    // (NB,Hkv,BS,D) or (NB,BS,Hkv,D)
  const Val& update = in(n, 1);  // (B,T,Hkv,D)
  const Val& table = in(n, 2);   // (B,MB)
  const Val& pos = in(n, 3);     // (B,T)
  const int offset_dim = graph::kv_positions_dim(g_.kv_layout());
  const int64_t NB = pool.shape[0], BS = pool.shape[size_t(offset_dim)];
  const int64_t B = pos.shape[0], T = pos.shape[1], MB = table.shape[1];
  const Shape bt = {B, T};
  const Val padding = e_.compare("LT", pos, e_.splat(0, "i32", bt));
  const Val p = e_.select(padding, e_.splat(0, "i32", bt), pos);
  const Val slot = e_.with_constant("divide", p, double(BS));  // (B,T) index into the table row
  // table[b, slot[b,t]] as a gather of the flattened table at b * MB + slot.
  const Val row = e_.binary("multiply", e_.iota(0, bt), e_.splat(double(MB), "i32", bt));
  const Val flat = e_.reshape(e_.binary("add", row, slot), {B * T});
  Val block = e_.reshape(e_.gather_rows(e_.reshape(table, {B * MB}), flat), bt);
  block = e_.select(padding, e_.splat(double(NB), "i32", bt), block);
  const Val offset = e_.with_constant("remainder", p, double(BS));
  const Val at = e_.concatenate({e_.reshape(block, {B * T, 1}), e_.reshape(offset, {B * T, 1})}, 1);
  const Shape rows = {B * T, update.shape[2], update.shape[3]};
  return e_.scatter_rows(pool, at, e_.convert(e_.reshape(update, rows), pool.elem), offset_dim);
}

// Each sequence's blocks gathered into a static cache (B, Hkv, MB * BS, D) or (B, MB * BS, Hkv,
// D) in table order, and the static attention over it with the positions as query slots.
Val Lowering::paged_attention(const Node& n) {
  const Val& table = in(n, 3);  // (B,MB)
  const int64_t B = table.shape[0], MB = table.shape[1];
  auto unpage = [&](const Val& pool) {
    const Val blocks = e_.gather_rows(pool, e_.reshape(table, {B * MB}));
    if (!head_major_) {  // (B * MB, BS, Hkv, D): the blocks of a row are its slots in order
      const int64_t BS = pool.shape[1], Hkv = pool.shape[2], D = pool.shape[3];
      return e_.reshape(blocks, {B, MB * BS, Hkv, D});
    }
    const int64_t Hkv = pool.shape[1], BS = pool.shape[2], D = pool.shape[3];
    const Val seq = e_.transpose(e_.reshape(blocks, {B, MB, Hkv, BS, D}), {0, 2, 1, 3, 4});
    return e_.reshape(seq, {B, Hkv, MB * BS, D});
  };
  const Val k = unpage(in(n, 1)), v = unpage(in(n, 2));
  return attend(n, in(n, 0), k, v, in(n, 4), nullptr);
}

Val Lowering::attend(const Node& n, const Val& q, const Val& k, const Val& v, const Val& qpos,
                     const Val* key_valid) {
  const auto& a = n.attrs_as<graph::AttentionAttrs>();
  const int64_t B = q.shape[0], T = q.shape[1], Hq = q.shape[2], D = q.shape[3];
  // k and v as the graph's KV layout has them: (B,Hkv,S,D) or (B,S,Hkv,D), contracted in place.
  const int64_t hd = graph::kv_heads_dim(g_.kv_layout());
  const int64_t pd = graph::kv_positions_dim(g_.kv_layout());
  const int64_t Hkv = k.shape[size_t(hd)], S = k.shape[size_t(pd)], G = Hq / Hkv;
  // Query head h reads KV head h / G: q as (B,T,Hkv,G,D), scores (B,Hkv,T,G,S).
  const Val qg = e_.reshape(q, {B, T, Hkv, G, D});
  Val s = e_.dot(qg, k, {0, 2}, {0, hd}, {4}, {3});
  s = e_.with_constant("multiply", s, a.scale);
  if (a.softcap > 0)
    s = e_.with_constant("multiply", e_.unary("tanh", e_.with_constant("divide", s, a.softcap)),
                         a.softcap);
  // Which slots each query sees, (B,T,S).
  const Shape bts = {B, T, S};
  const Val qp = e_.broadcast(qpos, bts, {0, 1});
  const Val j = e_.iota(2, bts);
  Val ok = e_.compare("LE", j, qp);
  if (a.sliding_window > 0)
    ok = e_.binary("and", ok,
                   e_.compare("GT", j, e_.with_constant("subtract", qp, double(a.sliding_window))));
  if (key_valid) ok = e_.binary("and", ok, e_.broadcast(*key_valid, bts, {0, 2}));
  const Val seen = e_.broadcast(ok, s.shape, {0, 2, 4});
  // Unseen slots take the lowest finite score (not -inf, which would make max - max a NaN in a
  // row that sees nothing) and then weight 0, so such a row sums to 0 and gives zeros.
  s = e_.select(seen, s, e_.splat(-3.4e38f, "f32", s.shape));
  const Val mx = e_.broadcast(e_.reduce(s, "maximum", -3.4e38f, {4}), s.shape, {0, 1, 2, 3});
  const Val p = e_.select(seen, e_.unary("exponential", e_.binary("subtract", s, mx)),
                          e_.splat(0, "f32", s.shape));
  Val sum = e_.reduce(p, "add", 0.0f, {4});  // (B,Hkv,T,G)
  const Val none = e_.compare("EQ", sum, e_.splat(0, "f32", sum.shape));
  sum = e_.select(none, e_.splat(1, "f32", sum.shape), sum);
  // p (B,Hkv,T,G,S) in the activation dtype . v -> (B,Hkv,T,G,D), then normalised.
  Val o = e_.dot(e_.convert(p, act_), v, {0, 1}, {0, hd}, {4}, {pd});
  o = e_.binary("divide", o, e_.broadcast(sum, o.shape, {0, 1, 2, 3}));
  o = e_.reshape(e_.transpose(o, {0, 2, 1, 3, 4}), {B, T, Hq, D});
  return out(n, o);
}

Val Lowering::lower_node(const Node& n) {
  const Shape& s = n.type.shape;
  switch (n.op) {
    case Op::kParameter:
    case Op::kState:
    case Op::kInput:
      break;  // arguments, named in run()
    case Op::kEmbedding:
      return embedding(n);
    case Op::kLinear:
      return linear_out(n, in(n, 0), in(n, 1), 2);
    case Op::kLinearQuant:
      return linear_out(n, e_.convert(in(n, 0), act_), quant_weight(n),
                        n.attrs_as<graph::LinearQuantAttrs>().has_zero ? 4 : 3);
    case Op::kRMSNorm:
      return rms_norm(n);
    case Op::kRope:
      return rope(n);
    case Op::kSiluMul: {
      const Val g = f32(n, 0);
      return out(
          n, e_.binary("multiply", e_.binary("multiply", g, e_.unary("logistic", g)), f32(n, 1)));
    }
    case Op::kGeluTanhMul: {
      // 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) * up
      const Val g = f32(n, 0);
      const Val g3 = e_.binary("multiply", e_.binary("multiply", g, g), g);
      const Val inner = e_.with_constant(
          "multiply", e_.binary("add", g, e_.with_constant("multiply", g3, 0.044715f)),
          0.7978845608028654f);
      const Val t = e_.with_constant("add", e_.unary("tanh", inner), 1.0f);
      const Val gelu = e_.binary("multiply", e_.with_constant("multiply", g, 0.5f), t);
      return out(n, e_.binary("multiply", gelu, f32(n, 1)));
    }
    case Op::kAdd:
      return out(n, e_.binary("add", f32(n, 0), f32(n, 1)));
    case Op::kScale:
      return out(n,
                 e_.with_constant("multiply", f32(n, 0), n.attrs_as<graph::ScaleAttrs>().factor));
    case Op::kSoftcap: {
      const float cap = n.attrs_as<graph::SoftcapAttrs>().cap;
      return out(
          n, e_.with_constant("multiply",
                              e_.unary("tanh", e_.with_constant("divide", f32(n, 0), cap)), cap));
    }
    case Op::kReshape:
      return e_.reshape(in(n, 0), s);
    case Op::kConvert:
      return out(n, in(n, 0));
    case Op::kTakeLast:
      return e_.slice(in(n, 0), 1, in(n, 0).shape[1] - s[1], in(n, 0).shape[1]);
    case Op::kSlice: {
      const auto& a = n.attrs_as<graph::SliceAttrs>();
      const Val& x = in(n, 0);
      const int64_t dim = x.rank() - 1, k = x.shape.back(), w = a.end - a.begin;
      const int64_t begin = a.begin + distributed::rank_offset(a.group, w);
      const int64_t have = std::clamp<int64_t>(k - begin, 0, w);  // the rest is padding
      if (have == w) return e_.slice(x, dim, begin, begin + w);
      Shape pad = s;
      pad.back() = w - have;
      const Val zeros = e_.splat(0, x.elem, pad);
      if (have == 0) return zeros;
      return e_.concatenate({e_.slice(x, dim, begin, k), zeros}, dim);
    }
    case Op::kCacheWrite:
      return cache_write(n);
    case Op::kAttention: {
      const Val& q = in(n, 0);
      const Shape bt = {q.shape[0], q.shape[1]};
      const Val qpos = e_.binary("add", e_.iota(1, bt), e_.broadcast(in(n, 3), bt, {}));
      if (n.inputs.size() < 5) return attend(n, q, in(n, 1), in(n, 2), qpos, nullptr);
      const Val& mask = in(n, 4);
      const Val valid = e_.compare("NE", mask, e_.splat(0, "i32", mask.shape));
      return attend(n, q, in(n, 1), in(n, 2), qpos, &valid);
    }
    case Op::kPagedCacheWrite:
      return paged_cache_write(n);
    case Op::kPagedAttention:
      return paged_attention(n);
    case Op::kCustomCall:
    case Op::kAllReduce:
    case Op::kAllGather:
      break;  // refused by run() before any node is lowered
  }
  throw InternalError(str_cat("StableHLO lowering: no rule for ", node_label(g_, n)));
}

LoweredModule Lowering::run() {
  const auto& nodes = g_.nodes();
  for (const Node& n : nodes)
    if (!can_lower(n))
      throw UnsupportedError(str_cat("StableHLO lowering: ", node_label(g_, n),
                                     " has no StableHLO form; a graph with this op needs the CPU "
                                     "backend"));
  vals_.resize(nodes.size());
  // Arguments in binding order: parameters, states, inputs.
  const std::vector<int> states = g_.leaves(Op::kState);
  const std::vector<int> outputs = g_.outputs();
  std::string args;
  int arg = 0;
  for (Op kind : {Op::kParameter, Op::kState, Op::kInput}) {
    const std::vector<int> ids = g_.leaves(kind);
    for (size_t i = 0; i < ids.size(); ++i) {
      const Node& n = nodes[size_t(ids[i])];
      Val& v = vals_[size_t(ids[i])];
      v = {"%arg" + std::to_string(arg++), element(n.type.dtype), n.type.shape};
      args += (args.empty() ? "" : ", ") + v.ssa + ": " + v.type();
      // A state's buffer is donated to its new value, so the cache is updated in place.
      if (kind == Op::kState)
        args += str_cat(" {tf.aliasing_output = ", outputs.size() + i, " : i32}");
    }
  }
  // The latest value of each state: cache writes (through reshapes) replace it. The CPU backend
  // writes in place, the module returns new values; they agree because ops read a cache through
  // the write that produced it (as GraphBuilder users build them), never the state leaf after it.
  std::vector<int> root(nodes.size()), latest(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    const bool in_place =
        n.op == Op::kReshape || n.op == Op::kCacheWrite || n.op == Op::kPagedCacheWrite;
    root[i] = in_place ? root[size_t(n.inputs[0])] : int(i);
    latest[i] = int(i);
    if (n.op == Op::kCacheWrite || n.op == Op::kPagedCacheWrite) latest[size_t(root[i])] = int(i);
    if (n.op != Op::kParameter && n.op != Op::kState && n.op != Op::kInput)
      vals_[i] = lower_node(n);
  }
  std::vector<Val> results;
  for (int o : outputs) results.push_back(vals_[size_t(o)]);
  for (int s : states)
    results.push_back(e_.reshape(vals_[size_t(latest[size_t(s)])], nodes[size_t(s)].type.shape));
  std::string ret, ret_types;
  for (const Val& r : results) {
    ret += (ret.empty() ? "" : ", ") + r.ssa;
    ret_types += (ret_types.empty() ? "" : ", ") + r.type();
  }
  LoweredModule m;
  m.num_outputs = outputs.size();
  m.num_states = states.size();
  m.mlir = str_cat(
      "module @tformers attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} "
      "{\n  func.func public @main(",
      args, ") -> (", ret_types, ") {\n", e_.body(), "    return",
      ret.empty() ? "" : " " + ret + " : " + ret_types, "\n  }\n}\n");
  return m;
}

}  // namespace

bool can_lower(const graph::Node& node) {
  if (node.op == Op::kLinearQuant)  // quant_weight reads rows
    return node.attrs_as<graph::LinearQuantAttrs>().layout == graph::QuantLayout::kRows;
  // Several sequences packed into a row (the rows operand) would need each query's own keys
  // gathered; the lowering gathers a sequence's blocks per batch row.
  if (node.op == Op::kPagedCacheWrite) return node.inputs.size() == 4;
  if (node.op == Op::kPagedAttention) return node.inputs.size() == 5;
  return node.op != Op::kCustomCall && node.op != Op::kAllReduce && node.op != Op::kAllGather;
}

LoweredModule lower(const graph::Graph& graph) { return Lowering(graph).run(); }

}  // namespace tformers::backends::pjrt
