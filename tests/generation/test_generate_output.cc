// tformers::generate(): the sequences CausalLM::generate returns, plus why each row ended, the
// per-step scores and logits, and cancellation by on_step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/error_of.h"
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

// A plan far beyond any machine's memory is refused before it allocates, naming its field and
// bytes; a million beams or return sequences used to grow the process past 8 GB first.
TEST(GenerateOutput, PlansBeyondMemoryAreRefusedBeforeAllocating) {
  CausalLM lm = tiny();
  const std::vector<int32_t> prompt = {1, 17, 300, 45};
  const int64_t huge = 1'000'000'000'000;
  std::string msg = testing::error_of<ResourceError>([&] {
    generate(lm, {prompt}, {.max_new_tokens = 4, .do_sample = true, .num_return_sequences = huge});
  });
  EXPECT_CONTAINS(msg, "num_return_sequences 1000000000000");
  EXPECT_CONTAINS(msg, "bytes this process can have");
  msg = testing::error_of<ResourceError>(
      [&] { generate(lm, {prompt}, {.max_new_tokens = 4, .num_beams = huge}); });
  EXPECT_CONTAINS(msg, "num_beams 1000000000000");
  EXPECT_CONTAINS(msg, "beam candidates");
  // Many prompts multiply too; so do the logits kept per step.
  const std::vector<std::vector<int32_t>> many(1000, prompt);
  msg = testing::error_of<ResourceError>([&] {
    generate(lm, many,
             {.max_new_tokens = 400,
              .do_sample = true,
              .num_return_sequences = 1'000'000,
              .output_scores = true});
  });
  EXPECT_CONTAINS(msg, "1000 prompt(s)");
  EXPECT_CONTAINS(msg, "kept per step");
  // The cache alone, as a caller of reset_cache sizes it.
  msg = testing::error_of<ResourceError>([&] { lm.reset_cache(huge, 512); });
  EXPECT_CONTAINS(msg, "batch 1000000000000 x max_cache_len 512");
}

TEST(GenerateOutput, OnStepCancelsGreedyAndBeamSearch) {
  CausalLM lm = tiny();
  const std::vector<int32_t> prompt = {1, 17, 300, 45};
  int steps = 0;
  auto two_steps = [&] { return ++steps < 2; };
  GenerateOutput greedy = generate(lm, {prompt}, {.max_new_tokens = 8}, {}, nullptr, two_steps);
  EXPECT_EQ(steps, 2);
  EXPECT_EQ(greedy.finish_reasons, std::vector<std::string>{"callback"});
  EXPECT_EQ(greedy.sequences[0].size(), prompt.size() + 2);

  // Beam search takes no on_token, but on_step: uncancelled it is asked once per step; cancelled
  // at the third step, every hypothesis ends there.
  const GenerationConfig beams{.max_new_tokens = 8, .num_beams = 3, .num_return_sequences = 2};
  steps = 0;
  GenerateOutput full = generate(lm, {prompt}, beams, {}, nullptr, [&] { return ++steps > 0; });
  EXPECT_GE(steps, 1);
  EXPECT_LE(steps, 8);
  EXPECT_EQ(full.sequences, lm.generate({prompt}, beams));
  steps = 0;
  GenerateOutput cut = generate(lm, {prompt}, beams, {}, nullptr, [&] { return ++steps < 3; });
  EXPECT_EQ(steps, 3);
  ASSERT_EQ(cut.sequences.size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(cut.finish_reasons[r], "callback");
    EXPECT_EQ(cut.sequences[r].size(), prompt.size() + 3);
  }
  // A cancelled search is an unfinished one: stopping after a step is not an error.
  EXPECT_TRUE(std::isfinite(cut.sequences_scores[0]));
}

// Index of the largest value, the first among equals (torch.argmax).
int32_t argmax(const float* v, int64_t n) { return int32_t(std::max_element(v, v + n) - v); }

TEST(GenerateOutput, ScoresAreProcessedLogitsPerStep) {
  CausalLM lm = tiny();
  const int64_t V = lm.config().vocab_size;
  const std::vector<int32_t> prompt = {1, 17, 300, 45};
  GenerationConfig c{.max_new_tokens = 6, .min_new_tokens = 6, .repetition_penalty = 1.5};
  c.output_scores = c.output_logits = true;
  GenerateOutput out = generate(lm, {prompt, {1, 99}}, c);
  ASSERT_EQ(out.scores.size(), 6u);
  ASSERT_EQ(out.logits.size(), 6u);
  for (size_t t = 0; t < 6; ++t) {
    ASSERT_EQ(out.scores[t].size(), size_t(2 * V));
    for (int64_t b = 0; b < 2; ++b) {
      const std::vector<int32_t>& seq = out.sequences[b];
      const size_t start = seq.size() - 6;  // where the row's new tokens begin
      const float* s = out.scores[t].data() + b * V;
      const float* l = out.logits[t].data() + b * V;
      // Greedy picks the best processed score.
      EXPECT_EQ(argmax(s, V), seq[start + t]);
      // Transformers' RepetitionPenaltyLogitsProcessor over the row so far; eos (2) is
      // suppressed by min_new_tokens.
      for (int64_t v = 0; v < V; ++v) {
        const bool seen = std::find(seq.begin(), seq.begin() + long(start + t), v) !=
                          seq.begin() + long(start + t);
        float want = seen ? (l[v] > 0 ? l[v] / 1.5f : l[v] * 1.5f) : l[v];
        if (v == 2) want = -INFINITY;
        ASSERT_FLOAT_EQ(s[v], want) << "step " << t << " row " << b << " token " << v;
      }
    }
  }
  // Off by default, and generation_config.json cannot turn them on for a call that did not ask.
  EXPECT_TRUE(generate(lm, {prompt}, {.max_new_tokens = 2}).scores.empty());
  lm.generation_config().output_scores = lm.generation_config().output_logits = true;
  GenerateOutput plain = generate(lm, {prompt}, {.max_new_tokens = 2});
  EXPECT_TRUE(plain.scores.empty());
  EXPECT_TRUE(plain.logits.empty());
}

TEST(GenerateOutput, BeamScoresAreLogSoftmaxOfTheLogits) {
  CausalLM lm = tiny();
  const int64_t V = lm.config().vocab_size;
  GenerationConfig c{.max_new_tokens = 4, .min_new_tokens = 4, .num_beams = 3};
  c.output_scores = c.output_logits = true;
  GenerateOutput out = generate(lm, {{1, 17, 300, 45}}, c);
  ASSERT_EQ(out.scores.size(), out.logits.size());
  ASSERT_GE(out.scores.size(), 1u);
  for (size_t t = 0; t < out.scores.size(); ++t) {
    ASSERT_EQ(out.scores[t].size(), size_t(3 * V));  // one row per running beam
    for (int64_t k = 0; k < 3; ++k) {
      const float* l = out.logits[t].data() + k * V;
      const double m = *std::max_element(l, l + V);
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(l[v]) - m);
      EXPECT_EQ(out.scores[t][k * V + 2], -INFINITY);  // eos, suppressed by min_new_tokens
      for (int64_t v = 3; v < V; ++v)
        ASSERT_NEAR(out.scores[t][k * V + v], double(l[v]) - m - std::log(sum), 1e-5)
            << "step " << t << " beam " << k << " token " << v;
    }
  }
}

}  // namespace

namespace {

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

}  // namespace

// A conversation's second call computes only what follows the tokens the first left in the
// cache, and gives the tokens and, within float32 rounding, the logits of a call that computes
// the whole prompt: wrong slots, positions or mask would change them far more.
TEST(GenerateOutput, KeptCacheComputesOnlyTheNewTokensAsAFreshCallWould) {
  CausalLM lm = tiny();
  const GenerationConfig config{.max_new_tokens = 6, .max_cache_len = 96, .output_logits = true};
  KeptCache kept;
  const std::vector<int32_t> first = {1, 17, 300, 45, 9, 88, 120};
  GenerateOutput turn1 = generate(lm, {first}, config, {}, nullptr, {}, &kept);
  EXPECT_EQ(turn1.cached_prompt_tokens, 0);
  // The cache holds the prompt and the generated tokens but the last, which no step read.
  ASSERT_EQ(kept.tokens.size(), first.size() + 5);
  EXPECT_TRUE(std::equal(kept.tokens.begin(), kept.tokens.end(), turn1.sequences[0].begin()));
  EXPECT_EQ(kept.cache_len, 96);

  std::vector<int32_t> second = turn1.sequences[0];
  for (int32_t id : {5, 77, 301, 2, 64}) second.push_back(id);
  GenerateOutput turn2 = generate(lm, {second}, config, {}, nullptr, {}, &kept);
  EXPECT_EQ(turn2.cached_prompt_tokens, int64_t(first.size() + 5));
  const GenerateOutput fresh = generate(lm, {second}, config);
  EXPECT_EQ(fresh.cached_prompt_tokens, 0);
  EXPECT_EQ(turn2.sequences, fresh.sequences);
  ASSERT_EQ(turn2.logits.size(), fresh.logits.size());
  for (size_t s = 0; s < fresh.logits.size(); ++s)
    EXPECT_LT(max_abs_diff(turn2.logits[s], fresh.logits[s]), 1e-4f) << "step " << s;

  // `fresh` ran the model since: the next call computes the whole prompt, as a fresh one does.
  GenerateOutput turn3 = generate(lm, {second}, config, {}, nullptr, {}, &kept);
  EXPECT_EQ(turn3.cached_prompt_tokens, 0);
  EXPECT_EQ(turn3.sequences, fresh.sequences);
  for (size_t s = 0; s < fresh.logits.size(); ++s)
    EXPECT_EQ(turn3.logits[s], fresh.logits[s]) << "step " << s;

  // A prompt that parts from the kept tokens keeps only what they share, at least its first
  // token computed again when the whole prompt is kept.
  std::vector<int32_t> branch(second.begin(), second.begin() + 4);
  branch.push_back(499);
  GenerateOutput turn4 = generate(lm, {branch}, config, {}, nullptr, {}, &kept);
  EXPECT_EQ(turn4.cached_prompt_tokens, 4);
  EXPECT_EQ(turn4.sequences, generate(lm, {branch}, config).sequences);
  generate(lm, {branch}, config, {}, nullptr, {}, &kept);  // kept again after the fresh call
  GenerateOutput again = generate(lm, {branch}, config, {}, nullptr, {}, &kept);
  EXPECT_EQ(again.cached_prompt_tokens, int64_t(branch.size() - 1));
  // Another cache length: all of it computed.
  GenerationConfig longer = config;
  longer.max_cache_len = 128;
  EXPECT_EQ(generate(lm, {branch}, longer, {}, nullptr, {}, &kept).cached_prompt_tokens, 0);
}

TEST(GenerateOutput, KeptCacheTakesOneRowWithoutBeams) {
  CausalLM lm = tiny();
  KeptCache kept;
  const std::vector<int32_t> p = {1, 17, 300};
  for (const GenerationConfig& c :
       {GenerationConfig{.max_new_tokens = 2, .num_beams = 2},
        GenerationConfig{.max_new_tokens = 2, .do_sample = true, .num_return_sequences = 2}})
    EXPECT_THROW(generate(lm, {p}, c, {}, nullptr, {}, &kept), InvalidArgumentError);
  EXPECT_THROW(generate(lm, {p, p}, {.max_new_tokens = 2}, {}, nullptr, {}, &kept),
               InvalidArgumentError);
  EXPECT_TRUE(kept.tokens.empty());
}

}  // namespace tformers
