// JSON files (config.json, generation_config.json, tokenizer files) with errors that name the
// file and the JSON path of the offending field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace tformers::io {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Nesting allowed in any JSON file tformers reads. Real files nest under 20 levels; the bound
// keeps every recursive walk over a parsed document (copies, dumps, comparisons) off the end
// of the stack.
inline constexpr size_t kMaxJsonDepth = 512;

// Size caps per kind of JSON file, far above any real one (Qwen3's tokenizer.json is 11 MB).
inline constexpr size_t kMaxConfigJsonBytes = 16u << 20;      // config, generation/tokenizer config
inline constexpr size_t kMaxTokenizerJsonBytes = 512u << 20;  // tokenizer.json
inline constexpr size_t kMaxIndexJsonBytes = 256u << 20;      // model.safetensors.index.json

// FormatError "WHERE:LINE:COL: JSON nests deeper than N levels" when an array or object in
// `text` opens below depth `max_depth`. Strings are skipped; the text need not be valid JSON
// (the parser reports that), so this runs before parsing.
void check_json_depth(std::string_view text, const std::string& where,
                      size_t max_depth = kMaxJsonDepth);

// Parses JSON text (depth-checked as above); FormatError with `where`, line and column on
// malformed JSON.
Json parse_json(std::string_view text, const std::string& where);

// As parse_json, into an ordered_json (keys in the text's order), in time linear in the text.
// ordered_json's own parser looks each key up in the object it fills, a scan of the keys so far,
// so an object of n keys cost n^2/2 comparisons (80,000 keys: 17 s). A key given twice keeps its
// first place and its last value, as there.
OrderedJson parse_ordered_json(std::string_view text, const std::string& where,
                               size_t max_depth = kMaxJsonDepth);

// Reads a regular file of at most `max_bytes` (io/file.h) and parses it as parse_json does.
// NotFoundError when the file is missing.
Json load_json_file(const std::string& path, size_t max_bytes = kMaxConfigJsonBytes);

// Typed field access. `where` names the file (and any parent path) for messages such as
// "config.json: field 'hidden_size' must be an integer, got string \"abc\"".
// T is one of int64_t, int, double, float, bool, std::string, std::vector<int64_t>, Json.
// - get_required: NotFoundError "WHERE: required field 'KEY' is missing" (also when null,
//   except for T = Json); FormatError naming the field and the expected type on a mismatch.
// - get_or / get_optional: an absent or null field gives the fallback / nullopt (null means
//   "unset" in Transformers' configs, e.g. "rope_scaling": null).
// Integers accept integral floats (4096.0) in range; doubles accept integers; an integer counts
// as a one-element std::vector<int64_t> (eos_token_id is written either way). `obj` that is not
// an object is a FormatError.
template <typename T>
T get_required(const Json& obj, const std::string& key, const std::string& where);
template <typename T>
T get_or(const Json& obj, const std::string& key, T fallback, const std::string& where);
template <typename T>
std::optional<T> get_optional(const Json& obj, const std::string& key, const std::string& where);

// Range-checked numbers. Each reads the field as get_required / get_or do, then throws
// FormatError "WHERE: field 'KEY' = V is out of range; allowed [LO, HI]" (bounds inclusive)
// when the value is outside; a missing field in get_int_in is NotFoundError as in get_required.
int64_t get_int_in(const Json& obj, const std::string& key, int64_t lo, int64_t hi,
                   const std::string& where);
int64_t get_int_in_or(const Json& obj, const std::string& key, int64_t fallback, int64_t lo,
                      int64_t hi, const std::string& where);
std::optional<int64_t> get_int_in_optional(const Json& obj, const std::string& key, int64_t lo,
                                           int64_t hi, const std::string& where);

// A finite number > 0 (rope_theta, rms_norm_eps): FormatError "WHERE: field 'KEY' = V must be a
// finite number > 0" otherwise (NaN, infinities, zero, negatives).
double get_positive_finite(const Json& obj, const std::string& key, const std::string& where);
double get_positive_finite_or(const Json& obj, const std::string& key, double fallback,
                              const std::string& where);

// A finite number in [lo, hi] (dropout, partial_rotary_factor, scaling factors).
double get_double_in(const Json& obj, const std::string& key, double lo, double hi,
                     const std::string& where);
double get_double_in_or(const Json& obj, const std::string& key, double fallback, double lo,
                        double hi, const std::string& where);

}  // namespace tformers::io
