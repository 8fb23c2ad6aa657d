#include "tokenizer/bpe.h"

#include <cstring>
#include <queue>

#include "tformers/error.h"
#include "tokenizer/unicode.h"

namespace tformers::tokenizer_detail {

namespace {

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

inline uint64_t hash_bytes(std::string_view s) {
  // Multiply-xorshift over 8-byte words, then a full avalanche; the top bit marks a used slot.
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (s.size() * 0xff51afd7ed558ccdULL);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 31;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  h = mix64(h ^ tail);
  return h | (1ULL << 63);
}

}  // namespace

uint64_t VocabMap::hash(std::string_view token) { return hash_bytes(token); }

static inline uint64_t head_of(std::string_view token) {
  uint64_t h = 0;
  std::memcpy(&h, token.data(), std::min<size_t>(8, token.size()));
  return h;
}

bool VocabMap::equal(const Slot& s, std::string_view token) const {
  if (s.length != token.size() || s.head != head_of(token)) return false;
  return token.size() <= 8 ||
         std::memcmp(arena_.data() + s.offset + 8, token.data() + 8, token.size() - 8) == 0;
}

void VocabMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap * 2 < n * 3) cap <<= 1;  // load factor <= 2/3
  if (cap <= slots_.size()) return;
  std::vector<Slot> old;
  old.swap(slots_);
  slots_.assign(cap, Slot{});
  size_t mask = cap - 1;
  for (const Slot& s : old) {
    if (!s.tag) continue;
    uint64_t h = hash(std::string_view(arena_).substr(s.offset, s.length));
    size_t i = h & mask;
    while (slots_[i].tag) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

void VocabMap::grow() { reserve(slots_.empty() ? 16 : slots_.size()); }

bool VocabMap::insert(std::string_view token, int32_t id) {
  return insert_hashed(token, hash(token), id);
}

bool VocabMap::insert_hashed(std::string_view token, uint64_t h, int32_t id) {
  if ((count_ + 1) * 3 > slots_.size() * 2) reserve(std::max<size_t>(count_ + 1, slots_.size()));
  size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  uint32_t tag = tag_of(h);
  while (slots_[i].tag) {
    if (slots_[i].tag == tag && equal(slots_[i], token)) return false;
    i = (i + 1) & mask;
  }
  slots_[i] = Slot{tag, id, head_of(token), static_cast<uint32_t>(arena_.size()),
                   static_cast<uint32_t>(token.size())};
  arena_.append(token);
  ++count_;
  return true;
}

int32_t VocabMap::find_hashed(std::string_view token, uint64_t h) const {
  if (slots_.empty()) return -1;
  size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  uint32_t tag = tag_of(h);
  while (slots_[i].tag) {
    const Slot& s = slots_[i];
    if (s.tag == tag && equal(s, token)) return s.id;
    i = (i + 1) & mask;
  }
  return -1;
}

BpeModel::BpeModel(const std::vector<std::pair<std::string_view, int64_t>>& vocab,
                   const std::vector<std::pair<std::string_view, std::string_view>>& merges,
                   BpeOptions options, const std::string& where)
    : options_(std::move(options)) {
  int64_t max_id = -1;
  for (auto& [tok, id] : vocab) {
    if (id < 0 || id > INT32_MAX) {
      throw FormatError(detail::str_cat(where, ": model.vocab[\"", tok, "\"] = ", id,
                                        " is not a valid token id"));
    }
    max_id = std::max(max_id, id);
  }
  // The id table is indexed by id, so one huge id would allocate for every id below it.
  if (max_id >= 0 && uint64_t(max_id) >= vocab.size() + kMaxVocabIdGap) {
    for (auto& [tok, id] : vocab)
      if (id == max_id)
        throw FormatError(detail::str_cat(
            where, ": model.vocab[\"", tok, "\"] = ", id, " is far outside the vocabulary's ",
            vocab.size(), " tokens; ids must be below the token count plus ", kMaxVocabIdGap,
            " (the vocabulary's ids should be dense, 0 to ", vocab.size() - 1, ")"));
  }
  vocab_.reserve(vocab.size());
  id_spans_.assign(static_cast<size_t>(max_id + 1), kNoToken);
  size_t bytes = 0;
  for (auto& v : vocab) bytes += v.first.size();
  id_arena_.reserve(bytes);

  // Bulk work is done in blocks: hash a block, prefetch its slots, then probe, so that the cache
  // misses of one block overlap instead of queueing (this is most of the load time).
  constexpr size_t kBlock = 32;
  uint64_t h[kBlock], h2[kBlock], h3[kBlock];
  for (size_t base = 0; base < vocab.size(); base += kBlock) {
    size_t n = std::min(kBlock, vocab.size() - base);
    for (size_t k = 0; k < n; ++k) {
      h[k] = VocabMap::hash(vocab[base + k].first);
      vocab_.prefetch(h[k]);
    }
    for (size_t k = 0; k < n; ++k) {
      auto& [tok, id] = vocab[base + k];
      vocab_.insert_hashed(tok, h[k], static_cast<int32_t>(id));
      id_spans_[id] = (static_cast<uint64_t>(id_arena_.size()) << 32) | tok.size();
      id_arena_.append(tok);
    }
  }

  size_t cap = 16;
  while (cap * 2 < merges.size() * 3) cap <<= 1;
  merge_table_.assign(cap, MergeSlot{});
  merge_mask_ = cap - 1;
  const std::string& prefix = options_.continuing_subword_prefix;
  std::string joined[kBlock];
  int32_t ia[kBlock], ib[kBlock];
  for (size_t base = 0; base < merges.size(); base += kBlock) {
    size_t n = std::min(kBlock, merges.size() - base);
    for (size_t k = 0; k < n; ++k) {
      const auto& [a, b] = merges[base + k];
      h[k] = VocabMap::hash(a);
      h2[k] = VocabMap::hash(b);
      vocab_.prefetch(h[k]);
      vocab_.prefetch(h2[k]);
      joined[k].assign(a);
      if (!prefix.empty() && b.substr(0, prefix.size()) == prefix) {
        joined[k].append(b.substr(prefix.size()));
      } else {
        joined[k].append(b);
      }
      h3[k] = VocabMap::hash(joined[k]);
      vocab_.prefetch(h3[k]);
    }
    for (size_t k = 0; k < n; ++k) {
      const auto& [a, b] = merges[base + k];
      size_t r = base + k;
      ia[k] = vocab_.find_hashed(a, h[k]);
      ib[k] = vocab_.find_hashed(b, h2[k]);
      if (ia[k] < 0 || ib[k] < 0) {
        throw FormatError(detail::str_cat(where, ": model.merges[", r, "] uses token \"",
                                          ia[k] < 0 ? a : b, "\" which is not in model.vocab"));
      }
      uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia[k])) << 32) |
                     static_cast<uint32_t>(ib[k]);
      h2[k] = key;
      __builtin_prefetch(&merge_table_[mix64(key) & merge_mask_]);
    }
    for (size_t k = 0; k < n; ++k) {
      size_t r = base + k;
      int32_t inew = vocab_.find_hashed(joined[k], h3[k]);
      if (inew < 0) {
        throw FormatError(detail::str_cat(where, ": model.merges[", r, "] produces \"", joined[k],
                                          "\" which is not in model.vocab"));
      }
      uint64_t key = h2[k];
      size_t i = mix64(key) & merge_mask_;
      bool duplicate = false;
      while (merge_table_[i].key != ~0ULL) {
        if (merge_table_[i].key == key) {
          duplicate = true;  // the first (lowest) rank wins
          break;
        }
        i = (i + 1) & merge_mask_;
      }
      if (!duplicate) merge_table_[i] = MergeSlot{key, static_cast<uint32_t>(r), inew};
    }
  }

  if (options_.unk_token) unk_id_ = vocab_.find(*options_.unk_token);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_ids_[b] = options_.byte_fallback ? vocab_.find(name) : -1;
  }
}

const BpeModel::MergeSlot* BpeModel::find_merge(int32_t a, int32_t b) const {
  uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  size_t i = mix64(key) & merge_mask_;
  while (true) {
    const MergeSlot& s = merge_table_[i];
    if (s.key == key) return &s;
    if (s.key == ~0ULL) return nullptr;
    i = (i + 1) & merge_mask_;
  }
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    int32_t id = vocab_.find(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (word.size() <= kMaxCachedWord) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(std::string(word));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t start = out.size();
  merge_word(word, out);
  if (word.size() <= kMaxCachedWord) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + start, out.end()));
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  const std::string& prefix = options_.continuing_subword_prefix;
  const std::string& suffix = options_.end_of_word_suffix;
  bool plain = prefix.empty() && suffix.empty();
  bool last_was_unk = false;
  std::string piece;
  size_t i = 0;
  auto push = [&](int32_t id) {
    int32_t n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, -1, true});
    if (n > 0) symbols[n - 1].next = n;
  };
  while (i < word.size()) {
    size_t b = i;
    i += utf8_length(static_cast<unsigned char>(word[i]));
    if (i > word.size()) i = word.size();
    std::string_view ch = word.substr(b, i - b);
    int32_t id;
    if (plain) {
      id = vocab_.find(ch);
    } else {
      piece.clear();
      if (b > 0) piece += prefix;
      piece.append(ch);
      if (i == word.size()) piece += suffix;
      id = vocab_.find(piece);
    }
    if (id >= 0) {
      push(id);
      last_was_unk = false;
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (unsigned char c : ch) all = all && byte_ids_[c] >= 0;
      if (all) {
        for (unsigned char c : ch) push(byte_ids_[c]);
        last_was_unk = false;
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (!(options_.fuse_unk && last_was_unk)) push(unk_id_);
      last_was_unk = true;
    }
    // Without an unknown token the character is dropped, as the Rust library does.
  }
  if (symbols.empty()) return;

  // Lowest rank first; ties go to the leftmost pair.
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const MergeSlot* m = find_merge(symbols[k].id, symbols[k + 1].id)) {
      heap.push({m->rank, static_cast<int32_t>(k), m->new_id});
    }
  }
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[c.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const MergeSlot* m = find_merge(left.id, right.id);
    if (!m || m->new_id != c.new_id || m->rank != c.rank) continue;  // stale entry
    left.id = c.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.pos;
    if (left.prev >= 0) {
      if (const MergeSlot* pm = find_merge(symbols[left.prev].id, left.id)) {
        heap.push({pm->rank, left.prev, pm->new_id});
      }
    }
    if (left.next >= 0) {
      if (const MergeSlot* nm = find_merge(left.id, symbols[left.next].id)) {
        heap.push({nm->rank, c.pos, nm->new_id});
      }
    }
  }
  for (int32_t k = 0; k >= 0; k = symbols[k].next) out.push_back(symbols[k].id);
}

}  // namespace tformers::tokenizer_detail
