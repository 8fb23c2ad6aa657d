// The hybrids of Gated DeltaNet and gated full attention, as Transformers 5.23 computes them:
// Qwen3NextForCausalLM (Qwen3-Next-80B-A3B), Qwen3_5ForCausalLM and Qwen3_5MoeForCausalLM, and the
// text model of the Hub's Qwen3.5 checkpoints (Qwen3_5ForConditionalGeneration and its MoE twin,
// whose config.json nests it as text_config and whose weights live under model.language_model;
// the vision tower's weights and the multi-token-prediction layers load as known and unused).
//
// layer_types names each layer "linear_attention" (Gated DeltaNet, layers.h) or "full_attention"
// (q_norm/k_norm, partial RoPE, an output gate from a doubled q_proj); every RMSNorm but the
// DeltaNet's own scales by (1 + w). Qwen3.5's multimodal RoPE (mrope_section) rotates text tokens
// as plain RoPE, since a text token's temporal, height and width positions are all its position.
// The MLP is a mixture of experts with a shared expert behind a sigmoid gate on the layers
// decoder_sparse_step and mlp_only_layers choose (Qwen3-Next; every layer of Qwen3.5-MoE), else
// a gated MLP.
#include <algorithm>
#include <tuple>

#include "models/layers.h"
#include "tformers/error.h"

namespace tformers::models {

namespace {

struct Qwen3NextConfig : DecoderConfig {
  std::string base = "model";
  bool attention_bias = false;
  std::vector<bool> linear;  // per layer: Gated DeltaNet, else full attention
  int64_t linear_key_heads = 0, linear_value_heads = 0, linear_key_dim = 0, linear_value_dim = 0;
  int64_t conv_width = 4;
  int64_t num_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0, decoder_sparse_step = 1;
  bool norm_topk_prob = true;
  std::vector<int64_t> mlp_only_layers;
};

// layer_types, or every full_attention_interval-th layer full attention as Qwen3-Next's config
// derives them when absent.
std::vector<bool> read_linear_layers(const io::Json& j, const std::string& where, int64_t layers) {
  std::vector<bool> linear;
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const io::Json& types = j["layer_types"];
    if (!types.is_array() || int64_t(types.size()) != layers)
      throw FormatError(where + ": layer_types must be a list of " + std::to_string(layers) +
                        " entries (num_hidden_layers)");
    for (const io::Json& t : types) {
      if (t != "linear_attention" && t != "full_attention")
        throw FormatError(where + ": layer_types entries must be \"linear_attention\" or " +
                          "\"full_attention\", got " + t.dump());
      linear.push_back(t == "linear_attention");
    }
    return linear;
  }
  const int64_t every = io::get_int_in_or(j, "full_attention_interval", 4, 1, 1 << 16, where);
  for (int64_t l = 0; l < layers; ++l) linear.push_back((l + 1) % every != 0);
  return linear;
}

// kNested: the config nests the text model (text_config, model.language_model); kAllMoe: every
// layer's MLP is a mixture; kGrouped: Qwen3-Next's grouped in_proj_qkvz and in_proj_ba.
template <bool kNested, bool kAllMoe, bool kGrouped>
class Qwen3NextFamily : public DecoderArchitecture<Qwen3NextConfig> {
 public:
  void read(const io::Json& outer, const std::string& where, Qwen3NextConfig& c) const override {
    const std::string w = kNested ? where + ": text_config" : where;
    const io::Json j = kNested ? nested_text_config(outer, where) : outer;
    if (kNested) c.base = "model.language_model";
    read_decoder_config(j, w, c, 256);
    c.rope = read_rope(j, w, c.head_dim, 10000.0, false);
    c.attention_bias = io::get_or<bool>(j, "attention_bias", false, w);
    c.linear = read_linear_layers(j, w, c.num_hidden_layers);
    c.linear_key_heads = io::get_int_in(j, "linear_num_key_heads", 1, 1 << 12, w);
    c.linear_value_heads = io::get_int_in(j, "linear_num_value_heads", 1, 1 << 12, w);
    if (c.linear_value_heads % c.linear_key_heads)
      throw FormatError(w + ": linear_num_value_heads (" + std::to_string(c.linear_value_heads) +
                        ") must be a multiple of linear_num_key_heads (" +
                        std::to_string(c.linear_key_heads) + ")");
    c.linear_key_dim = io::get_int_in(j, "linear_key_head_dim", 1, 1 << 12, w);
    c.linear_value_dim = io::get_int_in(j, "linear_value_head_dim", 1, 1 << 12, w);
    c.conv_width = io::get_int_in_or(j, "linear_conv_kernel_dim", 4, 2, 64, w);
    read_experts(j, w, c);
  }

  DecoderModel model(const Qwen3NextConfig& c) const override {
    DecoderModel m = llama_model(c);
    m.base = c.base;
    m.norm.unit_offset = true;
    for (size_t l = 0; l < m.blocks.size(); ++l) {
      DecoderBlock& blk = m.blocks[l];
      blk.norm.unit_offset = true;
      if (c.linear[l]) {
        blk.linear_attn = GatedDeltaNet{.hidden = c.hidden_size,
                                        .key_heads = c.linear_key_heads,
                                        .value_heads = c.linear_value_heads,
                                        .key_dim = c.linear_key_dim,
                                        .value_dim = c.linear_value_dim,
                                        .conv_width = c.conv_width,
                                        .eps = float(c.rms_norm_eps),
                                        .grouped = kGrouped};
      } else {
        blk.attn.qkv_bias = blk.attn.o_bias = c.attention_bias;
        blk.attn.qk_norm = RMSNorm{c.head_dim, float(c.rms_norm_eps), true};
        blk.attn.output_gate = true;
      }
      if (sparse(c, int64_t(l))) blk.moe = moe(c);
    }
    return m;
  }

  bool ignorable(const Qwen3NextConfig& c, const std::string& name) const override {
    return name.starts_with("mtp.") || (kNested && name.starts_with("model.visual."));
  }

 private:
  static void read_experts(const io::Json& j, const std::string& w, Qwen3NextConfig& c) {
    const bool any = kAllMoe || io::get_int_in_or(j, "num_experts", 0, 0, 1 << 16, w) > 0;
    if (!any) return;
    std::tie(c.num_experts, c.num_experts_per_tok) = read_expert_counts(j, w, "num_experts");
    c.moe_intermediate_size = io::get_int_in(j, "moe_intermediate_size", 1, 1 << 20, w);
    c.shared_expert_intermediate_size =
        io::get_int_in(j, "shared_expert_intermediate_size", 1, 1 << 20, w);
    c.decoder_sparse_step = io::get_int_in_or(j, "decoder_sparse_step", 1, 1, 1 << 16, w);
    // Qwen3.5-MoE's router always renormalises its top k.
    c.norm_topk_prob = kAllMoe || io::get_or<bool>(j, "norm_topk_prob", true, w);
    c.mlp_only_layers = io::get_or<std::vector<int64_t>>(j, "mlp_only_layers", {}, w);
  }

  static bool sparse(const Qwen3NextConfig& c, int64_t l) {
    if (c.num_experts == 0) return false;
    if (kAllMoe) return true;
    return std::count(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), l) == 0 &&
           (l + 1) % c.decoder_sparse_step == 0;
  }

  static SparseMoE moe(const Qwen3NextConfig& c) {
    return SparseMoE{.hidden = c.hidden_size,
                     .intermediate = c.moe_intermediate_size,
                     .experts = c.num_experts,
                     .top_k = c.num_experts_per_tok,
                     .norm_topk_prob = c.norm_topk_prob,
                     .shared = GatedMLP{.hidden = c.hidden_size,
                                        .intermediate = c.shared_expert_intermediate_size},
                     .shared_name = "shared_expert",
                     .shared_gate = true};
  }
};

using Qwen3NextForCausalLM = Qwen3NextFamily<false, false, true>;
using Qwen3_5ForCausalLM = Qwen3NextFamily<false, false, false>;
using Qwen3_5ForConditionalGeneration = Qwen3NextFamily<true, false, false>;
using Qwen3_5MoeForCausalLM = Qwen3NextFamily<false, true, false>;
using Qwen3_5MoeForConditionalGeneration = Qwen3NextFamily<true, true, false>;

}  // namespace

TFORMERS_REGISTER_ARCHITECTURE("Qwen3NextForCausalLM", Qwen3NextForCausalLM);
TFORMERS_REGISTER_ARCHITECTURE("Qwen3_5ForCausalLM", Qwen3_5ForCausalLM);
TFORMERS_REGISTER_ARCHITECTURE("Qwen3_5ForConditionalGeneration", Qwen3_5ForConditionalGeneration);
TFORMERS_REGISTER_ARCHITECTURE("Qwen3_5MoeForCausalLM", Qwen3_5MoeForCausalLM);
TFORMERS_REGISTER_ARCHITECTURE("Qwen3_5MoeForConditionalGeneration",
                               Qwen3_5MoeForConditionalGeneration);

}  // namespace tformers::models
