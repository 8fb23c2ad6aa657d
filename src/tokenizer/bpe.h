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
  int32_t find(std::string_view token) const { return find_hashed(token, hash(token)); }
  // The same split in two steps so that bulk loads can prefetch slots ahead of the lookups.
  static uint64_t hash(std::string_view token);
  void prefetch(uint64_t h) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[h & (slots_.size() - 1)]);
  }
  int32_t find_hashed(std::string_view token, uint64_t h) const;
  bool insert_hashed(std::string_view token, uint64_t h, int32_t id);
  size_t size() const { return count_; }

 private:
  // 24 bytes: the table for a 262k vocab stays small, which matters because fresh pages are
  // slow to fault in.
  struct Slot {
    uint32_t tag = 0;  // high hash bits with the top bit set; 0 marks an empty slot
    int32_t id = -1;
    uint64_t head = 0;  // the first 8 bytes, so short tokens compare without touching the arena
    uint32_t offset = 0, length = 0;
  };
  static uint32_t tag_of(uint64_t h) { return static_cast<uint32_t>(h >> 32) | 0x80000000u; }
  bool equal(const Slot& s, std::string_view token) const;
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

// How far above the vocabulary's token count an id may lie, in model.vocab and in added_tokens.
// Real files are dense or nearly so; the bound keeps id-indexed tables proportional to the file.
inline constexpr uint64_t kMaxVocabIdGap = 1u << 20;

class BpeModel {
 public:
  // `vocab` token -> id, `merges` in rank order. `where` names the file in errors.
  BpeModel(const std::vector<std::pair<std::string_view, int64_t>>& vocab,
           const std::vector<std::pair<std::string_view, std::string_view>>& merges,
           BpeOptions options, const std::string& where);

  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  int32_t token_to_id(std::string_view token) const { return vocab_.find(token); }
  // False for ids the vocab does not have.
  bool id_to_token(int32_t id, std::string_view& token) const {
    if (id < 0 || static_cast<size_t>(id) >= id_spans_.size()) return false;
    uint64_t span = id_spans_[id];
    if (span == kNoToken) return false;
    token = std::string_view(id_arena_).substr(span >> 32, span & 0xFFFFFFFFu);
    return true;
  }
  size_t max_id_plus_one() const { return id_spans_.size(); }

 private:
  struct MergeSlot {
    uint64_t key = ~0ULL;
    uint32_t rank = 0;
    int32_t new_id = 0;
  };
  const MergeSlot* find_merge(int32_t a, int32_t b) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  VocabMap vocab_;
  static constexpr uint64_t kNoToken = ~0ULL;
  std::string id_arena_;
  std::vector<uint64_t> id_spans_;  // offset << 32 | length into id_arena_, or kNoToken
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
