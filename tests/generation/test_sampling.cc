// Greedy and seeded sampling: the documented algorithm, determinism per seed, and the
// distribution it draws from.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "generation/sampling.h"
#include "tformers/error.h"

namespace tformers::generation {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Against a stable sort of every index, highest first: scores with many ties (a few distinct
// values), -inf and NaN, for k from 0 past the vocabulary's size.
TEST(TopKIndices, IsAStableSortsFirstK) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t V = 1 + rng() % 60;
    std::vector<float> scores(V);
    for (float& x : scores) {
      const uint32_t r = rng() % 10;
      x = r == 0 ? -kInf : r == 1 ? std::numeric_limits<float>::quiet_NaN() : float(r % 4) - 1.5f;
    }
    std::vector<int32_t> sorted;
    for (size_t i = 0; i < V; ++i)
      if (!std::isnan(scores[i])) sorted.push_back(int32_t(i));
    std::stable_sort(sorted.begin(), sorted.end(),
                     [&](int32_t a, int32_t b) { return scores[size_t(a)] > scores[size_t(b)]; });
    for (size_t k : {size_t(0), size_t(1), size_t(3), size_t(20), V, V + 5}) {
      std::vector<int32_t> out(k, -1);
      const size_t n = top_k_indices(scores, out);
      ASSERT_EQ(n, std::min(k, sorted.size())) << "trial " << trial << " k " << k;
      EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + ptrdiff_t(n)),
                std::vector<int32_t>(sorted.begin(), sorted.begin() + ptrdiff_t(n)))
          << "trial " << trial << " k " << k;
    }
  }
}

TEST(Greedy, FirstIndexAmongEqualMaxima) {
  EXPECT_EQ(Sampler::greedy(std::vector<float>{1, 3, 3, 2}), 1);
  EXPECT_EQ(Sampler::greedy(std::vector<float>{-kInf, -1, -kInf, -1}), 1);
  EXPECT_EQ(Sampler::greedy(std::vector<float>{-kInf, -kInf}), 0);  // as torch.argmax
  EXPECT_EQ(Sampler::greedy(std::vector<float>{0, 0, 5}), 2);
}

TEST(Sampler, FollowsTheDocumentedAlgorithm) {
  // Recompute what the header documents with a separate generator: u from the top 53 bits,
  // first index whose cumulative weight exceeds u * total.
  const std::vector<float> s = {0.0f, 1.0f, -kInf, 0.5f, 2.0f};
  Sampler sampler(1234);
  std::mt19937_64 ref(1234);
  for (int draw = 0; draw < 200; ++draw) {
    const double u = double(ref() >> 11) * 0x1.0p-53;
    std::vector<double> w;
    double total = 0;
    for (float x : s) total += w.emplace_back(std::exp(double(x) - 2.0));
    double acc = 0;
    int expected = -1;
    for (int i = 0; i < int(s.size()) && expected < 0; ++i) {
      acc += w[i];
      if (w[i] > 0 && acc > u * total) expected = i;
    }
    ASSERT_EQ(sampler.sample(s), expected) << "draw " << draw;
  }
}

TEST(Sampler, SameSeedSameDrawsOtherSeedOtherDraws) {
  std::vector<float> s(64);
  for (int i = 0; i < 64; ++i) s[i] = float(i % 7) * 0.1f;
  auto draws = [&](uint64_t seed) {
    Sampler sampler(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) out.push_back(sampler.sample(s));
    return out;
  };
  EXPECT_EQ(draws(42), draws(42));
  EXPECT_NE(draws(42), draws(43));
  EXPECT_EQ(Sampler(42).seed(), 42u);
}

TEST(Sampler, NeverDrawsFilteredTokensAndMatchesTheDistribution) {
  // probs .5 .25 0 .25
  const std::vector<float> s = {float(std::log(0.5)), float(std::log(0.25)), -kInf,
                                float(std::log(0.25))};
  Sampler sampler(7);
  std::vector<int> count(4, 0);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++count[sampler.sample(s)];
  EXPECT_EQ(count[2], 0);
  // Binomial standard deviation at n = 40000 is <= 0.0025; allow 4 of them.
  EXPECT_NEAR(count[0] / double(n), 0.5, 0.01);
  EXPECT_NEAR(count[1] / double(n), 0.25, 0.01);
  EXPECT_NEAR(count[3] / double(n), 0.25, 0.01);
}

TEST(Sampler, NextTokenIsGreedyWithoutSampling) {
  Sampler sampler(3);
  const std::vector<float> s = {0.0f, 0.1f, 0.1f, -1.0f};
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sampler.next_token(s, false), 1);
}

TEST(Sampler, UniformIsInTheUnitInterval) {
  Sampler sampler(0);
  for (int i = 0; i < 1000; ++i) {
    double u = sampler.next_uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(Sampler, RefusesRowsWithNothingToDraw) {
  Sampler sampler(1);
  EXPECT_THROW(sampler.sample(std::vector<float>{-kInf, -kInf}), InvalidArgumentError);
  EXPECT_THROW(sampler.sample(std::vector<float>{0.0f, std::nanf("")}), InvalidArgumentError);
  EXPECT_THROW(sampler.sample(std::vector<float>{0.0f, kInf}), InvalidArgumentError);
}

}  // namespace
}  // namespace tformers::generation
