// GenerationConfig: reading generation_config.json and layering configs (merged_with).
// Resolving them into one call's values is generation's (src/generation/resolve.cc).
#include <algorithm>
#include <cstdio>

#include "io/json.h"
#include "tformers/error.h"
#include "tformers/generation.h"

namespace tformers {

namespace {

using detail::str_cat;
using io::get_optional;
using io::Json;

// bad_words_ids: a list of token-id lists ([[5], [7, 8]]).
std::optional<std::vector<std::vector<int64_t>>> get_bad_words(const Json& j,
                                                               const std::string& where) {
  auto v = get_optional<Json>(j, "bad_words_ids", where);
  if (!v || v->is_null()) return std::nullopt;
  if (!v->is_array())
    throw FormatError(str_cat(where,
                              ": field 'bad_words_ids' must be a list of lists of token ids "
                              "([[5], [7, 8]]), got ",
                              v->type_name()));
  std::vector<std::vector<int64_t>> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& seq = (*v)[i];
    if (!seq.is_array())
      throw FormatError(str_cat(where, ": field 'bad_words_ids[", i,
                                "]' must be a list of token ids (bad_words_ids is a list of "
                                "lists, e.g. [[5], [7, 8]]), got ",
                                seq.type_name()));
    // Reuse the typed reader for the inner list so errors name the element.
    Json holder = Json::object({{str_cat("bad_words_ids[", i, "]"), seq}});
    out.push_back(
        *get_optional<std::vector<int64_t>>(holder, str_cat("bad_words_ids[", i, "]"), where));
  }
  return out;
}

// stop_strings: one string or a list of strings, as Transformers accepts.
std::optional<std::vector<std::string>> get_stop_strings(const Json& j, const std::string& where) {
  auto v = get_optional<Json>(j, "stop_strings", where);
  if (!v || v->is_null()) return std::nullopt;
  if (v->is_string()) return std::vector<std::string>{v->get<std::string>()};
  if (!v->is_array())
    throw FormatError(str_cat(where,
                              ": field 'stop_strings' must be a string or a list of "
                              "strings, got ",
                              v->type_name()));
  std::vector<std::string> out;
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string())
      throw FormatError(str_cat(where, ": field 'stop_strings[", i, "]' must be a string, got ",
                                (*v)[i].type_name()));
    out.push_back((*v)[i].get<std::string>());
  }
  return out;
}

// early_stopping: true, false or "never".
std::optional<EarlyStopping> get_early_stopping(const Json& j, const std::string& where) {
  auto v = get_optional<Json>(j, "early_stopping", where);
  if (!v || v->is_null()) return std::nullopt;
  if (v->is_boolean()) return v->get<bool>() ? EarlyStopping::kTrue : EarlyStopping::kFalse;
  if (v->is_string() && v->get<std::string>() == "never") return EarlyStopping::kNever;
  throw FormatError(
      str_cat(where, ": field 'early_stopping' must be true, false or \"never\", got ", v->dump()));
}

// Transformers' GenerationConfig fields that tformers does not implement, with their defaults:
// a config that sets one to anything else would generate differently there, so it is named.
const std::pair<const char*, Json> kUnimplemented[] = {
    {"num_beam_groups", 1},
    {"diversity_penalty", 0.0},
    {"penalty_alpha", nullptr},
    {"dola_layers", nullptr},
    {"epsilon_cutoff", 0.0},
    {"eta_cutoff", 0.0},
    {"top_h", nullptr},
    {"encoder_repetition_penalty", 1.0},
    {"encoder_no_repeat_ngram_size", 0},
    {"force_words_ids", nullptr},
    {"constraints", nullptr},
    {"renormalize_logits", false},
    {"forced_bos_token_id", nullptr},
    {"forced_eos_token_id", nullptr},
    {"remove_invalid_values", false},
    {"exponential_decay_length_penalty", nullptr},
    {"begin_suppress_tokens", nullptr},
    {"forced_decoder_ids", nullptr},
    {"sequence_bias", nullptr},
    {"token_healing", false},
    {"guidance_scale", nullptr},
    {"low_memory", nullptr},
    {"watermarking_config", nullptr},
    {"max_time", nullptr},
    {"assistant_model", nullptr},
    {"num_assistant_tokens_schedule", "constant"},
    {"assistant_early_exit", nullptr},
    {"assistant_lookbehind", 10},
    {"target_lookbehind", 10},
    {"output_attentions", false},
    {"output_hidden_states", false},
    {"return_dict_in_generate", false},
};

void warn_unimplemented(const Json& j, const std::string& where) {
  if (!j.is_object()) return;
  for (const auto& [name, fallback] : kUnimplemented) {
    auto it = j.find(name);
    if (it == j.end() || it->is_null() || *it == fallback) continue;
    std::fprintf(stderr,
                 "tformers: warning: %s: %s = %s is not implemented in tformers and is ignored; "
                 "generation differs from Transformers' (remove the field to silence this)\n",
                 where.c_str(), name, it->dump(-1, ' ', true).c_str());
  }
}

template <typename T>
void take(std::optional<T>& field, const std::optional<T>& over) {
  if (over) field = over;
}

// The fields of a generation config read from `j`; `w` names its source in errors.
GenerationConfig read_config(const Json& j, const std::string& w) {
  GenerationConfig c;
  c.max_length = get_optional<int64_t>(j, "max_length", w);
  c.max_new_tokens = get_optional<int64_t>(j, "max_new_tokens", w);
  c.min_length = get_optional<int64_t>(j, "min_length", w);
  c.min_new_tokens = get_optional<int64_t>(j, "min_new_tokens", w);
  c.do_sample = get_optional<bool>(j, "do_sample", w);
  c.num_beams = get_optional<int64_t>(j, "num_beams", w);
  c.num_return_sequences = get_optional<int64_t>(j, "num_return_sequences", w);
  c.length_penalty = get_optional<double>(j, "length_penalty", w);
  c.early_stopping = get_early_stopping(j, w);
  c.temperature = get_optional<double>(j, "temperature", w);
  c.top_k = get_optional<int64_t>(j, "top_k", w);
  c.top_p = get_optional<double>(j, "top_p", w);
  c.min_p = get_optional<double>(j, "min_p", w);
  c.typical_p = get_optional<double>(j, "typical_p", w);
  c.repetition_penalty = get_optional<double>(j, "repetition_penalty", w);
  c.no_repeat_ngram_size = get_optional<int64_t>(j, "no_repeat_ngram_size", w);
  c.prompt_lookup_num_tokens = get_optional<int64_t>(j, "prompt_lookup_num_tokens", w);
  c.max_matching_ngram_size = get_optional<int64_t>(j, "max_matching_ngram_size", w);
  c.num_assistant_tokens = get_optional<int64_t>(j, "num_assistant_tokens", w);
  c.assistant_confidence_threshold = get_optional<double>(j, "assistant_confidence_threshold", w);
  c.bad_words_ids = get_bad_words(j, w);
  c.suppress_tokens = get_optional<std::vector<int64_t>>(j, "suppress_tokens", w);
  c.eos_token_id = get_optional<std::vector<int64_t>>(j, "eos_token_id", w);
  c.pad_token_id = get_optional<int64_t>(j, "pad_token_id", w);
  c.bos_token_id = get_optional<int64_t>(j, "bos_token_id", w);
  c.stop_strings = get_stop_strings(j, w);
  if (auto seed = get_optional<int64_t>(j, "seed", w)) {
    if (*seed < 0)
      throw FormatError(str_cat(w, ": field 'seed' = ", *seed, " must be a non-negative integer"));
    c.seed = uint64_t(*seed);
  }
  c.cache_implementation = get_optional<std::string>(j, "cache_implementation", w);
  c.max_cache_len = get_optional<int64_t>(j, "max_cache_len", w);
  c.disable_compile = get_optional<bool>(j, "disable_compile", w);
  c.output_scores = get_optional<bool>(j, "output_scores", w);
  c.output_logits = get_optional<bool>(j, "output_logits", w);
  warn_unimplemented(j, w);
  return c;
}

}  // namespace

GenerationConfig GenerationConfig::from_file(const std::string& path) {
  return read_config(io::load_json_file(path), path);
}

GenerationConfig GenerationConfig::from_json_string(std::string_view json_text,
                                                    const std::string& where) {
  const Json j = io::parse_json(json_text, where);
  GenerationConfig c = read_config(j, where);
  // Keyword arguments, unlike a file, are typed by a person: one that is no field (a typo such as
  // max_new_token) is refused, as Transformers' generate() refuses unused model_kwargs. A key is
  // a field when reading it alone sets something; the unimplemented ones are named above, and
  // these are Transformers' bookkeeping or make no difference here (the static cache is always
  // used).
  static const char* const kNoEffect[] = {"transformers_version", "_from_model_config",
                                          "use_cache"};
  for (const auto& item : j.items()) {
    // Named, not a structured binding: clang 14 (the fuzz build's) cannot capture one in a lambda.
    const std::string& key = item.key();
    const Json& value = item.value();
    auto named = [&](const char* name) { return key == name; };
    if (value.is_null() || std::ranges::any_of(kNoEffect, named) ||
        std::ranges::any_of(kUnimplemented, [&](const auto& f) { return named(f.first); }))
      continue;
    if (read_config(Json::object({{key, value}}), where) == GenerationConfig{})
      throw InvalidArgumentError(str_cat(where, ": '", key,
                                         "' is not a generation setting (GenerationConfig's "
                                         "fields are listed in docs/python.md)"));
  }
  return c;
}

GenerationConfig GenerationConfig::merged_with(const GenerationConfig& o) const {
  GenerationConfig c = *this;
  take(c.max_length, o.max_length);
  take(c.max_new_tokens, o.max_new_tokens);
  take(c.min_length, o.min_length);
  take(c.min_new_tokens, o.min_new_tokens);
  take(c.do_sample, o.do_sample);
  take(c.num_beams, o.num_beams);
  take(c.num_return_sequences, o.num_return_sequences);
  take(c.length_penalty, o.length_penalty);
  take(c.early_stopping, o.early_stopping);
  take(c.temperature, o.temperature);
  take(c.top_k, o.top_k);
  take(c.top_p, o.top_p);
  take(c.min_p, o.min_p);
  take(c.typical_p, o.typical_p);
  take(c.repetition_penalty, o.repetition_penalty);
  take(c.no_repeat_ngram_size, o.no_repeat_ngram_size);
  take(c.prompt_lookup_num_tokens, o.prompt_lookup_num_tokens);
  take(c.max_matching_ngram_size, o.max_matching_ngram_size);
  take(c.num_assistant_tokens, o.num_assistant_tokens);
  take(c.assistant_confidence_threshold, o.assistant_confidence_threshold);
  take(c.bad_words_ids, o.bad_words_ids);
  take(c.suppress_tokens, o.suppress_tokens);
  take(c.eos_token_id, o.eos_token_id);
  take(c.pad_token_id, o.pad_token_id);
  take(c.bos_token_id, o.bos_token_id);
  take(c.stop_strings, o.stop_strings);
  take(c.seed, o.seed);
  take(c.cache_implementation, o.cache_implementation);
  take(c.max_cache_len, o.max_cache_len);
  take(c.disable_compile, o.disable_compile);
  take(c.output_scores, o.output_scores);
  take(c.output_logits, o.output_logits);
  return c;
}

}  // namespace tformers
