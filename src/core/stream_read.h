// The streaming-read loop behind every roofline (tformers bench, bench/). One core reads more
// from memory when it follows several streams far apart than when it follows one, because the
// hardware prefetchers then keep every stream in flight: on the 2-core AMD EPYC of
// bench/RESULTS.md, over the mmap'd Qwen3-0.6B linears, 1 / 2 / 4 / 8 streams per thread read
// 14.6 / 18.5 / 20.9 / 20.7 GB/s with one thread (25.3 / 29.9 / 35.0 / 33.5 with two). A
// roofline must be the most the memory gives, so the loop reads 4 parts side by side; the decode
// GEMV does the same (kernels_x86.h, kStreams). Streams far apart alias: over a 1 GiB buffer, 4
// streams 256 MiB apart read 9-10 GB/s, 4 streams 2 MiB apart 19-23, so a long range is read one
// chunk of 8 MiB at a time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/thread_pool.h"

namespace tformers {

// The sum of the words [b, e) of p, with the loop of the active CPU target. The sum is what
// keeps the loads; callers only time the call.
uint64_t stream_sum(const uint64_t* p, int64_t b, int64_t e);

// Far beyond any last-level cache, so the loop measures memory.
constexpr size_t kReadBandwidthBytes = size_t(1) << 30;

// Streaming-read bandwidth in GB/s of anonymous memory as copied weights get it (core/memory.h:
// 2 MiB-aligned, huge pages requested), with every thread of `pool`: the median of `passes`
// passes of stream_sum over a fresh buffer of `bytes`, written first (never-written pages all
// map the zero page, which reads from cache). The buffer is freed before returning.
double read_bandwidth(ThreadPool& pool, size_t bytes = kReadBandwidthBytes, int passes = 5);

}  // namespace tformers
