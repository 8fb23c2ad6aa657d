// Models with linear-attention layers (Qwen3-Next, Qwen3.5): their recurrent state lives in the
// static cache beside the attention layers' keys and values. Padding must leave the state alone,
// and a kept cache may only continue from everything it holds (test_step_cuts.cc: one prompt's
// logits do not depend on how it is cut into steps).
#include <gtest/gtest.h>

#include "golden_util.h"
#include "tformers/error.h"
#include "tformers/generation.h"
#include "tformers/model.h"

namespace tformers {
namespace {

using testing::model_dir;
using testing::random_ids;
using testing::row_error;

class Hybrid : public ::testing::TestWithParam<const char*> {};

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
