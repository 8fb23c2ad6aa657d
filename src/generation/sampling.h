// Picks the next token from one row of processed scores.
//
// Greedy: the first index among equal maxima, as torch.argmax.
//
// Sampling (what "the same seed gives the same text" rests on; the algorithm is fixed so that a
// seed means the same draws on every platform and standard library):
//   1. One std::mt19937_64 is seeded with the 64-bit seed once per generate() call
//      (Sampler's constructor) and draws for every row and step of that call in the order the
//      caller asks.
//   2. softmax in double: w[i] = exp(scores[i] - max(scores)) (0 for -inf), total = sum of w in
//      index order.
//   3. One draw per token: u = (next 64-bit output >> 11) * 2^-53, a double in [0, 1) (not
//      std::uniform_real_distribution, whose algorithm differs between standard libraries).
//   4. Inverse CDF in index order: the first i with w[i] > 0 and w[0] + ... + w[i] > u * total;
//      if rounding leaves none, the last i with w[i] > 0.
// Random generators differ from PyTorch's, so a seed gives other tokens than Transformers does;
// the distribution sampled from is the same.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace tformers::generation {

class Sampler {
 public:
  explicit Sampler(uint64_t seed) : seed_(seed), engine_(seed) {}

  // First index among equal maxima (all -inf gives 0, as torch.argmax).
  static int32_t greedy(std::span<const float> scores);
  // One draw from softmax(scores). InvalidArgumentError when no token can be drawn (every score
  // -inf, or a NaN / +inf score).
  int32_t sample(std::span<const float> scores);
  // greedy() or sample().
  int32_t next_token(std::span<const float> scores, bool do_sample) {
    return do_sample ? sample(scores) : greedy(scores);
  }
  // Step 3 above, exposed for tests.
  double next_uniform();
  uint64_t seed() const { return seed_; }

 private:
  uint64_t seed_;
  std::mt19937_64 engine_;
};

// The indices of the out.size() highest scores (fewer if there are fewer scores), highest first,
// ties to the lower index: a sort's first k, found in one pass that keeps the best k so far, so
// that a few log-probability alternatives cost a read of the vocabulary, not a sort of it. NaN
// scores never rank. Returns how many it wrote.
size_t top_k_indices(std::span<const float> scores, std::span<int32_t> out);

}  // namespace tformers::generation
