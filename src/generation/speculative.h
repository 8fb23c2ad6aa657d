// Speculative sampling's choice at one checked position (Transformers' _speculative_sampling, after
// Leviathan et al. and Chen et al.): the assistant drew `proposed` from q = softmax(its processed
// scores); the model's processed scores give p. The proposal is kept with probability
// min(1, p(x) / q(x)); otherwise a token is drawn from max(0, p - q), renormalised. Whatever q is,
// the token returned is distributed as p: sampling with an assistant samples the model's own
// distribution, the assistant only sets how many tokens a step keeps.
#pragma once

#include <cstdint>
#include <span>

#include "generation/sampling.h"

namespace tformers::generation {

// The token chosen at a position whose proposal is `proposed` (see above), drawing from
// `sampler`; `p_scores` and `q_scores` are processed scores over the same vocabulary.
int32_t speculative_choice(std::span<const float> p_scores, std::span<const float> q_scores,
                           int32_t proposed, Sampler& sampler);

}  // namespace tformers::generation
