// LlamaForCausalLM (Llama 2, Llama 3.x): the reference decoder. Optional attention and MLP
// biases; RoPE with llama3 scaling handled by the shared rope_inv_freq.
#include "models/layers.h"

namespace tformers::models {

namespace {

class LlamaForCausalLM : public Architecture {
 public:
  void read_config(const io::Json& json, ModelConfig& c, const std::string& where) const override {
    c.mlp_bias = io::get_or<bool>(json, "mlp_bias", false, where);
  }
  std::vector<WeightSpec> weights(const ModelConfig& c) const override {
    return decoder_weights(c, {});
  }
  bool ignorable(const std::string& name) const override {
    // Old conversions saved the RoPE table; it is recomputed from the config.
    return name.ends_with(".rotary_emb.inv_freq");
  }
  void build(graph::GraphBuilder& b, Params& p, const ModelConfig& c, const StepShape& s,
             DType cache_dtype) const override {
    build_decoder(b, p, c, s, cache_dtype, {});
  }
  std::map<std::string, std::string> tp_plan() const override { return decoder_tp_plan({}); }
  void validate_tp(const ModelConfig& c, distributed::TpModel& tp) const override {
    validate_decoder_tp(c, tp);
  }
};

}  // namespace

TFORMERS_REGISTER_ARCHITECTURE("LlamaForCausalLM", LlamaForCausalLM);

}  // namespace tformers::models
