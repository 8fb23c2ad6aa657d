// Qwen3ForCausalLM: the Llama decoder plus RMSNorm on each query and key head (q_norm, k_norm)
// before RoPE. Qwen3-0.6B ties lm_head to embed_tokens.
#include "models/layers.h"
#include "tformers/error.h"

namespace tformers::models {

namespace {

class Qwen3ForCausalLM : public Architecture {
 public:
  void read_config(const io::Json& json, ModelConfig& c, const std::string& where) const override {
    // Qwen3Config's own default, used when config.json omits head_dim.
    if (!json.contains("head_dim")) c.head_dim = 128;
    if (io::get_or<bool>(json, "use_sliding_window", false, where))
      throw UnsupportedError(where +
                             ": use_sliding_window=true is not supported for Qwen3 yet; set it to "
                             "false (all released Qwen3 checkpoints use full attention)");
  }
  std::vector<WeightSpec> weights(const ModelConfig& c) const override {
    return decoder_weights(c, {.qk_norm = true});
  }
  void build(graph::GraphBuilder& b, Params& p, const ModelConfig& c, const StepShape& s,
             DType cache_dtype) const override {
    build_decoder(b, p, c, s, cache_dtype, {.qk_norm = true});
  }
  std::map<std::string, std::string> tp_plan() const override {
    return decoder_tp_plan({.qk_norm = true});
  }
  void validate_tp(const ModelConfig& c, distributed::TpModel& tp) const override {
    validate_decoder_tp(c, tp);
  }
};

}  // namespace

TFORMERS_REGISTER_ARCHITECTURE("Qwen3ForCausalLM", Qwen3ForCausalLM);

}  // namespace tformers::models
