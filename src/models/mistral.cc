// MistralForCausalLM (Mistral 7B, Mistral Small, Ministral): the Llama decoder without biases,
// with head_dim from config.json when set (Mistral Small's 128 is not hidden_size / heads) and,
// when sliding_window is set, the same window on every layer (Mistral 7B v0.1's 4096; null in
// the later releases).
#include "models/layers.h"
#include "tformers/error.h"

namespace tformers::models {

namespace {

struct MistralConfig : DecoderConfig {
  int64_t sliding_window = 0;  // 0: full attention
};

class MistralForCausalLM : public DecoderArchitecture<MistralConfig> {
 public:
  void read(const io::Json& j, const std::string& where, MistralConfig& c) const override {
    read_decoder_config(j, where, c);
    c.rope = read_rope(j, where, c.head_dim, 10000.0, false);
    c.sliding_window = io::get_or<int64_t>(j, "sliding_window", 0, where);
    if (c.sliding_window < 0)
      throw FormatError(where + ": field 'sliding_window' must be positive or null, got " +
                        std::to_string(c.sliding_window));
  }
  DecoderModel model(const MistralConfig& c) const override {
    DecoderModel m = llama_model(c);
    for (DecoderBlock& blk : m.blocks) blk.attn.sliding_window = c.sliding_window;
    return m;
  }
};

}  // namespace

TFORMERS_REGISTER_ARCHITECTURE("MistralForCausalLM", MistralForCausalLM);

}  // namespace tformers::models
