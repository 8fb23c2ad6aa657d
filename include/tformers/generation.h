// Generation settings, named and defaulted as in Transformers' GenerationConfig. Every field is
// optional so configs can be layered with Transformers' precedence: global defaults, then the
// model's generation_config.json, then the config passed to generate(), then per-call overrides
// (GenerationConfig::merged_with). resolve() fills the defaults and validates the combination.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tformers {

class CausalLM;
class Tokenizer;

// Transformers' early_stopping: True, False or "never".
enum class EarlyStopping { kFalse, kTrue, kNever };

struct GenerationConfig {
  // Length. max_new_tokens wins over max_length (prompt + new tokens, default 20).
  std::optional<int64_t> max_length;
  std::optional<int64_t> max_new_tokens;
  std::optional<int64_t> min_length;  // default 0
  std::optional<int64_t> min_new_tokens;
  // Strategy.
  std::optional<bool> do_sample;                // default false (greedy)
  std::optional<int64_t> num_beams;             // default 1 (no beam search)
  std::optional<int64_t> num_return_sequences;  // default 1
  // Beam search: finished hypotheses score sum(log p) / generated_length ** length_penalty.
  std::optional<double> length_penalty;  // default 1.0
  // When beam search stops: kTrue as soon as num_beams hypotheses are finished, kFalse (the
  // default) when no running beam is likely to beat them, kNever when none can.
  std::optional<EarlyStopping> early_stopping;
  // Logits processors and warpers (Transformers' defaults in comments).
  std::optional<double> temperature;            // 1.0
  std::optional<int64_t> top_k;                 // 50
  std::optional<double> top_p;                  // 1.0
  std::optional<double> min_p;                  // unset
  std::optional<double> typical_p;              // 1.0
  std::optional<double> repetition_penalty;     // 1.0
  std::optional<int64_t> no_repeat_ngram_size;  // 0
  std::optional<std::vector<std::vector<int64_t>>> bad_words_ids;
  std::optional<std::vector<int64_t>> suppress_tokens;
  // Special tokens and stopping.
  std::optional<std::vector<int64_t>> eos_token_id;  // one id or a list
  std::optional<int64_t> pad_token_id;
  std::optional<int64_t> bos_token_id;
  std::optional<std::vector<std::string>> stop_strings;  // needs a tokenizer
  // Sampling seed: the same seed gives the same output. Unset: a fresh random seed per call.
  std::optional<uint64_t> seed;
  // Cache and compilation.
  std::optional<std::string> cache_implementation;  // "static" (the only one on the CPU)
  // Static cache length. Default: the padded prompt plus max_new_tokens, rounded up to the next
  // power of two from 16 (as prompts are), so that different max_new_tokens share one compiled
  // prefill and decode step; at most twice the KV memory of the exact length.
  std::optional<int64_t> max_cache_len;
  std::optional<bool> disable_compile;  // run without the compile cache
  // Prompt lookup decoding (Transformers' names): up to prompt_lookup_num_tokens tokens that
  // followed an earlier occurrence of the output's last n-gram (n up to max_matching_ngram_size,
  // default 2) are checked in one forward, and those greedy search would choose are kept: the
  // same tokens as without it, fewer steps. Greedy search of one sequence, attention-only models.
  std::optional<int64_t> prompt_lookup_num_tokens;
  std::optional<int64_t> max_matching_ngram_size;
  // Assisted generation (generate()'s assistant_model): the assistant proposes up to
  // num_assistant_tokens tokens (default 20, Transformers' "constant" schedule), stopping early
  // once it gives its own choice less than assistant_confidence_threshold (default 0.4).
  std::optional<int64_t> num_assistant_tokens;
  std::optional<double> assistant_confidence_threshold;
  // What tformers::generate() returns besides the sequences (GenerateOutput): each step's
  // scores after the logits processors, and each step's raw logits. Only the config passed to
  // generate() turns them on, not generation_config.json, so that callers that read only the
  // sequences never keep every step's logits.
  std::optional<bool> output_scores;  // default false
  std::optional<bool> output_logits;  // default false

  // Reads generation_config.json; unknown fields are ignored as in Transformers, fields of the
  // wrong type are a FormatError naming the field. A Transformers field that tformers does not
  // implement (num_beam_groups, diversity_penalty, constraints, penalty_alpha, ...) set to
  // something other than its default gets a warning on stderr naming it.
  static GenerationConfig from_file(const std::string& path);
  // Same from JSON text (the Python package passes generate()'s keyword arguments this way);
  // `where` names the source in error messages. Unlike a file, a key that is no field of
  // Transformers' GenerationConfig (a typo) is an InvalidArgumentError.
  static GenerationConfig from_json_string(std::string_view json_text, const std::string& where);
  // This config with every field that `over` sets replaced by `over`'s value.
  GenerationConfig merged_with(const GenerationConfig& over) const;
  bool operator==(const GenerationConfig&) const = default;
};

// A config with every default filled in and every value checked (InvalidArgumentError naming
// the field and the accepted range).
struct ResolvedGenerationConfig {
  int64_t max_new_tokens = 0;  // computed for a given prompt length
  int64_t min_new_tokens = 0;
  bool do_sample = false;
  int64_t num_beams = 1;
  int64_t num_return_sequences = 1;
  double length_penalty = 1.0;
  EarlyStopping early_stopping = EarlyStopping::kFalse;
  double temperature = 1.0;
  int64_t top_k = 50;
  double top_p = 1.0;
  std::optional<double> min_p;
  double typical_p = 1.0;
  double repetition_penalty = 1.0;
  int64_t no_repeat_ngram_size = 0;
  std::vector<std::vector<int64_t>> bad_words_ids;
  std::vector<int64_t> suppress_tokens;
  std::vector<int64_t> eos_token_id;
  std::optional<int64_t> pad_token_id;
  std::vector<std::string> stop_strings;
  uint64_t seed = 0;
  int64_t max_cache_len = 0;
  bool disable_compile = false;
  int64_t prompt_lookup_num_tokens = 0;  // 0: off
  int64_t max_matching_ngram_size = 2;
  int64_t num_assistant_tokens = 20;
  double assistant_confidence_threshold = 0.4;
  bool output_scores = false;  // set by generate() from its call's config, not by resolve()
  bool output_logits = false;
  // OpenAI's presence_penalty, frequency_penalty and logit_bias (token id, bias), which
  // Transformers' GenerationConfig has no fields for: the serving engine sets them from its
  // request (ServingRequest), not resolve().
  double presence_penalty = 0, frequency_penalty = 0;
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// Fills defaults and validates `config` for a prompt of `prompt_len` tokens and a model with
// `vocab_size` entries and `max_positions` positions.
ResolvedGenerationConfig resolve(const GenerationConfig& config, int64_t prompt_len,
                                 int64_t vocab_size, int64_t max_positions);

// Receives tokens as they are generated (row, token id); generation stops early if it returns
// false.
using TokenCallback = std::function<bool(int64_t row, int32_t token)>;

// Asked once per step, after its forward pass, in beam search too; generation stops there when it
// returns false. It cancels rather than streams, so unlike a TokenCallback it works where tokens
// are final only at the end (the Python package checks for Ctrl-C in it).
using StepCallback = std::function<bool()>;

// Why a returned row ended: "stop" (an eos id or a stop string), "length" (max_new_tokens) or
// "callback" (on_token or on_step returned false), as OpenAI's finish_reason.
struct GenerateOutput {
  std::vector<std::vector<int32_t>> sequences;
  // Beam search only: each returned hypothesis' score, sum(log p) / length ** length_penalty
  // (Transformers' sequences_scores). Empty otherwise.
  std::vector<float> sequences_scores;
  std::vector<std::string> finish_reasons;
  // With output_scores / output_logits, one entry per generated step, each rows × vocab_size
  // float32 (row-major), as Transformers' scores and logits tuples: the rows are the sequences'
  // rows, or with beam search the running beams (num_beams per prompt). `scores` are the logits
  // after the logits processors (and warpers when sampling); with beam search they are
  // log_softmax's outputs after the processors, before the beam's running score is added.
  std::vector<std::vector<float>> scores;
  std::vector<std::vector<float>> logits;
  // With a KeptCache: the prompt's leading tokens found in the cache, which were not computed.
  int64_t cached_prompt_tokens = 0;
  // With prompt lookup or an assistant: the tokens proposed, and those of them kept (vLLM's
  // num_draft_tokens and num_accepted_tokens).
  int64_t draft_tokens = 0, accepted_draft_tokens = 0;
};

// What one row's generate() call left in the model's static cache, for the next call of a
// conversation: passed to each call, it lets a prompt that begins with those tokens (a chat's
// history, now with the reply and a new message) compute only what follows them, as llama.cpp's
// chat keeps its cache between turns (Transformers: past_key_values handed back to generate).
// The prompt's last token is always computed, for its logits. The whole prompt is computed when
// the cache holds none of it, when anything else ran the model since (another generate(), a
// forward(), a serving engine), or when the cache length differs (set max_cache_len to keep it
// fixed); tokens and logits then are those of a call without one. With one, a prompt's numbers
// differ from a fresh call's in the last bits (its tokens are computed in other groups), as
// llama.cpp's do. One prompt, num_return_sequences 1, no beam search.
struct KeptCache {
  std::vector<int32_t> tokens;  // the ids whose keys and values the cache holds, in order
  std::vector<int32_t> slots;   // the cache slot of each
  int64_t cache_len = 0;
  uint64_t cache_writes = 0;  // the model's count of steps and allocations after that call
};

// model.generate() with Transformers' return_dict_in_generate=True: the same sequences, plus
// beam scores, per-step scores and logits when asked, and why each row ended. With num_beams > 1
// (beam search) nothing is streamed, so `on_token` must be empty, as Transformers refuses a
// streamer there; `on_step` may cancel any search. `assistant_model` (assisted generation, as
// Transformers' argument of that name): another model of the same vocabulary whose greedy
// proposals `model` checks several at a time; greedy search of one sequence, the same tokens as
// without it, models without recurrent state.
GenerateOutput generate(CausalLM& model, const std::vector<std::vector<int32_t>>& input_ids,
                        const GenerationConfig& config = {}, const TokenCallback& on_token = {},
                        const Tokenizer* tokenizer = nullptr, const StepCallback& on_step = {},
                        KeptCache* kept = nullptr, CausalLM* assistant_model = nullptr);

}  // namespace tformers
