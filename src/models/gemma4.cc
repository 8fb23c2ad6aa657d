// Gemma4ForCausalLM (Gemma 4's text model, model_type gemma4_text) and the text path of the
// Hub's Gemma 4 checkpoints (Gemma4ForConditionalGeneration: the config nests it as text_config,
// its weights live under model.language_model; the vision and audio towers load as known and
// unused), as Transformers 5.23 computes them:
// - sliding layers (RoPE base 1e4 over head_dim) and full layers (proportional RoPE over their
//   own, larger head dim; with attention_k_eq_v their values are the keys' projection); q_norm,
//   k_norm and a v_norm without weight on every head, scores scaled by 1;
// - per-layer embeddings (hidden_size_per_layer_input), a gated input added after each MLP;
// - the last num_kv_shared_layers layers read the cache of the last earlier layer of their type
//   and keep none (their MLPs twice as wide with use_double_wide_mlp);
// - with enable_moe_block, a mixture of experts beside each MLP (layers.h: moe_beside);
// - four RMSNorms per layer that scale by w (not Gemma 3's 1 + w), each layer's output times its
//   layer_scalar, the embedding times sqrt(hidden_size), logits soft-capped when
//   final_logit_softcapping is set.
#include <cmath>
#include <map>

#include "models/layers.h"
#include "tformers/error.h"

namespace tformers::models {

namespace {

struct Gemma4Config : DecoderConfig {
  std::string base = "model";
  RopeConfig local_rope;                // sliding layers
  std::vector<int64_t> sliding_window;  // per layer, 0: full attention
  std::vector<int64_t> layer_head_dim, layer_kv_heads;
  std::vector<int64_t> kv_source;  // per layer: the layer whose cache it reads, or -1
  Activation act = Activation::kGeluTanh;
  bool attention_bias = false, k_eq_v = false, double_wide_mlp = false;
  float final_softcap = 0;
  int64_t per_layer_dim = 0, per_layer_vocab = 0;
  int64_t num_experts = 0, top_k_experts = 0, moe_intermediate_size = 0;
};

// The sliding window of each layer: layer_types, else five sliding layers to one full one; the
// last layer is full attention whatever they say, as Gemma4TextConfig forces it.
std::vector<int64_t> read_windows(const io::Json& j, const std::string& w, int64_t layers) {
  std::vector<std::string> types;
  for (int64_t l = 0; l < layers; ++l)
    types.push_back((l + 1) % 6 ? "sliding_attention" : "full_attention");
  std::vector<int64_t> windows =
      read_layer_windows(j, w, types, io::get_or<int64_t>(j, "sliding_window", 512, w));
  windows.back() = 0;
  return windows;
}

// Each layer's head_dim and KV heads: per_layer_config's overrides by layer index (what
// Transformers 5.23 writes), else global_head_dim (512 unless set) and, with attention_k_eq_v,
// num_global_key_value_heads on the full-attention layers.
void read_head_overrides(const io::Json& j, const std::string& w, Gemma4Config& c) {
  const int64_t layers = c.num_hidden_layers;
  c.layer_head_dim.assign(size_t(layers), c.head_dim);
  c.layer_kv_heads.assign(size_t(layers), c.num_key_value_heads);
  const auto per_layer = j.find("per_layer_config");
  if (per_layer == j.end() || per_layer->is_null()) {
    const int64_t dim = io::get_int_in_or(j, "global_head_dim", 512, 1, 1 << 16, w);
    const int64_t kv = c.k_eq_v ? io::get_int_in_or(j, "num_global_key_value_heads",
                                                    c.num_key_value_heads, 1, 1 << 16, w)
                                : c.num_key_value_heads;
    for (int64_t l = 0; l < layers; ++l)
      if (c.sliding_window[size_t(l)] == 0)
        c.layer_head_dim[size_t(l)] = dim, c.layer_kv_heads[size_t(l)] = kv;
    return;
  }
  if (!per_layer->is_object())
    throw FormatError(w + ": per_layer_config must be an object of layer index to overrides");
  for (const auto& [key, overrides] : per_layer->items()) {
    const std::string at = w + ": per_layer_config." + key;
    char* end = nullptr;
    const long long l = std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || l < 0 || l >= layers)
      throw FormatError(at + ": the key must be a layer index below " + std::to_string(layers));
    if (!overrides.is_object()) throw FormatError(at + " must be an object");
    for (const auto& [field, value] : overrides.items())
      if (field != "head_dim" && field != "num_key_value_heads")
        throw UnsupportedError(at + "." + field +
                               ": only head_dim and num_key_value_heads may differ per layer");
    c.layer_head_dim[size_t(l)] =
        io::get_int_in_or(overrides, "head_dim", c.head_dim, 1, 1 << 16, at);
    c.layer_kv_heads[size_t(l)] =
        io::get_int_in_or(overrides, "num_key_value_heads", c.num_key_value_heads, 1, 1 << 16, at);
  }
}

// The overrides above, each layer's query heads shared evenly by its KV heads.
void read_layer_heads(const io::Json& j, const std::string& w, Gemma4Config& c) {
  read_head_overrides(j, w, c);
  for (size_t l = 0; l < c.layer_kv_heads.size(); ++l)
    if (c.num_attention_heads % c.layer_kv_heads[l])
      throw FormatError(w + ": layer " + std::to_string(l) + " has " +
                        std::to_string(c.layer_kv_heads[l]) +
                        " KV heads, which do not divide num_attention_heads " +
                        std::to_string(c.num_attention_heads));
}

// Gemma4TextConfig.kv_sharing_modes: each of the last `shared` layers reads the cache of the last
// layer before them of its own type.
std::vector<int64_t> read_kv_sources(const io::Json& j, const std::string& w,
                                     const std::vector<int64_t>& windows) {
  const int64_t layers = int64_t(windows.size());
  const int64_t shared = io::get_int_in_or(j, "num_kv_shared_layers", 0, 0, layers - 1, w);
  std::vector<int64_t> source(size_t(layers), -1);
  for (int64_t l = layers - shared; l < layers; ++l) {
    for (int64_t p = layers - shared - 1; p >= 0 && source[size_t(l)] < 0; --p)
      if ((windows[size_t(p)] == 0) == (windows[size_t(l)] == 0)) source[size_t(l)] = p;
    if (source[size_t(l)] < 0)
      throw FormatError(w + ": num_kv_shared_layers " + std::to_string(shared) + " leaves layer " +
                        std::to_string(l) + " no earlier layer of its type to share a cache with");
  }
  return source;
}

void read_moe(const io::Json& j, const std::string& w, Gemma4Config& c) {
  if (!io::get_or<bool>(j, "enable_moe_block", false, w)) return;
  c.num_experts = io::get_int_in(j, "num_experts", 1, 1 << 16, w);
  c.top_k_experts = io::get_int_in(j, "top_k_experts", 1, c.num_experts, w);
  c.moe_intermediate_size = io::get_int_in(j, "moe_intermediate_size", 1, 1 << 20, w);
}

template <bool kNested>
class Gemma4Family : public DecoderArchitecture<Gemma4Config> {
 public:
  void read(const io::Json& outer, const std::string& where, Gemma4Config& c) const override {
    const std::string w = kNested ? where + ": text_config" : where;
    const io::Json j = kNested ? nested_text_config(outer, where) : outer;
    if (kNested) c.base = "model.language_model";
    read_decoder_config(j, w, c, 256, {"gelu_pytorch_tanh"});
    c.tie_word_embeddings = io::get_or<bool>(j, "tie_word_embeddings", true, w);
    c.act = parse_activation(
        io::get_or<std::string>(j, "hidden_activation", "gelu_pytorch_tanh", w), w);
    c.attention_bias = io::get_or<bool>(j, "attention_bias", false, w);
    c.k_eq_v = io::get_or<bool>(j, "attention_k_eq_v", false, w);
    c.double_wide_mlp = io::get_or<bool>(j, "use_double_wide_mlp", false, w);
    const double cap = io::get_or<double>(j, "final_logit_softcapping", 0, w);
    if (!(cap >= 0 && cap <= 1e9))
      throw FormatError(w + ": final_logit_softcapping must be in [0, 1e9] or null");
    c.final_softcap = float(cap);
    if (io::get_or<std::string>(j, "use_bidirectional_attention", "", w) == "all")
      throw UnsupportedError(w +
                             ": use_bidirectional_attention \"all\" (a bidirectional "
                             "encoder) is not a causal language model");
    c.sliding_window = read_windows(j, w, c.num_hidden_layers);
    read_layer_heads(j, w, c);
    c.kv_source = read_kv_sources(j, w, c.sliding_window);
    read_ropes(j, w, c);
    c.per_layer_dim = io::get_int_in_or(j, "hidden_size_per_layer_input", 256, 0, 1 << 16, w);
    c.per_layer_vocab = io::get_int_in_or(j, "vocab_size_per_layer_input", 262144, 1, 1 << 24, w);
    read_moe(j, w, c);
  }

  DecoderModel model(const Gemma4Config& c) const override {
    DecoderModel m = llama_model(c);
    m.base = c.base;
    // Transformers computes sqrt(hidden_size) in double; the layer casts it to the table dtype.
    m.embed.scale = float(std::sqrt(double(c.hidden_size)));
    m.final_softcap = c.final_softcap;
    if (c.per_layer_dim)
      m.per_layer = {.vocab = c.per_layer_vocab,
                     .hidden = c.hidden_size,
                     .layers = c.num_hidden_layers,
                     .dim = c.per_layer_dim,
                     .eps = float(c.rms_norm_eps)};
    for (size_t l = 0; l < m.blocks.size(); ++l) block(c, l, m.blocks[l]);
    return m;
  }

  bool ignorable(const Gemma4Config& c, const std::string& name) const override {
    if (kNested)
      for (const char* tower : {"model.vision_tower.", "model.audio_tower.", "model.embed_vision.",
                                "model.embed_audio."})
        if (name.starts_with(tower)) return true;
    // The released checkpoints keep k/v projections and norms for the KV-shared layers, unused.
    const std::string layers = c.base + ".layers.";
    if (!name.starts_with(layers)) return false;
    const size_t dot = name.find('.', layers.size());
    const int64_t l = std::atoll(name.substr(layers.size(), dot - layers.size()).c_str());
    if (l < 0 || l >= int64_t(c.kv_source.size()) || c.kv_source[size_t(l)] < 0) return false;
    const std::string rest = name.substr(dot + 1);
    for (const char* unused :
         {"self_attn.k_proj.", "self_attn.v_proj.", "self_attn.k_norm.", "self_attn.v_norm."})
      if (rest.starts_with(unused)) return true;
    return false;
  }

 private:
  // rope_parameters has one entry per layer type; full layers rotate by their own head dim.
  static void read_ropes(const io::Json& j, const std::string& w, Gemma4Config& c) {
    const auto per_type = j.find("rope_parameters");
    auto entry = [&](const char* type) {
      io::Json only = j;
      only["rope_parameters"] =
          per_type != j.end() && per_type->is_object() && per_type->contains(type)
              ? per_type->at(type)
              : io::Json();
      return only;
    };
    int64_t full_dim = c.head_dim;
    for (size_t l = 0; l < c.sliding_window.size(); ++l)
      if (c.sliding_window[l] == 0) full_dim = c.layer_head_dim[l];
    c.rope = read_rope(entry("full_attention"), w + " (rope_parameters.full_attention)", full_dim,
                       1e6, false);
    c.local_rope = read_rope(entry("sliding_attention"), w + " (rope_parameters.sliding_attention)",
                             c.head_dim, 1e4, false);
  }

  static void block(const Gemma4Config& c, size_t l, DecoderBlock& blk) {
    const bool sliding = c.sliding_window[l] != 0, shared = c.kv_source[l] >= 0;
    const int64_t dim = c.layer_head_dim[l];
    const float eps = float(c.rms_norm_eps);
    blk.post_attn = "post_attention_layernorm";
    blk.pre_mlp = "pre_feedforward_layernorm";
    blk.post_mlp = "post_feedforward_layernorm";
    Attention& a = blk.attn;
    a.kv_heads = c.layer_kv_heads[l];
    a.head_dim = dim;
    a.qkv_bias = a.o_bias = c.attention_bias;
    a.qk_norm = RMSNorm{dim, eps};
    a.v_norm = RMSNorm{dim, eps, false, false};
    a.k_eq_v = c.k_eq_v && !sliding;
    a.kv_source = c.kv_source[l];
    a.scale = 1;
    a.sliding_window = c.sliding_window[l];
    a.rotary = {sliding ? c.local_rope : c.rope};
    blk.mlp.act = c.act;
    if (shared && c.double_wide_mlp) blk.mlp.intermediate *= 2;
    if (c.num_experts)
      blk.moe_beside = SparseMoE{.hidden = c.hidden_size,
                                 .intermediate = c.moe_intermediate_size,
                                 .experts = c.num_experts,
                                 .top_k = c.top_k_experts,
                                 .norm_topk_prob = true,
                                 .router = "router",
                                 .act = c.act,
                                 .scaled_router = true,
                                 .router_eps = eps};
    blk.per_layer_input = c.per_layer_dim;
    blk.per_layer_act = c.act;
    blk.layer_scalar = true;
  }
};

using Gemma4ForCausalLM = Gemma4Family<false>;
using Gemma4ForConditionalGeneration = Gemma4Family<true>;

}  // namespace

TFORMERS_REGISTER_ARCHITECTURE("Gemma4ForCausalLM", Gemma4ForCausalLM);
TFORMERS_REGISTER_ARCHITECTURE("Gemma4ForConditionalGeneration", Gemma4ForConditionalGeneration);

}  // namespace tformers::models
