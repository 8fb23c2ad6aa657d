// Token masks for structured output: which tokens may come next so that the text stays within a
// JsonGrammar (generation/json_grammar.h), computed by walking a trie of the vocabulary's token
// bytes with the byte-level matcher and cutting every branch at the first byte it refuses.
//
//   auto vocab = std::make_shared<TokenVocabulary>(tokenizer, model_vocab_size);  // once
//   TokenMatcher m(JsonGrammar::compile(schema), vocab, stop_ids);                // per sequence
//   m.apply(scores);   // disallowed tokens -inf
//   m.accept(token);   // the chosen token moves the state on
//
// Only tokens of the model's vocabulary with bytes (Tokenizer::token_bytes) can be part of the
// value; added tokens never are (special or not: <think>, <tool_call>). The stop ids (the eos
// ids, such as an end-of-turn token) are allowed exactly when the bytes so far are a whole value.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "generation/json_grammar.h"

namespace tformers {
class Tokenizer;
}

namespace tformers::generation {

class TokenVocabulary {
 public:
  // The text tokens of `tokenizer`, for logits of `vocab_size` entries (ids the tokenizer lacks,
  // such as a model's padded rows, are never allowed).
  TokenVocabulary(const Tokenizer& tokenizer, int64_t vocab_size);
  // Each id's bytes; nullopt (or empty) for an id that is never part of a value.
  explicit TokenVocabulary(std::vector<std::optional<std::string>> bytes);

  int64_t size() const { return int64_t(bytes_.size()); }
  const std::optional<std::string>& bytes(int32_t id) const { return bytes_[size_t(id)]; }

  // The trie: node 0 is the root; a node's children are nodes [first_child, end_child), sorted
  // by byte, and the tokens whose bytes end at it are tokens_[first_token, end_token).
  struct Node {
    uint8_t byte = 0;
    int32_t first_child = 0, end_child = 0;
    int32_t first_token = 0, end_token = 0;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  size_t max_token_bytes() const { return max_bytes_; }

 private:
  void build();
  std::vector<std::optional<std::string>> bytes_;
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;
  size_t max_bytes_ = 0;
};

class TokenMatcher {
 public:
  TokenMatcher(std::shared_ptr<const JsonGrammar> grammar,
               std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int64_t> stop_ids);

  // The tokens allowed next, one bit each (bit i of word i / 64), vocabulary().size() bits.
  void allowed(std::vector<uint64_t>& bits) const;
  // Sets every score of a token not allowed next to -inf (`scores` has vocabulary().size()).
  void apply(std::span<float> scores) const;
  // Moves on by one token; false (and no change) when it is not allowed. A stop id is allowed
  // once the value is whole, and ends the matcher.
  bool accept(int32_t token);
  // Accepts the tokens of `generated` not accepted yet (the generated tokens of a sequence, all
  // of them each time): InternalError for one that is not allowed.
  void sync(std::span<const int32_t> generated);
  int64_t accepted() const { return accepted_; }

  // The text so far is a whole value (a stop id may come next).
  bool accepting() const { return ended_ || bytes_.accepting(); }
  // A whole value that nothing but a stop id can follow (or a stop id came).
  bool finished() const { return ended_ || bytes_.finished(); }
  bool ended() const { return ended_; }
  bool has_stop_ids() const { return !stop_ids_.empty(); }
  const TokenVocabulary& vocabulary() const { return *vocab_; }

 private:
  std::shared_ptr<const JsonGrammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  std::vector<int32_t> stop_ids_;
  JsonMatcher bytes_;
  bool ended_ = false;
  int64_t accepted_ = 0;
  // The walk's states, one per depth of the trie (reused from call to call): the string's frame
  // alone while in a plain string (lite), else the matcher's whole state.
  struct Level {
    bool lite = false;
    JsonMatcher::Frame top;
    JsonMatcher::State full;
  };
  mutable std::vector<Level> levels_;
  mutable JsonMatcher::State base_;
  mutable std::vector<uint64_t> bits_;
};

}  // namespace tformers::generation
