// resolve(): the values one generate() call runs with, from a layered GenerationConfig, with
// Transformers' defaults, precedence and checks (GenerationConfig.validate,
// _prepare_generated_length and the processors' constructors).
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "tformers/error.h"
#include "tformers/generation.h"

namespace tformers {

namespace {

using detail::str_cat;

// The processors scale float32 scores, so a factor must survive the conversion to float: a
// double below FLT_MIN would become 0 (or a denormal that flush-to-zero turns into 0) and one
// above FLT_MAX infinity, and either would turn every score into inf or nan.
constexpr const char* kFloatRange = "[1.17549e-38, 3.40282e+38]";

bool in_float_range(double v) {
  return v >= double(std::numeric_limits<float>::min()) &&
         v <= double(std::numeric_limits<float>::max());
}

[[noreturn]] void invalid(const std::string& msg) {
  throw InvalidArgumentError("generate: " + msg);
}

void check_token_ids(const std::vector<int64_t>& ids, const std::string& field,
                     int64_t vocab_size) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab_size)
      invalid(str_cat(field, "[", i, "] = ", ids[i], " is outside the vocabulary [0, ", vocab_size,
                      "); use token ids of this model's tokenizer"));
}

}  // namespace

ResolvedGenerationConfig resolve(const GenerationConfig& c, int64_t prompt_len, int64_t vocab_size,
                                 int64_t max_positions) {
  TF_CHECK(vocab_size > 0 && max_positions > 0, "vocab_size ", vocab_size, " max_positions ",
           max_positions);
  ResolvedGenerationConfig r;
  if (prompt_len <= 0) invalid("the prompt is empty; give at least one token");
  if (prompt_len >= max_positions)
    invalid(str_cat("the prompt has ", prompt_len, " tokens but the model has ", max_positions,
                    " positions (max_position_embeddings), which leaves no room for a new token; "
                    "shorten the prompt to at most ",
                    max_positions - 1, " tokens"));

  // Length: max_new_tokens wins over max_length (prompt + new tokens, default 20).
  if (c.max_new_tokens) {
    if (*c.max_new_tokens <= 0)
      invalid(str_cat("max_new_tokens must be greater than 0, got ", *c.max_new_tokens));
    r.max_new_tokens = *c.max_new_tokens;
  } else {
    const int64_t max_length = c.max_length.value_or(20);
    // Transformers warns and still generates one token here; a length that leaves nothing to
    // generate is almost always a mistake, so it is refused with the fix.
    if (max_length <= prompt_len)
      invalid(str_cat("max_length = ", max_length, " (prompt plus new tokens",
                      c.max_length ? "" : ", the default", ") leaves no room after a prompt of ",
                      prompt_len, " tokens; set max_new_tokens (> 0) or a max_length above ",
                      prompt_len));
    r.max_new_tokens = max_length - prompt_len;
  }
  // Compared without adding: a max_new_tokens near INT64_MAX would overflow the sum (both are
  // positive, so their unsigned sum is exact for the message).
  if (r.max_new_tokens > max_positions - prompt_len)
    invalid(str_cat("the prompt (", prompt_len, " tokens) plus max_new_tokens (", r.max_new_tokens,
                    ") needs ", uint64_t(prompt_len) + uint64_t(r.max_new_tokens),
                    " positions, more than the model's ", max_positions,
                    " (max_position_embeddings); lower max_new_tokens to at most ",
                    max_positions - prompt_len, " or shorten the prompt"));
  const int64_t total = prompt_len + r.max_new_tokens;

  // min_new_tokens wins over min_length (which counts the prompt); both only hold eos back.
  if (c.min_new_tokens) {
    if (*c.min_new_tokens < 0)
      invalid(str_cat("min_new_tokens must be >= 0, got ", *c.min_new_tokens));
    r.min_new_tokens = *c.min_new_tokens;
  } else if (c.min_length) {
    if (*c.min_length < 0) invalid(str_cat("min_length must be >= 0, got ", *c.min_length));
    r.min_new_tokens = std::max<int64_t>(0, *c.min_length - prompt_len);
  }

  r.do_sample = c.do_sample.value_or(false);
  r.num_beams = c.num_beams.value_or(1);
  if (r.num_beams < 1)
    invalid(str_cat("num_beams must be >= 1 (1: no beam search), got ", r.num_beams));
  r.num_return_sequences = c.num_return_sequences.value_or(1);
  if (r.num_return_sequences < 1)
    invalid(str_cat("num_return_sequences must be >= 1, got ", r.num_return_sequences));
  r.length_penalty = c.length_penalty.value_or(1.0);
  if (!std::isfinite(r.length_penalty))
    invalid(str_cat("length_penalty must be a finite float, got ", r.length_penalty));
  r.early_stopping = c.early_stopping.value_or(EarlyStopping::kFalse);
  if (r.num_beams > 1) {
    if (r.num_return_sequences > r.num_beams)
      invalid(str_cat("num_return_sequences (", r.num_return_sequences,
                      ") must be at most num_beams (", r.num_beams,
                      ") in beam search; raise num_beams or lower num_return_sequences"));
    if (r.do_sample)
      throw UnsupportedError(
          "generate: beam sampling (num_beams > 1 with do_sample=true) is not implemented; set "
          "do_sample=false for beam search or num_beams=1 for sampling");
  } else if (r.num_return_sequences > 1 && !r.do_sample) {
    invalid(str_cat("greedy decoding without beam search does not support num_return_sequences ",
                    "different from 1 (got ", r.num_return_sequences,
                    "): every sequence would be the same; set do_sample=true or "
                    "num_return_sequences=1"));
  } else if (r.length_penalty != 1.0 || r.early_stopping != EarlyStopping::kFalse) {
    // Transformers warns about these too (when not at their defaults): only beam search reads
    // them.
    std::fprintf(stderr,
                 "tformers: warning: length_penalty and early_stopping only apply to beam search "
                 "(num_beams > 1); they are ignored here\n");
  }

  // Sampling-only fields are ignored without do_sample, as Transformers does (it warns).
  if (r.do_sample) {
    r.temperature = c.temperature.value_or(1.0);
    if (!in_float_range(r.temperature))
      invalid(str_cat("temperature must be a strictly positive float in ", kFloatRange,
                      " when do_sample is true, got ", r.temperature,
                      "; for greedy decoding set do_sample=false"));
    r.top_k = c.top_k.value_or(50);
    if (r.top_k < 0)
      invalid(str_cat("top_k must be a non-negative integer (0 disables it), got ", r.top_k));
    r.top_p = c.top_p.value_or(1.0);
    if (!(r.top_p > 0 && r.top_p <= 1))
      invalid(str_cat("top_p must be in (0, 1] (1 disables it), got ", r.top_p));
    r.min_p = c.min_p;
    if (r.min_p && !(*r.min_p >= 0 && *r.min_p <= 1))
      invalid(str_cat("min_p must be in [0, 1], got ", *r.min_p));
    r.typical_p = c.typical_p.value_or(1.0);
    if (!(r.typical_p > 0 && r.typical_p <= 1))
      invalid(str_cat("typical_p must be in (0, 1] (1 disables it), got ", r.typical_p));
  }

  r.repetition_penalty = c.repetition_penalty.value_or(1.0);
  if (!in_float_range(r.repetition_penalty))
    invalid(str_cat("repetition_penalty must be a strictly positive float in ", kFloatRange,
                    " (1.0 means no penalty), got ", r.repetition_penalty));
  r.no_repeat_ngram_size = c.no_repeat_ngram_size.value_or(0);
  if (r.no_repeat_ngram_size < 0)
    invalid(
        str_cat("no_repeat_ngram_size must be >= 0 (0 disables it), got ", r.no_repeat_ngram_size));

  // Prompt lookup decoding checks its proposals against greedy choices of one sequence.
  r.prompt_lookup_num_tokens = c.prompt_lookup_num_tokens.value_or(0);
  if (r.prompt_lookup_num_tokens < 0 || r.prompt_lookup_num_tokens > 64)
    invalid(str_cat("prompt_lookup_num_tokens must be in [0, 64] (0 disables it), got ",
                    r.prompt_lookup_num_tokens));
  r.max_matching_ngram_size = c.max_matching_ngram_size.value_or(2);
  if (r.max_matching_ngram_size < 1 || r.max_matching_ngram_size > 64)
    invalid(str_cat("max_matching_ngram_size must be in [1, 64], got ", r.max_matching_ngram_size));
  r.num_assistant_tokens = c.num_assistant_tokens.value_or(20);
  if (r.num_assistant_tokens < 1 || r.num_assistant_tokens > 64)
    invalid(str_cat("num_assistant_tokens must be in [1, 64], got ", r.num_assistant_tokens));
  r.assistant_confidence_threshold = c.assistant_confidence_threshold.value_or(0.4);
  if (!(r.assistant_confidence_threshold >= 0 && r.assistant_confidence_threshold <= 1))
    invalid(str_cat("assistant_confidence_threshold must be in [0, 1] (0: never stop early), got ",
                    r.assistant_confidence_threshold));

  // Token ids.
  r.eos_token_id = c.eos_token_id.value_or(std::vector<int64_t>{});
  check_token_ids(r.eos_token_id, "eos_token_id", vocab_size);
  r.bad_words_ids = c.bad_words_ids.value_or(std::vector<std::vector<int64_t>>{});
  for (size_t i = 0; i < r.bad_words_ids.size(); ++i) {
    if (r.bad_words_ids[i].empty())
      invalid(str_cat("bad_words_ids[", i, "] is empty; each entry is a non-empty list of ids"));
    check_token_ids(r.bad_words_ids[i], str_cat("bad_words_ids[", i, "]"), vocab_size);
  }
  r.suppress_tokens = c.suppress_tokens.value_or(std::vector<int64_t>{});
  check_token_ids(r.suppress_tokens, "suppress_tokens", vocab_size);
  // The pad id fills finished rows and the left padding the model reads, so it must be a token.
  if (c.pad_token_id) check_token_ids({*c.pad_token_id}, "pad_token_id", vocab_size);
  // Transformers pads finished rows with the first eos id when no pad id is set.
  r.pad_token_id = c.pad_token_id;
  if (!r.pad_token_id && !r.eos_token_id.empty()) r.pad_token_id = r.eos_token_id[0];

  r.stop_strings = c.stop_strings.value_or(std::vector<std::string>{});
  for (size_t i = 0; i < r.stop_strings.size(); ++i)
    if (r.stop_strings[i].empty())
      invalid(str_cat("stop_strings[", i, "] is empty; it would stop before the first token"));

  if (c.seed) {
    r.seed = *c.seed;
  } else {
    std::random_device rd;
    r.seed = (uint64_t(rd()) << 32) ^ uint64_t(rd());
  }

  // The cache: tformers always runs a static cache; "dynamic" gives the same results.
  if (c.cache_implementation && *c.cache_implementation != "static" &&
      *c.cache_implementation != "dynamic")
    throw UnsupportedError(str_cat("generate: cache_implementation '", *c.cache_implementation,
                                   "' is not supported; use \"static\" (the default)"));
  r.max_cache_len = c.max_cache_len.value_or(total);
  if (r.max_cache_len < total)
    invalid(str_cat("max_cache_len = ", r.max_cache_len, " cannot hold the prompt (", prompt_len,
                    " tokens) plus max_new_tokens (", r.max_new_tokens, "); raise it to at least ",
                    total, " or leave it unset"));
  // No position past max_positions is ever written (the length check above), so a larger cache
  // only costs memory; refusing it also keeps every size computed from it far from overflow.
  if (r.max_cache_len > max_positions)
    invalid(str_cat("max_cache_len = ", r.max_cache_len, " is more than the model's ",
                    max_positions, " positions (max_position_embeddings); give ", total, " to ",
                    max_positions, " or leave it unset"));
  r.disable_compile = c.disable_compile.value_or(false);
  return r;
}

}  // namespace tformers
