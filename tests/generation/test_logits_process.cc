// Each processor and warper against hand-computed cases, including the edge cases issue 4 names,
// and the chain's order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "generation/logits_process.h"

namespace tformers::generation {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<bool> kept(const std::vector<float>& s) {
  std::vector<bool> k;
  for (float x : s) k.push_back(x != -kInf);
  return k;
}

std::vector<float> logs(std::vector<double> probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(float(std::log(p)));
  return out;
}

TEST(RepetitionPenalty, DividesPositiveMultipliesNegativeOncePerDistinctId) {
  std::vector<float> s = {2.0f, -2.0f, 3.0f, 0.0f};
  std::vector<int32_t> ids = {0, 0, 1, 1, 1, 3};
  apply_repetition_penalty(ids, 2.0f, s);
  EXPECT_EQ(s, (std::vector<float>{1.0f, -4.0f, 3.0f, 0.0f}));
}

TEST(RepetitionPenalty, BelowOneRewardsRepeats) {
  std::vector<float> s = {2.0f, -2.0f, 3.0f};
  std::vector<int32_t> ids = {1, 0};
  apply_repetition_penalty(ids, 0.5f, s);
  EXPECT_EQ(s, (std::vector<float>{4.0f, -1.0f, 3.0f}));
}

// The OpenAI penalties by their formula, written out per token: score - (frequency * c) -
// presence for every token counted c > 0 times in `generated`.
std::vector<float> penalized(std::vector<float> s, const std::vector<int32_t>& generated,
                             float presence, float frequency) {
  for (size_t t = 0; t < s.size(); ++t) {
    const auto c = std::count(generated.begin(), generated.end(), int32_t(t));
    if (c > 0) s[t] = s[t] - frequency * float(c) - presence;
  }
  return s;
}

TEST(PresenceFrequencyPenalty, LowersEachGeneratedTokenByPresencePlusFrequencyTimesCount) {
  const std::vector<float> scores = {1.5f, -0.25f, 3.0f, 0.5f, 2.0f};
  const std::vector<int32_t> generated = {2, 0, 2, 2, 3};
  for (const auto& [presence, frequency] :
       std::vector<std::pair<float, float>>{{0.5f, 0}, {0, 0.75f}, {1.25f, 0.5f}, {-2, -1}}) {
    std::vector<float> s = scores;
    apply_presence_frequency_penalty(generated, presence, frequency, s);
    EXPECT_EQ(s, penalized(scores, generated, presence, frequency)) << presence << " " << frequency;
  }
  // Tokens not generated, and filtered ones, are left as they are.
  std::vector<float> s = {-kInf, 1.0f};
  apply_presence_frequency_penalty(std::vector<int32_t>{0}, 2, 2, s);
  EXPECT_EQ(s, (std::vector<float>{-kInf, 1.0f}));
}

TEST(PresenceFrequencyPenalty, ChangesTheGreedyChoiceAndCountsOnlyGeneratedTokens) {
  // Token 0 leads by 1; generated twice, it falls below token 1.
  LogitsProcessorList list(
      [] {
        ResolvedGenerationConfig c;
        c.presence_penalty = 0.5;
        c.frequency_penalty = 0.5;
        return c;
      }(),
      3);
  EXPECT_EQ(list.names(), std::vector<std::string>{"presence_frequency_penalty"});
  const std::vector<float> scores = {3.0f, 2.0f, 0.0f};
  // The prompt (here the first three ids) repeats token 1 without being penalized.
  const std::vector<int32_t> ids = {1, 1, 1, 0, 0};
  std::vector<float> s = scores;
  list.process(ids, 3, s);
  EXPECT_EQ(s, penalized(scores, {0, 0}, 0.5f, 0.5f));
  EXPECT_EQ(std::max_element(s.begin(), s.end()) - s.begin(), 1);
  EXPECT_EQ(std::max_element(scores.begin(), scores.end()) - scores.begin(), 0);
}

TEST(LogitBias, AddsEachBiasAndKeepsFilteredTokensFiltered) {
  std::vector<float> s = {1.0f, 2.0f, -kInf, 0.5f};
  const std::vector<std::pair<int32_t, float>> bias = {{0, 100}, {2, 100}, {3, -0.5f}};
  apply_logit_bias(bias, s);
  EXPECT_EQ(s, (std::vector<float>{1.0f + 100, 2.0f, -kInf, 0.0f}));
}

TEST(NoRepeatNgram, BansTheTokenThatWouldRepeatABigram) {
  std::vector<float> s(8, 0.0f);
  std::vector<int32_t> ids = {5, 6, 7, 5};
  apply_no_repeat_ngram(ids, 2, s);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(s[i] == -kInf, i == 6) << i;
}

TEST(NoRepeatNgram, SizeOneBansEverySeenToken) {
  std::vector<float> s(6, 1.0f);
  std::vector<int32_t> ids = {3, 3, 4};
  apply_no_repeat_ngram(ids, 1, s);
  EXPECT_EQ(kept(s), (std::vector<bool>{true, true, true, false, false, true}));
}

TEST(NoRepeatNgram, TrigramAndTooShortContext) {
  std::vector<float> s(6, 1.0f);
  std::vector<int32_t> ids = {1, 2, 3, 1, 2};
  apply_no_repeat_ngram(ids, 3, s);
  EXPECT_EQ(kept(s), (std::vector<bool>{true, true, true, false, true, true}));
  std::vector<float> t(6, 1.0f);
  std::vector<int32_t> one = {1};
  apply_no_repeat_ngram(one, 3, t);  // cur_len + 1 < n: nothing to ban
  EXPECT_EQ(t, std::vector<float>(6, 1.0f));
}

TEST(BadWords, SingleTokensAlwaysLongerOnlyAfterTheirPrefix) {
  std::vector<std::vector<int64_t>> bad = {{3, 4}, {5}};
  std::vector<int64_t> eos = {2};
  std::vector<float> s(6, 0.0f);
  std::vector<int32_t> after_prefix = {1, 3};
  apply_bad_words(after_prefix, bad, eos, s);
  EXPECT_EQ(kept(s), (std::vector<bool>{true, true, true, true, false, false}));
  std::vector<float> t(6, 0.0f);
  std::vector<int32_t> other = {3, 1};
  apply_bad_words(other, bad, eos, t);
  EXPECT_EQ(kept(t), (std::vector<bool>{true, true, true, true, true, false}));
}

TEST(BadWords, EosOnlySequenceIsDroppedAndLongSequencesIgnored) {
  std::vector<int64_t> eos = {2, 4};
  std::vector<float> s(6, 0.0f);
  std::vector<int32_t> ids = {1};
  apply_bad_words(ids, {{2}, {4}}, eos, s);
  EXPECT_EQ(s, std::vector<float>(6, 0.0f));
  // Transformers 5.23's SequenceBiasLogitsProcessor skips a sequence whose prefix is longer than
  // the context ({0, 1, 3} after {1}), but compares a prefix as long as the context with all of
  // it ({1, 5} after {1} bans 5; 4.x skipped that one too).
  apply_bad_words(ids, {{0, 1, 3}, {1, 5}}, eos, s);
  EXPECT_EQ(kept(s), (std::vector<bool>{true, true, true, true, true, false}));
  std::vector<float> t(6, 0.0f);
  std::vector<int32_t> two = {0, 1};
  apply_bad_words(two, {{0, 1, 3}, {2, 0, 1, 4}}, eos, t);
  EXPECT_EQ(kept(t), (std::vector<bool>{true, true, true, false, true, true}));
}

TEST(MinNewTokens, EosIsMinusInfUntilReached) {
  std::vector<int64_t> eos = {2, 4};
  std::vector<float> s(5, 1.0f);
  apply_min_new_tokens(2, 3, eos, s);
  EXPECT_EQ(kept(s), (std::vector<bool>{true, true, false, true, false}));
  std::vector<float> t(5, 1.0f);
  apply_min_new_tokens(3, 3, eos, t);
  EXPECT_EQ(t, std::vector<float>(5, 1.0f));
}

TEST(SuppressTokens, AreMinusInf) {
  std::vector<float> s = {1, 2, 3, 4};
  std::vector<int64_t> sup = {3, 0};
  apply_suppress_tokens(sup, s);
  EXPECT_EQ(kept(s), (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(s[1], 2.0f);
}

TEST(Temperature, Divides) {
  std::vector<float> s = {1.0f, 2.0f, -4.0f, -kInf};
  apply_temperature(0.5f, s);
  EXPECT_EQ(s, (std::vector<float>{2.0f, 4.0f, -8.0f, -kInf}));
}

// The smallest temperature resolve() accepts overflows ordinary scores; they saturate at the
// largest float, keeping their order and leaving filtered tokens filtered.
TEST(Temperature, OverflowSaturatesInsteadOfInf) {
  constexpr float kMax = std::numeric_limits<float>::max();
  std::vector<float> s = {100.0f, -100.0f, 0.0f, -kInf};
  apply_temperature(std::numeric_limits<float>::min(), s);
  EXPECT_EQ(s, (std::vector<float>{kMax, -kMax, 0.0f, -kInf}));
  std::vector<float> r = {100.0f, -100.0f, 1.0f, -kInf};
  std::vector<int32_t> ids = {0, 1, 3};
  apply_repetition_penalty(ids, std::numeric_limits<float>::min(), r);
  EXPECT_EQ(r,
            (std::vector<float>{kMax, -100.0f * std::numeric_limits<float>::min(), 1.0f, -kInf}));
  apply_repetition_penalty(ids, kMax, r);
  EXPECT_EQ(r[0], 1.0f);
  EXPECT_EQ(r[3], -kInf);
}

TEST(TopK, KeepsEveryTokenTiedWithTheKth) {
  std::vector<float> s = {1.0f, 3.0f, 2.0f, 2.0f, 0.0f};
  apply_top_k(2, s);
  EXPECT_EQ(kept(s), (std::vector<bool>{false, true, true, true, false}));
  EXPECT_EQ(s[1], 3.0f);  // kept scores are untouched
  EXPECT_EQ(s[2], 2.0f);
}

TEST(TopK, ClampsToTheVocabularyAndMinTokensToKeep) {
  std::vector<float> s = {1.0f, 3.0f, 2.0f};
  apply_top_k(10, s);
  EXPECT_EQ(kept(s), (std::vector<bool>{true, true, true}));
  apply_top_k(0, s);  // clamped up to min_tokens_to_keep = 1
  EXPECT_EQ(kept(s), (std::vector<bool>{false, true, false}));
}

TEST(TopP, AlwaysKeepsTheBestToken) {
  std::vector<float> s = {10.0f, 0.0f, 0.0f};
  apply_top_p(0.01, s);
  EXPECT_EQ(kept(s), (std::vector<bool>{true, false, false}));
}

TEST(TopP, KeepsTheSmallestSetReachingTopP) {
  // probs .2 .3 .5: ascending cumulative .2 .5 1.
  std::vector<float> s = logs({0.2, 0.3, 0.5});
  apply_top_p(0.75, s);  // removes cumulative <= .25: only .2
  EXPECT_EQ(kept(s), (std::vector<bool>{false, true, true}));
  std::vector<float> t = logs({0.2, 0.3, 0.5});
  apply_top_p(0.45, t);  // removes cumulative <= .55: .2 and .3
  EXPECT_EQ(kept(t), (std::vector<bool>{false, false, true}));
  std::vector<float> u = logs({0.2, 0.3, 0.5});
  apply_top_p(1.0, u);
  EXPECT_EQ(kept(u), (std::vector<bool>{true, true, true}));
}

TEST(TopP, TiesAreBrokenByIndexAsTorchsStableSort) {
  // probs .5 .25 .25, p = .6: ascending order is 1, 2, 0 (ties by index); cumulative .25 .5 1;
  // only the first (index 1) is <= .4. Transformers' TopPLogitsWarper gives the same on this row
  // (make_generation_goldens.py's self_test), but it calls torch.sort without stable=True, which
  // on a full vocabulary row orders ties arbitrarily: the engine's index order is its own
  // deterministic choice there, and only matters for exactly tied scores at the cut.
  std::vector<float> s = logs({0.5, 0.25, 0.25});
  apply_top_p(0.6, s);
  EXPECT_EQ(kept(s), (std::vector<bool>{true, false, true}));
}

TEST(TopP, IgnoresAlreadyFilteredTokens) {
  std::vector<float> s = logs({0.2, 0.3, 0.5});
  s.insert(s.begin() + 1, -kInf);
  apply_top_p(0.75, s);
  EXPECT_EQ(kept(s), (std::vector<bool>{false, false, true, true}));
}

TEST(MinP, RelativeToTheTopProbability) {
  std::vector<float> s = logs({0.5, 0.3, 0.15, 0.05});
  apply_min_p(0.2, s);  // threshold .2 * .5 = .1
  EXPECT_EQ(kept(s), (std::vector<bool>{true, true, true, false}));
  std::vector<float> t = logs({0.5, 0.3, 0.15, 0.05});
  apply_min_p(0.7, t);  // threshold .35
  EXPECT_EQ(kept(t), (std::vector<bool>{true, false, false, false}));
  std::vector<float> u = logs({0.25, 0.25, 0.5});
  apply_min_p(1.0, u);  // only the best survives
  EXPECT_EQ(kept(u), (std::vector<bool>{false, false, true}));
}

// probs .5 .25 .125 .125: entropy 1.75 ln2, |surprisal - entropy| = .75 .25 1.25 1.25 (x ln2);
// ascending order 1, 0, 2, 3 with cumulative probabilities .25 .75 .875 1.
TEST(TypicalP, KeepsTokensClosestToTheEntropyUntilTheMass) {
  std::vector<float> s = logs({0.5, 0.25, 0.125, 0.125});
  apply_typical_p(0.5, s);  // one cumulative below .5 -> threshold .75: keeps 1 and 0
  EXPECT_EQ(kept(s), (std::vector<bool>{true, true, false, false}));
  std::vector<float> t = logs({0.5, 0.25, 0.125, 0.125});
  apply_typical_p(0.8, t);  // threshold 1.25: the tie keeps both 2 and 3
  EXPECT_EQ(kept(t), (std::vector<bool>{true, true, true, true}));
}

TEST(TypicalP, TheTokenCrossingTheMassIsKept) {
  // Cumulative .25 .75 .875: mass .76 counts two below it (threshold 1.25, all kept), mass .74
  // counts one (threshold .75).
  std::vector<float> s = logs({0.5, 0.25, 0.125, 0.125});
  apply_typical_p(0.76, s);
  EXPECT_EQ(kept(s), (std::vector<bool>{true, true, true, true}));
  std::vector<float> t = logs({0.5, 0.25, 0.125, 0.125});
  apply_typical_p(0.74, t);
  EXPECT_EQ(kept(t), (std::vector<bool>{true, true, false, false}));
}

TEST(TypicalP, IgnoresAlreadyFilteredTokens) {
  std::vector<float> s = logs({0.5, 0.25, 0.125, 0.125});
  s.push_back(-kInf);
  apply_typical_p(0.5, s);
  EXPECT_EQ(kept(s), (std::vector<bool>{true, true, false, false, false}));
}

TEST(TypicalP, MinTokensToKeepIsTheMostTypicalNotTheMostLikely) {
  std::vector<float> s = logs({0.5, 0.25, 0.125, 0.125});
  apply_typical_p(0.2, s);  // no cumulative below .2 -> threshold .25: only token 1 stays
  EXPECT_EQ(kept(s), (std::vector<bool>{false, true, false, false}));
}

// Straightforward versions of Transformers' formulations (full sorts) for the randomized checks
// of the faster implementations above.
std::vector<bool> naive_top_k(const std::vector<float>& s, int64_t k) {
  std::vector<float> sorted = s;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const float kth = sorted[std::min<size_t>(std::max<int64_t>(k, 1), s.size()) - 1];
  std::vector<bool> keep;
  for (float x : s) keep.push_back(!(x < kth) && x != -kInf);
  return keep;
}

std::vector<bool> naive_top_p(const std::vector<float>& s, double p) {
  std::vector<size_t> order(s.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return s[a] < s[b]; });
  const float m = *std::max_element(s.begin(), s.end());
  double total = 0;
  for (float x : s) total += std::exp(double(x) - m);
  std::vector<bool> keep(s.size(), true);
  double cum = 0;
  for (size_t j = 0; j + 1 < order.size(); ++j) {
    cum += std::exp(double(s[order[j]]) - m) / total;
    if (cum <= 1 - p) keep[order[j]] = false;
  }
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == -kInf) keep[i] = false;
  return keep;
}

TEST(Warpers, RandomRowsMatchTheFullSortFormulations) {
  std::mt19937 gen(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int v = 1 + int(gen() % 700);
    // Small integer-valued logits make many exact ties; a wide spread makes peaked rows.
    const bool ties = trial % 2 == 0;
    std::normal_distribution<float> normal(0.0f, trial % 3 == 0 ? 6.0f : 1.5f);
    std::vector<float> s(v);
    for (float& x : s) x = ties ? float(int(gen() % 9)) * 0.5f : normal(gen);
    if (v > 3) s[gen() % v] = -kInf;
    const int64_t k = 1 + int64_t(gen() % 80);
    const double p = std::uniform_real_distribution<double>(0.01, 0.999)(gen);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " v " << v << " k " << k << " p " << p);
    if (std::all_of(s.begin(), s.end(), [](float x) { return x == -kInf; })) continue;
    std::vector<float> a = s;
    apply_top_k(k, a);
    EXPECT_EQ(kept(a), naive_top_k(s, k));
    std::vector<float> b = s;
    apply_top_p(p, b);
    EXPECT_EQ(kept(b), naive_top_p(s, p));
    for (int i = 0; i < v; ++i) {
      if (b[i] != -kInf) {
        ASSERT_EQ(b[i], s[i]);  // kept scores are untouched
      }
    }
  }
}

ResolvedGenerationConfig sampling_config() {
  ResolvedGenerationConfig c;
  c.do_sample = true;
  c.top_k = 0;
  return c;
}

TEST(LogitsProcessorList, OrderIsTransformers) {
  ResolvedGenerationConfig c = sampling_config();
  c.repetition_penalty = 1.1;
  c.presence_penalty = 0.5;
  c.logit_bias = {{1, 2.0f}};
  c.no_repeat_ngram_size = 2;
  c.bad_words_ids = {{3}};
  c.min_new_tokens = 2;
  c.eos_token_id = {2};
  c.suppress_tokens = {4};
  c.temperature = 0.7;
  c.top_k = 5;
  c.top_p = 0.9;
  c.min_p = 0.05;
  c.typical_p = 0.95;
  LogitsProcessorList list(c, 10);
  EXPECT_EQ(list.names(),
            (std::vector<std::string>{"repetition_penalty", "presence_frequency_penalty",
                                      "logit_bias", "no_repeat_ngram", "no_bad_words",
                                      "min_new_tokens", "suppress_tokens", "temperature", "top_k",
                                      "top_p", "min_p", "typical_p"}));
}

TEST(LogitsProcessorList, WarpersOnlyWhenSampling) {
  ResolvedGenerationConfig c;
  c.temperature = 0.5;
  c.top_p = 0.5;
  c.repetition_penalty = 1.2;
  EXPECT_EQ(LogitsProcessorList(c, 10).names(), (std::vector<std::string>{"repetition_penalty"}));
  c.do_sample = true;
  EXPECT_EQ(LogitsProcessorList(c, 10).names(),
            (std::vector<std::string>{"repetition_penalty", "temperature", "top_k", "top_p"}));
}

TEST(LogitsProcessorList, NeutralValuesAddNoStage) {
  ResolvedGenerationConfig c = sampling_config();
  c.min_new_tokens = 3;  // no eos: nothing to hold back
  EXPECT_TRUE(LogitsProcessorList(c, 10).empty());
}

TEST(LogitsProcessorList, ProcessesInOrderAndReportsEachStage) {
  ResolvedGenerationConfig c = sampling_config();
  c.repetition_penalty = 2.0;
  c.temperature = 0.5;
  c.top_k = 2;
  LogitsProcessorList list(c, 4);
  std::vector<float> s = {4.0f, 3.0f, 1.0f, -1.0f};
  std::vector<int32_t> ids = {0, 3};
  std::vector<std::pair<std::string, std::vector<float>>> seen;
  list.process(ids, 1, s, [&](std::string_view name, std::span<const float> x) {
    seen.emplace_back(std::string(name), std::vector<float>(x.begin(), x.end()));
  });
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].second, (std::vector<float>{2.0f, 3.0f, 1.0f, -2.0f}));
  EXPECT_EQ(seen[1].second, (std::vector<float>{4.0f, 6.0f, 2.0f, -4.0f}));
  EXPECT_EQ(seen[2].second, (std::vector<float>{4.0f, 6.0f, -kInf, -kInf}));
  EXPECT_EQ(s, seen[2].second);
}

TEST(LogitsProcessorList, MinNewTokensCountsFromThePrompt) {
  ResolvedGenerationConfig c;
  c.min_new_tokens = 1;
  c.eos_token_id = {1};
  LogitsProcessorList list(c, 3);
  std::vector<int32_t> ids = {0, 2, 0};
  std::vector<float> s(3, 0.0f);
  list.process(ids, 3, s);  // nothing generated yet
  EXPECT_EQ(s[1], -kInf);
  std::vector<float> t(3, 0.0f);
  list.process(ids, 2, t);  // one generated
  EXPECT_EQ(t[1], 0.0f);
}

}  // namespace
}  // namespace tformers::generation
