// Model shapes of the benchmarks, written as checkpoints with random bf16 weights.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "tformers/tensor.h"

namespace tformers::bench {

struct ModelShape {
  std::string name, arch, model_type;
  int64_t vocab, hidden, inter, layers, heads, kv_heads, head_dim;
  bool qk_norm;
  // A mixture of experts on every layer instead of the MLP (Qwen3-MoE): `experts` of `inter`
  // hidden units each, `top_k` per token, in Transformers 5's fused expert tensors.
  int64_t experts = 0, top_k = 0;
  // gpt-oss's layers instead (sinks, biases, its router and MXFP4 experts as released).
  bool gpt_oss = false;
  // Qwen3.5's hybrid instead: every fourth layer gated full attention, the others Gated DeltaNet
  // (16 key heads and 32 value heads of 128, a convolution of 4), (1 + w) norms.
  bool qwen3_5 = false;
  // Gemma 4's layers instead (add_gemma4()): five sliding layers (window 512) to one full one with
  // twice head_dim, per-layer inputs of 256, the second half of the layers KV-shared.
  bool gemma4 = false;
};

const ModelShape kQwen3{
    "qwen3-0.6b", "Qwen3ForCausalLM", "qwen3", 151936, 1024, 3072, 28, 16, 8, 128, true};
const ModelShape kLlama{
    "llama-3.2-1b", "LlamaForCausalLM", "llama", 128256, 2048, 8192, 16, 32, 8, 64, false};
// Llama 3.1 8B's shape (its head is untied; here, as in every shape, the embedding is the head).
const ModelShape kLlama8B{
    "llama-3.1-8b", "LlamaForCausalLM", "llama", 128256, 4096, 14336, 32, 32, 8, 128, false};

// Qwen3-30B-A3B's layers (128 experts of 768, 8 per token), 2 of its 48: what one of its layers
// reads and computes, at 2.6 GB of bf16 rather than 61 GB.
const ModelShape kQwen3Moe2L{"qwen3-30b-a3b-2l",
                             "Qwen3MoeForCausalLM",
                             "qwen3_moe",
                             151936,
                             2048,
                             768,
                             2,
                             32,
                             4,
                             128,
                             true,
                             128,
                             8};

// gpt-oss-20b's layers (32 experts of 2880, 4 per token, MXFP4), 2 of its 24: 1.6 GB of
// experts and a 1.2 GB bf16 embedding (its vocabulary of 201088).
const ModelShape kGptOss2L{"gpt-oss-20b-2l",
                           "GptOssForCausalLM",
                           "gpt_oss",
                           201088,
                           2880,
                           2880,
                           2,
                           64,
                           8,
                           64,
                           false,
                           32,
                           4,
                           true};
// All 24 of them, 12.8 GB: the whole model's memory (its head tied here, as in every shape).
const ModelShape kGptOss20B{
    "gpt-oss-20b", "GptOssForCausalLM", "gpt_oss", 201088, 2880, 2880, 24, 64, 8, 64, false, 32, 4,
    true};

// Qwen3.5-9B's layers (hidden 4096, MLP 12288, attention 16 heads of 256 with 4 KV heads), 4 of
// its 32: three Gated DeltaNet layers and one of attention, as each group of four holds them.
const ModelShape kQwen35_9B4L{"qwen3.5-9b-4l",
                              "Qwen3_5ForCausalLM",
                              "qwen3_5_text",
                              248320,
                              4096,
                              12288,
                              4,
                              16,
                              4,
                              256,
                              true,
                              0,
                              0,
                              false,
                              true};
// The dense model users compare it with, Qwen3-8B (36 layers), as 4 of its layers.
const ModelShape kQwen3_8B4L{
    "qwen3-8b-4l", "Qwen3ForCausalLM", "qwen3", 151936, 4096, 12288, 4, 32, 8, 128, true};

// Gemma-4-E4B's text layers (hidden 2560, MLP 10240, 8 heads on 2 KV heads of 256 in sliding
// layers, 512 in full ones; per-layer inputs of 256 from a 262144-token table), 12 of its 42: two
// groups of five sliding layers and a full one, the second group reading the first's caches, as
// E4B's last 18 layers read earlier ones'.
const ModelShape kGemma4E4B12L{.name = "gemma-4-e4b-12l",
                               .arch = "Gemma4ForCausalLM",
                               .model_type = "gemma4_text",
                               .vocab = 262144,
                               .hidden = 2560,
                               .inter = 10240,
                               .layers = 12,
                               .heads = 8,
                               .kv_heads = 2,
                               .head_dim = 256,
                               .qk_norm = true,
                               .gemma4 = true};
// The shape called `name`, or null.
inline const ModelShape* find_shape(const std::string& name) {
  for (const ModelShape* m : {&kQwen3, &kLlama, &kLlama8B, &kQwen3Moe2L, &kGptOss2L, &kGptOss20B,
                              &kQwen35_9B4L, &kQwen3_8B4L, &kGemma4E4B12L})
    if (m->name == name) return m;
  return nullptr;
}

// Qwen3.5's Gated DeltaNet dimensions in the shapes above.
constexpr int64_t kDeltaKeyHeads = 16, kDeltaValueHeads = 32, kDeltaHeadDim = 128, kDeltaConv = 4;

// config.json's fields beyond the common ones, for the shape's family.
inline std::string family_fields(const ModelShape& m) {
  if (m.gemma4) {
    std::string types;
    for (int64_t l = 0; l < m.layers; ++l)
      types += std::string(l ? ", " : "") +
               ((l + 1) % 6 ? "\"sliding_attention\"" : "\"full_attention\"");
    return ", \"layer_types\": [" + types +
           "], \"sliding_window\": 512, \"global_head_dim\": " + std::to_string(2 * m.head_dim) +
           ", \"num_kv_shared_layers\": " + std::to_string(m.layers / 2) +
           ", \"hidden_size_per_layer_input\": 256, \"vocab_size_per_layer_input\": " +
           std::to_string(m.vocab) +
           ", \"final_logit_softcapping\": 30.0, \"rope_parameters\": {\"sliding_attention\": "
           "{\"rope_type\": \"default\", \"rope_theta\": 10000.0}, \"full_attention\": "
           "{\"rope_type\": \"proportional\", \"partial_rotary_factor\": 0.25, "
           "\"rope_theta\": 1000000.0}}";
  }
  if (m.gpt_oss)
    return ", \"num_local_experts\": 32, \"num_experts_per_tok\": 4, \"sliding_window\": 128, "
           "\"quantization_config\": {\"quant_method\": \"mxfp4\"}";
  if (m.experts)
    return ", \"num_experts\": " + std::to_string(m.experts) +
           ", \"num_experts_per_tok\": " + std::to_string(m.top_k) +
           ", \"moe_intermediate_size\": " + std::to_string(m.inter) + ", \"norm_topk_prob\": true";
  if (!m.qwen3_5) return "";
  std::string types;
  for (int64_t l = 0; l < m.layers; ++l)
    types +=
        std::string(l ? ", " : "") + ((l + 1) % 4 ? "\"linear_attention\"" : "\"full_attention\"");
  return ", \"layer_types\": [" + types +
         "], \"linear_num_key_heads\": " + std::to_string(kDeltaKeyHeads) +
         ", \"linear_num_value_heads\": " + std::to_string(kDeltaValueHeads) +
         ", \"linear_key_head_dim\": " + std::to_string(kDeltaHeadDim) +
         ", \"linear_value_head_dim\": " + std::to_string(kDeltaHeadDim) +
         ", \"linear_conv_kernel_dim\": " + std::to_string(kDeltaConv) +
         ", \"partial_rotary_factor\": 0.25";
}

// Random tensors by name, from one seeded generator, saved as one safetensors file.
class RandomWeights {
 public:
  // bf16 values uniform in scale * [-1/2, 1/2).
  void add(const std::string& name, Shape shape, float scale) {
    Tensor t = Tensor::zeros(shape, DType::bf16);
    uint16_t* p = t.data<uint16_t>();
    uint32_t s = rng_() | 1;
    for (int64_t i = 0; i < t.numel(); ++i) {
      s ^= s << 13, s ^= s >> 17, s ^= s << 5;  // xorshift: fast enough for 10^9 values
      p[i] = f32_to_bf16(scale * (float(s >> 8) * 0x1p-24f - 0.5f));
    }
    tensors_.push_back({name, t});
  }
  // MXFP4 experts: random codes, exponents around 2^-7 (values up to about 0.05).
  void add_mxfp4(const std::string& name, int64_t E, int64_t N, int64_t K) {
    Tensor blocks = Tensor::zeros({E, N, K / 32, 16}, DType::u8);
    Tensor scales = Tensor::zeros({E, N, K / 32}, DType::u8);
    for (int64_t i = 0; i < blocks.numel(); ++i) blocks.data<uint8_t>()[i] = uint8_t(rng_());
    for (int64_t i = 0; i < scales.numel(); ++i)
      scales.data<uint8_t>()[i] = uint8_t(118 + rng_() % 4);
    tensors_.push_back({name + "_blocks", blocks});
    tensors_.push_back({name + "_scales", scales});
  }
  void save(const std::string& path) const { io::save_safetensors(path, tensors_); }

 private:
  std::vector<std::pair<std::string, Tensor>> tensors_;
  std::mt19937 rng_{7};
};

// Gemma 4's layers and per-layer inputs (kGemma4E4B12L): the full layers' heads twice as wide,
// the KV-shared second half without k/v projections.
inline void add_gemma4(const ModelShape& m, RandomWeights& w) {
  const int64_t h = m.hidden, per_layer = 256;
  w.add("model.embed_tokens_per_layer.weight", {m.vocab, m.layers * per_layer}, 0.1f);
  w.add("model.per_layer_model_projection.weight", {m.layers * per_layer, h}, 0.05f);
  w.add("model.per_layer_projection_norm.weight", {per_layer}, 1.0f);
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string n = "model.layers." + std::to_string(l) + ".";
    const int64_t d = (l + 1) % 6 ? m.head_dim : 2 * m.head_dim;
    for (const char* norm :
         {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
          "post_feedforward_layernorm", "post_per_layer_input_norm"})
      w.add(n + norm + ".weight", {h}, 1.0f);
    w.add(n + "self_attn.q_proj.weight", {m.heads * d, h}, 0.05f);
    w.add(n + "self_attn.q_norm.weight", {d}, 1.0f);
    if (l < m.layers / 2) {
      w.add(n + "self_attn.k_proj.weight", {m.kv_heads * d, h}, 0.05f);
      w.add(n + "self_attn.v_proj.weight", {m.kv_heads * d, h}, 0.05f);
      w.add(n + "self_attn.k_norm.weight", {d}, 1.0f);
    }
    w.add(n + "self_attn.o_proj.weight", {h, m.heads * d}, 0.05f);
    w.add(n + "mlp.gate_proj.weight", {m.inter, h}, 0.05f);
    w.add(n + "mlp.up_proj.weight", {m.inter, h}, 0.05f);
    w.add(n + "mlp.down_proj.weight", {h, m.inter}, 0.05f);
    w.add(n + "per_layer_input_gate.weight", {per_layer, h}, 0.05f);
    w.add(n + "per_layer_projection.weight", {h, per_layer}, 0.05f);
    w.add(n + "layer_scalar", {1}, 1.0f);
  }
}

// Writes config.json and random bf16 weights of the shape (tied embeddings), once.
inline void make_model(const ModelShape& m, const std::string& dir) {
  if (std::filesystem::exists(dir + "/model.safetensors")) return;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json")
      << "{\"architectures\": [\"" << m.arch << "\"], \"model_type\": \"" << m.model_type
      << "\", \"vocab_size\": " << m.vocab << ", \"hidden_size\": " << m.hidden
      << ", \"intermediate_size\": " << m.inter << ", \"num_hidden_layers\": " << m.layers
      << ", \"num_attention_heads\": " << m.heads << ", \"num_key_value_heads\": " << m.kv_heads
      << ", \"head_dim\": " << m.head_dim
      << ", \"max_position_embeddings\": 40960, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000,"
         " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"hidden_act\": \""
      << (m.gemma4 ? "gelu_pytorch_tanh" : "silu") << "\"" << family_fields(m) << "}";
  RandomWeights w;
  auto add = [&](const std::string& name, Shape shape, float scale) { w.add(name, shape, scale); };
  auto add_mxfp4 = [&](const std::string& name, int64_t E, int64_t N, int64_t K) {
    w.add_mxfp4(name, E, N, K);
  };
  const int64_t h = m.hidden, q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  add("model.embed_tokens.weight", {m.vocab, h}, 0.1f);
  if (m.gemma4) {
    add_gemma4(m, w);
    add("model.norm.weight", {h}, 1.0f);
    w.save(dir + "/model.safetensors");
    return;
  }
  // A DeltaNet layer's weights (Qwen3.5's projections).
  auto add_delta_net = [&](const std::string& n) {
    const int64_t keys = kDeltaKeyHeads * kDeltaHeadDim, values = kDeltaValueHeads * kDeltaHeadDim;
    add(n + "in_proj_qkv.weight", {2 * keys + values, h}, 0.05f);
    add(n + "in_proj_z.weight", {values, h}, 0.05f);
    add(n + "in_proj_b.weight", {kDeltaValueHeads, h}, 0.05f);
    add(n + "in_proj_a.weight", {kDeltaValueHeads, h}, 0.05f);
    add(n + "conv1d.weight", {2 * keys + values, 1, kDeltaConv}, 0.5f);
    add(n + "dt_bias", {kDeltaValueHeads}, 1.0f);
    add(n + "A_log", {kDeltaValueHeads}, 1.0f);
    add(n + "norm.weight", {kDeltaHeadDim}, 1.0f);
    add(n + "out_proj.weight", {h, values}, 0.05f);
  };
  for (int l = 0; l < m.layers; ++l) {
    std::string n = "model.layers." + std::to_string(l) + ".";
    add(n + "input_layernorm.weight", {h}, 1.0f);
    add(n + "post_attention_layernorm.weight", {h}, 1.0f);
    if (m.qwen3_5 && (l + 1) % 4) {
      add_delta_net(n + "linear_attn.");
    } else {
      add(n + "self_attn.q_proj.weight", {m.qwen3_5 ? 2 * q : q, h}, 0.05f);
      add(n + "self_attn.k_proj.weight", {kv, h}, 0.05f);
      add(n + "self_attn.v_proj.weight", {kv, h}, 0.05f);
      add(n + "self_attn.o_proj.weight", {h, q}, 0.05f);
      if (m.qk_norm) {
        add(n + "self_attn.q_norm.weight", {m.head_dim}, 1.0f);
        add(n + "self_attn.k_norm.weight", {m.head_dim}, 1.0f);
      }
    }
    if (m.gpt_oss) {
      for (const char* b : {"q_proj", "k_proj", "v_proj"})
        add(n + "self_attn." + b + ".bias", {std::string(b) == "q_proj" ? q : kv}, 0.05f);
      add(n + "self_attn.o_proj.bias", {h}, 0.05f);
      add(n + "self_attn.sinks", {m.heads}, 1.0f);
      add(n + "mlp.router.weight", {m.experts, h}, 0.05f);
      add(n + "mlp.router.bias", {m.experts}, 0.05f);
      add_mxfp4(n + "mlp.experts.gate_up_proj", m.experts, 2 * m.inter, h);
      add(n + "mlp.experts.gate_up_proj_bias", {m.experts, 2 * m.inter}, 0.05f);
      add_mxfp4(n + "mlp.experts.down_proj", m.experts, h, m.inter);
      add(n + "mlp.experts.down_proj_bias", {m.experts, h}, 0.05f);
      continue;
    }
    if (m.experts) {
      add(n + "mlp.gate.weight", {m.experts, h}, 0.05f);
      add(n + "mlp.experts.gate_up_proj", {m.experts, 2 * m.inter, h}, 0.05f);
      add(n + "mlp.experts.down_proj", {m.experts, h, m.inter}, 0.05f);
      continue;
    }
    add(n + "mlp.gate_proj.weight", {m.inter, h}, 0.05f);
    add(n + "mlp.up_proj.weight", {m.inter, h}, 0.05f);
    add(n + "mlp.down_proj.weight", {h, m.inter}, 0.05f);
  }
  add("model.norm.weight", {h}, 1.0f);
  w.save(dir + "/model.safetensors");
}

}  // namespace tformers::bench
