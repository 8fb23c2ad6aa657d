// The serving engine's block manager: blocks on demand, prefix keys chained block to block,
// reference counts on shared blocks, LRU eviction of cached blocks, and no block lost.
#include "generation/block_manager.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>

#include "common/error_of.h"
#include "tformers/error.h"

namespace tformers::generation {
namespace {

using testing::error_of;
using Table = BlockManager::Table;

std::vector<int32_t> iota(int32_t from, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A prompt as the engine admits one: the cached prefix, then blocks for every token, then the
// full blocks committed.
int64_t admit(BlockManager& bm, const std::vector<int32_t>& prompt, Table& t) {
  const int64_t n = int64_t(prompt.size()), hit = bm.match_prefix(prompt, n, t);
  EXPECT_TRUE(bm.grow(t, n));
  bm.commit(t, prompt, n, n);
  return hit;
}

// Looks up a prompt.
int64_t match(BlockManager& bm, const std::vector<int32_t>& prompt, Table& t) {
  return bm.match_prefix(prompt, int64_t(prompt.size()), t);
}

TEST(BlockManager, GrowsOnDemandAndRefusesWithoutTakingAny) {
  BlockManager bm(4, 4, true);
  Table a, b;
  EXPECT_TRUE(bm.grow(a, 1));
  EXPECT_EQ(a.blocks.size(), 1u);
  EXPECT_TRUE(bm.grow(a, 4));  // still one block
  EXPECT_EQ(a.blocks.size(), 1u);
  EXPECT_TRUE(bm.grow(a, 5));
  EXPECT_EQ(a.blocks, (std::vector<int32_t>{0, 1}));  // low numbers first
  EXPECT_EQ(bm.used_blocks(), 2);
  EXPECT_FALSE(bm.grow(b, 9));  // three blocks, two free
  EXPECT_TRUE(b.blocks.empty());
  EXPECT_EQ(bm.free_blocks(), 2);
  EXPECT_TRUE(bm.grow(b, 8));
  EXPECT_EQ(bm.free_blocks(), 0);
  bm.release(a);
  bm.release(b);
  EXPECT_TRUE(a.blocks.empty());
  EXPECT_EQ(bm.free_blocks(), 4);
  EXPECT_EQ(bm.cached_blocks(), 0);  // nothing committed
}

TEST(BlockManager, FullBlocksAreSharedByPrefixAndCountedOnce) {
  BlockManager bm(16, 4, true);
  const std::vector<int32_t> prefix = iota(100, 8);  // two blocks
  Table a, b;
  EXPECT_EQ(admit(bm, concat(prefix, {1, 2, 3}), a), 0);
  EXPECT_EQ(bm.cached_blocks(), 2);  // the partial third block is not cached
  EXPECT_EQ(admit(bm, concat(prefix, {7, 7, 7, 7, 7}), b), 8);
  EXPECT_EQ(std::vector<int32_t>(b.blocks.begin(), b.blocks.begin() + 2),
            std::vector<int32_t>(a.blocks.begin(), a.blocks.begin() + 2));
  EXPECT_NE(b.blocks[2], a.blocks[2]);
  // a: 3 blocks, b: 2 shared + 2 own.
  EXPECT_EQ(bm.used_blocks(), 5);
  EXPECT_EQ(bm.cached_blocks(), 3);  // b's third block is full
  bm.release(a);
  EXPECT_EQ(bm.used_blocks(), 4);  // the shared ones are still b's
  bm.release(b);
  EXPECT_EQ(bm.used_blocks(), 0);
  EXPECT_EQ(bm.free_blocks(), 16);
  EXPECT_EQ(bm.cached_blocks(), 3);  // released, still cached
  Table c;
  EXPECT_EQ(admit(bm, concat(prefix, {7, 7, 7, 7, 8}), c), 12);
  bm.release(c);
}

TEST(BlockManager, KeysChainOnThePrefix) {
  BlockManager bm(16, 4, true);
  const std::vector<int32_t> second = {5, 6, 7, 8};
  Table a, b, c;
  admit(bm, concat({1, 1, 1, 1}, second), a);
  // The same second block after another first block is another prefix: no hit at all.
  EXPECT_EQ(admit(bm, concat({2, 2, 2, 2}, second), b), 0);
  // A hit stops at the first block that differs, even if later ones match.
  EXPECT_EQ(admit(bm, concat({1, 1, 1, 1}, concat({5, 6, 7, 9}, second)), c), 4);
  // Only whole blocks are looked up.
  Table d;
  EXPECT_EQ(match(bm, std::vector<int32_t>{1, 1, 1, 1, 5, 6, 7}, d), 4);
  for (Table* t : {&a, &b, &c, &d}) bm.release(*t);
  EXPECT_EQ(bm.used_blocks(), 0);
}

TEST(BlockManager, EvictsTheLeastRecentlyReleasedTailFirst) {
  BlockManager bm(6, 2, true);
  const std::vector<int32_t> x = {1, 2, 3, 4, 5, 6}, y = {9, 8, 7, 6, 5, 4};
  Table a, b;
  admit(bm, x, a);
  admit(bm, y, b);
  EXPECT_EQ(bm.free_blocks(), 0);
  bm.release(a);  // released first: evicted first, its last block before its first
  bm.release(b);
  EXPECT_EQ(bm.free_blocks(), 6);
  EXPECT_EQ(bm.cached_blocks(), 6);
  Table fresh;
  EXPECT_TRUE(bm.grow(fresh, 2));  // takes x's third block
  EXPECT_EQ(bm.cached_blocks(), 5);
  Table hx, hy;
  EXPECT_EQ(match(bm, x, hx), 4);
  EXPECT_EQ(match(bm, y, hy), 6);
  // Released again, y before x: y's blocks are now the least recent, its tail the first.
  bm.release(hy);
  bm.release(hx);
  Table more;
  EXPECT_TRUE(bm.grow(more, 4));  // two blocks: y's third and second
  Table hx2, hy2;
  EXPECT_EQ(match(bm, x, hx2), 4);
  EXPECT_EQ(match(bm, y, hy2), 2);
  for (Table* t : {&fresh, &more, &hx2, &hy2}) bm.release(*t);
  EXPECT_EQ(bm.free_blocks(), 6);
}

TEST(BlockManager, HeldBlocksAreNeverEvicted) {
  BlockManager bm(3, 2, true);
  Table a, b;
  admit(bm, {1, 2, 3, 4}, a);
  EXPECT_FALSE(bm.grow(b, 4));  // one free block, both of a's held
  EXPECT_TRUE(bm.grow(b, 2));
  Table h;
  EXPECT_EQ(match(bm, std::vector<int32_t>{1, 2, 3, 4}, h), 4);
  bm.release(h);
  bm.release(a);
  bm.release(b);
  EXPECT_EQ(bm.free_blocks(), 3);
}

TEST(BlockManager, TheSamePrefixComputedTwiceIsCachedOnce) {
  BlockManager bm(8, 2, true);
  const std::vector<int32_t> x = {1, 2, 3, 4, 5};
  Table a, b;
  // Both looked up before either is committed, as two prompts admitted together.
  EXPECT_EQ(match(bm, x, a), 0);
  EXPECT_EQ(match(bm, x, b), 0);
  ASSERT_TRUE(bm.grow(a, 5) && bm.grow(b, 5));
  bm.commit(a, x, 5, 5);
  bm.commit(b, x, 5, 5);
  EXPECT_EQ(bm.cached_blocks(), 2);
  const std::vector<int32_t> first(a.blocks.begin(), a.blocks.begin() + 2);
  bm.release(b);  // its full blocks were duplicates: free, not cached
  bm.release(a);
  EXPECT_EQ(bm.cached_blocks(), 2);
  Table c;
  EXPECT_EQ(match(bm, x, c), 4);
  EXPECT_EQ(c.blocks, first);
  bm.release(c);
}

TEST(BlockManager, CommitFollowsTheComputedPositions) {
  BlockManager bm(8, 4, true);
  std::vector<int32_t> x = iota(10, 3);
  Table a;
  ASSERT_TRUE(bm.grow(a, 3));
  bm.commit(a, x, 3, 3);
  EXPECT_EQ(bm.cached_blocks(), 0);
  for (int32_t t = 0; t < 5; ++t) {  // decode steps: one token computed at a time
    x.push_back(t);
    ASSERT_TRUE(bm.grow(a, int64_t(x.size())));
    bm.commit(a, x, int64_t(x.size()) - 1, 3);  // the newest token not yet computed
  }
  EXPECT_EQ(bm.cached_blocks(), 1);  // 7 computed of 8: the second block is not yet
  bm.commit(a, x, int64_t(x.size()), 3);
  EXPECT_EQ(bm.cached_blocks(), 2);
  bm.release(a);
}

// Blocks with generated positions serve the sequence that computed them, coming back with the
// same prompt, and not a prompt that repeats its tokens; blocks of prompt positions only serve
// any prompt that begins with them.
TEST(BlockManager, GeneratedPositionsAreKeyedWithThePromptLength) {
  BlockManager bm(16, 4, true);
  const std::vector<int32_t> prompt = iota(20, 6);
  std::vector<int32_t> x = prompt;
  Table a;
  ASSERT_TRUE(bm.grow(a, 6));
  bm.commit(a, x, 6, 6);
  for (int32_t t = 0; t < 7; ++t) {
    x.push_back(t);
    ASSERT_TRUE(bm.grow(a, int64_t(x.size())));
    bm.commit(a, x, int64_t(x.size()) - 1, 6);
  }
  EXPECT_EQ(bm.cached_blocks(), 3);  // 12 of 13 computed
  bm.release(a);
  Table resumed, longer, other;
  EXPECT_EQ(bm.match_prefix(std::span(x).first(12), 6, resumed), 12);
  EXPECT_EQ(match(bm, std::vector<int32_t>(x.begin(), x.begin() + 12), longer), 4);
  EXPECT_EQ(match(bm, {20, 21, 22, 23, 99}, other), 4);
  for (Table* t : {&resumed, &longer, &other}) bm.release(*t);
}

TEST(BlockManager, WithoutPrefixCachingNothingIsShared) {
  BlockManager bm(4, 2, false);
  Table a, b;
  EXPECT_EQ(admit(bm, {1, 2, 3, 4}, a), 0);
  EXPECT_EQ(admit(bm, {1, 2, 3, 4}, b), 0);
  EXPECT_EQ(bm.cached_blocks(), 0);
  EXPECT_EQ(bm.used_blocks(), 4);
  bm.release(a);
  bm.release(b);
  EXPECT_EQ(bm.free_blocks(), 4);
}

// Random sequences over a small vocabulary, so that prefixes repeat: growing, committing,
// sharing and releasing in any order loses no block and never hands out a held one.
TEST(BlockManager, NoBlockLostOrHandedOutTwice) {
  BlockManager bm(24, 3, true);
  std::mt19937 rng(7);
  struct Live {
    std::vector<int32_t> tokens;
    int64_t prompt = 0;
    Table t;
  };
  std::vector<Live> live;
  int64_t hits = 0, shared = 0;  // that the walk exercises sharing at all
  for (int step = 0; step < 3000; ++step) {
    const int what = int(rng() % 3);
    if (what == 0 || live.empty()) {
      Live s;
      for (uint32_t i = 0, n = 1 + rng() % 12; i < n; ++i) s.tokens.push_back(int32_t(rng() % 2));
      s.prompt = int64_t(s.tokens.size());
      hits += bm.match_prefix(std::span(s.tokens).first(s.tokens.size() - 1), s.prompt, s.t);
      if (!bm.grow(s.t, s.prompt)) {
        bm.release(s.t);
        continue;
      }
      bm.commit(s.t, s.tokens, s.prompt, s.prompt);
      live.push_back(std::move(s));
    } else if (what == 1) {
      Live& s = live[rng() % live.size()];
      s.tokens.push_back(int32_t(rng() % 2));
      if (bm.grow(s.t, int64_t(s.tokens.size())))
        bm.commit(s.t, s.tokens, int64_t(s.tokens.size()), s.prompt);
      else
        s.tokens.pop_back();
    } else {
      const size_t i = rng() % live.size();
      bm.release(live[i].t);
      live.erase(live.begin() + ptrdiff_t(i));
    }
    // The pool counts each block the tables hold once, and tables share a block only where
    // their tokens up to its end are the same, and so is their prompt length unless the block
    // holds prompt positions only.
    std::map<int32_t, std::vector<std::pair<const Live*, size_t>>> holders;
    for (const Live& s : live)
      for (size_t j = 0; j < s.t.blocks.size(); ++j) holders[s.t.blocks[j]].push_back({&s, j});
    for (const auto& [block, at] : holders)
      for (const auto& [s, j] : at) {
        ASSERT_EQ(j, at.front().second) << "block " << block << " step " << step;
        const size_t end = (j + 1) * 3;
        if (s != at.front().first) {
          ++shared;
          const Live* o = at.front().first;
          ASSERT_TRUE(
              s->tokens.size() >= end && o->tokens.size() >= end &&
              std::equal(s->tokens.begin(), s->tokens.begin() + ptrdiff_t(end), o->tokens.begin()))
              << "block " << block << " step " << step;
          ASSERT_TRUE(s->prompt == o->prompt ||
                      (s->prompt >= int64_t(end) && o->prompt >= int64_t(end)))
              << "block " << block << " step " << step;
        }
      }
    ASSERT_EQ(bm.used_blocks(), int64_t(holders.size())) << "step " << step;
  }
  EXPECT_GT(hits, 0);
  EXPECT_GT(shared, 0);
  for (Live& s : live) bm.release(s.t);
  EXPECT_EQ(bm.used_blocks(), 0);
  EXPECT_EQ(bm.free_blocks(), 24);
  EXPECT_LE(bm.cached_blocks(), 24);
}

TEST(BlockManager, BadSizes) {
  EXPECT_CONTAINS(error_of<InvalidArgumentError>([] { BlockManager bm(0, 4, true); }),
                  "num_blocks 0");
  EXPECT_CONTAINS(error_of<InvalidArgumentError>([] { BlockManager bm(4, 0, true); }),
                  "block_size 0");
}

}  // namespace
}  // namespace tformers::generation
