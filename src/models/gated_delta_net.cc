// Gated DeltaNet, the linear-attention layer of Qwen3-Next and Qwen3.5 (layers.h), as
// Transformers 5.23 computes it (Qwen3NextGatedDeltaNet, Qwen3_5GatedDeltaNet).
#include <cmath>

#include "models/layers.h"
#include "tformers/error.h"

namespace tformers::models {

using graph::BinaryFn;
using graph::GraphBuilder;
using graph::TensorType;
using graph::UnaryFn;

void GatedDeltaNet::declare(std::vector<WeightSpec>& w, const std::string& prefix) const {
  const int64_t keys = key_heads * key_dim, values = value_heads * value_dim;
  // Transformers' tp_plan: each rank projects its share of the features and the ranks gather
  // them, so every rank runs the convolution and the delta rule whole on the whole state.
  const char* gathered = "colwise_gather_output";
  if (grouped) {
    Linear{hidden, 2 * keys + 2 * values, false, gathered}.declare(w, prefix + ".in_proj_qkvz");
    Linear{hidden, 2 * value_heads, false, gathered}.declare(w, prefix + ".in_proj_ba");
  } else {
    Linear{hidden, 2 * keys + values, false, gathered}.declare(w, prefix + ".in_proj_qkv");
    Linear{hidden, values, false, gathered}.declare(w, prefix + ".in_proj_z");
    Linear{hidden, value_heads, false, gathered}.declare(w, prefix + ".in_proj_b");
    Linear{hidden, value_heads, false, gathered}.declare(w, prefix + ".in_proj_a");
  }
  w.push_back({prefix + ".conv1d.weight", {conv_channels(), 1, conv_width}, WeightRole::kConv});
  w.push_back({prefix + ".dt_bias", {value_heads}, WeightRole::kNorm});
  w.push_back({prefix + ".A_log", {value_heads}, WeightRole::kNorm});
  w.push_back({prefix + ".norm.weight", {value_dim}, WeightRole::kNorm});
  Linear{values, hidden, false, gathered}.declare(w, prefix + ".out_proj");
}

GatedDeltaNet::Projected GatedDeltaNet::project(Ctx& c, Value x, const std::string& prefix) const {
  GraphBuilder& b = c.b;
  const int64_t B = c.s.batch, T = c.s.new_tokens, H = value_heads, Hk = key_heads;
  const int64_t Dk = key_dim, Dv = value_dim;
  if (!grouped)
    return {linear(c, x, prefix + ".in_proj_qkv"),
            b.reshape(linear(c, x, prefix + ".in_proj_z"), {B, T, H, Dv}),
            linear(c, x, prefix + ".in_proj_b"), linear(c, x, prefix + ".in_proj_a")};
  // Each key head's group of rows: its q and k, then its value heads' v and z; then [b a] for
  // the same value heads. Cut per group, the parts line up as the ungrouped projections give them.
  const int64_t r = H / Hk;
  const Value qkvz =
      b.reshape(linear(c, x, prefix + ".in_proj_qkvz"), {B, T, Hk, 2 * Dk + 2 * r * Dv});
  auto part = [&](Value y, int64_t begin, int64_t n, Shape shape, const char* what) {
    return b.reshape(b.slice_last(y, begin, begin + n, prefix + what), std::move(shape));
  };
  const Value q = part(qkvz, 0, Dk, {B, T, Hk * Dk}, ".q");
  const Value k = part(qkvz, Dk, Dk, {B, T, Hk * Dk}, ".k");
  const Value v = part(qkvz, 2 * Dk, r * Dv, {B, T, H * Dv}, ".v");
  const Value z = part(qkvz, 2 * Dk + r * Dv, r * Dv, {B, T, H, Dv}, ".z");
  const Value ba = b.reshape(linear(c, x, prefix + ".in_proj_ba"), {B, T, Hk, 2 * r});
  return {b.concat({q, k, v}, 2, prefix + ".qkv"), z, part(ba, 0, r, {B, T, H}, ".b"),
          part(ba, r, r, {B, T, H}, ".a")};
}

Value GatedDeltaNet::operator()(Ctx& c, Value x, const std::string& prefix, int64_t layer) const {
  TF_CHECK(!c.s.paged() || (c.s.state_slots > 0 && c.s.sequences == 0), prefix,
           ": a paged step of a model with recurrent state needs state slots, one sequence a row");
  GraphBuilder& b = c.b;
  const int64_t B = c.s.batch, T = c.s.new_tokens, H = value_heads, Hk = key_heads;
  const int64_t Dk = key_dim, Dv = value_dim, C = conv_channels();
  // The static cache's row of each batch row, or the paged pools' slot of each.
  const bool paged = c.s.paged();
  const std::string state =
      (paged ? "recurrent_pool." : "recurrent_state.") + std::to_string(layer);
  const int64_t rows = paged ? c.s.state_slots : B;
  const Projected in = project(c, x, prefix);

  const Value conv_state = b.state(state + ".conv", {DType::f32, {rows, conv_width - 1, C}});
  const Value w = b.reshape(c.p(prefix + ".conv1d.weight"), {C, conv_width});
  const std::string conv = prefix + ".conv1d";
  const Value mixed = b.unary(
      UnaryFn::kSilu, paged ? b.paged_causal_conv1d(in.mixed, w, conv_state, c.slots, c.pos, conv)
                            : b.causal_conv1d(in.mixed, w, conv_state, c.start, c.mask, conv));

  // q and k L2-normalised over each head (as fla's l2norm: x rsqrt(sum x^2 + 1e-6)), q then
  // scaled by 1/sqrt(Dk) as the delta rule's kernels do.
  const TensorType scalar{b.activation(), {}};
  auto l2norm = [&](Value y, const std::string& name) {
    const Value sum = b.reduce(graph::ReduceFn::kSum, b.binary(BinaryFn::kMul, y, y), 3);
    const Value inv =
        b.unary(UnaryFn::kRsqrt, b.binary(BinaryFn::kAdd, sum, b.constant(1e-6, scalar)));
    return b.binary(BinaryFn::kMul, y, inv, name);
  };
  auto heads = [&](int64_t begin, int64_t n, Shape shape, const char* what) {
    return b.reshape(b.slice_last(mixed, begin, begin + n, prefix + what), std::move(shape));
  };
  const Value q = b.scale(l2norm(heads(0, Hk * Dk, {B, T, Hk, Dk}, ".q_heads"), prefix + ".q_norm"),
                          float(1.0 / std::sqrt(double(Dk))), prefix + ".q_scale");
  const Value k = l2norm(heads(Hk * Dk, Hk * Dk, {B, T, Hk, Dk}, ".k_heads"), prefix + ".k_norm");
  const Value v = heads(2 * Hk * Dk, H * Dv, {B, T, H, Dv}, ".v_heads");

  // beta = sigmoid(b); g = -exp(A_log) softplus(a + dt_bias), in float32 as Transformers does.
  const Value beta = b.unary(UnaryFn::kSigmoid, in.b, prefix + ".beta");
  const Value a = b.binary(BinaryFn::kAdd, b.convert(in.a, DType::f32),
                           b.convert(c.p(prefix + ".dt_bias"), DType::f32));
  const Value decay = b.unary(UnaryFn::kExp, b.convert(c.p(prefix + ".A_log"), DType::f32));
  const Value g = b.binary(BinaryFn::kMul, b.unary(UnaryFn::kNeg, decay),
                           b.unary(UnaryFn::kSoftplus, a), prefix + ".g");

  const Value delta_state = b.state(state + ".delta", {DType::f32, {rows, H, Dk, Dv}});
  const std::string rule = prefix + ".delta_rule";
  Value y = paged ? b.paged_gated_delta_rule(q, k, v, g, beta, delta_state, c.slots, c.pos, rule)
                  : b.gated_delta_rule(q, k, v, g, beta, delta_state, c.start, c.mask,
                                       rule);  // (B,T,H,Dv)
  y = b.rms_norm(y, c.p(prefix + ".norm.weight"), eps, prefix + ".norm");
  y = b.binary(BinaryFn::kMul, y, b.unary(UnaryFn::kSilu, in.z), prefix + ".gated");
  return linear(c, b.reshape(y, {B, T, H * Dv}), prefix + ".out_proj");
}

LayerState GatedDeltaNet::state() const {
  return {.kind = LayerState::Kind::kRecurrent,
          .conv_channels = conv_channels(),
          .conv_width = conv_width,
          .heads = value_heads,
          .key_dim = key_dim,
          .value_dim = value_dim};
}

}  // namespace tformers::models
