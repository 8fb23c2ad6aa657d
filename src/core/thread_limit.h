// The most threads tformers runs a pool with: the range of --threads and TFORMERS_NUM_THREADS.
#pragma once

namespace tformers {

constexpr int kMaxThreads = 1024;

}  // namespace tformers
