#include "models/layers.h"

#include <cmath>
#include <numbers>

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
  w.push_back({prefix + ".weight", {dim}, WeightRole::kNorm});
}

Value RMSNorm::operator()(Ctx& c, Value x, const std::string& prefix) const {
  Value w = c.p(prefix + ".weight");
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

// ---- Attention ----

void Attention::declare(std::vector<WeightSpec>& w, const std::string& prefix) const {
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  if (packed_qkv) {
    Linear{hidden, q + 2 * kv, qkv_bias, ""}.declare(w, prefix + ".qkv_proj");
  } else {
    Linear{hidden, output_gate ? 2 * q : q, qkv_bias, "colwise"}.declare(w, prefix + ".q_proj");
    Linear{hidden, kv, qkv_bias, "colwise"}.declare(w, prefix + ".k_proj");
    Linear{hidden, kv, qkv_bias, "colwise"}.declare(w, prefix + ".v_proj");
  }
  Linear{q, hidden, o_bias, packed_qkv ? "" : "rowwise"}.declare(w, prefix + ".o_proj");
  if (qk_norm) {
    qk_norm->declare(w, prefix + ".q_norm");
    qk_norm->declare(w, prefix + ".k_norm");
  }
  // Whole on every rank; a rank that holds some of the heads takes their sinks (operator()).
  if (sinks) w.push_back({prefix + ".sinks", {heads}, WeightRole::kNorm});
}

Value Attention::operator()(Ctx& c, Value x, const std::string& prefix, int64_t layer) const {
  GraphBuilder& b = c.b;
  const int64_t B = c.s.batch, T = c.s.new_tokens, S = c.s.cache_len, D = head_dim;
  Value q, k, v;
  if (packed_qkv) {
    const int64_t nq = heads * D, nkv = kv_heads * D;
    Value qkv = linear(c, x, prefix + ".qkv_proj");
    auto parts = split(c, qkv, {nq, nkv, nkv}, prefix + ".qkv_proj");
    q = parts[0], k = parts[1], v = parts[2];
  } else {
    q = linear(c, x, prefix + ".q_proj");
    k = linear(c, x, prefix + ".k_proj");
    v = linear(c, x, prefix + ".v_proj");
  }
  // Head counts follow the projections' outputs: a rank of a tensor-parallel model holds only
  // its heads.
  const int64_t Hq = b.type(q).shape.back() / (output_gate ? 2 * D : D),
                Hkv = b.type(k).shape.back() / D;
  Value gate = -1;
  if (output_gate) {
    const Value per_head = b.reshape(q, {B, T, Hq, 2 * D});
    gate = b.reshape(b.slice_last(per_head, D, 2 * D, prefix + ".gate"), {B, T, Hq * D});
    q = b.slice_last(per_head, 0, D, prefix + ".query");
  }
  q = b.reshape(q, {B, T, Hq, D});
  k = b.reshape(k, {B, T, Hkv, D});
  v = b.reshape(v, {B, T, Hkv, D});
  if (qk_norm) {
    q = (*qk_norm)(c, q, prefix + ".q_norm");
    k = (*qk_norm)(c, k, prefix + ".k_norm");
  }
  q = rotary(c, q, prefix + ".rope_q");
  k = rotary(c, k, prefix + ".rope_k");
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
    const std::string pool = "kv_pool." + std::to_string(layer);
    const TensorType pt =
        graph::kv_cache_type(b.kv_layout(), c.cache_dtype, c.s.kv_blocks, Hkv, c.s.block_size, D);
    Value kc =
        b.paged_cache_write(b.state(pool + ".key", pt), k, c.table, c.pos, pool + ".key", c.rows);
    Value vc = b.paged_cache_write(b.state(pool + ".value", pt), v, c.table, c.pos, pool + ".value",
                                   c.rows);
    att = b.paged_attention(q, kc, vc, c.table, c.pos, s, options, name, c.rows);
  } else {
    const std::string cache = "past_key_values." + std::to_string(layer);
    const TensorType ct = graph::kv_cache_type(b.kv_layout(), c.cache_dtype, B, Hkv, S, D);
    Value kc = b.cache_write(b.state(cache + ".key", ct), k, c.start, cache + ".key");
    Value vc = b.cache_write(b.state(cache + ".value", ct), v, c.start, cache + ".value");
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
  const std::string name = prefix + ".act";
  Value act = layer_op(c, this->act == Activation::kSilu, "SiLUAndMul", {gate, up},
                       c.b.type(gate).shape, {}, name, [&] {
                         return this->act == Activation::kSilu ? c.b.silu_mul(gate, up, name)
                                                               : c.b.gelu_tanh_mul(gate, up, name);
                       });
  return linear(c, act, prefix + ".down_proj");
}

// ---- Mixture of experts ----

void SparseMoE::declare(std::vector<WeightSpec>& w, const std::string& prefix) const {
  const std::string hub =
      hub_module.empty() ? prefix : prefix.substr(0, prefix.rfind('.') + 1) + hub_module;
  const std::string gate = prefix + "." + router;
  WeightSpec scorer{gate + ".weight", {experts, hidden}, WeightRole::kRouter};
  if (hub != prefix) scorer.stacked_from = {hub + "." + router + ".weight"};
  w.push_back(std::move(scorer));
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

std::pair<Value, Value> SparseMoE::route(Ctx& c, Value x, const std::string& prefix) const {
  GraphBuilder& b = c.b;
  const std::string gate = prefix + "." + router;
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
  if (!clamped) return b.silu_mul(gate, up, name);
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

Value SparseMoE::operator()(Ctx& c, Value x, const std::string& prefix) const {
  GraphBuilder& b = c.b;
  const Shape xs = b.type(x).shape;  // (B,T,H)
  const auto [idx, weights] = route(c, x, prefix);
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

std::vector<WeightSpec> DecoderModel::weights() const {
  std::vector<WeightSpec> w;
  embed.declare(w, base + ".embed_tokens");
  for (size_t l = 0; l < blocks.size(); ++l) {
    const DecoderBlock& blk = blocks[l];
    const std::string n = base + ".layers." + std::to_string(l) + ".";
    for (const std::string* norm : {&blk.pre_attn, &blk.post_attn, &blk.pre_mlp, &blk.post_mlp})
      if (!norm->empty()) blk.norm.declare(w, n + *norm);
    if (blk.linear_attn)
      blk.linear_attn->declare(w, n + "linear_attn");
    else
      blk.attn.declare(w, n + "self_attn");
    if (blk.moe)
      blk.moe->declare(w, n + "mlp");
    else
      blk.mlp.declare(w, n + "mlp");
  }
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
  for (size_t l = 0; l < blocks.size(); ++l) {
    const DecoderBlock& blk = blocks[l];
    const std::string n = base + ".layers." + std::to_string(l) + ".";
    auto sublayer = [&](const std::string& pre, const std::string& post, auto&& body,
                        const std::string& residual) {
      Value y = body(blk.norm(c, h, n + pre));
      if (!post.empty()) y = blk.norm(c, y, n + post);
      h = b.add(h, y, n + residual);
    };
    sublayer(
        blk.pre_attn, blk.post_attn,
        [&](Value x) {
          return blk.linear_attn ? (*blk.linear_attn)(c, x, n + "linear_attn", int64_t(l))
                                 : blk.attn(c, x, n + "self_attn", int64_t(l));
        },
        "residual_attn");
    sublayer(
        blk.pre_mlp, blk.post_mlp,
        [&](Value x) {
          const std::string mlp = n + "mlp";
          return blk.moe ? (*blk.moe)(c, x, mlp) : blk.mlp(c, x, mlp);
        },
        "residual_mlp");
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
