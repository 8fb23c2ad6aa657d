// tformers::generate(): the sequences CausalLM::generate returns, plus why each row ended.
#include <gtest/gtest.h>

#include "tformers/model.h"

namespace tformers {
namespace {

CausalLM tiny() {
  return AutoModelForCausalLM::from_pretrained(
      std::string(TFORMERS_TEST_DATA) + "/models/tiny-qwen3",
      {.dtype = float32, .device_map = "cpu"});
}

TEST(GenerateOutput, FinishReasons) {
  CausalLM lm = tiny();
  const std::vector<int32_t> prompt = {1, 17, 300, 45};
  GenerateOutput full = generate(lm, {prompt}, {.max_new_tokens = 5});
  EXPECT_EQ(full.finish_reasons, std::vector<std::string>{"length"});
  EXPECT_EQ(full.sequences, lm.generate({prompt}, {.max_new_tokens = 5}));
  EXPECT_TRUE(full.sequences_scores.empty());

  // The second generated token as eos: the row stops there.
  GenerationConfig eos{.max_new_tokens = 5};
  eos.eos_token_id = std::vector<int64_t>{full.sequences[0][prompt.size() + 1]};
  GenerateOutput stopped = generate(lm, {prompt}, eos);
  EXPECT_EQ(stopped.finish_reasons, std::vector<std::string>{"stop"});
  EXPECT_EQ(stopped.sequences[0].size(), prompt.size() + 2);

  int calls = 0;
  GenerateOutput cut =
      generate(lm, {prompt}, {.max_new_tokens = 5}, [&](int64_t, int32_t) { return ++calls < 2; });
  EXPECT_EQ(cut.finish_reasons, std::vector<std::string>{"callback"});
  EXPECT_EQ(cut.sequences[0].size(), prompt.size() + 2);
}

}  // namespace
}  // namespace tformers
