// The compile cache as an LRU bounded by arena bytes, on a backend whose executables declare the
// arena size the test picks (the first dimension of the graph's one input).
#include <gtest/gtest.h>

#include <map>

#include "backends/compile_cache.h"
#include "graph/builder.h"
#include "graph/fake_backend.h"
#include "tformers/error.h"

namespace tformers {
namespace {

using backends::CompileCache;

using testing::FakeBackend;
using testing::FakeExecutable;

graph::Graph graph_of(int64_t bytes) {
  graph::GraphBuilder b;
  b.output(b.input("x", {DType::u8, {bytes}}));
  return b.finish();
}

FakeExecutable& fake(const std::shared_ptr<backends::Executable>& e) {
  return static_cast<FakeExecutable&>(*e);
}

TEST(CompileCacheLru, HitReturnsTheSameExecutable) {
  FakeBackend backend;
  CompileCache cache(1000);
  bool compiled = false;
  auto a = cache.get(backend, graph_of(100), &compiled);
  EXPECT_TRUE(compiled);
  EXPECT_EQ(cache.get(backend, graph_of(100), &compiled), a);
  EXPECT_FALSE(compiled);
  CompileStats s = cache.stats();
  EXPECT_EQ(s.compiles, 1u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.bytes, 100u);
  EXPECT_EQ(s.budget_bytes, 1000u);
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(backend.compiles, 1);
}

TEST(CompileCacheLru, EvictsTheLeastRecentlyUsedBeyondTheBudget) {
  FakeBackend backend;
  CompileCache cache(250);
  auto a = cache.get(backend, graph_of(100));
  auto b = cache.get(backend, graph_of(101));
  cache.get(backend, graph_of(100));  // a is now more recent than b
  auto c = cache.get(backend, graph_of(102));
  CompileStats s = cache.stats();
  EXPECT_EQ(s.entries, 2u);
  EXPECT_EQ(s.bytes, 202u);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(fake(b).trims, 1);  // evicted and trimmed
  EXPECT_EQ(fake(a).trims, 0);
  EXPECT_EQ(fake(c).trims, 0);
  // b still works for whoever holds it, but the cache compiles it again.
  EXPECT_EQ(cache.get(backend, graph_of(100)), a);
  EXPECT_NE(cache.get(backend, graph_of(101)), b);
  EXPECT_EQ(backend.compiles, 4);
  // Inserting b again dropped c, the least recently used.
  EXPECT_EQ(fake(c).trims, 1);
  EXPECT_EQ(cache.stats().evictions, 2u);
}

TEST(CompileCacheLru, KeepsANewEntryLargerThanTheBudget) {
  FakeBackend backend;
  CompileCache cache(50);
  auto big = cache.get(backend, graph_of(100));
  CompileStats s = cache.stats();
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.bytes, 100u);
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(cache.get(backend, graph_of(100)), big);  // a hit, not a recompile per step
  cache.get(backend, graph_of(10));
  s = cache.stats();
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.bytes, 10u);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(fake(big).trims, 1);
}

TEST(CompileCacheLru, SetBudgetEvictsOldestFirst) {
  FakeBackend backend;
  CompileCache cache(1000);
  auto a = cache.get(backend, graph_of(100));
  auto b = cache.get(backend, graph_of(101));
  auto c = cache.get(backend, graph_of(102));
  cache.get(backend, graph_of(100));  // order, newest first: a, c, b
  cache.set_budget(150);
  CompileStats s = cache.stats();
  EXPECT_EQ(s.budget_bytes, 150u);
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.bytes, 100u);
  EXPECT_EQ(s.evictions, 2u);
  EXPECT_EQ(fake(a).trims, 0);
  EXPECT_EQ(fake(b).trims, 1);
  EXPECT_EQ(fake(c).trims, 1);
  cache.set_budget(0);  // nothing is kept
  EXPECT_EQ(cache.stats().entries, 0u);
  EXPECT_EQ(cache.stats().bytes, 0u);
}

// The key is (graph hash, backend name): the registry has one backend per name.
TEST(CompileCacheLru, BackendsOfOneNameShareEntries) {
  FakeBackend one, two;
  CompileCache cache(1000);
  auto a = cache.get(one, graph_of(100));
  EXPECT_EQ(cache.get(two, graph_of(100)), a);
  EXPECT_EQ(two.compiles, 0);
}

TEST(CompileCacheLru, BudgetFromEnvironment) {
  EXPECT_EQ(CompileCache::budget_from_env(nullptr), CompileCache::kDefaultBudget);
  EXPECT_EQ(CompileCache::budget_from_env(""), CompileCache::kDefaultBudget);
  EXPECT_EQ(CompileCache::budget_from_env("0"), 0u);
  EXPECT_EQ(CompileCache::budget_from_env("268435456"), uint64_t(1) << 28);
  for (const char* bad : {"1G", "-5", " 12", "12 ", "abc", "99999999999999999999999"})
    EXPECT_THROW(CompileCache::budget_from_env(bad), InvalidArgumentError) << bad;
}

TEST(CompileCacheLru, GlobalBudgetIsSettable) {
  CompileCache& g = CompileCache::global();
  const uint64_t before = g.stats().budget_bytes;
  set_compile_cache_budget(12345);
  EXPECT_EQ(compile_stats().budget_bytes, 12345u);
  set_compile_cache_budget(before);
  EXPECT_EQ(compile_stats().budget_bytes, before);
}

}  // namespace
}  // namespace tformers
