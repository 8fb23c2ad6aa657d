#include "core/stream_read.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "core/cpu_features.h"
#include "core/memory.h"

namespace tformers {
namespace {

constexpr int kReadStreams = 4;
constexpr int64_t kReadChunk = int64_t(1) << 20;  // words: 8 MiB

// Sum of the words [b, e) of p, read as kReadStreams equal parts side by side, 64 bytes of each
// per step into independent accumulators, so that memory, not the adds, bounds the loop.
__attribute__((target("avx2"))) uint64_t chunk_sum_avx2(const uint64_t* p, int64_t b, int64_t e) {
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

uint64_t chunk_sum_scalar(const uint64_t* p, int64_t b, int64_t e) {
  const int64_t part = (e - b) / kReadStreams;
  uint64_t acc[kReadStreams] = {};
  for (int64_t i = 0; i < part; ++i)
    for (int s = 0; s < kReadStreams; ++s) acc[s] += p[b + s * part + i];
  uint64_t sum = 0;
  for (uint64_t a : acc) sum += a;
  for (int64_t i = b + kReadStreams * part; i < e; ++i) sum += p[i];
  return sum;
}

}  // namespace

uint64_t stream_sum(const uint64_t* p, int64_t b, int64_t e) {
  const bool avx2 = cpu::active_target() >= cpu::Target::kAVX2;
  uint64_t sum = 0;
  for (int64_t c = b; c < e; c += kReadChunk) {
    const int64_t ce = std::min(e, c + kReadChunk);
    sum += avx2 ? chunk_sum_avx2(p, c, ce) : chunk_sum_scalar(p, c, ce);
  }
  return sum;
}

double read_bandwidth(ThreadPool& pool, size_t bytes, int passes) {
  const int64_t words = int64_t(bytes / 8);
  std::shared_ptr<void> mem = allocate_pages(size_t(words) * 8);
  uint64_t* buf = static_cast<uint64_t*>(mem.get());
  // Written by the threads that read it, so each part's pages sit near its reader.
  pool.parallel_for(
      words, [&](int64_t b, int64_t e, int) { std::memset(buf + b, 1, size_t(e - b) * 8); }, 4096);
  // One slot per thread, a cache line apart, so that the sums do not share a line.
  std::vector<uint64_t> sums(size_t(pool.num_threads()) * 8, 0);
  std::vector<double> gbs;
  for (int r = 0; r < passes; ++r) {
    const auto t = std::chrono::steady_clock::now();
    pool.parallel_for(
        words, [&](int64_t b, int64_t e, int th) { sums[size_t(th) * 8] += stream_sum(buf, b, e); },
        4096);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    gbs.push_back(double(words) * 8 / s / 1e9);
  }
  // The sums must look used, or the loop could go: a volatile store of their total.
  volatile uint64_t sink = 0;
  for (uint64_t v : sums) sink = sink + v;
  std::sort(gbs.begin(), gbs.end());
  return gbs[gbs.size() / 2];
}

}  // namespace tformers
