// A JSON reader for tokenizer.json that fills the two huge members (model.vocab, model.merges)
// straight into flat vectors and builds nlohmann::json only for the rest. nlohmann's DOM alone
// takes ~190 ms on Qwen3's 11 MB file; this keeps the whole load under the 100 ms budget.
#pragma once

#include <deque>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tformers::tokenizer_detail {

struct TokenizerJson {
  nlohmann::json doc;       // the file without model.vocab / model.merges when those were taken out
  bool has_vocab = false;   // model.vocab was an object {token: id}
  bool has_merges = false;  // model.merges was an array
  // Views into the parsed text, or into `arena` for strings that had escapes; valid while both
  // the text and this object live.
  std::vector<std::pair<std::string_view, int64_t>> vocab;
  std::vector<std::pair<std::string_view, std::string_view>> merges;
  std::deque<std::string> arena;
};

// FormatError naming `where`, line and column on malformed JSON, and the JSON path
// (model.merges[12]) for members of the wrong type.
TokenizerJson parse_tokenizer_json(std::string_view text, const std::string& where);

}  // namespace tformers::tokenizer_detail
