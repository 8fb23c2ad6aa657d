#include "generation/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tformers/error.h"

namespace tformers::generation {

int32_t Sampler::greedy(std::span<const float> scores) {
  TF_CHECK(!scores.empty(), "greedy: no scores");
  size_t best = 0;
  for (size_t i = 1; i < scores.size(); ++i)
    if (scores[i] > scores[best]) best = i;
  return int32_t(best);
}

size_t top_k_indices(std::span<const float> scores, std::span<int32_t> out) {
  const size_t k = std::min(out.size(), scores.size());
  if (k == 0) return 0;
  size_t n = 0;
  float kth = 0;  // the lowest kept score, once k are kept
  for (size_t i = 0; i < scores.size(); ++i) {
    const float x = scores[i];
    // Scores come in index order, so one equal to a kept score ranks after it; NaN fails too.
    if (n == k ? !(x > kth) : std::isnan(x)) continue;
    if (n < k) ++n;  // else the lowest kept one drops out
    size_t j = n - 1;
    for (; j > 0 && x > scores[size_t(out[j - 1])]; --j) out[j] = out[j - 1];
    out[j] = int32_t(i);
    if (n == k) kth = scores[size_t(out[k - 1])];
  }
  return n;
}

double Sampler::next_uniform() {
  // The top 53 bits make a double in [0, 1) with every value equally likely.
  return double(engine_() >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(std::span<const float> scores) {
  TF_CHECK(!scores.empty(), "sample: no scores");
  double m = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < scores.size(); ++i) {
    const float s = scores[i];
    if (std::isnan(s) || s == std::numeric_limits<float>::infinity())
      throw InvalidArgumentError(detail::str_cat(
          "sampling: the score of token ", i, " is ", s,
          ", so no probability distribution can be formed (the model's logits overflowed or a "
          "custom processor produced it); check the model's dtype or use greedy decoding"));
    m = std::max(m, double(s));
  }
  if (m == -std::numeric_limits<double>::infinity())
    throw InvalidArgumentError(
        "sampling: every token was filtered out (all scores are -inf); relax bad_words_ids, "
        "suppress_tokens or the sampling filters");
  // Two passes over the weights instead of storing them: filtered tokens (-inf) weigh 0 and are
  // skipped, which after top_k leaves a few dozen exps on a vocabulary of 150k.
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  double total = 0;
  for (float s : scores)
    if (s != kNegInf) total += std::exp(double(s) - m);
  const double target = next_uniform() * total;
  double acc = 0;
  size_t last = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (scores[i] == kNegInf) continue;
    const double w = std::exp(double(scores[i]) - m);
    if (w == 0) continue;
    acc += w;
    last = i;
    if (acc > target) return int32_t(i);
  }
  return int32_t(last);  // rounding left the sum at or below target
}

}  // namespace tformers::generation
