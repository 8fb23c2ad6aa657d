// Counters of the compile cache: how often a step's graph was compiled and how often an
// executable was reused.
#pragma once

#include <cstdint>

namespace tformers {

struct CompileStats {
  uint64_t compiles = 0;  // graphs compiled (cache misses)
  uint64_t hits = 0;      // executables found in the compile cache
};

}  // namespace tformers
