#include "graph/ops.h"

#include <algorithm>
#include <array>
#include <type_traits>

#include "tformers/error.h"

namespace tformers::graph {

namespace {

// The position of attribute kind A in Attrs.
template <class A, size_t I = 0>
constexpr size_t attrs_index() {
  if constexpr (std::is_same_v<A, std::variant_alternative_t<I, Attrs>>)
    return I;
  else
    return attrs_index<A, I + 1>();
}
constexpr size_t kNone = attrs_index<std::monostate>();

// ---- Decompositions of the composites ----

Value act(GraphBuilder& b, Value x) { return b.convert(x, b.activation()); }

Value add(GraphBuilder& b, const Node& n, const std::vector<Value>& in) {
  return b.binary(BinaryFn::kAdd, in[0], in[1], n.name);
}
Value silu_mul(GraphBuilder& b, const Node& n, const std::vector<Value>& in) {
  return b.binary(BinaryFn::kMul, b.unary(UnaryFn::kSilu, in[0]), in[1], n.name);
}
Value gelu_tanh_mul(GraphBuilder& b, const Node& n, const std::vector<Value>& in) {
  return b.binary(BinaryFn::kMul, b.unary(UnaryFn::kGeluTanh, in[0]), in[1], n.name);
}
Value scale(GraphBuilder& b, const Node& n, const std::vector<Value>& in) {
  const Value f = b.constant(n.attrs_as<ScaleAttrs>().factor, {b.activation(), {}});
  return b.binary(BinaryFn::kMul, in[0], f, n.name);
}
Value softcap(GraphBuilder& b, const Node& n, const std::vector<Value>& in) {
  const Value cap = b.constant(n.attrs_as<SoftcapAttrs>().cap, {b.activation(), {}});
  return b.binary(BinaryFn::kMul, b.unary(UnaryFn::kTanh, b.binary(BinaryFn::kDiv, in[0], cap)),
                  cap, n.name);
}
// x * rsqrt(mean(x^2) + eps) * w, or * (1 + w) with a unit offset.
Value rms_norm(GraphBuilder& b, const Node& n, const std::vector<Value>& in) {
  const auto& a = n.attrs_as<RMSNormAttrs>();
  const Value x = in[0];
  const int64_t axis = int64_t(b.type(x).shape.size()) - 1;
  const TensorType scalar{b.activation(), {}};
  const Value sum = b.reduce(ReduceFn::kSum, b.binary(BinaryFn::kMul, x, x), axis);
  const Value mean =
      b.binary(BinaryFn::kDiv, sum, b.constant(double(b.type(x).shape.back()), scalar));
  const Value inv =
      b.unary(UnaryFn::kRsqrt, b.binary(BinaryFn::kAdd, mean, b.constant(a.eps, scalar)));
  Value w = act(b, in[1]);
  if (a.unit_offset) w = b.binary(BinaryFn::kAdd, w, b.constant(1.0, scalar));
  return b.binary(BinaryFn::kMul, b.binary(BinaryFn::kMul, x, inv), w, n.name);
}
// exp(x - max) / sum over the last dim.
Value softmax(GraphBuilder& b, const Node& n, const std::vector<Value>& in) {
  const int64_t axis = int64_t(b.type(in[0]).shape.size()) - 1;
  const Value e = b.unary(UnaryFn::kExp,
                          b.binary(BinaryFn::kSub, in[0], b.reduce(ReduceFn::kMax, in[0], axis)));
  return b.binary(BinaryFn::kDiv, e, b.reduce(ReduceFn::kSum, e, axis), n.name);
}

#define TF_OP(OP, NAME, ATTRS, MIN, MAX, DECOMPOSE) \
  OpDef { Op::OP, NAME, ATTRS, MIN, MAX, DECOMPOSE }

// In Op's order (checked below).
constexpr OpDef kOps[] = {
    TF_OP(kParameter, "parameter", kNone, 0, 0, nullptr),
    TF_OP(kState, "state", kNone, 0, 0, nullptr),
    TF_OP(kInput, "input", kNone, 0, 0, nullptr),
    TF_OP(kEmbedding, "embedding", attrs_index<EmbeddingAttrs>(), 2, 2, nullptr),
    TF_OP(kLinear, "linear", kNone, 2, 3, nullptr),
    TF_OP(kRMSNorm, "rms_norm", attrs_index<RMSNormAttrs>(), 2, 2, rms_norm),
    TF_OP(kRope, "rope", attrs_index<RopeAttrs>(), 2, 2, nullptr),
    TF_OP(kSiluMul, "silu_mul", kNone, 2, 2, silu_mul),
    TF_OP(kAdd, "add", kNone, 2, 2, add),
    TF_OP(kReshape, "reshape", kNone, 1, 1, nullptr),
    TF_OP(kCacheWrite, "cache_write", kNone, 3, 3, nullptr),
    TF_OP(kAttention, "attention", attrs_index<AttentionAttrs>(), 4, 6, nullptr),
    TF_OP(kTakeLast, "take_last", attrs_index<TakeLastAttrs>(), 1, 1, nullptr),
    TF_OP(kCustomCall, "custom_call", attrs_index<CustomCallAttrs>(), 0, -1, nullptr),
    TF_OP(kAllReduce, "all_reduce", attrs_index<AllReduceAttrs>(), 1, 2, nullptr),
    TF_OP(kAllGather, "all_gather", attrs_index<AllGatherAttrs>(), 1, 1, nullptr),
    TF_OP(kSlice, "slice", attrs_index<SliceAttrs>(), 1, 1, nullptr),
    TF_OP(kLinearQuant, "linear_quant", attrs_index<LinearQuantAttrs>(), 3, 5, nullptr),
    TF_OP(kGeluTanhMul, "gelu_tanh_mul", kNone, 2, 2, gelu_tanh_mul),
    TF_OP(kScale, "scale", attrs_index<ScaleAttrs>(), 1, 1, scale),
    TF_OP(kSoftcap, "softcap", attrs_index<SoftcapAttrs>(), 1, 1, softcap),
    TF_OP(kPagedCacheWrite, "paged_cache_write", kNone, 4, 5, nullptr),
    TF_OP(kPagedAttention, "paged_attention", attrs_index<AttentionAttrs>(), 5, 7, nullptr),
    TF_OP(kConvert, "convert", kNone, 1, 1, nullptr),
    TF_OP(kConstant, "constant", attrs_index<ConstantAttrs>(), 0, 0, nullptr),
    TF_OP(kUnary, "unary", attrs_index<UnaryAttrs>(), 1, 1, nullptr),
    TF_OP(kBinary, "binary", attrs_index<BinaryAttrs>(), 2, 2, nullptr),
    TF_OP(kSelect, "select", kNone, 3, 3, nullptr),
    TF_OP(kReduce, "reduce", attrs_index<ReduceAttrs>(), 1, 1, nullptr),
    TF_OP(kSoftmax, "softmax", kNone, 1, 1, softmax),
    TF_OP(kTopK, "top_k", attrs_index<TopKAttrs>(), 1, 1, nullptr),
    TF_OP(kTakeAlong, "take_along", kNone, 2, 2, nullptr),
    TF_OP(kScatterAdd, "scatter_add", kNone, 3, 3, nullptr),
    TF_OP(kConcat, "concat", attrs_index<AxisAttrs>(), 1, -1, nullptr),
    TF_OP(kTranspose, "transpose", attrs_index<TransposeAttrs>(), 1, 1, nullptr),
    TF_OP(kBroadcast, "broadcast", kNone, 1, 1, nullptr),
    TF_OP(kIota, "iota", attrs_index<AxisAttrs>(), 0, 0, nullptr),
    TF_OP(kCumsum, "cumsum", attrs_index<AxisAttrs>(), 1, 1, nullptr),
    TF_OP(kMatMul, "matmul", kNone, 2, 2, nullptr),
    TF_OP(kLinearId, "linear_id", attrs_index<LinearIdAttrs>(), 3, 4, nullptr),
    TF_OP(kLinearIdQuant, "linear_id_quant", attrs_index<LinearIdAttrs>(), 4, 6, nullptr),
    TF_OP(kCausalConv1d, "causal_conv1d", kNone, 5, 5, nullptr),
    TF_OP(kGatedDeltaRule, "gated_delta_rule", kNone, 8, 8, nullptr),
    TF_OP(kPagedCausalConv1d, "paged_causal_conv1d", kNone, 5, 5, nullptr),
    TF_OP(kPagedGatedDeltaRule, "paged_gated_delta_rule", kNone, 8, 8, nullptr),
};
#undef TF_OP

static_assert(std::size(kOps) == kOpCount, "every Op has one OpDef");
constexpr bool in_order() {
  for (size_t i = 0; i < std::size(kOps); ++i)
    if (size_t(kOps[i].op) != i) return false;
  return true;
}
static_assert(in_order(), "kOps lists the ops in Op's order");

}  // namespace

const OpDef& op_def(Op op) {
  TF_CHECK(size_t(op) < kOpCount, "no op ", int(op));
  return kOps[size_t(op)];
}

const char* op_name(Op op) { return size_t(op) < kOpCount ? kOps[size_t(op)].name : "?"; }

Graph decompose(const Graph& g, const HasRule& has_rule) {
  // What stays: leaves, nodes with a rule, and nodes with no decomposition, which the backend
  // refuses in its own words.
  auto keep = [&](const Node& n) {
    return is_leaf(n.op) || has_rule(n) || !op_def(n.op).decompose;
  };
  if (std::all_of(g.nodes().begin(), g.nodes().end(), keep)) return g;
  GraphBuilder b(g.activation_dtype(), g.kv_layout());
  std::vector<Value> to(g.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    Node n = g.node(int(i));
    for (int& in : n.inputs) in = to[size_t(in)];
    if (keep(n)) {
      to[i] = b.copy(std::move(n));
      continue;
    }
    const OpDef& d = op_def(n.op);
    // The decomposition is itself a graph the backend may lack rules for.
    GraphBuilder part(g.activation_dtype(), g.kv_layout());
    std::vector<Value> operands;
    for (int in : n.inputs) operands.push_back(part.input("", b.type(in)));
    part.output(d.decompose(part, n, operands));
    const Graph expanded = decompose(part.finish(), has_rule);
    std::vector<Value> map(expanded.nodes().size());
    size_t next_operand = 0;
    for (size_t j = 0; j < expanded.nodes().size(); ++j) {
      Node m = expanded.node(int(j));
      if (m.op == Op::kInput) {
        map[j] = n.inputs[next_operand++];
        continue;
      }
      for (int& in : m.inputs) in = map[size_t(in)];
      map[j] = b.copy(std::move(m));
    }
    to[i] = map[size_t(expanded.outputs().front())];
    TF_CHECK(b.type(to[i]) == g.node(int(i)).type, "decomposition of ", d.name, " gives ",
             b.type(to[i]).str(), ", not ", g.node(int(i)).type.str());
  }
  for (int o : g.outputs()) b.output(to[size_t(o)]);
  return b.finish();
}

}  // namespace tformers::graph
