// JSON files (config.json, generation_config.json, tokenizer files) with errors that name the
// file and the JSON path of the offending field.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace tformers::io {

using Json = nlohmann::json;

// Parses a file; FormatError with file, line and column on malformed JSON, NotFoundError when
// the file is missing.
Json load_json_file(const std::string& path);

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

}  // namespace tformers::io
