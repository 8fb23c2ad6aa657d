// MistralForCausalLM (Mistral 7B, Mistral Small, Ministral): the Llama decoder without biases,
// with head_dim from config.json when set (Mistral Small's 128 is not hidden_size / heads) and,
// when sliding_window is set, the same window on every layer (Mistral 7B v0.1's 4096; null in
// the later releases). MixtralForCausalLM (Mixtral 8x7B, 8x22B): Mistral's decoder with a mixture
// of experts on every layer: a softmax router, the top k renormalised, the experts' fused
// tensors as Transformers 5 holds them (mlp.gate, mlp.experts.gate_up_proj) or, as Hub
// checkpoints store them, block_sparse_moe.gate and each expert's w1 (gate), w3 (up), w2 (down).
#include <tuple>

#include "models/layers.h"
#include "tformers/error.h"

namespace tformers::models {

namespace {

struct MistralConfig : DecoderConfig {
  int64_t sliding_window = 0;  // 0: full attention
};

void read_mistral(const io::Json& j, const std::string& where, MistralConfig& c) {
  read_decoder_config(j, where, c);
  c.rope = read_rope(j, where, c.head_dim, 10000.0, false);
  c.sliding_window = io::get_or<int64_t>(j, "sliding_window", 0, where);
  if (c.sliding_window < 0)
    throw FormatError(where + ": field 'sliding_window' must be positive or null, got " +
                      std::to_string(c.sliding_window));
}

DecoderModel mistral_model(const MistralConfig& c) {
  DecoderModel m = llama_model(c);
  for (DecoderBlock& blk : m.blocks) blk.attn.sliding_window = c.sliding_window;
  return m;
}

class MistralForCausalLM : public DecoderArchitecture<MistralConfig> {
 public:
  void read(const io::Json& j, const std::string& where, MistralConfig& c) const override {
    read_mistral(j, where, c);
  }
  DecoderModel model(const MistralConfig& c) const override { return mistral_model(c); }
};

struct MixtralConfig : MistralConfig {
  int64_t num_local_experts = 0, num_experts_per_tok = 0;
};

class MixtralForCausalLM : public DecoderArchitecture<MixtralConfig> {
 public:
  void read(const io::Json& j, const std::string& where, MixtralConfig& c) const override {
    read_mistral(j, where, c);
    std::tie(c.num_local_experts, c.num_experts_per_tok) =
        read_expert_counts(j, where, "num_local_experts");
  }
  DecoderModel model(const MixtralConfig& c) const override {
    DecoderModel m = mistral_model(c);
    for (DecoderBlock& blk : m.blocks) {
      blk.moe = SparseMoE{.hidden = c.hidden_size,
                          .intermediate = c.intermediate_size,
                          .experts = c.num_local_experts,
                          .top_k = c.num_experts_per_tok,
                          .norm_topk_prob = true,
                          .hub_module = "block_sparse_moe",
                          .gate_proj = "w1",
                          .up_proj = "w3",
                          .down_proj = "w2"};
    }
    return m;
  }
};

}  // namespace

TFORMERS_REGISTER_ARCHITECTURE("MistralForCausalLM", MistralForCausalLM);
TFORMERS_REGISTER_ARCHITECTURE("MixtralForCausalLM", MixtralForCausalLM);

}  // namespace tformers::models
