// Glm4MoeForCausalLM (GLM-4.5, GLM-4.5-Air, GLM-4.6): attention with q/k/v biases
// (attention_bias), optional q/k norms (use_qk_norm) and RoPE over the first
// partial_rotary_factor of each head (rotate-half, unlike GLM-4's adjacent pairs); the first
// first_k_dense_replace layers have a dense MLP, the others a mixture of experts routed by sigmoid
// scores with a correction bias, group-limited (n_group, topk_group), renormalised
// (norm_topk_prob), times routed_scaling_factor, plus n_shared_experts always-on experts. The
// multi-token-prediction layers the checkpoints append (model.layers.{num_hidden_layers}...) are
// loaded past and not used: decoding predicts one token per step.
#include <string>
#include <tuple>

#include "models/layers.h"
#include "tformers/error.h"

namespace tformers::models {

namespace {

struct Glm4MoeConfig : DecoderConfig {
  bool attention_bias = false, use_qk_norm = false, norm_topk_prob = true;
  int64_t n_routed_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0;
  int64_t n_shared_experts = 0, n_group = 1, topk_group = 1, first_k_dense_replace = 0;
  double routed_scaling_factor = 1;
};

class Glm4MoeForCausalLM : public DecoderArchitecture<Glm4MoeConfig> {
 public:
  void read(const io::Json& j, const std::string& where, Glm4MoeConfig& c) const override {
    read_decoder_config(j, where, c, 128);
    io::Json rope = j;
    // Glm4MoeConfig's default when config.json gives no partial_rotary_factor.
    if (!j.contains("partial_rotary_factor")) rope["partial_rotary_factor"] = 0.5;
    c.rope = read_rope(rope, where, c.head_dim, 10000.0, false);
    c.attention_bias = io::get_or<bool>(j, "attention_bias", false, where);
    c.use_qk_norm = io::get_or<bool>(j, "use_qk_norm", false, where);
    c.norm_topk_prob = io::get_or<bool>(j, "norm_topk_prob", true, where);
    std::tie(c.n_routed_experts, c.num_experts_per_tok) =
        read_expert_counts(j, where, "n_routed_experts");
    c.moe_intermediate_size = io::get_int_in(j, "moe_intermediate_size", 1, 1 << 20, where);
    c.n_shared_experts = io::get_int_in_or(j, "n_shared_experts", 1, 0, 1 << 10, where);
    c.n_group = io::get_int_in_or(j, "n_group", 1, 1, c.n_routed_experts, where);
    c.topk_group = io::get_int_in_or(j, "topk_group", 1, 1, c.n_group, where);
    c.first_k_dense_replace =
        io::get_int_in_or(j, "first_k_dense_replace", 1, 0, c.num_hidden_layers, where);
    c.routed_scaling_factor = io::get_or<double>(j, "routed_scaling_factor", 1.0, where);
    check_groups(c, where);
  }
  DecoderModel model(const Glm4MoeConfig& c) const override {
    DecoderModel m = llama_model(c);
    for (size_t l = 0; l < m.blocks.size(); ++l) {
      DecoderBlock& blk = m.blocks[l];
      blk.attn.qkv_bias = c.attention_bias;
      if (c.use_qk_norm) blk.attn.qk_norm = RMSNorm{c.head_dim, float(c.rms_norm_eps)};
      if (int64_t(l) < c.first_k_dense_replace) continue;
      SparseMoE moe{.hidden = c.hidden_size,
                    .intermediate = c.moe_intermediate_size,
                    .experts = c.n_routed_experts,
                    .top_k = c.num_experts_per_tok,
                    .norm_topk_prob = c.norm_topk_prob,
                    .scoring = SparseMoE::Scoring::kSigmoid,
                    .score_bias = true,
                    .groups = c.n_group,
                    .topk_groups = c.topk_group,
                    .scaling = float(c.routed_scaling_factor)};
      if (c.n_shared_experts > 0)
        moe.shared = GatedMLP{c.hidden_size, c.moe_intermediate_size * c.n_shared_experts};
      blk.moe = moe;
    }
    return m;
  }
  bool ignorable(const Glm4MoeConfig& c, const std::string& name) const override {
    // The MTP layers follow the decoder's: model.layers.{num_hidden_layers + i}.
    const std::string layers = "model.layers.";
    if (!name.starts_with(layers)) return false;
    const size_t dot = name.find('.', layers.size());
    const std::string index = name.substr(layers.size(), dot - layers.size());
    if (index.empty() || index.size() > 6 || index.find_first_not_of("0123456789") != index.npos)
      return false;
    return std::stoll(index) >= c.num_hidden_layers;
  }

 private:
  static void check_groups(const Glm4MoeConfig& c, const std::string& where) {
    if (c.n_routed_experts % c.n_group != 0)
      throw FormatError(where + ": n_routed_experts (" + std::to_string(c.n_routed_experts) +
                        ") must be a multiple of n_group (" + std::to_string(c.n_group) + ")");
    const int64_t per = c.n_routed_experts / c.n_group;
    if (c.n_group > 1 && per < 2)
      throw FormatError(where +
                        ": each of the n_group groups scores its two best experts, so it "
                        "needs at least 2 of the n_routed_experts; got " +
                        std::to_string(per));
    if (c.num_experts_per_tok > c.topk_group * per)
      throw FormatError(where + ": num_experts_per_tok (" + std::to_string(c.num_experts_per_tok) +
                        ") is more than the " + std::to_string(c.topk_group * per) +
                        " experts of the topk_group groups a token may use");
  }
};

}  // namespace

TFORMERS_REGISTER_ARCHITECTURE("Glm4MoeForCausalLM", Glm4MoeForCausalLM);

}  // namespace tformers::models
