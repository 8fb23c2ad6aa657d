// The internals behind tformers::Tokenizer, shared by tokenizer.cc and chat_template.cc.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/components.h"

namespace tformers::tokenizer_detail {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, normalized = false, single_word = false;
};

// Leftmost-longest matching of added tokens (what the Rust library's Aho-Corasick does).
class AddedTokenTrie {
 public:
  void add(const std::string& content, int32_t token_index);
  bool empty() const { return nodes_.size() <= 1; }
  // (start, end, token index) of non-overlapping matches, left to right.
  void find(std::string_view text, std::vector<std::tuple<size_t, size_t, int32_t>>& out) const;

 private:
  struct Node {
    int32_t token = -1;
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
  };
  std::vector<Node> nodes_{Node{}};
  bool first_byte_[256] = {};
};

struct TokenizerImpl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;

  std::vector<AddedToken> added_tokens;
  std::unordered_map<int32_t, size_t> added_by_id;
  std::unordered_map<std::string, int32_t> added_by_content;
  AddedTokenTrie raw_trie, normalized_trie;

  // tokenizer_config.json
  nlohmann::json config = nlohmann::json::object();
  std::string bos_token, eos_token, pad_token, unk_token;
  int64_t model_max_length = INT64_MAX;
  std::string padding_side = "right";
  std::string truncation_side = "right";
  std::string chat_template;
  std::string folder;  // the model folder read by AutoTokenizer::from_pretrained
  bool clean_up_tokenization_spaces = false;

  // Ids of one sequence before the post-processor.
  std::vector<int32_t> encode_raw(std::string_view text) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Tokenizer::token_bytes.
  std::optional<std::string> token_bytes(int32_t id) const;
};

}  // namespace tformers::tokenizer_detail
