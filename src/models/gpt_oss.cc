// GptOssForCausalLM (gpt-oss-20b, gpt-oss-120b), as Transformers 5.23's gpt_oss computes it:
// attention with q/k/v/o biases and a learned sink logit per head in every softmax, on layers
// that alternate a sliding window (128) and full attention (layer_types), YaRN RoPE (rotate-half);
// a mixture of experts on every layer, routed by the top k of the router's logits (with its
// bias) and a softmax over those k, each expert with biases and the clamped SwiGLU (`alpha`,
// `limit`) whose gate and up rows the checkpoints interleave. The experts load from the float
// layout Transformers saves (each expert transposed, (in, out)) or from MXFP4 blocks and scales
// as the released checkpoints ship them (models/stored_layout.h).
#include <tuple>

#include "models/layers.h"
#include "tformers/error.h"

namespace tformers::models {

namespace {

struct GptOssConfig : DecoderConfig {
  int64_t num_local_experts = 0, num_experts_per_tok = 0;
  bool attention_bias = true;
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;
  std::vector<int64_t> windows;  // per layer; 0: full attention
};

class GptOssForCausalLM : public DecoderArchitecture<GptOssConfig> {
 public:
  void read(const io::Json& j, const std::string& where, GptOssConfig& c) const override {
    read_decoder_config(j, where, c, 64);
    c.rope = read_rope(with_default_rope(j), where, c.head_dim, 150000.0, false);
    std::tie(c.num_local_experts, c.num_experts_per_tok) =
        read_expert_counts(j, where, "num_local_experts");
    c.attention_bias = io::get_or<bool>(j, "attention_bias", true, where);
    c.swiglu_alpha = io::get_double_in_or(j, "swiglu_alpha", 1.702, 1e-6, 1e6, where);
    c.swiglu_limit = io::get_double_in_or(j, "swiglu_limit", 7.0, 1e-6, 1e6, where);
    // GptOssConfig's default: sliding on even layers (0, 2, ...), full on odd ones.
    std::vector<std::string> types;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
    const auto window = io::get_optional<int64_t>(j, "sliding_window", where);
    c.windows = read_layer_windows(j, where, types, window.value_or(128));
  }
  DecoderModel model(const GptOssConfig& c) const override {
    DecoderModel m = llama_model(c);
    for (size_t l = 0; l < m.blocks.size(); ++l) {
      DecoderBlock& blk = m.blocks[l];
      blk.attn.qkv_bias = blk.attn.o_bias = c.attention_bias;
      blk.attn.sinks = true;
      blk.attn.sliding_window = c.windows[l];
      blk.moe = SparseMoE{.hidden = c.hidden_size,
                          .intermediate = c.intermediate_size,
                          .experts = c.num_local_experts,
                          .top_k = c.num_experts_per_tok,
                          .scoring = SparseMoE::Scoring::kTopKSoftmax,
                          .router = "router",
                          .router_bias = true,
                          .expert_bias = true,
                          .clamped = ClampedSwiGlu{float(c.swiglu_alpha), float(c.swiglu_limit)},
                          .gpt_oss_layout = true};
    }
    return m;
  }

 private:
  // GptOssConfig's YaRN when config.json says nothing of RoPE scaling.
  static io::Json with_default_rope(const io::Json& j) {
    if (j.contains("rope_scaling") || j.contains("rope_parameters")) return j;
    io::Json r = j;
    r["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 32.0},
                         {"beta_fast", 32.0},   {"beta_slow", 1.0},
                         {"truncate", false},   {"original_max_position_embeddings", 4096}};
    return r;
  }
};

}  // namespace

TFORMERS_REGISTER_ARCHITECTURE("GptOssForCausalLM", GptOssForCausalLM);

}  // namespace tformers::models
