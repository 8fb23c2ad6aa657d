// LlamaForCausalLM (Llama 2, Llama 3.x): the reference decoder. Optional biases on all four
// attention projections (attention_bias) and on the MLP (mlp_bias); RoPE with default, linear,
// llama3 or yarn scaling.
#include "models/layers.h"

namespace tformers::models {

namespace {

struct LlamaConfig : DecoderConfig {
  bool attention_bias = false, mlp_bias = false;
};

class LlamaForCausalLM : public DecoderArchitecture<LlamaConfig> {
 public:
  void read(const io::Json& j, const std::string& where, LlamaConfig& c) const override {
    read_decoder_config(j, where, c);
    c.rope = read_rope(j, where, c.head_dim, 10000.0, false);
    c.attention_bias = io::get_or<bool>(j, "attention_bias", false, where);
    c.mlp_bias = io::get_or<bool>(j, "mlp_bias", false, where);
  }
  DecoderModel model(const LlamaConfig& c) const override {
    DecoderModel m = llama_model(c);
    for (DecoderBlock& blk : m.blocks) {
      blk.attn.qkv_bias = blk.attn.o_bias = c.attention_bias;
      blk.mlp.bias = c.mlp_bias;
    }
    return m;
  }
  bool ignorable(const LlamaConfig&, const std::string& name) const override {
    // Old conversions saved the RoPE table; it is recomputed from the config.
    return name.ends_with(".rotary_emb.inv_freq");
  }
};

}  // namespace

TFORMERS_REGISTER_ARCHITECTURE("LlamaForCausalLM", LlamaForCausalLM);

}  // namespace tformers::models
