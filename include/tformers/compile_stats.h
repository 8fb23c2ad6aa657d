// Counters of the process-wide compile cache, which keeps compiled forward steps (one per shape
// and backend) shared by every model that builds the same graph. The cache holds at most a
// byte budget of step scratch memory (the arena each compiled step plans for its intermediate
// values), evicting the least recently used steps beyond it: 1 GiB unless the environment
// variable TFORMERS_COMPILE_CACHE_BYTES (a decimal byte count) or set_compile_cache_budget()
// says otherwise. A model keeps the steps it uses even when the cache evicts them.
#pragma once

#include <cstdint>

namespace tformers {

struct CompileStats {
  uint64_t compiles = 0;  // graphs compiled (cache misses)
  uint64_t hits = 0;      // executables found in the compile cache
  // Of the compiles, the programs a PJRT backend loaded from its persistent compile cache (on
  // disk, from an earlier process) instead of compiling them.
  uint64_t loaded = 0;
  // The process-wide cache only (zero in a model's own counters):
  uint64_t entries = 0;       // executables held
  uint64_t bytes = 0;         // their arena bytes
  uint64_t budget_bytes = 0;  // the most bytes it holds
  uint64_t evictions = 0;     // executables dropped to stay within the budget
};

// Process-wide compile cache counters.
CompileStats compile_stats();

// Sets the process-wide compile cache's byte budget, evicting at once what exceeds it.
void set_compile_cache_budget(uint64_t bytes);

}  // namespace tformers
