#include "backends/compile_cache.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "tformers/error.h"

namespace tformers {

namespace backends {

uint64_t CompileCache::budget_from_env(const char* value) {
  if (!value || !*value) return kDefaultBudget;
  uint64_t bytes = 0;
  const char* end = value + std::strlen(value);
  auto [p, ec] = std::from_chars(value, end, bytes);
  if (ec != std::errc() || p != end)
    throw InvalidArgumentError(std::string(kBudgetEnv) + "=\"" + value +
                               "\" is not a byte count: give a decimal number such as 1073741824");
  return bytes;
}

// Never destroyed: at exit its PJRT executables would be destroyed after the plugin's own static
// objects (created later, at its first compile, so destroyed first), and XLA's CPU plugin then
// spun for ever in its JIT's debugger-registration listener (seen as a two-rank test that hung in
// exit() once in a few runs). The plugins themselves are never unloaded either (pjrt_api.cc).
CompileCache& CompileCache::global() {
  static CompileCache* cache = new CompileCache(budget_from_env(std::getenv(kBudgetEnv)));
  return *cache;
}

std::shared_ptr<Executable> CompileCache::get(Backend& backend, const graph::Graph& graph,
                                              bool* compiled) {
  Key key{graph.hash(), backend.name()};
  if (compiled) *compiled = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      ++stats_.hits;
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->exe;
    }
  }
  std::shared_ptr<Executable> exe = backend.compile(graph);
  if (compiled) *compiled = true;
  std::list<Entry> evicted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.compiles;
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->exe;
    }
    lru_.push_front({key, exe, exe->arena_bytes()});
    index_.emplace(key, lru_.begin());
    bytes_ += lru_.front().bytes;
    evict_over_budget(&key, evicted);
  }
  // Trimmed outside the cache's lock: trim() takes the executable's own. A model that still
  // holds an evicted executable keeps running it and allocates its arena again.
  for (Entry& e : evicted) e.exe->trim();
  return exe;
}

void CompileCache::evict_over_budget(const Key* keep, std::list<Entry>& evicted) {
  auto it = lru_.end();
  while (bytes_ > budget_ && it != lru_.begin()) {
    --it;
    if (keep && it->key == *keep) continue;
    bytes_ -= it->bytes;
    index_.erase(it->key);
    ++stats_.evictions;
    evicted.splice(evicted.end(), lru_, it++);
  }
}

CompileStats CompileCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  CompileStats s = stats_;
  s.entries = lru_.size();
  s.bytes = bytes_;
  s.budget_bytes = budget_;
  return s;
}

void CompileCache::set_budget(uint64_t bytes) {
  std::list<Entry> evicted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    budget_ = bytes;
    evict_over_budget(nullptr, evicted);
  }
  for (Entry& e : evicted) e.exe->trim();
}

void CompileCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  lru_.clear();
  index_.clear();
  bytes_ = 0;
}

}  // namespace backends

CompileStats compile_stats() { return backends::CompileCache::global().stats(); }

void set_compile_cache_budget(uint64_t bytes) {
  backends::CompileCache::global().set_budget(bytes);
}

}  // namespace tformers
