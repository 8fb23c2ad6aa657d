// The layer library the architecture files compose, in the spirit of candle's model files and
// llama.cpp's graph builders. Each layer is a small value describing its options; it declares
// its weights (with roles and default tensor-parallel styles) under a checkpoint prefix
// ("model.layers.3.self_attn") and builds its part of a step's graph under the same prefix, so
// declarations and graph never disagree and names match Transformers. Every layer goes through
// tensor parallelism (the weight's resolved style decides the collectives) and through layer
// overrides (hub kernels) where one can take its inputs.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "models/architecture.h"

namespace tformers::models {

using graph::Value;

// ---- Config ----

// RoPE as config.json describes it, resolved once: the rotated features per head, their
// inverse frequencies after rope_scaling, the pairing, and the attention factor (yarn, longrope).
struct RopeConfig {
  std::vector<float> inv_freq;  // rotary_dim / 2 entries
  int64_t rotary_dim = 0;       // features rotated per head (partial_rotary_factor * head_dim)
  bool interleaved = false;     // pairs (2i, 2i+1) as GLM; else rotate-half (i, i + rotary_dim/2)
  float attention_factor = 1;   // yarn, longrope: cos and sin are scaled by this
};

// rope_theta (or `theta`), partial_rotary_factor and rope_scaling (default, linear, dynamic,
// llama3, yarn, longrope, proportional) of a config.json; UnsupportedError for other types.
RopeConfig read_rope(const io::Json& j, const std::string& where, int64_t head_dim, double theta,
                     bool interleaved);

// The text model's config of a multimodal checkpoint (Qwen3.5's, Gemma 4's): config.json's
// text_config object, where the fields such a config keeps at the top (tie_word_embeddings, the
// special token ids, dtype) fill what text_config lacks.
io::Json nested_text_config(const io::Json& j, const std::string& where);

// The fields every decoder-only transformer shares.
struct DecoderConfig : ArchConfig {
  int64_t intermediate_size = 0, num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
};

// Reads PretrainedConfig's fields and DecoderConfig's, range-checked, with messages naming the
// file and field. `head_dim_default` is used when config.json has no head_dim (0: hidden_size /
// num_attention_heads, as Llama); `acts` are the hidden_act values the architecture builds.
void read_decoder_config(const io::Json& j, const std::string& where, DecoderConfig& c,
                         int64_t head_dim_default = 0,
                         const std::vector<std::string>& acts = {"silu"});

// A mixture's expert count, from config.json's `name` or from num_local_experts (Transformers'
// other name for it, which it writes for some families), and num_experts_per_tok, range-checked.
std::pair<int64_t, int64_t> read_expert_counts(const io::Json& j, const std::string& where,
                                               const char* name);

// The sliding window of each layer (0: full attention): config.json's layer_types when present
// ("full_attention" / "sliding_attention", one per layer), else `types`, the architecture's
// default from its older fields. Sliding layers need a positive `window` (sliding_window).
std::vector<int64_t> read_layer_windows(const io::Json& j, const std::string& where,
                                        std::vector<std::string> types, int64_t window);

// ---- Building ----

// One step's graph under construction: the builder, the weights, the shape and the inputs every
// layer may read.
struct Ctx {
  graph::GraphBuilder& b;
  Params& p;
  const StepShape& s;
  DType cache_dtype;
  Value ids, pos;               // input_ids, position_ids (B,T)
  Value start = -1, mask = -1;  // static cache: cache_position (); attention_mask (B,S)
  Value table = -1;             // paged cache: block_table (B or sequences, table_blocks)
  Value rows = -1;              // a packed paged step: sequence_index (B,T), each token's table row
  Value slots = -1;             // a paged step's state_slots (B,2), with linear attention
  // Each attention layer's caches as written this step (static) or its pools (paged), for the
  // layers that read another layer's cache (Attention::kv_source).
  std::map<int64_t, std::pair<Value, Value>> kv;
};
// Declares the step's inputs.
Ctx begin_step(graph::GraphBuilder& b, Params& p, const StepShape& s, DType cache_dtype);

// ---- Layers ----

enum class Activation : uint8_t { kSilu, kGeluTanh };
// "silu" or "gelu_pytorch_tanh" (also "gelu_new"), else UnsupportedError naming the field.
Activation parse_activation(const std::string& name, const std::string& where);
// act(gate) * up, one op.
Value activation_mul(Ctx& c, Activation act, Value gate, Value up, const std::string& name);

// A linear layer's weights: "<prefix>.weight" (out, in) and, with bias, "<prefix>.bias". A
// packed or fused weight ([gate; up], [q; k; v]) is one Linear whose output is cut with split();
// its tensor-parallel style is then packed_colwise (two equal parts) or replicate.
struct Linear {
  int64_t in = 0, out = 0;
  bool bias = false;
  std::string tp_style;  // default style; "" replicate
  void declare(std::vector<WeightSpec>& w, const std::string& prefix) const;
};
// x (..., in) -> (..., out) through the weights under `prefix` as loaded: prepared as int8 or
// int4 by the backend, or split over ranks with the collectives the weight's style needs.
Value linear(Ctx& c, Value x, const std::string& prefix);
// The parts of the output y (..., sum) of the packed or fused linear at `prefix` along the last
// dim, as this rank holds them (each part split alike, and padded, under packed_colwise).
std::vector<Value> split(Ctx& c, Value y, const std::vector<int64_t>& parts,
                         const std::string& prefix);

// "<prefix>.weight" (dim). Gemma's variant scales by (1 + w), in float32; Gemma 4 has norms
// without a weight (`weighted` false: the value per feature is 1).
struct RMSNorm {
  int64_t dim = 0;
  float eps = 1e-6f;
  bool unit_offset = false;
  bool weighted = true;
  void declare(std::vector<WeightSpec>& w, const std::string& prefix) const;
  Value operator()(Ctx& c, Value x, const std::string& prefix) const;
};

// x (B,T,H,D) rotated by position.
struct Rotary {
  RopeConfig rope;
  Value operator()(Ctx& c, Value x, const std::string& name) const;
};

// Self-attention with grouped-query heads over the layer's static KV cache
// past_key_values.{layer} (or its paged pool kv_pool.{layer}): q/k/v/o projections (or one packed
// qkv_proj), optional per-head q/k norms before RoPE, an optional sliding window and logit
// soft-capping.
struct Attention {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool qkv_bias = false, o_bias = false;
  bool packed_qkv = false;         // one "qkv_proj" (Phi-3 style) instead of q/k/v_proj
  std::optional<RMSNorm> qk_norm;  // q_norm / k_norm over head_dim (Qwen3, Gemma 3)
  Rotary rotary;
  float scale = 0;             // 0: 1 / sqrt(head_dim)
  int64_t sliding_window = 0;  // 0: full attention
  float softcap = 0;           // 0: none
  bool sinks = false;          // "<prefix>.sinks" (heads): a logit per head in every softmax
  // q_proj gives each head its query and then a gate of head_dim: the heads' outputs are
  // multiplied by sigmoid(gate) before o_proj (Qwen3-Next, Qwen3.5).
  bool output_gate = false;
  std::optional<RMSNorm> v_norm;  // over head_dim, on the values (Gemma 4: without weight)
  bool k_eq_v = false;            // the values are k_proj's output, before k_norm and RoPE
  // Gemma 4's KV-shared layers: keys and values are this earlier layer's cache, as it wrote it
  // this step; the layer has no k/v projections or norms and keeps no cache of its own.
  int64_t kv_source = -1;
  void declare(std::vector<WeightSpec>& w, const std::string& prefix) const;
  // x (B,T,hidden) -> (B,T,hidden), writing keys and values into past_key_values.{layer}.
  Value operator()(Ctx& c, Value x, const std::string& prefix, int64_t layer) const;
  // This rank's KV heads: all of them unless the plan splits the heads.
  LayerState cache(const distributed::TpModel* tp, const std::string& prefix) const;
  void validate_tp(const distributed::TpModel& tp, const std::string& prefix) const;

 private:
  // The projections' keys and values (B,T,Hkv * D) as heads (B,T,Hkv,D), normed and rotated.
  std::pair<Value, Value> keys_values(Ctx& c, Value k, Value v, const std::string& prefix) const;
  // The caches or pools holding this step's keys and values: written here from the projections
  // k and v, or by kv_source.
  std::pair<Value, Value> caches(Ctx& c, Value k, Value v, const std::string& prefix,
                                 int64_t layer) const;
};

// Gated DeltaNet (Qwen3-Next, Qwen3.5), linear attention over a recurrent state: projections give
// q and k (key_heads by key_dim), v and an output gate z (value_heads by value_dim), and b and a
// per value head. q, k and v go through a causal depthwise convolution ("conv1d", conv_width
// taps, no bias) and silu; q and k are L2-normalised and q scaled by 1/sqrt(key_dim); the gated
// delta rule (graph.h) runs with beta = sigmoid(b) and decay g = -exp(A_log) softplus(a +
// dt_bias), each value head reading key head h / (value_heads / key_heads); its output goes
// through an RMSNorm per head ("norm", eps) times silu(z), then out_proj. Qwen3.5 projects with
// in_proj_qkv, in_proj_z, in_proj_b and in_proj_a; Qwen3-Next (`grouped`) with in_proj_qkvz and
// in_proj_ba, whose rows come in groups per key head ([q k v z] and [b a], a group's value heads
// together). Its weights are whole on every rank under tensor parallelism.
struct GatedDeltaNet {
  int64_t hidden = 0, key_heads = 0, value_heads = 0, key_dim = 0, value_dim = 0;
  int64_t conv_width = 4;
  float eps = 1e-6f;
  bool grouped = false;
  void declare(std::vector<WeightSpec>& w, const std::string& prefix) const;
  // x (B,T,hidden) -> (B,T,hidden), updating recurrent_state.{layer} (the static cache's) or the
  // paged pools' recurrent_pool.{layer} at each row's state slot.
  Value operator()(Ctx& c, Value x, const std::string& prefix, int64_t layer) const;
  LayerState state() const;

 private:
  int64_t conv_channels() const { return 2 * key_heads * key_dim + value_heads * value_dim; }
  // The convolution's input (B,T,conv_channels) and z (B,T,H,Dv), b and a (B,T,H).
  struct Projected {
    Value mixed, z, b, a;
  };
  Projected project(Ctx& c, Value x, const std::string& prefix) const;
};

// down(act(gate(x)) * up(x)), with gate and up separate or fused in one gate_up_proj.
struct GatedMLP {
  int64_t hidden = 0, intermediate = 0;
  Activation act = Activation::kSilu;
  bool bias = false;
  bool fused_gate_up = false;  // "gate_up_proj" (GLM) instead of gate_proj and up_proj
  void declare(std::vector<WeightSpec>& w, const std::string& prefix) const;
  Value operator()(Ctx& c, Value x, const std::string& prefix) const;
  void validate_tp(const distributed::TpModel& tp, const std::string& prefix) const;
};

// gpt-oss's expert activation: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g) where
// g = min(gate, limit).
struct ClampedSwiGlu {
  float alpha = 1.702f, limit = 7.0f;
};

// A mixture of experts. The router "<prefix>.gate" (experts by hidden) scores every expert: a
// softmax over them (Qwen3-MoE, Mixtral), or each expert's sigmoid (GLM-4.5) whose choice adds the
// per-expert "<prefix>.gate.e_score_correction_bias" and, with groups, keeps only the experts of
// the topk_groups groups whose two best choices score highest. The top k are kept, their scores
// renormalised to sum to 1 with norm_topk_prob and times `scaling`, and each token goes through
// its k experts' gated MLPs, summed with those weights; a shared expert (GLM-4.5's
// "<prefix>.shared_experts") adds its output for every token. gpt-oss instead takes the top k of
// the router's logits (with its bias) and a softmax over those k (kTopKSoftmax). The experts are
// "<prefix>.experts.gate_up_proj" (experts, 2 intermediate, hidden) and ".down_proj" (experts,
// hidden, intermediate) as Transformers 5 holds them, stacked at load from the per-expert tensors
// of Hub checkpoints ("<prefix>.experts.3.gate_proj.weight"), or read from gpt-oss's layout
// (transposed, gate and up interleaved, or MXFP4), with optional per-expert biases
// ".gate_up_proj_bias" (experts, 2 intermediate) and ".down_proj_bias" (experts, hidden).
struct SparseMoE {
  enum class Scoring : uint8_t { kSoftmax, kSigmoid, kTopKSoftmax };
  int64_t hidden = 0, intermediate = 0, experts = 0, top_k = 0;
  bool norm_topk_prob = false;
  Scoring scoring = Scoring::kSoftmax;
  bool score_bias = false;              // kSigmoid: e_score_correction_bias
  int64_t groups = 1, topk_groups = 1;  // group-limited choice (n_group, topk_group)
  float scaling = 1;                    // routed_scaling_factor
  std::optional<GatedMLP> shared;       // "<prefix>.<shared_name>"
  std::string shared_name = "shared_experts";
  // The shared expert's output times sigmoid("<prefix>.shared_expert_gate" (1, hidden) x)
  // (Qwen3-Next, Qwen3.5-MoE).
  bool shared_gate = false;
  std::string router = "gate";           // the router's module (gpt-oss: "router")
  bool router_bias = false;              // "<prefix>.<router>.bias"
  bool expert_bias = false;              // the experts' biases
  std::optional<ClampedSwiGlu> clamped;  // else silu(gate) * up
  bool gpt_oss_layout = false;           // the experts stored as gpt-oss stores them
  Activation act = Activation::kSilu;    // the experts' act(gate) * up, unless clamped
  // Gemma 4's router ("<prefix>.router" with .proj, .scale and .per_expert_scale): its input is
  // RMS-normed without weight, times .scale and hidden^-1/2, before .proj; the softmax's top k,
  // renormalised, are then times .per_expert_scale of their experts.
  bool scaled_router = false;
  float router_eps = 1e-6f;  // scaled_router's norm (rms_norm_eps)
  // The module and each expert's projections as Hub checkpoints name them, where Transformers 5
  // renamed them (Mixtral's block_sparse_moe with w1, w3, w2; its "mlp" holds gate and experts).
  std::string hub_module;  // "": the module's own name
  std::string gate_proj = "gate_proj", up_proj = "up_proj", down_proj = "down_proj";
  void declare(std::vector<WeightSpec>& w, const std::string& prefix) const;
  // The experts run on x; the router reads `route_x` when given (Gemma 4 routes by the block's
  // input, not by the experts' normed one), else x.
  Value operator()(Ctx& c, Value x, const std::string& prefix, Value route_x = -1) const;
  void validate_tp(const distributed::TpModel& tp, const std::string& prefix) const;

 private:
  // (B,T,k) int32 experts and (B,T,k) weights of each token.
  std::pair<Value, Value> route(Ctx& c, Value x, const std::string& prefix) const;
  // Gemma 4's router input (scaled_router).
  Value scaled_router_input(Ctx& c, Value x, const std::string& prefix) const;
  // The router's projection: "<prefix>.<router>", or its ".proj" with scaled_router.
  std::string scorer(const std::string& prefix) const {
    return prefix + "." + router + (scaled_router ? ".proj" : "");
  }
  // gate_up (B,T,k,2I) of the experts idx (with their biases added) -> (B,T,k,I).
  Value activation(Ctx& c, Value gate_up, const std::string& prefix) const;
  // `choice` (B,T,E) f32 with the experts outside each token's best topk_groups groups at -1e30.
  Value keep_top_groups(Ctx& c, Value choice, const std::string& prefix) const;
};

// The token embedding "<prefix>.weight" (vocab, hidden), times `scale` when set (Gemma scales by
// sqrt(hidden), rounded to the weight dtype as Transformers does).
struct Embedding {
  int64_t vocab = 0, hidden = 0;
  float scale = 0;  // 0: none
  void declare(std::vector<WeightSpec>& w, const std::string& prefix) const;
  Value operator()(Ctx& c, const std::string& prefix) const;
};

// ---- The decoder stack ----

// One pre-norm block: h += post_attn(attn(pre_attn(h))); h += post_mlp(mlp(pre_mlp(h))). The
// norm names are the checkpoint's; the post norms are optional (GLM-4 and Gemma 3 have them).
struct DecoderBlock {
  Attention attn;
  std::optional<GatedDeltaNet> linear_attn;  // instead of attn, under "linear_attn"
  GatedMLP mlp;
  std::optional<SparseMoE> moe;  // instead of mlp, under the same prefix
  // Gemma 4's MoE layers: a mixture beside the MLP, under the layer's own prefix ("router",
  // "experts"), on pre_feedforward_layernorm_2(h) and routed by h; the MLP's output normed by
  // post_feedforward_layernorm_1 and the mixture's by post_feedforward_layernorm_2 are summed
  // before post_mlp.
  std::optional<SparseMoE> moe_beside;
  // Gemma 4's per-layer input (DecoderModel::per_layer) of this many features: after the MLP,
  // h += post_per_layer_input_norm(per_layer_projection(act(per_layer_input_gate(h)) * input)).
  int64_t per_layer_input = 0;
  Activation per_layer_act = Activation::kGeluTanh;
  bool layer_scalar = false;  // h is multiplied by "<layer>.layer_scalar" (1) at the end (Gemma 4)
  RMSNorm norm;               // all of the block's norms are alike
  std::string pre_attn = "input_layernorm", post_attn;
  std::string pre_mlp = "post_attention_layernorm", post_mlp;
  void declare(std::vector<WeightSpec>& w, const std::string& prefix) const;
  // h after the block at `prefix` ("<base>.layers.<layer>"); `per_layer` its per-layer input.
  Value operator()(Ctx& c, Value h, Value per_layer, const std::string& prefix,
                   int64_t layer) const;

 private:
  Value feed_forward(Ctx& c, Value h, const std::string& prefix) const;
  Value add_per_layer_input(Ctx& c, Value h, Value input, const std::string& prefix) const;
};

// Gemma 4's per-layer embeddings: every layer's input of `dim` features, from a table of all
// layers' ("<base>.embed_tokens_per_layer", vocab by layers * dim, times sqrt(dim)) and from the
// embedded tokens (per_layer_model_projection times hidden^-1/2, RMS-normed per layer by
// per_layer_projection_norm), summed and times 2^-1/2.
struct PerLayerEmbedding {
  int64_t vocab = 0, hidden = 0, layers = 0, dim = 0;  // dim 0: none
  float eps = 1e-6f;
  void declare(std::vector<WeightSpec>& w, const std::string& base) const;
  // (B,T,layers * dim) from the embedded tokens `embedded` (B,T,hidden).
  Value operator()(Ctx& c, Value embedded, const std::string& base) const;
};

// embed_tokens, the blocks, the final norm and lm_head (tied to the embedding when
// tie_word_embeddings), optionally soft-capped: the whole model as the loader sees it.
struct DecoderModel {
  // The stack's checkpoint prefix: "model", or "model.language_model" for the text model of a
  // multimodal checkpoint (Qwen3.5's).
  std::string base = "model";
  Embedding embed;
  PerLayerEmbedding per_layer;
  std::vector<DecoderBlock> blocks;
  RMSNorm norm;
  bool tie_word_embeddings = false;
  float final_softcap = 0;  // 0: none
  std::vector<WeightSpec> weights() const;
  std::vector<LayerState> states(const distributed::TpModel* tp) const;
  void build(graph::GraphBuilder& b, Params& p, const StepShape& s, DType cache_dtype) const;
  void validate_tp(const distributed::TpModel& tp) const;
};

// An architecture that is a DecoderModel built from its config: the file says how to read the
// config and how to build the model from it, and nothing else.
template <class Config>
class DecoderArchitecture : public ArchitectureFor<Config> {
 public:
  virtual DecoderModel model(const Config& c) const = 0;
  std::vector<WeightSpec> weights(const Config& c) const override { return model(c).weights(); }
  std::vector<LayerState> states(const Config& c, const distributed::TpModel* tp) const override {
    return model(c).states(tp);
  }
  void build(graph::GraphBuilder& b, Params& p, const Config& c, const StepShape& s,
             DType cache_dtype) const override {
    model(c).build(b, p, s, cache_dtype);
  }
  void validate_tp(const Config& c, const distributed::TpModel& tp) const override {
    model(c).validate_tp(tp);
  }
};

// The Llama block and stack for a DecoderConfig: q/k/v/o and gate/up/down projections, RMSNorm
// before attention and MLP. Architectures adjust the result (biases, q/k norms).
DecoderModel llama_model(const DecoderConfig& c);

}  // namespace tformers::models
