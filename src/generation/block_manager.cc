#include "generation/block_manager.h"

#include <algorithm>
#include <string>

#include "tformers/error.h"

namespace tformers::generation {

BlockManager::BlockManager(int64_t num_blocks, int64_t block_size, bool prefix_caching)
    : block_size_(block_size), prefix_caching_(prefix_caching) {
  if (num_blocks < 1 || num_blocks > INT32_MAX)
    throw InvalidArgumentError("BlockManager: num_blocks " + std::to_string(num_blocks) +
                               " must be in [1, " + std::to_string(INT32_MAX) + "]");
  if (block_size < 1)
    throw InvalidArgumentError("BlockManager: block_size " + std::to_string(block_size) +
                               " must be positive");
  refs_.assign(size_t(num_blocks), 0);
  where_.resize(size_t(num_blocks));
  key_.assign(size_t(num_blocks), 0);
  free_.resize(size_t(num_blocks));
  // Popped from the back: low block numbers first.
  for (int64_t i = 0; i < num_blocks; ++i) free_[size_t(i)] = int32_t(num_blocks - 1 - i);
}

uint64_t BlockManager::key_of(uint64_t parent, uint64_t salt, std::span<const int32_t> tokens) {
  // splitmix64's finalizer over each token folded into the running value: every bit of a token
  // and of the parent's key reaches every bit of the result.
  auto mix = [](uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(mix(parent + 0x9e3779b97f4a7c15ull) ^ salt);
  for (int32_t t : tokens) h = mix(h ^ (uint64_t(uint32_t(t)) + 0x9e3779b97f4a7c15ull));
  return h == 0 ? 1 : h;  // 0 marks an uncached block
}

int64_t BlockManager::match_prefix(std::span<const int32_t> tokens, int64_t prefilled, Table& t) {
  if (!prefix_caching_) return 0;
  uint64_t parent = 0;
  for (size_t i = 0; (i + 1) * size_t(block_size_) <= tokens.size(); ++i) {
    const auto block_tokens = tokens.subspan(i * size_t(block_size_), size_t(block_size_));
    const uint64_t salt = salt_of(i, prefilled), key = key_of(parent, salt, block_tokens);
    const auto it = by_key_.find(key);
    if (it == by_key_.end() || it->second.parent != parent || it->second.salt != salt ||
        !std::equal(block_tokens.begin(), block_tokens.end(), it->second.tokens.begin()))
      break;
    const int32_t b = it->second.block;
    if (refs_[size_t(b)]++ == 0) evictable_.erase(where_[size_t(b)]);
    t.blocks.push_back(b);
    t.keys.push_back(key);
    parent = key;
  }
  return int64_t(t.blocks.size()) * block_size_;
}

int32_t BlockManager::take() {
  if (!free_.empty()) {
    const int32_t b = free_.back();
    free_.pop_back();
    return b;
  }
  const int32_t b = evictable_.front();
  evictable_.pop_front();
  by_key_.erase(key_[size_t(b)]);
  key_[size_t(b)] = 0;
  return b;
}

bool BlockManager::grow(Table& t, int64_t positions) {
  const int64_t need = blocks_for(positions) - int64_t(t.blocks.size());
  if (need <= 0) return true;
  if (need > free_blocks()) return false;
  for (int64_t i = 0; i < need; ++i) {
    const int32_t b = take();
    refs_[size_t(b)] = 1;
    t.blocks.push_back(b);
  }
  return true;
}

void BlockManager::commit(Table& t, std::span<const int32_t> tokens, int64_t computed,
                          int64_t prefilled) {
  if (!prefix_caching_) return;
  const size_t full = size_t(std::min<int64_t>(computed, int64_t(tokens.size())) / block_size_);
  while (t.keys.size() < std::min(full, t.blocks.size())) {
    const size_t i = t.keys.size();
    const uint64_t parent = i == 0 ? 0 : t.keys[i - 1];
    const auto block_tokens = tokens.subspan(i * size_t(block_size_), size_t(block_size_));
    const uint64_t salt = salt_of(i, prefilled), key = key_of(parent, salt, block_tokens);
    const int32_t b = t.blocks[i];
    // The key chains on even when another block holds it, so later blocks still find their
    // parent's key.
    if (by_key_.emplace(key, Cached{parent, salt, {block_tokens.begin(), block_tokens.end()}, b})
            .second)
      key_[size_t(b)] = key;
    t.keys.push_back(key);
  }
}

void BlockManager::release(Table& t) { truncate(t, 0); }

void BlockManager::truncate(Table& t, size_t blocks) {
  while (t.blocks.size() > blocks) {
    const int32_t b = t.blocks.back();
    t.blocks.pop_back();
    if (--refs_[size_t(b)] > 0) continue;
    if (key_[size_t(b)] != 0)
      where_[size_t(b)] = evictable_.insert(evictable_.end(), b);
    else
      free_.push_back(b);
  }
  if (t.keys.size() > blocks) t.keys.resize(blocks);
}

}  // namespace tformers::generation
