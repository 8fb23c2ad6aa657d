// Logits and greedy tokens of the tiny checkpoints against Transformers itself (goldens from
// tools/reference/make_goldens.py), in float32 and bfloat16 (and float16 against float32),
// single and sharded files, tied and untied, hand-made and saved by Transformers.
#include <gtest/gtest.h>

#include "golden_util.h"
#include "tformers/model.h"

namespace tformers {
namespace {

using testing::load_goldens;
using testing::model_dir;
using testing::prefill_logits;
using testing::row_error;

class Golden : public ::testing::TestWithParam<std::string> {};

// f16 keeps 11 significant bits to bf16's 8: the bfloat16 bound below (2e-2 from the exact
// model) over 8.
constexpr double kF16Tolerance = 2.5e-3;

TEST_P(Golden, Float32LogitsAndGreedyMatchTransformers) {
  const std::string name = GetParam();
  CausalLM lm = AutoModelForCausalLM::from_pretrained(model_dir(name),
                                                      {.dtype = float32, .device_map = "cpu"});
  for (const auto& c : load_goldens(name, "float32")) {
    Tensor logits = prefill_logits(lm, c.input_ids);
    const int64_t V = lm.config().vocab_size;
    ASSERT_EQ(logits.numel(), int64_t(c.logits.size()) * V);
    for (size_t t = 0; t < c.logits.size(); ++t)
      EXPECT_LT(row_error(logits.data<float>() + t * V, c.logits[t]), 1e-4)
          << name << " prompt of " << c.input_ids.size() << " tokens, position " << t;
    // The goldens' greedy runs never stop at eos (hf-qwen2's reaches it): an empty eos list.
    auto out = lm.generate({c.input_ids}, {.max_new_tokens = int64_t(c.greedy.size()),
                                           .eos_token_id = std::vector<int64_t>{}});
    std::vector<int32_t> generated(out[0].begin() + c.input_ids.size(), out[0].end());
    EXPECT_EQ(generated, c.greedy) << name << " prompt of " << c.input_ids.size() << " tokens";
  }
}

TEST_P(Golden, Bfloat16LogitsMatchTransformers) {
  const std::string name = GetParam();
  CausalLM lm = AutoModelForCausalLM::from_pretrained(model_dir(name),
                                                      {.dtype = bfloat16, .device_map = "cpu"});
  auto f32 = load_goldens(name, "float32");
  auto bf16 = load_goldens(name, "bfloat16");
  ASSERT_EQ(f32.size(), bf16.size());
  // gpt-oss's clamped SwiGLU (limit 1 in the tiny model) and its top-4 routing turn bf16 weight
  // rounding into steps rather than a smooth error: Transformers' own bf16 run differs from its
  // float32 one by up to 0.031 (ours 0.022, measured 2026-12-07).
  const bool gpt_oss = name.find("gpt-oss") != std::string::npos;
  // The hybrids (Gated DeltaNet beside attention) normalise each head's output, often a small
  // sum of cancelling terms in a random tiny model, so rounding moves them far more: bf16 caches
  // and weights put ours 0.064 (hf-qwen3-5) to 0.31 (hf-qwen3-5-moe, where a flipped route
  // carries on through the recurrent state) from the exact model, and Transformers' own bf16 run
  // is 0.12 to 0.56 from its float32 one (measured 2026-12-07). The float32 test holds them to
  // 1e-4.
  const bool hybrid =
      name.find("qwen3-next") != std::string::npos || name.find("qwen3-5") != std::string::npos;
  // Gemma 4 rounds at more points (per-layer inputs, a norm on every q, k and v head, unscaled
  // scores): ours 0.028 from the exact model, Transformers' own bf16 run 0.041 from its float32
  // one (hf-gemma4, measured 2026-12-08).
  const bool gemma4 = name.find("gemma4") != std::string::npos;
  const bool routed = gpt_oss || hybrid || name.find("moe") != std::string::npos;
  const double exact_bound = hybrid ? 0.4 : gemma4 ? 4e-2 : gpt_oss ? 3e-2 : 2e-2;
  for (size_t i = 0; i < f32.size(); ++i) {
    Tensor logits = prefill_logits(lm, f32[i].input_ids);
    const int64_t V = lm.config().vocab_size;
    for (size_t t = 0; t < f32[i].logits.size(); ++t) {
      const float* row = logits.data<float>() + t * V;
      // bf16 weights with f32 math: within 2e-2 of the exact (f32) model. Against PyTorch's
      // all-bf16 computation the rounding points differ, so the reference README measures a
      // correct implementation at up to ~2.3e-2 there: 5e-2.
      EXPECT_LT(row_error(row, f32[i].logits[t]), exact_bound) << name << " position " << t;
      // A mixture of experts routes each token by a discrete top-k: where PyTorch's bf16 router
      // logits round a near-tie the other way it picks another expert (hf-qwen3-moe: 0.15 at
      // one position), so for it only the bound against the exact model holds.
      if (!routed) {
        EXPECT_LT(row_error(row, bf16[i].logits[t]), 5e-2) << name << " position " << t;
      }
    }
    // Greedy tokens agree with the bf16 golden until the first near-tie.
    auto out = lm.generate({bf16[i].input_ids}, {.max_new_tokens = int64_t(bf16[i].greedy.size()),
                                                 .eos_token_id = std::vector<int64_t>{}});
    ASSERT_EQ(out[0].size(), bf16[i].input_ids.size() + bf16[i].greedy.size()) << name;
    for (size_t k = 0; k < bf16[i].greedy.size(); ++k) {
      if (bf16[i].greedy_margins[k] < 0.25f) break;  // a near-tie: bf16 rounding may flip it
      EXPECT_EQ(out[0][bf16[i].input_ids.size() + k], bf16[i].greedy[k]) << name << " step " << k;
      if (out[0][bf16[i].input_ids.size() + k] != bf16[i].greedy[k]) break;
    }
  }
}

// float16 weights with float32 math (the CPU backend's float16): within f16's rounding of the
// exact model, in a prefill and in the decode step after it (which reads the keys and values
// the prefill cached).
TEST_P(Golden, Float16LogitsMatchFloat32) {
  const std::string name = GetParam();
  CausalLM lm = AutoModelForCausalLM::from_pretrained(model_dir(name),
                                                      {.dtype = float16, .device_map = "cpu"});
  EXPECT_EQ(lm.dtype(), float16);
  const int64_t V = lm.config().vocab_size;
  // The hybrids' and Gemma 4's rounding sensitivity (above): 6.3e-3 measured on hf-qwen3-5,
  // 3.0e-3 on hf-gemma4.
  const bool sensitive =
      name.find("qwen3-5") != std::string::npos ||
      (name.find("gemma4") != std::string::npos && name.find("moe") == std::string::npos);
  const double bound = sensitive ? 1e-2 : kF16Tolerance;
  for (const auto& c : load_goldens(name, "float32")) {
    const Tensor logits = prefill_logits(lm, c.input_ids);
    for (size_t t = 0; t < c.logits.size(); ++t)
      EXPECT_LT(row_error(logits.data<float>() + t * V, c.logits[t]), bound)
          << name << " prompt of " << c.input_ids.size() << " tokens, position " << t;
    const int64_t T = int64_t(c.input_ids.size());
    if (T < 2) continue;
    lm.reset_cache(1, T);
    ForwardArgs a;
    a.input_ids = Tensor::from_vector<int32_t>(
        {1, T - 1}, DType::i32, std::vector<int32_t>(c.input_ids.begin(), c.input_ids.end() - 1));
    lm.forward(a);
    a.input_ids = Tensor::from_vector<int32_t>({1, 1}, DType::i32, {c.input_ids.back()});
    a.cache_position = T - 1;
    const Tensor last = lm.forward(a);
    EXPECT_LT(row_error(last.data<float>(), c.logits.back()), bound) << name << " decode";
  }
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

// The hand-made checkpoints (tools/reference/make_tiny_models.py, older config layout).
INSTANTIATE_TEST_SUITE_P(TinyModels, Golden,
                         ::testing::Values("tiny-qwen3", "tiny-qwen3-sharded", "tiny-qwen2",
                                           "tiny-llama", "tiny-llama-sharded", "tiny-mistral",
                                           "tiny-glm4", "tiny-glm", "tiny-gemma3",
                                           "tiny-llama-longrope"),
                         param_name);

// Checkpoints that Transformers 5 itself built and saved (tools/reference/make_hf_models.py):
// its config layout (rope_parameters, dtype, layer_types) and its tensor names.
INSTANTIATE_TEST_SUITE_P(HfModels, Golden,
                         ::testing::Values("hf-llama", "hf-qwen2", "hf-qwen3", "hf-mistral",
                                           "hf-glm", "hf-glm4", "hf-gemma3", "hf-qwen3-moe",
                                           "hf-mixtral", "hf-glm4-moe", "hf-gpt-oss",
                                           "hf-gpt-oss-mxfp4", "hf-qwen3-next", "hf-qwen3-5",
                                           "hf-qwen3-5-moe", "hf-qwen3-5-vl", "hf-gemma4",
                                           "hf-gemma4-moe", "hf-gemma4-vl"),
                         param_name);

}  // namespace
}  // namespace tformers
