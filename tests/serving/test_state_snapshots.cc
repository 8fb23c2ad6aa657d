// The serving engine's kept recurrent states (generation/state_snapshots.h): found by key, reused
// least recently used first, never while pinned.
#include <gtest/gtest.h>

#include "generation/state_snapshots.h"

namespace tformers::generation {
namespace {

TEST(StateSnapshots, FoundByKeyReusedLeastRecentlyUsedFirstNeverWhilePinned) {
  StateSnapshots s(10, 2);  // slots 10 and 11
  EXPECT_EQ(s.find(7), -1);
  const int32_t a = s.take();
  const int32_t b = s.take();
  EXPECT_EQ(std::min(a, b), 10);
  EXPECT_EQ(std::max(a, b), 11);
  EXPECT_EQ(s.take(), -1);  // both pinned by their writers
  s.keep(7, a);
  s.keep(8, b);
  EXPECT_EQ(s.find(7), a);
  EXPECT_EQ(s.find(8), b);
  s.unpin(b);
  EXPECT_EQ(s.take(), b) << "the only slot without a pin";
  EXPECT_EQ(s.find(8), -1) << "taken again: what it held is forgotten";
  s.keep(9, b);
  s.unpin(a);
  s.unpin(b);
  EXPECT_EQ(s.find(9), b);
  EXPECT_EQ(s.find(7), a);  // a is now the most recently used
  EXPECT_EQ(s.take(), b);   // so b goes first
  EXPECT_EQ(s.find(9), -1);
  // A key kept again moves to its new slot; the old one holds nothing and goes first.
  s.keep(7, b);
  EXPECT_EQ(s.find(7), b);
  EXPECT_EQ(s.take(), a);
  EXPECT_EQ(s.take(), -1);
}

}  // namespace
}  // namespace tformers::generation
