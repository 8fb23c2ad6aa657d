// Models with linear-attention layers (Qwen3-Next, Qwen3.5): their recurrent state lives in the
// static cache beside the attention layers' keys and values. One prompt's logits must not depend
// on how it is cut into steps, padding must leave the state alone, and a kept cache may only
// continue from everything it holds.
#include <gtest/gtest.h>

#include <random>

#include "golden_util.h"
#include "tformers/error.h"
#include "tformers/generation.h"
#include "tformers/model.h"

namespace tformers {
namespace {

using testing::model_dir;
using testing::row_error;

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> id(3, int32_t(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& t : ids) t = id(gen);
  return ids;
}

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

class Hybrid : public ::testing::TestWithParam<const char*> {};

// The chunked, single-step and token-by-token forms of the delta rule and the convolution's
// window agree: 200 tokens at once, in chunks of 7, and one at a time give the same logits.
TEST_P(Hybrid, PrefillInOneStepEqualsChunksOf7AndTokenByToken) {
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

// A left-padded row of a batch gives its tokens as the row alone does: padding tokens neither
// enter the convolution's window nor the delta rule's state.
TEST_P(Hybrid, LeftPaddedRowsGenerateAsAlone) {
  CausalLM lm = AutoModelForCausalLM::from_pretrained(model_dir(GetParam()), {.dtype = float32});
  const std::vector<int32_t> shorter = random_ids(5, lm.config().vocab_size, 3);
  const std::vector<int32_t> longer = random_ids(13, lm.config().vocab_size, 4);
  const GenerationConfig config{.max_new_tokens = 8};
  const auto both = lm.generate({shorter, longer}, config);
  EXPECT_EQ(both[0], lm.generate({shorter}, config)[0]);
  EXPECT_EQ(both[1], lm.generate({longer}, config)[0]);
}

// A kept cache continues a conversation only from all of its tokens: the recurrent state cannot
// go back to a shorter prefix, so a prompt that parts from them is computed whole.
TEST_P(Hybrid, KeptCacheContinuesOnlyFromEverythingItHolds) {
  CausalLM lm = AutoModelForCausalLM::from_pretrained(model_dir(GetParam()), {.dtype = float32});
  const GenerationConfig config{.max_new_tokens = 6, .max_cache_len = 96};
  KeptCache kept;
  const std::vector<int32_t> first = random_ids(9, lm.config().vocab_size, 5);
  const GenerateOutput turn1 = generate(lm, {first}, config, {}, nullptr, {}, &kept);
  std::vector<int32_t> second = turn1.sequences[0];
  for (int32_t id : {5, 77, 301}) second.push_back(id);
  const GenerateOutput turn2 = generate(lm, {second}, config, {}, nullptr, {}, &kept);
  EXPECT_EQ(turn2.cached_prompt_tokens, int64_t(first.size() + 5));
  EXPECT_EQ(turn2.sequences, generate(lm, {second}, config).sequences);

  generate(lm, {second}, config, {}, nullptr, {}, &kept);  // kept again after the fresh call
  std::vector<int32_t> branch(second.begin(), second.begin() + 6);
  branch.push_back(499);
  const GenerateOutput turn3 = generate(lm, {branch}, config, {}, nullptr, {}, &kept);
  EXPECT_EQ(turn3.cached_prompt_tokens, 0);
  EXPECT_EQ(turn3.sequences, generate(lm, {branch}, config).sequences);
}

INSTANTIATE_TEST_SUITE_P(Models, Hybrid,
                         ::testing::Values("hf-qwen3-next", "hf-qwen3-5", "hf-qwen3-5-moe",
                                           "hf-qwen3-5-vl"),
                         [](const auto& info) { return testing::test_name_of(info.param); });

}  // namespace
}  // namespace tformers
