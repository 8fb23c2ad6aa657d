// Qwen2ForCausalLM (Qwen2, Qwen2.5): the Llama decoder with biases on the q, k and v projections
// (not on o_proj). Layers from max_window_layers on use a sliding window when
// use_sliding_window is set, or as config.json's layer_types say; the released checkpoints use
// full attention throughout.
#include "models/layers.h"

namespace tformers::models {

namespace {

struct Qwen2Config : DecoderConfig {
  std::vector<int64_t> sliding_window;  // per layer, 0: full attention
};

class Qwen2ForCausalLM : public DecoderArchitecture<Qwen2Config> {
 public:
  void read(const io::Json& j, const std::string& where, Qwen2Config& c) const override {
    read_decoder_config(j, where, c);
    c.rope = read_rope(j, where, c.head_dim, 10000.0, false);
    const bool use = io::get_or<bool>(j, "use_sliding_window", false, where);
    const int64_t window = io::get_or<int64_t>(j, "sliding_window", 0, where);
    const int64_t from = io::get_or<int64_t>(j, "max_window_layers", c.num_hidden_layers, where);
    std::vector<std::string> types(size_t(c.num_hidden_layers), "full_attention");
    if (use)
      for (int64_t l = std::max<int64_t>(from, 0); l < c.num_hidden_layers; ++l)
        types[size_t(l)] = "sliding_attention";
    c.sliding_window = read_layer_windows(j, where, types, window);
  }
  DecoderModel model(const Qwen2Config& c) const override {
    DecoderModel m = llama_model(c);
    for (size_t l = 0; l < m.blocks.size(); ++l) {
      m.blocks[l].attn.qkv_bias = true;
      m.blocks[l].attn.sliding_window = c.sliding_window[l];
    }
    return m;
  }
};

}  // namespace

TFORMERS_REGISTER_ARCHITECTURE("Qwen2ForCausalLM", Qwen2ForCausalLM);

}  // namespace tformers::models
