// Left padding of rows of different lengths into one prefill batch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tformers/tensor.h"

namespace tformers::generation {

struct LeftPadded {
  Tensor input_ids;       // int32 (B, P): each row right-aligned, padding slots hold pad_id
  Tensor position_ids;    // int32 (B, P): 0.. over the real tokens, 1 on padding
  Tensor attention_mask;  // int32 (B, S) over cache slots: 0 on padding, 1 from the first token
};

// `rows` right-aligned in `padded_len` positions over a cache of `cache_len` slots. Padding
// holds a harmless id and position 1 (Transformers' masked_fill); the mask keeps every real
// token from seeing it.
LeftPadded left_pad(const std::vector<std::span<const int32_t>>& rows, int64_t padded_len,
                    int64_t cache_len, int32_t pad_id);

}  // namespace tformers::generation
