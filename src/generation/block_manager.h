// The serving engine's KV blocks: which pool block holds which positions of which sequence.
//
// A sequence's block table grows as the sequence does (grow), one block per block_size
// positions, so the pool holds what sequences have computed, not what they might reach.
//
// Prefix caching (as vLLM's automatic prefix caching): once a block is full and its keys and
// values computed, it is keyed by a hash of its tokens chained with the hash of the block before
// it (commit), so the key names the whole prefix up to the block's end, and with it every
// position's keys and values. A new sequence looks up its tokens block by block (match_prefix)
// and shares the longest run found: those blocks are reference-counted and only read, since a
// sequence only ever writes past its shared blocks. A block whose last reference goes stays
// cached, and is handed out again (its hash forgotten) only when no never-used block is left,
// least recently released first. A sequence's blocks are released tail first, so a prefix
// outlives its continuations.
//
// A position's keys and values depend on its tokens and also on the step that computed them: a
// prompt's positions come from a prefill, a generated token's from a decode step, and the two
// may round differently (the CPU's attention does), though a prefill gives the same bits however
// its prompt is cut at block ends (docs/serving.md says when). So a block that holds generated
// positions is keyed with the prompt's length as well (`prefilled`): it serves the sequence that
// computed it when that one comes back after a preemption, never a longer prompt that repeats those
// tokens, whose prefill would have given other bits.
//
// The 64-bit key is checked against the block's tokens, its parent's key and that prompt length
// on every hit, so a wrong hit needs two prefixes whose chained keys collide and whose last
// blocks are equal.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace tformers::generation {

class BlockManager {
 public:
  // One sequence's blocks, in position order, and the keys of the first of them that are cached
  // (full and computed) under this sequence's tokens.
  struct Table {
    std::vector<int32_t> blocks;
    std::vector<uint64_t> keys;
  };

  // InvalidArgumentError for num_blocks outside [1, INT32_MAX] or block_size < 1.
  BlockManager(int64_t num_blocks, int64_t block_size, bool prefix_caching);

  int64_t num_blocks() const { return int64_t(refs_.size()); }
  // Blocks a grow() can take now: never used, freed, or cached without a reference.
  int64_t free_blocks() const { return int64_t(free_.size() + evictable_.size()); }
  // Blocks some sequence holds.
  int64_t used_blocks() const { return num_blocks() - free_blocks(); }
  // Blocks kept under a prefix key, held or not.
  int64_t cached_blocks() const { return int64_t(by_key_.size()); }

  // The blocks needed to hold `positions` positions.
  int64_t blocks_for(int64_t positions) const {
    return (positions + block_size_ - 1) / block_size_;
  }
  // Starts an empty table on the longest run of cached blocks that hold a prefix of `tokens`
  // (none without prefix caching), taking a reference to each; returns the positions they hold.
  // `prefilled`: the sequence's prompt length (its positions computed by prefills; the rest by
  // decode steps). Give only the tokens that may be taken from the cache: a caller that needs the
  // logits of its last token leaves that token out.
  int64_t match_prefix(std::span<const int32_t> tokens, int64_t prefilled, Table& t);
  // Grows the table to hold `positions` positions; false, taking nothing, when the pool cannot.
  bool grow(Table& t, int64_t positions);
  // Caches the table's blocks that `computed` of `tokens` (the sequence's tokens, from position
  // 0) fill, `prefilled` as for match_prefix. A block whose key another block already holds
  // stays uncached: both hold the same keys and values, and the older one serves later hits.
  void commit(Table& t, std::span<const int32_t> tokens, int64_t computed, int64_t prefilled);
  // Drops the table's references, tail first, and empties it.
  void release(Table& t);
  // Drops the references of the table's blocks past its first `blocks`, tail first.
  void truncate(Table& t, size_t blocks);

 private:
  struct Cached {
    uint64_t parent = 0;          // the key of the block before (0 for the first)
    uint64_t salt = 0;            // 0 for prefilled positions only, else the prompt length + 1
    std::vector<int32_t> tokens;  // block_size tokens
    int32_t block = 0;
  };
  // What a block's key mixes in besides its parent and its tokens: block `i` of a sequence whose
  // first `prefilled` positions were prefilled.
  uint64_t salt_of(size_t i, int64_t prefilled) const {
    return int64_t(i + 1) * block_size_ <= prefilled ? 0 : uint64_t(prefilled) + 1;
  }
  static uint64_t key_of(uint64_t parent, uint64_t salt, std::span<const int32_t> tokens);
  // A block off the free list, else the least recently released cached one (forgotten).
  int32_t take();

  int64_t block_size_;
  bool prefix_caching_;
  std::vector<int32_t> refs_;  // per block
  std::vector<int32_t> free_;  // never used or uncached; popped from the back
  // Cached blocks without a reference, least recently released first; where_ has each one's
  // place, and key_ each cached block's key (0: not cached).
  std::list<int32_t> evictable_;
  std::vector<std::list<int32_t>::iterator> where_;
  std::vector<uint64_t> key_;
  std::unordered_map<uint64_t, Cached> by_key_;
};

}  // namespace tformers::generation
