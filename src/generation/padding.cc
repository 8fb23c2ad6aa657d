#include "generation/padding.h"

#include <algorithm>

#include "tformers/error.h"

namespace tformers::generation {

LeftPadded left_pad(const std::vector<std::span<const int32_t>>& rows, int64_t padded_len,
                    int64_t cache_len, int32_t pad_id) {
  const int64_t B = int64_t(rows.size()), P = padded_len, S = cache_len;
  LeftPadded out{Tensor::zeros({B, P}, DType::i32), Tensor::zeros({B, P}, DType::i32),
                 Tensor::zeros({B, S}, DType::i32)};
  for (int64_t b = 0; b < B; ++b) {
    const std::span<const int32_t> row = rows[b];
    TF_CHECK(int64_t(row.size()) <= P && P <= S, "row of ", row.size(), " in ", P, " of ", S);
    const int64_t offset = P - int64_t(row.size());
    int32_t* mask = out.attention_mask.data<int32_t>() + b * S;
    std::fill(mask + offset, mask + S, 1);
    int32_t* ids = out.input_ids.data<int32_t>() + b * P;
    int32_t* pos = out.position_ids.data<int32_t>() + b * P;
    for (int64_t t = 0; t < P; ++t) {
      ids[t] = t < offset ? pad_id : row[t - offset];
      pos[t] = t < offset ? 1 : int32_t(t - offset);
    }
  }
  return out;
}

int64_t bucketed(const std::vector<int64_t>& buckets, int64_t len) {
  for (int64_t b : buckets)
    if (b >= len) return b;
  return len;
}

KeptLayout keep_prefix(const KeptCache& kept, std::span<const int32_t> prompt, int64_t new_tokens,
                       int64_t cache_len, const std::vector<int64_t>& buckets, bool whole_only) {
  const size_t most = std::min(kept.tokens.size(), prompt.size() - 1);
  const size_t reused = size_t(
      std::mismatch(prompt.begin(), prompt.begin() + int64_t(most), kept.tokens.begin()).first -
      prompt.begin());
  if (reused == 0 || (whole_only && reused != kept.tokens.size())) return {};
  const int64_t first = kept.slots[reused - 1] + 1, rest = int64_t(prompt.size() - reused);
  int64_t padded = bucketed(buckets, rest);
  if (first + padded + new_tokens > cache_len)
    padded = std::max(rest, cache_len - new_tokens - first);
  if (first + padded + new_tokens > cache_len) return {};
  return {int64_t(reused), first, padded};
}

LeftPadded continue_kept(const KeptCache& kept, std::span<const int32_t> prompt,
                         const KeptLayout& layout, int64_t cache_len, int32_t pad_id) {
  const std::span<const int32_t> rest = prompt.subspan(size_t(layout.reused));
  LeftPadded out = left_pad({rest}, layout.padded_len, cache_len, pad_id);
  const int64_t padding = layout.padded_len - int64_t(rest.size());
  int32_t* pos = out.position_ids.data<int32_t>();
  for (int64_t t = padding; t < layout.padded_len; ++t) pos[t] += int32_t(layout.reused);
  int32_t* mask = out.attention_mask.data<int32_t>();
  const int64_t first_new = layout.first_slot + padding;
  std::fill(mask, mask + first_new, 0);
  std::fill(mask + first_new, mask + cache_len, 1);
  for (int64_t i = 0; i < layout.reused; ++i) mask[kept.slots[size_t(i)]] = 1;
  return out;
}

void record_kept(KeptCache& kept, const KeptLayout& layout, std::span<const int32_t> prompt,
                 const std::vector<int32_t>& sequence, int64_t padded_len, int64_t cache_len,
                 uint64_t cache_writes) {
  const size_t reused = size_t(layout.reused);
  kept.tokens.assign(prompt.begin(), prompt.end());
  kept.slots.resize(reused);
  const int64_t rest = int64_t(prompt.size() - reused);
  for (int64_t j = 0; j < rest; ++j)
    kept.slots.push_back(int32_t(layout.first_slot + padded_len - rest + j));
  for (size_t j = prompt.size(); j + 1 < sequence.size(); ++j) {
    kept.tokens.push_back(sequence[j]);
    kept.slots.push_back(int32_t(layout.first_slot + padded_len + int64_t(j - prompt.size())));
  }
  kept.cache_len = cache_len;
  kept.cache_writes = cache_writes;
}

}  // namespace tformers::generation
