// The stages of a tokenizer.json pipeline, each built from its JSON object:
//   normalizer -> pre_tokenizer -> model (bpe.h) -> post_processor, and decoder for the way back.
// Unknown "type" values are UnsupportedError naming the JSON path and the supported types.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tformers::tokenizer_detail {

using Json = nlohmann::json;

// A compiled PCRE2 pattern (UTF + UCP + JIT) with Oniguruma's meaning of \s, which is what the
// Rust library uses.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Non-overlapping matches [start, end) over valid UTF-8 text, left to right.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*, the pattern as PCRE2's Unicode 14 reads it
  // The pattern with its \p{X} classes extended by the characters Unicode 15+ added (null when
  // that changes nothing): used only for text that holds such a character, since the long
  // classes cost about a fifth of the speed on other text.
  void* newer_code_ = nullptr;
};

// A Split pattern: a literal string or a regex.
class Pattern {
 public:
  Pattern(const Json& pattern, const std::string& where);
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Cuts `text` into pieces by the matches of a pattern, the way the Rust library's
// NormalizedString::split does; empty pieces are dropped.
// `first_start`, when given, receives the offset of the first piece kept (npos when none is).
void split_by_matches(std::string_view text, const std::vector<std::pair<size_t, size_t>>& matches,
                      SplitBehavior behavior, bool invert, std::vector<std::string>& out,
                      size_t* first_start = nullptr);

// Normalizers and pre-tokenizers are small programs written in tokenizer.json, and they can
// expand text: eight Replace steps of "a" -> 16 "a"s turn one byte into 4 GiB. Their output may
// be at most kMaxGrowth times their input plus kGrowthSlack bytes (room for Prepend and
// Metaspace markers on short inputs); real tokenizers stay under 4 times.
struct GrowthBudget {
  static constexpr size_t kMaxGrowth = 64;
  static constexpr size_t kGrowthSlack = 64 * 1024;
  explicit GrowthBudget(size_t input_bytes);
  size_t input_bytes;
  size_t max_bytes;
  // FormatError naming `path` (the tokenizer.json component) and the budget when `bytes` is
  // over it.
  void check(size_t bytes, const std::string& path) const;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Steps that can multiply the text check `budget` before building it; sequences check it
  // after every step.
  virtual void normalize(std::string& text, const GrowthBudget& budget) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // `at_input_start`: the first split starts at offset 0 of the original input (Metaspace's
  // prepend_scheme "first" needs it); cleared by a pre-tokenizer that removes the text before it.
  // Every step grows the text by a bounded factor; sequences check `budget` after each one.
  virtual void pre_tokenize(std::vector<std::string>& splits, bool& at_input_start,
                            const GrowthBudget& budget) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // One token as the raw bytes it adds in the middle of a text (constrained decoding needs each
  // token's bytes): what decode_chain does to each token, without the steps that look at the
  // whole text (the first token's prefix space, stripping the ends) and without replacing
  // invalid UTF-8, since a token may hold part of a character.
  virtual void raw_token(std::string& token) const = 0;
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual size_t added_tokens(bool pair) const = 0;
  // Joins the sequences with special tokens when add_special_tokens, else just concatenates.
  virtual std::vector<int32_t> process(std::vector<int32_t> a, const std::vector<int32_t>* b,
                                       bool add_special_tokens) const = 0;
};

// Token string -> id, for the post-processors that name their special tokens.
using TokenLookup = std::unordered_map<std::string, int32_t>;

std::unique_ptr<Normalizer> make_normalizer(const Json& j, const std::string& path);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j, const std::string& path);
std::unique_ptr<Decoder> make_decoder(const Json& j, const std::string& path);
std::unique_ptr<PostProcessor> make_post_processor(const Json& j, const std::string& path);
// The post-processor Transformers' LlamaTokenizerFast builds from add_bos_token/add_eos_token.
std::unique_ptr<PostProcessor> make_bos_eos_processor(std::vector<int32_t> bos,
                                                      std::vector<int32_t> eos);

// Shared JSON accessors whose errors name the file path and JSON path.
const Json& member(const Json& j, const char* key, const std::string& path);
std::string get_string(const Json& j, const char* key, const std::string& path);
bool get_bool(const Json& j, const char* key, const std::string& path, bool fallback);
std::string component_type(const Json& j, const std::string& path, const char* supported);

}  // namespace tformers::tokenizer_detail
