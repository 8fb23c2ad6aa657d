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

}  // namespace tformers::generation
