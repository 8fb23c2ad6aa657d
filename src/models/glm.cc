// GlmForCausalLM (GLM-4, e.g. THUDM/glm-4-9b-hf): the Llama decoder with q/k/v biases, one
// gate_up_proj for the MLP and RoPE over the first half of each head only (partial_rotary_factor)
// rotating adjacent pairs (2i, 2i+1).
// Glm4ForCausalLM (GLM-4-0414, e.g. zai-org/GLM-4-9B-0414) adds a norm after attention
// (post_self_attn_layernorm) and after the MLP (post_mlp_layernorm), each before its residual
// add; post_attention_layernorm keeps its Llama role, the norm before the MLP.
#include "models/layers.h"

namespace tformers::models {

namespace {

struct GlmConfig : DecoderConfig {
  bool attention_bias = true;
};

template <bool kPostNorms>
class GlmDecoder : public DecoderArchitecture<GlmConfig> {
 public:
  void read(const io::Json& j, const std::string& where, GlmConfig& c) const override {
    // 128 and 0.5 are GlmConfig's and Glm4Config's defaults when config.json omits them.
    read_decoder_config(j, where, c, 128);
    io::Json rope = j;
    if (!j.contains("partial_rotary_factor")) rope["partial_rotary_factor"] = 0.5;
    c.rope = read_rope(rope, where, c.head_dim, 10000.0, true);
    c.attention_bias = io::get_or<bool>(j, "attention_bias", true, where);
  }
  DecoderModel model(const GlmConfig& c) const override {
    DecoderModel m = llama_model(c);
    for (DecoderBlock& blk : m.blocks) {
      blk.attn.qkv_bias = c.attention_bias;
      blk.mlp.fused_gate_up = true;
      if (kPostNorms) {
        blk.post_attn = "post_self_attn_layernorm";
        blk.post_mlp = "post_mlp_layernorm";
      }
    }
    return m;
  }
};

using GlmForCausalLM = GlmDecoder<false>;
using Glm4ForCausalLM = GlmDecoder<true>;

}  // namespace

TFORMERS_REGISTER_ARCHITECTURE("GlmForCausalLM", GlmForCausalLM);
TFORMERS_REGISTER_ARCHITECTURE("Glm4ForCausalLM", Glm4ForCausalLM);

}  // namespace tformers::models
