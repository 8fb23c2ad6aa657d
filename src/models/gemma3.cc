// Gemma3ForCausalLM (Gemma 3 text, model_type gemma3_text, e.g. google/gemma-3-1b-it): local
// layers attend over a sliding window with RoPE base rope_local_base_freq, every
// sliding_window_pattern-th layer (or as layer_types says) is global with rope_theta and
// rope_scaling. Four RMSNorms per layer (before and after attention and the MLP), each scaling by
// (1 + w) in float32 as Gemma stores the weights as offsets; q_norm/k_norm on each head; scores
// scaled by query_pre_attn_scalar^-1/2; a gelu-tanh MLP; the embedding times sqrt(hidden_size);
// final logits soft-capped when the config sets final_logit_softcapping (attention scores are
// not, whatever attn_logit_softcapping says, as in Transformers). RoPE settings come from
// rope_theta, rope_scaling and rope_local_base_freq, or from Transformers 5's rope_parameters
// with one entry per layer type.
#include <cmath>

#include "models/layers.h"
#include "tformers/error.h"

namespace tformers::models {

namespace {

struct Gemma3Config : DecoderConfig {
  RopeConfig local_rope;                // sliding layers
  std::vector<int64_t> sliding_window;  // per layer, 0: global
  Activation act = Activation::kGeluTanh;
  bool attention_bias = false;
  float query_pre_attn_scalar = 256, attn_softcap = 0, final_softcap = 0;
};

class Gemma3ForCausalLM : public DecoderArchitecture<Gemma3Config> {
 public:
  void read(const io::Json& j, const std::string& where, Gemma3Config& c) const override {
    // Gemma3TextConfig's defaults where config.json omits a field: head_dim 256, tied
    // embeddings, base 1e6 (global) and 1e4 (local), a 4096 window, 5 local layers per global.
    read_decoder_config(j, where, c, 256, {"gelu_pytorch_tanh"});
    c.tie_word_embeddings = io::get_or<bool>(j, "tie_word_embeddings", true, where);
    c.act = parse_activation(
        io::get_or<std::string>(j, "hidden_activation", "gelu_pytorch_tanh", where), where);
    c.attention_bias = io::get_or<bool>(j, "attention_bias", false, where);
    auto per_type = j.find("rope_parameters");
    if (per_type != j.end() && per_type->is_object() &&
        (per_type->contains("full_attention") || per_type->contains("sliding_attention"))) {
      // Transformers 5's layout: one rope_parameters object per layer type (a missing one
      // falls back to the defaults, as Gemma3TextConfig does).
      auto entry = [&](const char* type) {
        return per_type->contains(type) ? per_type->at(type) : io::Json();
      };
      io::Json global = j;
      global["rope_parameters"] = entry("full_attention");
      c.rope =
          read_rope(global, where + " (rope_parameters.full_attention)", c.head_dim, 1e6, false);
      c.local_rope =
          read_rope(io::Json{{"rope_parameters", entry("sliding_attention")}},
                    where + " (rope_parameters.sliding_attention)", c.head_dim, 1e4, false);
    } else {
      c.rope = read_rope(j, where, c.head_dim, 1e6, false);
      const double local_base = io::get_or<double>(j, "rope_local_base_freq", 1e4, where);
      c.local_rope = read_rope(io::Json{{"rope_theta", local_base}},
                               where + " (rope_local_base_freq)", c.head_dim, 1e4, false);
    }
    auto number = [&](const char* key, double fallback, double lo) {
      const double v = io::get_or<double>(j, key, fallback, where);
      if (!std::isfinite(v) || v < lo || v > 1e9)
        throw FormatError(where + ": field '" + key + "' must be a number in [" +
                          std::to_string(lo) + ", 1e9] or null, got " + std::to_string(v));
      return float(v);
    };
    c.query_pre_attn_scalar = number("query_pre_attn_scalar", 256, 1e-6);
    // Checked, but not applied: Transformers' Gemma3Attention (5.23.0) never passes
    // attn_logit_softcapping to its attention function (Gemma 2's does), and the released
    // Gemma 3 configs set it to null.
    c.attn_softcap = number("attn_logit_softcapping", 0, 0);
    c.final_softcap = number("final_logit_softcapping", 0, 0);
    const int64_t pattern = io::get_or<int64_t>(j, "sliding_window_pattern", 6, where);
    if (pattern < 1)
      throw FormatError(where + ": field 'sliding_window_pattern' must be positive, got " +
                        std::to_string(pattern));
    std::vector<std::string> types;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      types.push_back((l + 1) % pattern ? "sliding_attention" : "full_attention");
    c.sliding_window =
        read_layer_windows(j, where, types, io::get_or<int64_t>(j, "sliding_window", 4096, where));
  }
  DecoderModel model(const Gemma3Config& c) const override {
    DecoderModel m = llama_model(c);
    // Transformers computes sqrt(hidden_size) in double; the layer casts it to the table dtype.
    m.embed.scale = float(std::sqrt(double(c.hidden_size)));
    m.norm.unit_offset = true;
    m.final_softcap = c.final_softcap;
    for (size_t l = 0; l < m.blocks.size(); ++l) {
      DecoderBlock& blk = m.blocks[l];
      blk.norm.unit_offset = true;
      blk.post_attn = "post_attention_layernorm";
      blk.pre_mlp = "pre_feedforward_layernorm";
      blk.post_mlp = "post_feedforward_layernorm";
      blk.attn.qkv_bias = blk.attn.o_bias = c.attention_bias;
      blk.attn.qk_norm = RMSNorm{c.head_dim, float(c.rms_norm_eps), true};
      blk.attn.scale = float(1.0 / std::sqrt(double(c.query_pre_attn_scalar)));
      blk.attn.sliding_window = c.sliding_window[l];
      blk.attn.rotary = {c.sliding_window[l] ? c.local_rope : c.rope};
      blk.mlp.act = c.act;
    }
    return m;
  }
};

}  // namespace

TFORMERS_REGISTER_ARCHITECTURE("Gemma3ForCausalLM", Gemma3ForCausalLM);

}  // namespace tformers::models
