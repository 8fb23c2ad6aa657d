// Qwen3MoeForCausalLM (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (q_norm and k_norm
// before RoPE) with a mixture of experts in place of the MLP on every decoder_sparse_step-th
// layer that mlp_only_layers does not name, as Transformers' Qwen3MoeDecoderLayer decides.
#include <algorithm>
#include <tuple>

#include "models/layers.h"
#include "tformers/error.h"

namespace tformers::models {

namespace {

struct Qwen3MoeConfig : DecoderConfig {
  bool attention_bias = false;
  int64_t num_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0;
  int64_t decoder_sparse_step = 1;
  bool norm_topk_prob = false;
  std::vector<int64_t> mlp_only_layers;
};

class Qwen3MoeForCausalLM : public DecoderArchitecture<Qwen3MoeConfig> {
 public:
  void read(const io::Json& j, const std::string& where, Qwen3MoeConfig& c) const override {
    read_decoder_config(j, where, c, 128);
    c.rope = read_rope(j, where, c.head_dim, 10000.0, false);
    c.attention_bias = io::get_or<bool>(j, "attention_bias", false, where);
    // Transformers 5 names the expert count num_experts in its arguments and num_local_experts
    // in the file it writes.
    std::tie(c.num_experts, c.num_experts_per_tok) = read_expert_counts(j, where, "num_experts");
    c.moe_intermediate_size = io::get_int_in(j, "moe_intermediate_size", 1, 1 << 20, where);
    c.decoder_sparse_step = io::get_int_in_or(j, "decoder_sparse_step", 1, 1, 1 << 16, where);
    c.norm_topk_prob = io::get_or<bool>(j, "norm_topk_prob", false, where);
    c.mlp_only_layers = io::get_or<std::vector<int64_t>>(j, "mlp_only_layers", {}, where);
    if (io::get_or<bool>(j, "use_sliding_window", false, where))
      throw UnsupportedError(where +
                             ": use_sliding_window=true is not supported for Qwen3-MoE; set it to "
                             "false (the released checkpoints use full attention)");
  }
  DecoderModel model(const Qwen3MoeConfig& c) const override {
    DecoderModel m = llama_model(c);
    for (size_t l = 0; l < m.blocks.size(); ++l) {
      DecoderBlock& blk = m.blocks[l];
      blk.attn.qkv_bias = blk.attn.o_bias = c.attention_bias;
      blk.attn.qk_norm = RMSNorm{c.head_dim, float(c.rms_norm_eps)};
      const bool dense =
          std::count(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), int64_t(l)) > 0 ||
          (int64_t(l) + 1) % c.decoder_sparse_step != 0;
      if (!dense)
        blk.moe = SparseMoE{.hidden = c.hidden_size,
                            .intermediate = c.moe_intermediate_size,
                            .experts = c.num_experts,
                            .top_k = c.num_experts_per_tok,
                            .norm_topk_prob = c.norm_topk_prob};
    }
    return m;
  }
};

}  // namespace

TFORMERS_REGISTER_ARCHITECTURE("Qwen3MoeForCausalLM", Qwen3MoeForCausalLM);

}  // namespace tformers::models
