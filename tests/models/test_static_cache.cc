// The static cache and the compile cache: prefill of N tokens then K single-token steps gives
// the logits of one prefill of N+K, and generation compiles exactly one prefill and one decode
// graph however many tokens it produces.
#include <gtest/gtest.h>

#include "backends/compile_cache.h"
#include "golden_util.h"
#include "tformers/error.h"
#include "tformers/model.h"

namespace tformers {
namespace {

using testing::model_dir;
using testing::row_error;

TEST(StaticCache, PrefillThenDecodeEqualsOnePrefill) {
  for (const char* name : {"tiny-qwen3", "tiny-llama"}) {
    CausalLM lm = AutoModelForCausalLM::from_pretrained(model_dir(name), {.dtype = float32});
    const std::vector<int32_t> ids = {5, 77, 300, 12, 9, 401, 23, 23, 150, 8, 77, 499};
    const int64_t N = 5, K = int64_t(ids.size()) - N, V = lm.config().vocab_size;
    const int64_t S = 32;  // larger than used: unused slots must not matter

    lm.reset_cache(1, S);
    ForwardArgs full;
    full.input_ids = Tensor::from_vector<int32_t>({1, N + K}, DType::i32, ids);
    full.logits_to_keep = 0;
    std::vector<float> expect = lm.forward(full).to_f32_vector();

    ForwardArgs pre;
    pre.input_ids = Tensor::from_vector<int32_t>(
        {1, N}, DType::i32, std::vector<int32_t>(ids.begin(), ids.begin() + N));
    pre.logits_to_keep = 0;
    Tensor first = lm.forward(pre);
    for (int64_t t = 0; t < N; ++t)
      EXPECT_LT(row_error(first.data<float>() + t * V,
                          std::vector<float>(expect.begin() + t * V, expect.begin() + (t + 1) * V)),
                1e-5)
          << name << " prefill position " << t;
    for (int64_t k = 0; k < K; ++k) {
      ForwardArgs step;
      step.input_ids = Tensor::from_vector<int32_t>({1, 1}, DType::i32, {ids[N + k]});
      step.cache_position = N + k;
      Tensor logits = lm.forward(step);
      const int64_t t = N + k;
      EXPECT_LT(row_error(logits.data<float>(),
                          std::vector<float>(expect.begin() + t * V, expect.begin() + (t + 1) * V)),
                1e-5)
          << name << " decode position " << t;
    }
  }
}

TEST(CompileCache, GenerateCompilesOnePrefillAndOneDecodeGraph) {
  backends::CompileCache::global().clear();
  CompileStats global_before = compile_stats();
  CausalLM lm = AutoModelForCausalLM::from_pretrained(model_dir("tiny-qwen3"), {.dtype = float32});
  auto out = lm.generate({{1, 2, 3, 4, 5}}, {.max_new_tokens = 32});
  EXPECT_EQ(out[0].size(), 5u + 32u);
  EXPECT_EQ(lm.compile_stats().compiles, 2u);
  EXPECT_EQ(compile_stats().compiles - global_before.compiles, 2u);

  // Same shapes again: nothing compiles; both steps are cache hits.
  uint64_t hits = lm.compile_stats().hits;
  lm.generate({{9, 8, 7, 6, 5}}, {.max_new_tokens = 32});
  EXPECT_EQ(lm.compile_stats().compiles, 2u);
  EXPECT_EQ(lm.compile_stats().hits, hits + 2);

  // A second model with the same graph finds the executables in the process-wide cache.
  CausalLM other =
      AutoModelForCausalLM::from_pretrained(model_dir("tiny-qwen3"), {.dtype = float32});
  other.generate({{1, 2, 3, 4, 5}}, {.max_new_tokens = 32});
  EXPECT_EQ(other.compile_stats().compiles, 0u);
  EXPECT_EQ(compile_stats().compiles - global_before.compiles, 2u);
}

TEST(StaticCache, ForwardRejectsWhatDoesNotFit) {
  CausalLM lm = AutoModelForCausalLM::from_pretrained(model_dir("tiny-qwen3"), {.dtype = float32});
  ForwardArgs a;
  a.input_ids = Tensor::from_vector<int32_t>({1, 3}, DType::i32, {1, 2, 3});
  EXPECT_THROW(lm.forward(a), InvalidArgumentError);  // no cache yet
  lm.reset_cache(1, 4);
  a.cache_position = 2;
  EXPECT_THROW(lm.forward(a), InvalidArgumentError);  // 2 + 3 > 4
  a.cache_position = 0;
  a.input_ids = Tensor::from_vector<int32_t>({1, 3}, DType::i32, {1, 512, 3});
  try {
    lm.forward(a);
    FAIL() << "token id 512 is outside a 512-entry vocabulary";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("512"), std::string::npos) << e.what();
  }
  EXPECT_THROW(lm.generate({{}}, {.max_new_tokens = 3}), InvalidArgumentError);
  EXPECT_THROW(lm.generate({{1, 2}}, {.max_new_tokens = 0}), InvalidArgumentError);
}

}  // namespace
}  // namespace tformers
