// Tokenizers that read Hugging Face tokenizer.json + tokenizer_config.json and give the token ids
// of the Rust `tokenizers` library (normalizer -> added tokens -> pre-tokenizer -> model ->
// post-processor, and the decoder chain back), plus what Transformers' PreTrainedTokenizerFast
// adds on top: special-token attributes, batch calls with padding and truncation, chat templates.
//
// Text is UTF-8. Invalid UTF-8 given to encode is not an error: each maximal invalid subpart is
// replaced by U+FFFD first, as Python's bytes.decode("utf-8", errors="replace") and JavaScript's
// TextDecoder do, because the Rust library only accepts valid strings (&str).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tformers {

namespace tokenizer_detail {
struct TokenizerImpl;
}

struct DecodeOptions {
  bool skip_special_tokens = false;
  // Transformers' clean_up_tokenization (" ." -> "." ...). Unset: tokenizer_config.json's
  // clean_up_tokenization_spaces (false when absent).
  std::optional<bool> clean_up_tokenization_spaces;
};

enum class PaddingStrategy { kDoNotPad, kLongest, kMaxLength };

// Options of Transformers' tokenizer __call__ for a batch.
struct CallOptions {
  bool add_special_tokens = true;
  PaddingStrategy padding = PaddingStrategy::kDoNotPad;
  bool truncation = false;
  // Unset: model_max_length from tokenizer_config.json (used by truncation and kMaxLength).
  std::optional<int64_t> max_length;
  std::optional<int64_t> pad_to_multiple_of;
  // "left" or "right"; unset: the tokenizer's padding_side / truncation_side.
  std::optional<std::string> padding_side;
  std::optional<std::string> truncation_side;
};

// input_ids [batch][seq] and attention_mask [batch][seq] (1 = real token, 0 = padding).
struct BatchEncoding {
  std::vector<std::vector<int32_t>> input_ids;
  std::vector<std::vector<int32_t>> attention_mask;
};

class Tokenizer {
 public:
  // The Rust library's Tokenizer::from_file: tokenizer.json only, no Transformers config.
  static Tokenizer from_file(const std::string& tokenizer_json_path);
  // Same from the JSON text; `where` names the source in error messages.
  static Tokenizer from_json_string(std::string_view json_text,
                                    const std::string& where = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of one text (and of an optional pair, for the post-processor's pair template).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  std::vector<int32_t> encode_pair(std::string_view text, std::string_view pair,
                                   bool add_special_tokens = true) const;
  // Token strings of one text (convert_ids_to_tokens(encode(text))).
  std::vector<std::string> tokenize(std::string_view text, bool add_special_tokens = false) const;

  std::string decode(std::span<const int32_t> ids, const DecodeOptions& options = {}) const;
  std::vector<std::string> batch_decode(const std::vector<std::vector<int32_t>>& ids,
                                        const DecodeOptions& options = {}) const;

  // Transformers' tokenizer(texts, padding=..., truncation=..., max_length=...).
  BatchEncoding operator()(const std::vector<std::string>& texts,
                           const CallOptions& options = {}) const;

  // Vocabulary (model vocab plus added tokens).
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  std::vector<std::string> convert_ids_to_tokens(std::span<const int32_t> ids) const;
  // The bytes a token of the model's vocabulary stands for in the middle of a text, as the
  // decoder gives them (byte-level BPE's "Ġthe" is " the", "<0x0A>" is "\n", "▁the" is " the"),
  // raw: a token that holds part of a UTF-8 character gives that part. Constrained decoding
  // matches tokens by these bytes. nullopt for an id the model's vocabulary lacks, and for added
  // tokens (special or not: <|im_end|>, <think>), which are not pieces of text.
  std::optional<std::string> token_bytes(int32_t id) const;
  size_t vocab_size() const;  // len(tokenizer): the largest id + 1
  bool is_special_id(int32_t id) const;
  // Number of ids the post-processor adds to one sequence (or a pair).
  size_t num_special_tokens_to_add(bool pair = false) const;

  // Special tokens from tokenizer_config.json (empty / unset when the config has none).
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  const std::string& pad_token() const;
  const std::string& unk_token() const;
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> pad_token_id() const;
  std::optional<int32_t> unk_token_id() const;
  int64_t model_max_length() const;
  const std::string& padding_side() const;
  void set_padding_side(const std::string& side);  // "left" or "right"
  void set_pad_token(const std::string& token);    // tokenizer.pad_token = token
  const std::string& chat_template() const;        // empty when the config has none
  // Replaces the chat template (Transformers: tokenizer.chat_template = ...).
  void set_chat_template(std::string chat_template);
  const nlohmann::json& config() const;  // tokenizer_config.json as read
  const std::string& folder() const;     // the folder from_pretrained read; empty from a file

  // Renders the chat template (tokenizer_config.json's, or `chat_template` when given) like
  // Transformers' apply_chat_template(tokenize=False): messages, tools (null for none),
  // add_generation_prompt, the special tokens, and `extra` merged into the context (for example
  // {"enable_thinking": false}). ordered_json keeps key order, which `tojson` of tool schemas
  // needs to match Transformers; nlohmann::json arguments convert implicitly.
  std::string apply_chat_template(
      const nlohmann::ordered_json& messages, bool add_generation_prompt = false,
      const nlohmann::ordered_json& tools = nullptr,
      const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
      const std::string& chat_template = "") const;

 private:
  friend class AutoTokenizer;
  explicit Tokenizer(std::unique_ptr<tokenizer_detail::TokenizerImpl> impl);
  std::unique_ptr<tokenizer_detail::TokenizerImpl> impl_;

 public:
  const tokenizer_detail::TokenizerImpl& impl() const { return *impl_; }
};

class AutoTokenizer {
 public:
  // A model folder (or Hub id found in the local cache) holding tokenizer.json and, optionally,
  // tokenizer_config.json. Transformers' LlamaTokenizerFast/GemmaTokenizerFast rebuild the
  // post-processor from add_bos_token/add_eos_token; that is mirrored here. `revision` (a
  // branch, tag or commit hash) picks the Hub cache snapshot, as in Transformers.
  static Tokenizer from_pretrained(const std::string& id_or_path,
                                   const std::string& revision = "main");
};

// Incremental decoding for generation: push ids one at a time and get back only text that is
// final, never half a UTF-8 character (like the Rust library's DecodeStream).
class TokenStreamer {
 public:
  explicit TokenStreamer(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  // Text that became complete with this id (often empty).
  std::string put(int32_t id);
  // Whatever is still held back (an incomplete character decodes to U+FFFD here).
  std::string end();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;
  size_t prefix_ids_ = 0;
  std::string prefix_text_;
};

}  // namespace tformers
