// Prompt lookup decoding (generation/prompt_lookup.h and generate()): its proposals as
// Transformers' PromptLookupCandidateGenerator makes them, and greedy output unchanged by it in
// fewer steps.
#include <gtest/gtest.h>

#include "generation/prompt_lookup.h"
#include "models/causal_lm_impl.h"
#include "tformers/error.h"
#include "tformers/generation.h"
#include "tformers/model.h"

namespace tformers {
namespace {

using generation::prompt_lookup;
using V = std::vector<int32_t>;

TEST(PromptLookup, TheEarliestOccurrenceOfTheLongestRecurringNgram) {
  // "7 8" recurs at 1 and 5: the earliest is followed by 9 4 7.
  EXPECT_EQ(prompt_lookup(V{1, 7, 8, 9, 4, 7, 8, 2, 7, 8}, 3, 2), (V{9, 4, 7}));
  // Capped at the sequence's end, and at `count`.
  EXPECT_EQ(prompt_lookup(V{5, 6, 1, 5, 6}, 4, 2), (V{1, 5, 6}));
  EXPECT_EQ(prompt_lookup(V{5, 6, 1, 5, 6}, 1, 2), (V{1}));
  // No bigram recurs: the last token alone.
  EXPECT_EQ(prompt_lookup(V{3, 9, 8, 4, 9}, 2, 2), (V{8, 4}));
  // Nothing recurs, nothing asked, a single token.
  EXPECT_TRUE(prompt_lookup(V{1, 2, 3, 4}, 3, 2).empty());
  EXPECT_TRUE(prompt_lookup(V{1, 2, 1, 2}, 0, 2).empty());
  EXPECT_TRUE(prompt_lookup(V{1}, 3, 2).empty());
}

// The shipped model (trained, so its choices have margins) and a tiny random one, each on a
// prompt whose continuation repeats it: the same tokens as greedy search, in fewer steps.
TEST(PromptLookup, GreedyOutputIsUnchangedInFewerSteps) {
  struct Case {
    std::string dir;
    V prompt;
  };
  const V verse = {319, 259, 378, 417, 11, 92, 240, 19, 388, 112, 53, 301, 44, 17};
  V repeated = verse;
  repeated.insert(repeated.end(), verse.begin(), verse.begin() + 5);
  for (const Case& c :
       {Case{std::string(TFORMERS_SOURCE_DIR) + "/models/kjv-fortunes-tiny", repeated},
        Case{std::string(TFORMERS_TEST_DATA) + "/models/hf-llama",
             V{5, 6, 7, 8, 9, 10, 5, 6, 7}}}) {
    CausalLM lm = AutoModelForCausalLM::from_pretrained(c.dir, {.dtype = float32});
    auto& state = models::state_of(lm);
    GenerationConfig plain{
        .max_new_tokens = 24, .do_sample = false, .eos_token_id = std::vector<int64_t>{}};
    const uint64_t before = state.cache_writes;
    const GenerateOutput want = generate(lm, {c.prompt}, plain);
    const uint64_t plain_steps = state.cache_writes - before;
    GenerationConfig lookup = plain;
    lookup.prompt_lookup_num_tokens = 6;
    const uint64_t middle = state.cache_writes;
    const GenerateOutput got = generate(lm, {c.prompt}, lookup);
    EXPECT_EQ(got.sequences, want.sequences) << c.dir;
    EXPECT_LT(state.cache_writes - middle, plain_steps) << c.dir << ": no proposal was kept";
  }
}

TEST(PromptLookup, RefusesWhatItCannotCheck) {
  CausalLM lm = AutoModelForCausalLM::from_pretrained(
      std::string(TFORMERS_TEST_DATA) + "/models/tiny-qwen3", {.dtype = float32});
  const GenerationConfig lookup{.max_new_tokens = 4, .prompt_lookup_num_tokens = 3};
  EXPECT_THROW(generate(lm, {{1, 2, 3}, {4, 5, 6}}, lookup), InvalidArgumentError);
  GenerationConfig sampled = lookup;
  sampled.do_sample = true;
  EXPECT_THROW(generate(lm, {{1, 2, 3}}, sampled), UnsupportedError);
  CausalLM hybrid = AutoModelForCausalLM::from_pretrained(
      std::string(TFORMERS_TEST_DATA) + "/models/hf-qwen3-5", {.dtype = float32});
  EXPECT_THROW(generate(hybrid, {{1, 2, 3}}, lookup), UnsupportedError);
}

}  // namespace
}  // namespace tformers
