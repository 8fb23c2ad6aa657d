// Logits processors and warpers with the semantics of Transformers' generation/logits_process.py,
// chained in the order of GenerationMixin._get_logits_processor. They run on the host, on one
// row of float32 scores at a time (generate() casts the last position's logits to float32 first,
// as Transformers does). Filtered tokens become -inf (the warpers' filter_value).
//
// Every function works on one row: `scores` (V) is modified in place; `ids` are the row's tokens
// so far, the prompt followed by the generated tokens, without padding. Token ids in `ids` and in
// the arguments must lie in [0, V) (resolve() checks the config's ids; the caller checks the
// prompt's).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tformers/generation.h"

namespace tformers::generation {

class TokenMatcher;

// Processors (always applied when configured).

// RepetitionPenaltyLogitsProcessor: for every distinct id in `ids` (prompt and generated), a
// positive score is divided by `penalty` and a negative one multiplied, once however often the
// id occurs.
void apply_repetition_penalty(std::span<const int32_t> ids, float penalty, std::span<float> scores);
// OpenAI's presence and frequency penalties, as vLLM applies them: every id occurring c > 0
// times in `generated` (the generated tokens only, not the prompt) has its score lowered by
// frequency * c, then by presence (two float subtractions). Negative penalties raise it.
void apply_presence_frequency_penalty(std::span<const int32_t> generated, float presence,
                                      float frequency, std::span<float> scores);
// OpenAI's logit_bias: each (id, bias) adds bias to that id's score (an id given twice gets
// both); a filtered (-inf) score stays filtered.
void apply_logit_bias(std::span<const std::pair<int32_t, float>> bias, std::span<float> scores);
// NoRepeatNGramLogitsProcessor: bans every token that would complete an n-gram of `ids` that
// already occurs in `ids` (n = `ngram_size` >= 1).
void apply_no_repeat_ngram(std::span<const int32_t> ids, int64_t ngram_size,
                           std::span<float> scores);
// NoBadWordsLogitsProcessor: a one-token sequence is always banned; a longer one bans its last
// token when `ids` end with the rest of it (a prefix longer than `ids` never matches; one as long
// as `ids` matches when it equals them). Sequences that are exactly one eos id are dropped first,
// as Transformers does (`eos_token_id`).
void apply_bad_words(std::span<const int32_t> ids,
                     const std::vector<std::vector<int64_t>>& bad_words_ids,
                     std::span<const int64_t> eos_token_id, std::span<float> scores);
// MinNewTokensLengthLogitsProcessor (and MinLengthLogitsProcessor, which resolve() turns into
// a count of new tokens): every eos id is -inf while fewer than `min_new_tokens` tokens have
// been generated (`generated` = ids.size() - prompt_len).
void apply_min_new_tokens(int64_t generated, int64_t min_new_tokens,
                          std::span<const int64_t> eos_token_id, std::span<float> scores);
// SuppressTokensLogitsProcessor: the listed ids are -inf at every step.
void apply_suppress_tokens(std::span<const int64_t> suppress_tokens, std::span<float> scores);

// Warpers (only when sampling). min_tokens_to_keep is 1, as without beam search.

// TemperatureLogitsWarper: scores / temperature (in float32, as torch divides a float32 tensor).
void apply_temperature(float temperature, std::span<float> scores);
// TopKLogitsWarper: removes every score strictly below the k-th largest, so tokens tied with the
// k-th score are all kept. k is clamped to [min_tokens_to_keep, V].
void apply_top_k(int64_t top_k, std::span<float> scores, int64_t min_tokens_to_keep = 1);
// TopPLogitsWarper: sorts ascending (ties by index), accumulates softmax probabilities and
// removes the tokens whose cumulative probability is <= 1 - top_p; the `min_tokens_to_keep`
// best tokens always stay.
void apply_top_p(double top_p, std::span<float> scores, int64_t min_tokens_to_keep = 1);
// MinPLogitsWarper: removes tokens whose probability is below min_p times the top probability;
// the `min_tokens_to_keep` best tokens always stay.
void apply_min_p(double min_p, std::span<float> scores, int64_t min_tokens_to_keep = 1);
// TypicalLogitsWarper: keeps the tokens whose surprisal is closest to the entropy, in that
// order, until their probabilities reach `mass` (the token that crosses it included).
void apply_typical_p(double mass, std::span<float> scores, int64_t min_tokens_to_keep = 1);

// Receives each stage's name and the scores right after it (goldens, debugging).
using StageCallback = std::function<void(std::string_view name, std::span<const float> scores)>;

// The chain a resolved config selects, in Transformers' order:
//   repetition_penalty (if != 1), presence_frequency_penalty (if either is != 0), logit_bias (if
//   any), no_repeat_ngram (if > 0), no_bad_words (if any),
//   min_new_tokens (if > 0 and there is an eos id), suppress_tokens (if any);
//   then, only when do_sample: temperature (if != 1), top_k (if != 0), top_p (if < 1),
//   min_p (if set), typical_p (if < 1).
// Stage names are the ones above (`no_bad_words`, as in the goldens). Transformers has neither
// OpenAI's penalties nor logit_bias; they follow repetition_penalty as in vLLM, which applies
// its penalties repetition first, and come before the bans so that a banned token stays banned
// whatever its bias.
//
// With a `constraint` (structured output, generation/token_matcher.h) a `grammar` stage comes
// first: it catches the matcher up with the generated tokens and sets every token it does not
// allow to -inf, so that no later stage can bring one back. Should the processors after it leave
// no token at all (a ban, min_new_tokens or a logit_bias of -100 on every token the grammar
// allows), the grammar wins: the scores return to what the grammar stage left, before the
// warpers.
class LogitsProcessorList {
 public:
  LogitsProcessorList(const ResolvedGenerationConfig& config, int64_t vocab_size,
                      std::shared_ptr<TokenMatcher> constraint = nullptr);

  // Processes one row in place. `scores` (V); `ids` the row's tokens so far (prompt, then
  // generated; no padding); `prompt_len` how many of them are the prompt. `after_each`, when
  // given, sees every stage's output.
  void process(std::span<const int32_t> ids, int64_t prompt_len, std::span<float> scores,
               const StageCallback& after_each = {}) const;

  // The active stages' names, in order.
  std::vector<std::string> names() const;
  bool empty() const { return stages_.empty(); }

 private:
  using Fn = std::function<void(std::span<const int32_t> ids, int64_t prompt_len,
                                std::span<float> scores)>;
  struct Stage {
    std::string name;
    Fn fn;
  };
  int64_t vocab_size_;
  std::vector<Stage> stages_;
  std::shared_ptr<TokenMatcher> constraint_;
  size_t first_warper_ = 0;                 // stages_[first_warper_...] are the warpers
  mutable std::vector<float> constrained_;  // the scores after the grammar stage
};

}  // namespace tformers::generation
