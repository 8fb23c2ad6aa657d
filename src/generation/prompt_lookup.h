// Prompt lookup decoding's proposals (Transformers' prompt_lookup_num_tokens, its
// PromptLookupCandidateGenerator): the tokens that followed the earliest earlier occurrence of the
// sequence's last n-gram, n from max_ngram down to 1. generate() checks them all in one forward
// and keeps those the model itself would have chosen, so a passage the output repeats from the
// prompt (code under edit, a quoted document) costs one weight read for several tokens.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tformers::generation {

// Up to `count` tokens that followed the earliest occurrence, before the end, of the last n
// tokens of `sequence` (the longest n <= max_ngram that has one); none when no n-gram recurs.
std::vector<int32_t> prompt_lookup(std::span<const int32_t> sequence, int64_t count,
                                   int64_t max_ngram);

}  // namespace tformers::generation
