// Executables cached by (graph hash, backend): a graph with the same structure, shapes and dtypes
// is compiled once per backend and process. The cache is a least-recently-used list bounded by a
// byte budget over the executables' arena bytes (the scratch memory one run of each needs);
// beyond it the least recently used executables are dropped and trimmed, while whoever still
// holds one keeps a working executable. The counters are what tests and --verbose read.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "backends/backend.h"
#include "tformers/compile_stats.h"

namespace tformers::backends {

class CompileCache {
 public:
  static constexpr uint64_t kDefaultBudget = uint64_t(1) << 30;
  static constexpr const char* kBudgetEnv = "TFORMERS_COMPILE_CACHE_BYTES";

  explicit CompileCache(uint64_t budget_bytes = kDefaultBudget) : budget_(budget_bytes) {}
  // The process-wide cache; its budget is budget_from_env(getenv(kBudgetEnv)).
  static CompileCache& global();
  // kDefaultBudget for null or empty, else the decimal byte count `value` spells
  // (InvalidArgumentError naming kBudgetEnv when it is anything else).
  static uint64_t budget_from_env(const char* value);

  // The cached executable for this graph on this backend, compiling it on a miss. Thread-safe;
  // compiling happens outside the lock, and when two threads miss on the same graph at once
  // both compile and both get the executable that was cached first. `compiled`, when given, is
  // set to whether this call compiled (a per-caller count that stats() deltas cannot give when
  // other threads compile at the same time).
  std::shared_ptr<Executable> get(Backend& backend, const graph::Graph& graph,
                                  bool* compiled = nullptr);
  CompileStats stats() const;
  // Evicts least recently used executables until the rest fit `bytes`. The executable a get()
  // has just added is kept even when it alone exceeds the budget, so that it is not compiled
  // again at once by the caller's next step.
  void set_budget(uint64_t bytes);
  void clear();

 private:
  using Key = std::pair<uint64_t, std::string>;
  struct Entry {
    Key key;
    std::shared_ptr<Executable> exe;
    uint64_t bytes;
  };
  // Moves entries beyond the budget (never `keep`) from the cache to `evicted`. Holds mu_.
  void evict_over_budget(const Key* keep, std::list<Entry>& evicted);

  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  std::map<Key, std::list<Entry>::iterator> index_;
  uint64_t budget_;
  uint64_t bytes_ = 0;
  CompileStats stats_;  // compiles, hits and evictions; the rest is filled in by stats()
};

}  // namespace tformers::backends
