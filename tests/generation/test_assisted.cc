// Assisted generation (generation/draft_model.h and generate()'s assistant_model): greedy output
// unchanged whatever the assistant proposes, in fewer steps of the main model when it proposes
// well, and clear refusals of what cannot be checked.
#include <gtest/gtest.h>

#include <map>

#include "generation/speculative.h"
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

// Speculative sampling's choice is distributed as p whatever q proposed: 200,000 draws of a
// proposal from q, then the choice, against p's expected counts (chi-square, 5 degrees of
// freedom, p-value 0.001: 20.5). q puts no weight on a token p likes (reached only through the
// residual) and much on one p never takes.
TEST(Assisted, SpeculativeChoiceIsDistributedAsTheModel) {
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  const std::vector<float> p = {0.1f, 1.2f, -0.5f, 0.7f, kNone, 0.0f};
  const std::vector<float> q = {1.5f, kNone, 0.3f, 0.2f, 0.9f, -1.0f};
  generation::Sampler sampler(11);
  constexpr int kDraws = 200000;
  std::vector<int64_t> counts(p.size(), 0);
  for (int i = 0; i < kDraws; ++i)
    ++counts[size_t(generation::speculative_choice(p, q, sampler.sample(q), sampler))];
  double total = 0, chi2 = 0;
  for (float s : p) total += s == kNone ? 0.0 : std::exp(double(s));
  for (size_t i = 0; i < p.size(); ++i) {
    const double expected = kDraws * (p[i] == kNone ? 0.0 : std::exp(double(p[i])) / total);
    if (expected == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has no probability under p";
      continue;
    }
    chi2 += (double(counts[i]) - expected) * (double(counts[i]) - expected) / expected;
  }
  EXPECT_LT(chi2, 20.5);
}

// Sampling with an assistant samples the model's distribution: the first three tokens of 1,500
// seeded draws each way (top_k 2: 8 outcomes) have the same histogram as without an assistant
// (two-sample chi-square, 7 degrees of freedom, p-value 0.001: 24.3). tiny-llama's proposals are
// all rejected (the residual draws every token); the model's own weights in int8 propose nearly
// its distribution, so most are kept and a few rejected.
TEST(Assisted, SpeculativeSamplingDrawsTheModelsDistribution) {
  CausalLM lm = load(kData + "hf-llama"), other = load(kData + "tiny-llama");
  CausalLM int8 = AutoModelForCausalLM::from_pretrained(kData + "hf-llama",
                                                        {.dtype = float32, .quantize = "int8"});
  GenerationConfig config{
      .max_new_tokens = 3, .do_sample = true, .top_k = 2, .eos_token_id = std::vector<int64_t>{}};
  config.num_assistant_tokens = 2;
  config.assistant_confidence_threshold = 0.0;
  const V prompt = {1, 93, 211, 7};
  constexpr int kDraws = 1500;
  for (CausalLM* assistant : {&other, &int8}) {
    std::map<V, std::pair<int64_t, int64_t>> outcomes;
    int64_t kept = 0, drafted = 0;
    for (int i = 0; i < kDraws; ++i) {
      config.seed = uint64_t(i);
      const GenerateOutput plain = generate(lm, {prompt}, config);
      config.seed = uint64_t(i + kDraws);
      const GenerateOutput sped =
          generate(lm, {prompt}, config, {}, nullptr, {}, nullptr, assistant);
      ++outcomes[V(plain.sequences[0].begin() + 4, plain.sequences[0].end())].first;
      ++outcomes[V(sped.sequences[0].begin() + 4, sped.sequences[0].end())].second;
      kept += sped.accepted_draft_tokens;
      drafted += sped.draft_tokens;
    }
    double chi2 = 0;
    for (const auto& [tokens, n] : outcomes)
      chi2 += double((n.first - n.second) * (n.first - n.second)) / double(n.first + n.second);
    EXPECT_LE(outcomes.size(), 8u);
    EXPECT_LT(chi2, 24.3) << (assistant == &int8 ? "int8 twin" : "tiny-llama");
    if (assistant == &other) EXPECT_EQ(kept, 0);
    if (assistant == &int8) {
      EXPECT_GT(kept, drafted / 2);
      EXPECT_LT(kept, drafted);
    }
  }
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
  for (const auto& run : {std::pair{&twin, kPlain}, std::pair{&other, kPlain},
                          std::pair{&twin, few}, std::pair{&other, few}}) {
    CausalLM* assistant = run.first;
    const GenerationConfig& config = run.second;
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

// Rejected proposals leave no trace: after an assisted turn whose proposals were mostly
// rejected, the next turn of the conversation, continued on the kept cache, equals the same turn
// computed fresh.
TEST(Assisted, RejectedProposalsLeaveNoTraceInAKeptCache) {
  CausalLM lm = load(kData + "hf-llama"), other = load(kData + "tiny-llama");
  GenerationConfig config = kPlain;
  config.max_new_tokens = 12;
  config.max_cache_len = 96;
  KeptCache kept;
  const GenerateOutput turn1 =
      generate(lm, {V{1, 93, 211, 7}}, config, {}, nullptr, {}, &kept, &other);
  ASSERT_GT(turn1.draft_tokens, turn1.accepted_draft_tokens);
  V second = turn1.sequences[0];
  second.insert(second.end(), {5, 77, 301});
  const GenerateOutput turn2 = generate(lm, {second}, config, {}, nullptr, {}, &kept);
  EXPECT_GT(turn2.cached_prompt_tokens, 0);
  EXPECT_EQ(turn2.sequences, generate(lm, {second}, config).sequences);
}

TEST(Assisted, RefusesWhatItCannotCheck) {
  CausalLM lm = load(kData + "tiny-qwen3"), assistant = load(kData + "tiny-llama");
  const GenerationConfig config{.max_new_tokens = 4};
  auto with = [&](CausalLM* a, const GenerationConfig& c, std::vector<V> prompts) {
    return [&lm, a, c, prompts] { generate(lm, prompts, c, {}, nullptr, {}, nullptr, a); };
  };
  EXPECT_THROW(with(&assistant, config, {{1, 2, 3}, {4, 5, 6}})(), InvalidArgumentError);
  GenerationConfig beams = config;
  beams.num_beams = 2;
  EXPECT_THROW(with(&assistant, beams, {{1, 2, 3}})(), UnsupportedError);
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
