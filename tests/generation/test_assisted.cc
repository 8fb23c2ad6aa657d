// Assisted generation (generation/draft_model.h and generate()'s assistant_model): greedy output
// unchanged whatever the assistant proposes, in fewer steps of the main model when it proposes
// well, and clear refusals of what cannot be checked.
#include <gtest/gtest.h>

#include "models/causal_lm_impl.h"
#include "tformers/error.h"
#include "tformers/generation.h"
#include "tformers/model.h"

namespace tformers {
namespace {

using V = std::vector<int32_t>;

CausalLM load(const std::string& dir) {
  return AutoModelForCausalLM::from_pretrained(dir, {.dtype = float32});
}

const std::string kData = std::string(TFORMERS_TEST_DATA) + "/models/";
const GenerationConfig kPlain{
    .max_new_tokens = 24, .do_sample = false, .eos_token_id = std::vector<int64_t>{}};

// The main model's steps (its cache writes) for one call.
uint64_t steps_of(CausalLM& lm, const std::function<void()>& call) {
  const uint64_t before = models::state_of(lm).cache_writes;
  call();
  return models::state_of(lm).cache_writes - before;
}

// An assistant that agrees with the model (the same checkpoint, loaded again) has its proposals
// kept: fewer steps. One that rarely agrees (another tiny model) changes nothing but the
// steps. Either way the tokens are greedy search's, also with a short num_assistant_tokens and
// with the confidence threshold off.
TEST(Assisted, GreedyOutputIsUnchangedWhateverTheAssistantProposes) {
  CausalLM lm = load(kData + "hf-llama"), twin = load(kData + "hf-llama"),
           other = load(kData + "tiny-llama");
  const V prompt = {1, 93, 211, 7, 400, 12};
  GenerateOutput want;
  const uint64_t plain = steps_of(lm, [&] { want = generate(lm, {prompt}, kPlain); });
  GenerationConfig few = kPlain;
  few.num_assistant_tokens = 3;
  few.assistant_confidence_threshold = 0.0;
  for (const auto& [assistant, config] : {std::pair{&twin, kPlain}, std::pair{&other, kPlain},
                                          std::pair{&twin, few}, std::pair{&other, few}}) {
    GenerateOutput got;
    const uint64_t steps = steps_of(
        lm, [&] { got = generate(lm, {prompt}, config, {}, nullptr, {}, nullptr, assistant); });
    EXPECT_EQ(got.sequences, want.sequences);
    EXPECT_GT(got.draft_tokens, 0);
    EXPECT_LE(got.accepted_draft_tokens, got.draft_tokens);
    if (assistant == &twin) EXPECT_GT(got.accepted_draft_tokens, 0);
    // The tiny model's choices are seldom 0.4 likely: by default its twin stops at its first
    // proposal, and the step takes two tokens; without the threshold it proposes three.
    const bool threshold = !config.assistant_confidence_threshold;
    if (assistant == &twin) EXPECT_LE(steps, threshold ? plain / 2 + 1 : plain / 3) << steps;
  }
}

TEST(Assisted, RefusesWhatItCannotCheck) {
  CausalLM lm = load(kData + "tiny-qwen3"), assistant = load(kData + "tiny-llama");
  const GenerationConfig config{.max_new_tokens = 4};
  auto with = [&](CausalLM* a, const GenerationConfig& c, std::vector<V> prompts) {
    return [&lm, a, c, prompts] { generate(lm, prompts, c, {}, nullptr, {}, nullptr, a); };
  };
  EXPECT_THROW(with(&assistant, config, {{1, 2, 3}, {4, 5, 6}})(), InvalidArgumentError);
  GenerationConfig sampled = config;
  sampled.do_sample = true;
  EXPECT_THROW(with(&assistant, sampled, {{1, 2, 3}})(), UnsupportedError);
  GenerationConfig lookup = config;
  lookup.prompt_lookup_num_tokens = 2;
  EXPECT_THROW(with(&assistant, lookup, {{1, 2, 3}})(), InvalidArgumentError);
  EXPECT_THROW(with(&lm, config, {{1, 2, 3}})(), InvalidArgumentError);
  CausalLM hybrid = load(kData + "hf-qwen3-5");
  EXPECT_THROW(with(&hybrid, config, {{1, 2, 3}})(), UnsupportedError);
  CausalLM kjv = load(std::string(TFORMERS_SOURCE_DIR) + "/models/kjv-fortunes-tiny");
  try {
    with(&kjv, config, {{1, 2, 3}})();
    ADD_FAILURE() << "an assistant of another vocabulary was taken";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("must share the model's tokenizer"), std::string::npos);
  }
  GenerationConfig bad = config;
  bad.num_assistant_tokens = 0;
  EXPECT_THROW(with(&assistant, bad, {{1, 2, 3}})(), InvalidArgumentError);
}

}  // namespace
}  // namespace tformers
