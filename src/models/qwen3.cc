// Qwen3ForCausalLM: the Llama decoder plus RMSNorm on each query and key head (q_norm, k_norm)
// before RoPE. Qwen3-0.6B ties lm_head to embed_tokens.
#include "models/layers.h"
#include "tformers/error.h"

namespace tformers::models {

namespace {

struct Qwen3Config : DecoderConfig {
  bool attention_bias = false;
};

class Qwen3ForCausalLM : public DecoderArchitecture<Qwen3Config> {
 public:
  void read(const io::Json& j, const std::string& where, Qwen3Config& c) const override {
    // 128 is Qwen3Config's own default, used when config.json omits head_dim.
    read_decoder_config(j, where, c, 128);
    c.rope = read_rope(j, where, c.head_dim, 10000.0, false);
    c.attention_bias = io::get_or<bool>(j, "attention_bias", false, where);
    if (io::get_or<bool>(j, "use_sliding_window", false, where))
      throw UnsupportedError(where +
                             ": use_sliding_window=true is not supported for Qwen3 yet; set it to "
                             "false (all released Qwen3 checkpoints use full attention)");
  }
  DecoderModel model(const Qwen3Config& c) const override {
    DecoderModel m = llama_model(c);
    for (DecoderBlock& blk : m.blocks) {
      blk.attn.qkv_bias = blk.attn.o_bias = c.attention_bias;
      blk.attn.qk_norm = RMSNorm{c.head_dim, float(c.rms_norm_eps)};
    }
    return m;
  }
};

}  // namespace

TFORMERS_REGISTER_ARCHITECTURE("Qwen3ForCausalLM", Qwen3ForCausalLM);

}  // namespace tformers::models
