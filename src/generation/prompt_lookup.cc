#include "generation/prompt_lookup.h"

#include <algorithm>

namespace tformers::generation {

std::vector<int32_t> prompt_lookup(std::span<const int32_t> sequence, int64_t count,
                                   int64_t max_ngram) {
  const int64_t len = int64_t(sequence.size());
  for (int64_t n = std::min(max_ngram, len - 1); n >= 1 && count > 0; --n) {
    const auto ngram = sequence.subspan(size_t(len - n));
    // The earliest window equal to the n-gram with a token after it (the n-gram's own place has
    // none).
    for (int64_t at = 0; at + n < len; ++at) {
      if (!std::equal(ngram.begin(), ngram.end(), sequence.begin() + at)) continue;
      const int64_t from = at + n, to = std::min(len, from + count);
      return {sequence.begin() + from, sequence.begin() + to};
    }
  }
  return {};
}

}  // namespace tformers::generation
