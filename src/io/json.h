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
// "config.json: field 'hidden_size' must be an integer, got string".
template <typename T>
T get_required(const Json& obj, const std::string& key, const std::string& where);
template <typename T>
T get_or(const Json& obj, const std::string& key, T fallback, const std::string& where);
template <typename T>
std::optional<T> get_optional(const Json& obj, const std::string& key, const std::string& where);

}  // namespace tformers::io
