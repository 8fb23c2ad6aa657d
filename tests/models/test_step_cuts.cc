// One prompt's logits do not depend on how it is cut into steps, for the models whose layers keep
// more than one kind of state: recurrent states (Qwen3-Next, Qwen3.5), sliding windows beside
// full attention, caches shared between layers (Gemma 4).
#include <gtest/gtest.h>

#include "golden_util.h"
#include "tformers/model.h"

namespace tformers {
namespace {

using testing::model_dir;
using testing::random_ids;
using testing::row_error;

// The logits of every position of `ids`, fed `chunk` tokens per forward() call.
std::vector<float> logits_in_chunks(CausalLM& lm, const std::vector<int32_t>& ids, int64_t chunk) {
  lm.reset_cache(1, 256);
  std::vector<float> out;
  for (int64_t at = 0; at < int64_t(ids.size()); at += chunk) {
    const int64_t n = std::min<int64_t>(chunk, int64_t(ids.size()) - at);
    ForwardArgs a;
    a.input_ids = Tensor::from_vector<int32_t>(
        {1, n}, DType::i32, std::vector<int32_t>(ids.begin() + at, ids.begin() + at + n));
    a.cache_position = at;
    a.logits_to_keep = 0;
    const std::vector<float> part = lm.forward(a).to_f32_vector();
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

class StepCuts : public ::testing::TestWithParam<const char*> {};

// 200 tokens at once, in chunks of 7, and one at a time give the same logits: the chunked,
// single-step and token-by-token forms of the delta rule and the convolution's window agree, and
// sliding windows, KV-shared layers and per-layer inputs read the cache as a whole prompt would.
TEST_P(StepCuts, PrefillInOneStepEqualsChunksOf7AndTokenByToken) {
  CausalLM lm = AutoModelForCausalLM::from_pretrained(model_dir(GetParam()), {.dtype = float32});
  const int64_t V = lm.config().vocab_size, T = 200;
  const std::vector<int32_t> ids = random_ids(T, V, 11);
  const std::vector<float> whole = logits_in_chunks(lm, ids, T);
  for (int64_t chunk : {7, 1}) {
    const std::vector<float> cut = logits_in_chunks(lm, ids, chunk);
    ASSERT_EQ(cut.size(), whole.size());
    double worst = 0;
    for (int64_t t = 0; t < T; ++t)
      worst = std::max(
          worst, row_error(cut.data() + t * V,
                           std::vector<float>(whole.begin() + t * V, whole.begin() + (t + 1) * V)));
    EXPECT_LT(worst, 1e-4) << GetParam() << " in chunks of " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, StepCuts,
                         ::testing::Values("hf-qwen3-next", "hf-qwen3-5", "hf-qwen3-5-moe",
                                           "hf-qwen3-5-vl", "hf-gemma4", "hf-gemma4-moe",
                                           "hf-gemma3", "hf-gpt-oss"),
                         [](const auto& info) { return testing::test_name_of(info.param); });

}  // namespace
}  // namespace tformers
