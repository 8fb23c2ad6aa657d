#include "models/layers.h"

#include <cmath>
#include <numbers>
#include <tuple>

#include "distributed/tp_model.h"
#include "tformers/error.h"

namespace tformers::models {

using distributed::TpStyle;
using graph::GraphBuilder;
using graph::TensorType;

Value Params::operator()(const std::string& name) {
  if (auto it = nodes_.find(name); it != nodes_.end()) return it->second;
  auto t = types_.find(name);
  TF_CHECK(t != types_.end(), "model code asked for weight '", name, "' that is not declared");
  return nodes_[name] = b_.parameter(name, t->second);
}

Ctx begin_step(GraphBuilder& b, Params& p, const StepShape& s, DType cache_dtype) {
  const int64_t B = s.batch, T = s.new_tokens, S = s.cache_len;
  Ctx c{b, p, s, cache_dtype};
  c.ids = b.input("input_ids", {DType::i32, {B, T}});
  c.pos = b.input("position_ids", {DType::i32, {B, T}});
  if (s.paged()) {
    c.table = b.input("block_table", {DType::i32, {s.sequences ? s.sequences : B, s.table_blocks}});
    if (s.sequences) c.rows = b.input("sequence_index", {DType::i32, {B, T}});
    if (s.state_slots) c.slots = b.input("state_slots", {DType::i32, {B, 2}});
  } else {
    c.start = b.input("cache_position", {DType::i32, {}});
    // The key mask changes once per generation, not per step: device state, not an input.
    c.mask = b.state("attention_mask", {DType::i32, {B, S}});
  }
  return c;
}

namespace {

// The override for `layer` when the model has some and one takes these inputs in this mode
// (inputs and floats in the layer contract's order, kernels_hub/package.cc), else the built-in
// op. `eligible` is false when the layer uses an option the contract does not carry. The
// contract's activations are float32 (weights, caches and inputs keep their dtypes): in a graph
// of other activations the kernel's activation inputs and its output are converted at its
// boundary, which a backend computing in float32 (the CPU's) makes no-ops.
template <class Builtin>
Value layer_op(Ctx& c, bool eligible, const char* layer, std::vector<Value> inputs,
               const Shape& out, std::vector<float> floats, const std::string& name,
               Builtin builtin) {
  if (c.p.overrides && eligible) {
    GraphBuilder& b = c.b;
    auto activation = [&](Value v) {
      switch (b.op(v)) {
        case graph::Op::kParameter:
        case graph::Op::kState:
        case graph::Op::kInput:
        case graph::Op::kCacheWrite:
        case graph::Op::kPagedCacheWrite:
          return false;
        default:
          return b.type(v).dtype == b.activation();
      }
    };
    std::vector<TensorType> types;
    for (Value v : inputs)
      types.push_back(activation(v) ? TensorType{DType::f32, b.type(v).shape} : b.type(v));
    Mode mode = c.s.new_tokens == 1 ? Mode::kDecode : Mode::kPrefill;
    if (auto call = c.p.overrides->find(layer, mode, types, name)) {
      for (Value& v : inputs)
        if (activation(v)) v = b.convert(v, DType::f32, name + ".to_f32");
      Value y = b.custom_call(std::move(call), std::move(inputs), {DType::f32, out},
                              std::move(floats), name);
      return b.convert(y, b.activation(), name + ".from_f32");
    }
  }
  return builtin();
}

}  // namespace

// ---- Linear ----

void Linear::declare(std::vector<WeightSpec>& w, const std::string& prefix) const {
  w.push_back({prefix + ".weight", {out, in}, WeightRole::kLinear, tp_style});
  if (bias)
    w.push_back({prefix + ".bias", {out}, WeightRole::kBias, "", true, "", prefix + ".weight"});
}

Value linear(Ctx& c, Value x, const std::string& prefix) {
  GraphBuilder& b = c.b;
  Params& p = c.p;
  Value bias = p.has(prefix + ".bias") ? p(prefix + ".bias") : -1;
  // x times this rank's weight (all of it without tensor parallelism), plus `bias`: the float
  // op, or the quantized one for a weight the backend quantized at load.
  auto mul = [&](Value x, Value bias) {
    const Value w = p(prefix + ".weight");
    const graph::LinearQuantAttrs* q = p.quant(prefix + ".weight");
    if (!q) return b.linear(x, w, bias, prefix);
    return b.linear_quant(x, w, p(prefix + ".weight_scale"),
                          q->has_zero ? p(prefix + ".weight_zero") : -1, bias, *q, prefix);
  };
  const distributed::TpModel* tp = p.tp();
  if (!tp) return mul(x, bias);
  // Every rank's shard has the same shape (padded with zeros: distributed/tp_plan.h), so every
  // rank builds this same graph.
  const distributed::WeightShard& w = tp->shard(prefix + ".weight");
  if (w.dim < 0) return mul(x, bias);  // replicated: no communication
  switch (w.style) {
    case TpStyle::kRowwiseSplitInput:
      // A replicated input: this rank multiplies its own columns of it.
      x = b.shard_last(x, w.chunk, tp->group_id(), prefix + ".split_input");
      [[fallthrough]];
    case TpStyle::kRowwise:
      // Partial sums over this rank's input features; the bias is added once, after the sum.
      return b.all_reduce(mul(x, -1), bias, tp->group_id(), prefix + ".all_reduce");
    case TpStyle::kColwiseGatherOutput: {
      const Value all =
          b.all_gather(mul(x, bias), tp->size(), tp->group_id(), prefix + ".all_gather");
      const int64_t n = w.full_shape[0];
      return w.chunk * tp->size() == n ? all : b.slice_last(all, 0, n, prefix + ".unpad");
    }
    default:  // colwise keeps its output sharded
      return mul(x, bias);
  }
}

std::vector<Value> split(Ctx& c, Value y, const std::vector<int64_t>& parts,
                         const std::string& prefix) {
  // Under packed_colwise each part is split over the ranks alike, each rank's piece padded to
  // the same length (distributed/tp_plan.h).
  const distributed::TpModel* tp = c.p.tp();
  const int ranks =
      tp && tp->shard(prefix + ".weight").style == TpStyle::kPackedColwise ? tp->size() : 1;
  const int64_t have = c.b.type(y).shape.back();
  std::vector<Value> out;
  int64_t begin = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const int64_t n = distributed::padded_chunk(parts[i], ranks);
    out.push_back(c.b.slice_last(y, begin, begin + n, prefix + ".part" + std::to_string(i)));
    begin += n;
  }
  TF_CHECK(begin == have, prefix, ": packed output of ", have, " features, parts of ", begin);
  return out;
}

// ---- Norm, rotary, activation ----

void RMSNorm::declare(std::vector<WeightSpec>& w, const std::string& prefix) const {
  if (weighted) w.push_back({prefix + ".weight", {dim}, WeightRole::kNorm});
}

Value RMSNorm::operator()(Ctx& c, Value x, const std::string& prefix) const {
  // Times ones without a weight: exact, and one op for every backend and hub kernel.
  Value w = weighted ? c.p(prefix + ".weight") : c.b.constant(1, {DType::f32, {dim}}, prefix);
  return layer_op(c, !unit_offset, "RMSNorm", {x, w}, c.b.type(x).shape, {eps}, prefix,
                  [&] { return c.b.rms_norm(x, w, eps, {.unit_offset = unit_offset}, prefix); });
}

Value Rotary::operator()(Ctx& c, Value x, const std::string& name) const {
  const int64_t D = c.b.type(x).shape.back();
  const bool plain = rope.rotary_dim == D && !rope.interleaved;
  return layer_op(
      c, plain, "RotaryEmbedding", {x, c.pos}, c.b.type(x).shape, rope.inv_freq, name, [&] {
        return c.b.rope(x, c.pos, rope.inv_freq,
                        {.rotary_dim = rope.rotary_dim, .interleaved = rope.interleaved}, name);
      });
}

Activation parse_activation(const std::string& name, const std::string& where) {
  if (name == "silu" || name == "swish") return Activation::kSilu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new") return Activation::kGeluTanh;
  throw UnsupportedError(where + ": hidden_act '" + name +
                         "' is not supported; supported: silu, gelu_pytorch_tanh");
}

Value activation_mul(Ctx& c, Activation act, Value gate, Value up, const std::string& name) {
  return layer_op(c, act == Activation::kSilu, "SiLUAndMul", {gate, up}, c.b.type(gate).shape, {},
                  name, [&] {
                    return act == Activation::kSilu ? c.b.silu_mul(gate, up, name)
                                                    : c.b.gelu_tanh_mul(gate, up, name);
                  });
}

// ---- Attention ----

void Attention::declare(std::vector<WeightSpec>& w, const std::string& prefix) const {
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  if (packed_qkv) {
    Linear{hidden, q + 2 * kv, qkv_bias, ""}.declare(w, prefix + ".qkv_proj");
  } else {
    Linear{hidden, output_gate ? 2 * q : q, qkv_bias, "colwise"}.declare(w, prefix + ".q_proj");
    if (kv_source < 0) Linear{hidden, kv, qkv_bias, "colwise"}.declare(w, prefix + ".k_proj");
    if (kv_source < 0 && !k_eq_v)
      Linear{hidden, kv, qkv_bias, "colwise"}.declare(w, prefix + ".v_proj");
  }
  Linear{q, hidden, o_bias, packed_qkv ? "" : "rowwise"}.declare(w, prefix + ".o_proj");
  if (qk_norm) {
    qk_norm->declare(w, prefix + ".q_norm");
    if (kv_source < 0) qk_norm->declare(w, prefix + ".k_norm");
  }
  if (v_norm && kv_source < 0) v_norm->declare(w, prefix + ".v_norm");
  // Whole on every rank; a rank that holds some of the heads takes their sinks (operator()).
  if (sinks) w.push_back({prefix + ".sinks", {heads}, WeightRole::kNorm});
}

std::pair<Value, Value> Attention::keys_values(Ctx& c, Value k, Value v,
                                               const std::string& prefix) const {
  GraphBuilder& b = c.b;
  const int64_t B = c.s.batch, T = c.s.new_tokens, D = head_dim;
  // A rank of a tensor-parallel model holds only its heads.
  const int64_t Hkv = b.type(k).shape.back() / D;
  k = b.reshape(k, {B, T, Hkv, D});
  v = b.reshape(v, {B, T, Hkv, D});
  if (qk_norm) k = (*qk_norm)(c, k, prefix + ".k_norm");
  if (v_norm) v = (*v_norm)(c, v, prefix + ".v_norm");
  return {rotary(c, k, prefix + ".rope_k"), v};
}

std::pair<Value, Value> Attention::caches(Ctx& c, Value k_proj, Value v_proj,
                                          const std::string& prefix, int64_t layer) const {
  if (kv_source >= 0) {
    const auto it = c.kv.find(kv_source);
    TF_CHECK(it != c.kv.end(), prefix, " reads layer ", kv_source, "'s cache, written after it");
    return it->second;
  }
  GraphBuilder& b = c.b;
  const auto [k, v] = keys_values(c, k_proj, v_proj, prefix);
  const Shape ks = b.type(k).shape;  // (B,T,Hkv,D)
  std::pair<Value, Value> out;
  if (c.s.paged()) {
    const std::string pool = "kv_pool." + std::to_string(layer);
    const TensorType pt = graph::kv_cache_type(b.kv_layout(), c.cache_dtype, c.s.kv_blocks, ks[2],
                                               c.s.block_size, ks[3]);
    out = {
        b.paged_cache_write(b.state(pool + ".key", pt), k, c.table, c.pos, pool + ".key", c.rows),
        b.paged_cache_write(b.state(pool + ".value", pt), v, c.table, c.pos, pool + ".value",
                            c.rows)};
  } else {
    const std::string cache = "past_key_values." + std::to_string(layer);
    const TensorType ct =
        graph::kv_cache_type(b.kv_layout(), c.cache_dtype, ks[0], ks[2], c.s.cache_len, ks[3]);
    out = {b.cache_write(b.state(cache + ".key", ct), k, c.start, cache + ".key"),
           b.cache_write(b.state(cache + ".value", ct), v, c.start, cache + ".value")};
  }
  return c.kv[layer] = out;
}

Value Attention::operator()(Ctx& c, Value x, const std::string& prefix, int64_t layer) const {
  GraphBuilder& b = c.b;
  const int64_t B = c.s.batch, T = c.s.new_tokens, D = head_dim;
  Value q, k = -1, v = -1;
  if (packed_qkv) {
    const int64_t nq = heads * D, nkv = kv_heads * D;
    auto parts = split(c, linear(c, x, prefix + ".qkv_proj"), {nq, nkv, nkv}, prefix + ".qkv_proj");
    q = parts[0], k = parts[1], v = parts[2];
  } else {
    q = linear(c, x, prefix + ".q_proj");
    if (kv_source < 0) {
      k = linear(c, x, prefix + ".k_proj");
      v = k_eq_v ? k : linear(c, x, prefix + ".v_proj");
    }
  }
  // Head counts follow the projections' outputs: a rank of a tensor-parallel model holds only
  // its heads.
  const int64_t Hq = b.type(q).shape.back() / (output_gate ? 2 * D : D);
  Value gate = -1;
  if (output_gate) {
    const Value per_head = b.reshape(q, {B, T, Hq, 2 * D});
    gate = b.reshape(b.slice_last(per_head, D, 2 * D, prefix + ".gate"), {B, T, Hq * D});
    q = b.slice_last(per_head, 0, D, prefix + ".query");
  }
  q = b.reshape(q, {B, T, Hq, D});
  if (qk_norm) q = (*qk_norm)(c, q, prefix + ".q_norm");
  q = rotary(c, q, prefix + ".rope_q");
  // Named values, not a structured binding: the hub-kernel lambda below captures them.
  Value kc, vc;
  std::tie(kc, vc) = caches(c, k, v, prefix, layer);
  // yarn scales cos and sin by attention_factor, so q.k grows by its square.
  const float f = rotary.rope.attention_factor;
  const float s = (scale > 0 ? scale : float(1.0 / std::sqrt(double(D)))) * f * f;
  graph::AttentionOptions options{.sliding_window = sliding_window, .softcap = softcap};
  if (sinks) {
    options.sinks = c.p(prefix + ".sinks");
    if (Hq != heads) options.sinks = b.shard_last(options.sinks, Hq, c.p.tp()->group_id());
  }
  const std::string name = prefix + ".attention";
  Value att;
  if (c.s.paged()) {
    // Hub kernels take a static cache (their layer contract), so paged steps use the built-in
    // op.
    att = b.paged_attention(q, kc, vc, c.table, c.pos, s, options, name, c.rows);
  } else {
    // Hub kernels' attention contract takes head-major caches.
    const bool plain = sliding_window == 0 && softcap == 0 && !sinks &&
                       b.kv_layout() == graph::KvLayout::kHeadMajor;
    att = layer_op(c, plain, "Attention", {q, kc, vc, c.start, c.mask}, b.type(q).shape, {s}, name,
                   [&] { return b.attention(q, kc, vc, c.start, c.mask, s, options, name); });
  }
  // att (B,T,Hq,D)
  att = b.reshape(att, {B, T, Hq * D});
  if (output_gate)
    att = b.binary(graph::BinaryFn::kMul, att, b.unary(graph::UnaryFn::kSigmoid, gate),
                   prefix + ".gated");
  return linear(c, att, prefix + ".o_proj");
}

LayerState Attention::cache(const distributed::TpModel* tp, const std::string& prefix) const {
  if (kv_source >= 0) return {.kind = LayerState::Kind::kShared};
  const std::string k = prefix + (packed_qkv ? ".qkv_proj.weight" : ".k_proj.weight");
  const bool split = tp && tp->size() > 1 && tp->shard(k).style == TpStyle::kColwise;
  return {.kv_heads = split ? kv_heads / tp->size() : kv_heads, .head_dim = head_dim};
}

// ---- MLP ----

void GatedMLP::declare(std::vector<WeightSpec>& w, const std::string& prefix) const {
  if (fused_gate_up) {
    Linear{hidden, 2 * intermediate, bias, "packed_colwise"}.declare(w, prefix + ".gate_up_proj");
  } else {
    Linear{hidden, intermediate, bias, "colwise"}.declare(w, prefix + ".gate_proj");
    Linear{hidden, intermediate, bias, "colwise"}.declare(w, prefix + ".up_proj");
  }
  Linear{intermediate, hidden, bias, "rowwise"}.declare(w, prefix + ".down_proj");
}

Value GatedMLP::operator()(Ctx& c, Value x, const std::string& prefix) const {
  Value gate, up;
  if (fused_gate_up) {
    auto parts = split(c, linear(c, x, prefix + ".gate_up_proj"), {intermediate, intermediate},
                       prefix + ".gate_up_proj");
    gate = parts[0], up = parts[1];
  } else {
    gate = linear(c, x, prefix + ".gate_proj");
    up = linear(c, x, prefix + ".up_proj");
  }
  return linear(c, activation_mul(c, act, gate, up, prefix + ".act"), prefix + ".down_proj");
}

// ---- Mixture of experts ----

void SparseMoE::declare(std::vector<WeightSpec>& w, const std::string& prefix) const {
  const std::string hub =
      hub_module.empty() ? prefix : prefix.substr(0, prefix.rfind('.') + 1) + hub_module;
  const std::string gate = scorer(prefix);
  WeightSpec scores{gate + ".weight", {experts, hidden}, WeightRole::kRouter};
  if (hub != prefix) scores.stacked_from = {hub + "." + router + ".weight"};
  w.push_back(std::move(scores));
  if (scaled_router) {
    w.push_back({prefix + "." + router + ".scale", {hidden}, WeightRole::kRouter});
    w.push_back({prefix + "." + router + ".per_expert_scale", {experts}, WeightRole::kRouter});
  }
  if (router_bias) w.push_back({gate + ".bias", {experts}, WeightRole::kRouter});
  if (score_bias) w.push_back({gate + ".e_score_correction_bias", {experts}, WeightRole::kRouter});
  // Under tensor parallelism the experts are split over the ranks (expert parallelism).
  WeightSpec gate_up{prefix + ".experts.gate_up_proj",
                     {experts, 2 * intermediate, hidden},
                     WeightRole::kExperts,
                     "grouped_gemm"};
  WeightSpec down{prefix + ".experts.down_proj",
                  {experts, hidden, intermediate},
                  WeightRole::kExperts,
                  "grouped_gemm"};
  if (gpt_oss_layout) {
    gate_up.stored = {.transposed = true, .interleaved = true, .mxfp4 = true};
    down.stored = {.transposed = true, .mxfp4 = true};
  }
  for (int64_t e = 0; e < experts && !gpt_oss_layout; ++e) {
    const std::string expert = hub + ".experts." + std::to_string(e);
    gate_up.stacked_from.push_back(expert + "." + gate_proj + ".weight");
    gate_up.stacked_from.push_back(expert + "." + up_proj + ".weight");
    down.stacked_from.push_back(expert + "." + down_proj + ".weight");
  }
  gate_up.read_share = down.read_share = double(top_k) / double(experts);
  w.push_back(std::move(gate_up));
  w.push_back(std::move(down));
  if (expert_bias) {
    // Split over the ranks with their experts.
    w.push_back({.name = prefix + ".experts.gate_up_proj_bias",
                 .shape = {experts, 2 * intermediate},
                 .role = WeightRole::kExpertBias,
                 .tp_style = "grouped_gemm",
                 .stored = {.interleaved = gpt_oss_layout}});
    w.push_back({prefix + ".experts.down_proj_bias",
                 {experts, hidden},
                 WeightRole::kExpertBias,
                 "grouped_gemm"});
  }
  if (shared) shared->declare(w, prefix + "." + shared_name);
  if (shared_gate) Linear{hidden, 1}.declare(w, prefix + ".shared_expert_gate");
}

Value SparseMoE::keep_top_groups(Ctx& c, Value choice, const std::string& prefix) const {
  GraphBuilder& b = c.b;
  const Shape cs = b.type(choice).shape;  // (B,T,E)
  const int64_t B = cs[0], T = cs[1], per = experts / groups;
  // A group scores the sum of its two best choices.
  const Value grouped = b.reshape(choice, {B, T, groups, per});
  const Value best2 = b.take_along(grouped, b.top_k(grouped, 2, prefix + ".group_top2"));
  const Value score = b.reshape(b.reduce(graph::ReduceFn::kSum, best2, 3), {B, T, groups});
  const Value kept = b.top_k(score, topk_groups, prefix + ".group_top_k");  // (B,T,topk_groups)
  // 1 for a kept group, else 0; then 0 or -1e30 added to each of its experts' choices.
  const Value mask = b.scatter_add(b.constant(0, {DType::f32, {B, T, groups}}), kept,
                                   b.constant(1, {DType::f32, {B, T, topk_groups}}));
  const Value penalty = b.binary(
      graph::BinaryFn::kMul, b.binary(graph::BinaryFn::kSub, mask, b.constant(1, {DType::f32, {}})),
      b.constant(1e30, {DType::f32, {}}), prefix + ".group_mask");
  return b.reshape(b.binary(graph::BinaryFn::kAdd, grouped, b.reshape(penalty, {B, T, groups, 1})),
                   cs);
}

Value SparseMoE::scaled_router_input(Ctx& c, Value x, const std::string& prefix) const {
  GraphBuilder& b = c.b;
  const std::string name = prefix + "." + router;
  const Value normed = RMSNorm{hidden, router_eps, false, false}(c, x, name + ".norm");
  return b.scale(b.binary(graph::BinaryFn::kMul, normed, c.p(name + ".scale")),
                 float(1.0 / std::sqrt(double(hidden))), name + ".scaled");
}

std::pair<Value, Value> SparseMoE::route(Ctx& c, Value x, const std::string& prefix) const {
  GraphBuilder& b = c.b;
  const std::string gate = scorer(prefix);
  if (scaled_router) x = scaled_router_input(c, x, prefix);
  const Value logits = linear(c, x, gate);  // (B,T,E)
  if (scoring == Scoring::kTopKSoftmax) {
    const Value idx = b.top_k(logits, top_k, gate + ".top_k");
    return {idx, b.softmax(b.take_along(logits, idx), gate + ".softmax")};
  }
  Value scores, choice;
  if (scoring == Scoring::kSoftmax) {
    scores = choice = b.softmax(logits, gate + ".softmax");
  } else {
    // GLM-4.5 routes in float32; the bias moves which experts are chosen, not their weights.
    scores = choice =
        b.unary(graph::UnaryFn::kSigmoid, b.convert(logits, DType::f32), gate + ".sigmoid");
    if (score_bias)
      choice = b.binary(graph::BinaryFn::kAdd, scores, c.p(gate + ".e_score_correction_bias"),
                        gate + ".choice");
    if (groups > 1) choice = keep_top_groups(c, choice, gate);
  }
  const Value idx = b.top_k(choice, top_k, gate + ".top_k");  // (B,T,k)
  Value weights = b.take_along(scores, idx, gate + ".weights");
  if (norm_topk_prob)
    weights = b.binary(graph::BinaryFn::kDiv, weights, b.reduce(graph::ReduceFn::kSum, weights, 2),
                       gate + ".norm");
  if (scaling != 1) weights = b.scale(weights, scaling, gate + ".scaling");
  if (scaled_router) {
    const Value per_expert = c.p(prefix + "." + router + ".per_expert_scale");
    const Shape ls = b.type(logits).shape;
    weights = b.binary(graph::BinaryFn::kMul, weights,
                       b.take_along(b.broadcast(per_expert, ls), idx), gate + ".per_expert_scale");
  }
  return {idx, weights};
}

namespace {

// x through the experts `name` at idx (this rank's share of them with group >= 0), plus their
// biases "<name>_bias" when declared: the float op, or the quantized one for experts the backend
// quantized at load.
Value experts_linear(Ctx& c, Value x, const std::string& name, Value idx, int group) {
  const Value bias = c.p.has(name + "_bias") ? c.p(name + "_bias") : -1;
  const graph::LinearQuantAttrs* q = c.p.quant(name);
  if (!q) return c.b.linear_id(x, c.p(name), idx, name, group, bias);
  return c.b.linear_id_quant(x, c.p(name), idx, c.p(name + "_scale"),
                             q->has_zero ? c.p(name + "_zero") : -1, *q, name, group, bias);
}

}  // namespace

Value SparseMoE::activation(Ctx& c, Value gate_up, const std::string& prefix) const {
  GraphBuilder& b = c.b;
  const std::string name = prefix + ".experts.act";
  const Value gate = b.slice_last(gate_up, 0, intermediate);
  const Value up = b.slice_last(gate_up, intermediate, 2 * intermediate);
  if (!clamped)
    return act == Activation::kSilu ? b.silu_mul(gate, up, name) : b.gelu_tanh_mul(gate, up, name);
  using graph::BinaryFn;
  auto constant = [&](float v) { return b.constant(v, {b.activation(), {}}); };
  const Value g = b.binary(BinaryFn::kMin, gate, constant(clamped->limit), name + ".gate");
  const Value u = b.binary(BinaryFn::kMax, b.binary(BinaryFn::kMin, up, constant(clamped->limit)),
                           constant(-clamped->limit), name + ".up");
  const Value glu =
      b.binary(BinaryFn::kMul, g, b.unary(graph::UnaryFn::kSigmoid, b.scale(g, clamped->alpha)),
               name + ".glu");
  return b.binary(BinaryFn::kMul, b.binary(BinaryFn::kAdd, u, constant(1)), glu, name);
}

Value SparseMoE::operator()(Ctx& c, Value x, const std::string& prefix, Value route_x) const {
  GraphBuilder& b = c.b;
  const Shape xs = b.type(x).shape;  // (B,T,H)
  const auto [idx, weights] = route(c, route_x >= 0 ? route_x : x, prefix);
  // Expert parallelism: each rank runs its own experts (the others' give zero rows) and the
  // ranks' sums are added.
  const distributed::TpModel* tp = c.p.tp();
  const bool split = tp && tp->size() > 1 &&
                     tp->shard(prefix + ".experts.gate_up_proj").style == TpStyle::kGroupedGemm;
  const int group = split ? tp->group_id() : -1;
  // Each token's k experts: (B,T,k,2I) -> (B,T,k,I) -> (B,T,k,H).
  const Value gate_up = experts_linear(c, x, prefix + ".experts.gate_up_proj", idx, group);
  const Value y =
      experts_linear(c, activation(c, gate_up, prefix), prefix + ".experts.down_proj", idx, group);
  const Value weighted =
      b.binary(graph::BinaryFn::kMul, y, b.reshape(weights, {xs[0], xs[1], top_k, 1}),
               prefix + ".experts.weighted");
  Value out = b.reshape(b.reduce(graph::ReduceFn::kSum, weighted, 2, prefix + ".experts.sum"), xs);
  if (split) out = b.all_reduce(out, -1, group, prefix + ".experts.all_reduce");
  if (shared) {
    const std::string name = prefix + "." + shared_name;
    Value y = (*shared)(c, x, name);
    if (shared_gate)
      y = b.binary(graph::BinaryFn::kMul, y,
                   b.unary(graph::UnaryFn::kSigmoid, linear(c, x, prefix + ".shared_expert_gate")),
                   name + ".gated");
    out = b.add(out, y, name + ".add");
  }
  return out;
}

// ---- Embedding and the stack ----

void Embedding::declare(std::vector<WeightSpec>& w, const std::string& prefix) const {
  w.push_back({prefix + ".weight", {vocab, hidden}, WeightRole::kEmbedding, "embedding_rowwise"});
}

Value Embedding::operator()(Ctx& c, const std::string& prefix) const {
  GraphBuilder& b = c.b;
  const std::string w = prefix + ".weight";
  const distributed::TpModel* tp = c.p.tp();
  Value h;
  if (!tp || tp->shard(w).style != TpStyle::kEmbeddingRowwise || tp->size() == 1) {
    h = b.embedding(c.p(w), c.ids, prefix);
  } else {
    // Split over the vocabulary: ids outside this rank's rows give zeros, summed over ranks.
    const distributed::WeightShard& s = tp->shard(w);
    Value part = b.embedding_shard(c.p(w), c.ids, s.full_shape[0], tp->group_id(), prefix);
    h = b.all_reduce(part, -1, tp->group_id(), prefix + ".all_reduce");
  }
  if (scale == 0) return h;
  // Transformers multiplies by the scale cast to the table's dtype: sqrt(1152) = 33.94 becomes
  // 34 for a bf16 Gemma 3 1B, and the activations follow that rounded value.
  float s = scale;
  const DType t = b.type(c.p(w)).dtype;
  if (t == DType::bf16) s = bf16_to_f32(f32_to_bf16(scale));
  if (t == DType::f16) s = f16_to_f32(f32_to_f16(scale));
  return b.scale(h, s, prefix + ".scale");
}

void PerLayerEmbedding::declare(std::vector<WeightSpec>& w, const std::string& base) const {
  if (dim == 0) return;
  Embedding{vocab, layers * dim}.declare(w, base + ".embed_tokens_per_layer");
  Linear{hidden, layers * dim}.declare(w, base + ".per_layer_model_projection");
  RMSNorm{dim, eps}.declare(w, base + ".per_layer_projection_norm");
}

Value PerLayerEmbedding::operator()(Ctx& c, Value embedded, const std::string& base) const {
  GraphBuilder& b = c.b;
  const Shape es = b.type(embedded).shape;  // (B,T,H)
  const Shape all{es[0], es[1], layers * dim}, per_layer{es[0], es[1], layers, dim};
  const Value tokens = Embedding{vocab, layers * dim, float(std::sqrt(double(dim)))}(
      c, base + ".embed_tokens_per_layer");
  const std::string proj = base + ".per_layer_model_projection";
  const Value projected =
      b.scale(linear(c, embedded, proj), float(1.0 / std::sqrt(double(hidden))), proj + ".scale");
  const Value normed = b.reshape(
      RMSNorm{dim, eps}(c, b.reshape(projected, per_layer), base + ".per_layer_projection_norm"),
      all);
  return b.scale(b.add(normed, tokens, base + ".per_layer_inputs"), float(1.0 / std::sqrt(2.0)),
                 base + ".per_layer_inputs.scale");
}

void DecoderBlock::declare(std::vector<WeightSpec>& w, const std::string& prefix) const {
  const std::string n = prefix + ".";
  for (const std::string* name : {&pre_attn, &post_attn, &pre_mlp, &post_mlp})
    if (!name->empty()) norm.declare(w, n + *name);
  if (linear_attn)
    linear_attn->declare(w, n + "linear_attn");
  else
    attn.declare(w, n + "self_attn");
  if (moe)
    moe->declare(w, n + "mlp");
  else
    mlp.declare(w, n + "mlp");
  if (moe_beside) {
    moe_beside->declare(w, prefix);
    for (const char* name : {"pre_feedforward_layernorm_2", "post_feedforward_layernorm_1",
                             "post_feedforward_layernorm_2"})
      norm.declare(w, n + name);
  }
  if (per_layer_input) {
    Linear{norm.dim, per_layer_input}.declare(w, n + "per_layer_input_gate");
    Linear{per_layer_input, norm.dim}.declare(w, n + "per_layer_projection");
    norm.declare(w, n + "post_per_layer_input_norm");
  }
  if (layer_scalar) w.push_back({n + "layer_scalar", {1}, WeightRole::kNorm});
}

Value DecoderBlock::feed_forward(Ctx& c, Value h, const std::string& prefix) const {
  const std::string n = prefix + ".";
  const Value x = norm(c, h, n + pre_mlp);
  Value y = moe ? (*moe)(c, x, n + "mlp") : mlp(c, x, n + "mlp");
  if (moe_beside) {
    const Value experts =
        (*moe_beside)(c, norm(c, h, n + "pre_feedforward_layernorm_2"), prefix, h);
    y = c.b.add(norm(c, y, n + "post_feedforward_layernorm_1"),
                norm(c, experts, n + "post_feedforward_layernorm_2"), n + "mlp_and_experts");
  }
  return post_mlp.empty() ? y : norm(c, y, n + post_mlp);
}

Value DecoderBlock::add_per_layer_input(Ctx& c, Value h, Value input,
                                        const std::string& prefix) const {
  const std::string n = prefix + ".";
  const Value gated = activation_mul(c, per_layer_act, linear(c, h, n + "per_layer_input_gate"),
                                     input, n + "per_layer_input");
  const Value y =
      norm(c, linear(c, gated, n + "per_layer_projection"), n + "post_per_layer_input_norm");
  return c.b.add(h, y, n + "residual_per_layer");
}

Value DecoderBlock::operator()(Ctx& c, Value h, Value per_layer, const std::string& prefix,
                               int64_t layer) const {
  GraphBuilder& b = c.b;
  const std::string n = prefix + ".";
  const Value x = norm(c, h, n + pre_attn);
  Value y = linear_attn ? (*linear_attn)(c, x, n + "linear_attn", layer)
                        : attn(c, x, n + "self_attn", layer);
  if (!post_attn.empty()) y = norm(c, y, n + post_attn);
  h = b.add(h, y, n + "residual_attn");
  h = b.add(h, feed_forward(c, h, prefix), n + "residual_mlp");
  if (per_layer_input) h = add_per_layer_input(c, h, per_layer, prefix);
  if (layer_scalar)
    h = b.binary(graph::BinaryFn::kMul, h, c.p(n + "layer_scalar"), n + "layer_scalar");
  return h;
}

std::vector<WeightSpec> DecoderModel::weights() const {
  std::vector<WeightSpec> w;
  embed.declare(w, base + ".embed_tokens");
  per_layer.declare(w, base);
  for (size_t l = 0; l < blocks.size(); ++l)
    blocks[l].declare(w, base + ".layers." + std::to_string(l));
  norm.declare(w, base + ".norm");
  WeightSpec head{
      "lm_head.weight", {embed.vocab, embed.hidden}, WeightRole::kLinear, "colwise_gather_output"};
  if (tie_word_embeddings) {
    head.required = false;
    head.tied_to = base + ".embed_tokens.weight";
  }
  w.push_back(head);
  return w;
}

std::vector<LayerState> DecoderModel::states(const distributed::TpModel* tp) const {
  std::vector<LayerState> out;
  for (size_t l = 0; l < blocks.size(); ++l)
    out.push_back(
        blocks[l].linear_attn
            ? blocks[l].linear_attn->state()
            : blocks[l].attn.cache(tp, base + ".layers." + std::to_string(l) + ".self_attn"));
  return out;
}

void DecoderModel::build(GraphBuilder& b, Params& p, const StepShape& s, DType cache_dtype) const {
  Ctx c = begin_step(b, p, s, cache_dtype);
  Value h = embed(c, base + ".embed_tokens");  // (B,T,H)
  const Value per_layer_inputs = per_layer.dim ? per_layer(c, h, base) : -1;
  for (size_t l = 0; l < blocks.size(); ++l) {
    const int64_t dim = per_layer.dim;
    const Value input =
        dim ? b.slice_last(per_layer_inputs, int64_t(l) * dim, int64_t(l + 1) * dim) : -1;
    h = blocks[l](c, h, input, base + ".layers." + std::to_string(l), int64_t(l));
  }
  // Only the kept positions go through the final norm and lm_head: (B,keep,H). A packed step
  // keeps its row's last `sequences` positions, where its sequences' last tokens lie (model
  // runner), as (sequences,1,H): the lm_head then sees one token per sequence, as in a step of
  // one sequence per row, and gives each the same bits.
  if (s.sequences) {
    h = b.reshape(b.take_last(h, s.sequences), {s.sequences, 1, b.type(h).shape[2]});
  } else if (s.logits_to_keep > 0 && s.logits_to_keep < s.new_tokens) {
    h = b.take_last(h, s.logits_to_keep);
  }
  h = norm(c, h, base + ".norm");
  // A tied lm_head is bound to embed_tokens' buffer (or its own slice of it when the plan splits
  // the two differently).
  Value logits = linear(c, h, "lm_head");
  if (final_softcap != 0) logits = b.softcap(logits, final_softcap, "final_logit_softcapping");
  // Logits leave every graph in float32, as Transformers' generate() upcasts them before the
  // logits processors: sampling and log-probabilities never see bf16 rounding ties of their own.
  b.output(b.convert(logits, DType::f32, "logits"));
}

DecoderModel llama_model(const DecoderConfig& c) {
  DecoderModel m;
  m.embed = {c.vocab_size, c.hidden_size};
  m.norm = {c.hidden_size, float(c.rms_norm_eps)};
  m.tie_word_embeddings = c.tie_word_embeddings;
  DecoderBlock blk;
  blk.norm = m.norm;
  blk.attn = {.hidden = c.hidden_size,
              .heads = c.num_attention_heads,
              .kv_heads = c.num_key_value_heads,
              .head_dim = c.head_dim,
              .rotary = {c.rope}};
  blk.mlp = {.hidden = c.hidden_size, .intermediate = c.intermediate_size};
  m.blocks.assign(size_t(c.num_hidden_layers), blk);
  return m;
}

}  // namespace tformers::models
