// tformers::generate(): the sequences CausalLM::generate returns, plus why each row ended, the
// per-step scores and logits, and cancellation by on_step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

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
}  // namespace tformers
