// Left padding of rows of different lengths into one prefill batch, and the layout of a prompt
// that continues what a KeptCache holds.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tformers/generation.h"
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

// The first of `buckets` that holds `len`, or `len` when none does (its own shape).
int64_t bucketed(const std::vector<int64_t>& buckets, int64_t len);

// Where a one-row call that continues a KeptCache puts its prompt: the leading tokens the cache
// holds stay in their slots, and the rest, left-padded to a bucket, follows the last of them.
struct KeptLayout {
  int64_t reused = 0;      // leading prompt tokens kept; 0: the whole prompt is computed
  int64_t first_slot = 0;  // the cache slot of the first computed position
  int64_t padded_len = 0;  // computed positions: the prompt's rest and its padding
};

// The longest prefix of `prompt` that `kept` holds, less the prompt's last token (computed for
// its logits), when the rest padded to one of `buckets` (or not padded, where the bucket would
// not fit) and `new_tokens` fit in `cache_len` after it; reused 0 otherwise. With `whole_only`
// (a model with linear-attention layers, whose recurrent state holds every kept token and cannot
// go back to a shorter prefix) only a prompt that begins with all of kept's tokens reuses them.
KeptLayout keep_prefix(const KeptCache& kept, std::span<const int32_t> prompt, int64_t new_tokens,
                       int64_t cache_len, const std::vector<int64_t>& buckets,
                       bool whole_only = false);

// The step over the prompt's rest: ids and positions (1, padded_len), positions counting on
// from the kept tokens, and the key mask over the cache that shows the kept and the new tokens
// and hides the padding before them.
LeftPadded continue_kept(const KeptCache& kept, std::span<const int32_t> prompt,
                         const KeptLayout& layout, int64_t cache_len, int32_t pad_id);

// What the cache holds after the call: the prompt and the generated tokens of `sequence` (the
// prompt followed by them) but the last, which no step read; the prompt's rest was computed in
// `padded_len` positions from layout.first_slot.
void record_kept(KeptCache& kept, const KeptLayout& layout, std::span<const int32_t> prompt,
                 const std::vector<int32_t>& sequence, int64_t padded_len, int64_t cache_len,
                 uint64_t cache_writes);

}  // namespace tformers::generation
