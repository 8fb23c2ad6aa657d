// The streaming-read loop behind every roofline of the benchmarks. One core reads more from
// memory when it follows several streams far apart than when it follows one, because the
// hardware prefetchers then keep every stream in flight: on the 2-core AMD EPYC of
// bench/RESULTS.md, over the mmap'd Qwen3-0.6B linears, 1 / 2 / 4 / 8 streams per thread read
// 14.6 / 18.5 / 20.9 / 20.7 GB/s with one thread (25.3 / 29.9 / 35.0 / 33.5 with two). A
// roofline must be the most the memory gives, so the loop reads kReadStreams parts side by side;
// the decode GEMV does the same (kernels_x86.h, kStreams). Streams far apart alias: over
// a 1 GiB buffer, 4 streams 256 MiB apart read 9-10 GB/s, 4 streams 2 MiB apart 19-23, so a
// long range is read one chunk of kReadChunk words at a time.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "core/cpu_features.h"

namespace tformers::bench {

constexpr int kReadStreams = 4;
constexpr int64_t kReadChunk = int64_t(1) << 20;  // 8 MiB

// Sum of the words [b, e) of p, read as kReadStreams equal parts side by side, 64 bytes of each
// per step into independent accumulators, so that memory, not the adds, bounds the loop.
__attribute__((target("avx2"))) inline uint64_t chunk_sum_avx2(const uint64_t* p, int64_t b,
                                                               int64_t e) {
  const int64_t part = (e - b) / kReadStreams / 8 * 8;
  __m256i acc[kReadStreams][2];
  for (auto& a : acc) a[0] = a[1] = _mm256_setzero_si256();
  for (int64_t i = 0; i < part; i += 8) {
#pragma GCC unroll 8
    for (int s = 0; s < kReadStreams; ++s) {
      const __m256i* q = reinterpret_cast<const __m256i*>(p + b + s * part + i);
      acc[s][0] = _mm256_add_epi64(acc[s][0], _mm256_loadu_si256(q));
      acc[s][1] = _mm256_add_epi64(acc[s][1], _mm256_loadu_si256(q + 1));
    }
  }
  __m256i t = _mm256_setzero_si256();
  for (const auto& a : acc) t = _mm256_add_epi64(t, _mm256_add_epi64(a[0], a[1]));
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), t);
  uint64_t sum = out[0] + out[1] + out[2] + out[3];
  for (int64_t i = b + kReadStreams * part; i < e; ++i) sum += p[i];
  return sum;
}

inline uint64_t chunk_sum_scalar(const uint64_t* p, int64_t b, int64_t e) {
  const int64_t part = (e - b) / kReadStreams;
  uint64_t acc[kReadStreams] = {};
  for (int64_t i = 0; i < part; ++i)
    for (int s = 0; s < kReadStreams; ++s) acc[s] += p[b + s * part + i];
  uint64_t sum = 0;
  for (uint64_t a : acc) sum += a;
  for (int64_t i = b + kReadStreams * part; i < e; ++i) sum += p[i];
  return sum;
}

// The sum of the words [b, e) of p, chunk by chunk, with the loop of the active target.
inline uint64_t stream_sum(const uint64_t* p, int64_t b, int64_t e) {
  const bool avx2 = cpu::active_target() >= cpu::Target::kAVX2;
  uint64_t sum = 0;
  for (int64_t c = b; c < e; c += kReadChunk) {
    const int64_t ce = std::min(e, c + kReadChunk);
    sum += avx2 ? chunk_sum_avx2(p, c, ce) : chunk_sum_scalar(p, c, ce);
  }
  return sum;
}

}  // namespace tformers::bench
