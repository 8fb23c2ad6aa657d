// Beam search with the semantics of Transformers' GenerationMixin._beam_search (4.50 and later):
// per prompt, num_beams running hypotheses; each step keeps the best
// max(2, 1 + len(eos_token_id)) * num_beams continuations of all beams, moves the ones among the
// best num_beams that hit eos (or max_new_tokens) to the finished hypotheses with score
// sum(log p) / generated_length ** length_penalty, and continues the best num_beams that did not.
// early_stopping decides when a prompt is done (see EarlyStopping). Scores are float32 sums of
// log_softmax outputs after the logits processors, as Transformers computes them.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "models/model_runner.h"
#include "tformers/generation.h"

namespace tformers::generation {

// Runs beam search for every prompt on a cache of `cache_len` slots. Each step recomputes every
// beam's prompt and tokens in one prefill of `padded_len(longest row)` positions: a beam's parent
// changes from step to step, and reordering the KV cache rows on the device is not available to
// generation (the cost is one prefill per step instead of one decode).
// Returns num_return_sequences hypotheses per prompt, best first, each its prompt followed by the
// same number of tokens (Transformers' length: the longest returned hypothesis), shorter ones
// filled as Transformers fills them. When `on_step` returns false, that step is the last, as if
// max_new_tokens ended there, and the rows not ended by eos finish with reason "callback".
GenerateOutput beam_search(models::ModelRunner& model,
                           const std::vector<std::vector<int32_t>>& prompts,
                           const ResolvedGenerationConfig& config, int64_t cache_len,
                           const std::function<int64_t(int64_t)>& padded_len,
                           const StepCallback& on_step);

}  // namespace tformers::generation
