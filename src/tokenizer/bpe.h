// The BPE model of tokenizer.json: byte-level (GPT-2, Qwen, Llama 3, DeepSeek) and
// SentencePiece-style with byte_fallback (Llama 2, Gemma). Merges are looked up in an
// open-addressing table keyed by the (left id, right id) pair; finished words are cached.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tformers::tokenizer_detail {

// String -> id with lookups by string_view and no allocation per lookup.
class VocabMap {
 public:
  void reserve(size_t n);
  // False when the token is already present (the first id is kept).
  bool insert(std::string_view token, int32_t id);
  // -1 when absent.
  int32_t find(std::string_view token) const;
  size_t size() const { return count_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0, length = 0;
    int32_t id = -1;
  };
  void grow();
  std::vector<Slot> slots_;
  std::string arena_;
  size_t count_ = 0;
};

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class BpeModel {
 public:
  // `vocab` token -> id, `merges` in rank order. `where` names the file in errors.
  BpeModel(std::vector<std::pair<std::string, int64_t>> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
           const std::string& where);

  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  int32_t token_to_id(std::string_view token) const { return vocab_.find(token); }
  const std::string* id_to_token(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < id_to_token_.size() && has_id_[id]
               ? &id_to_token_[id]
               : nullptr;
  }
  size_t max_id_plus_one() const { return id_to_token_.size(); }

 private:
  struct MergeSlot {
    uint64_t key = ~0ULL;
    uint32_t rank = 0;
    int32_t new_id = 0;
  };
  const MergeSlot* find_merge(int32_t a, int32_t b) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  VocabMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  std::vector<MergeSlot> merge_table_;
  uint64_t merge_mask_ = 0;
  BpeOptions options_;
  int32_t unk_id_ = -1;
  int32_t byte_ids_[256];  // byte_fallback: id of "<0xXX>", or -1

  static constexpr size_t kCacheCapacity = 1 << 17;
  static constexpr size_t kMaxCachedWord = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace tformers::tokenizer_detail
