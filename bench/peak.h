// Compute-peak microbenchmarks shared by the benchmarks: 12 independent FMA (or vdpbf16ps)
// accumulators in registers, no memory traffic, on every pool thread at once. A kernel's speed
// is reported as a fraction of this peak measured in the same run.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "core/cpu_features.h"
#include "core/thread_pool.h"

namespace tformers::bench {

inline volatile float g_peak_sink;
constexpr int64_t kPeakIters = 1 << 22;

// Each loop returns the flops it did.
__attribute__((target("avx2,fma"))) inline double fma_loop_avx2() {
  __m256 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(float(i) * 1e-3f);
  const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-4f);
  for (int64_t it = 0; it < kPeakIters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
  __m256 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, a[i]);
  g_peak_sink = _mm256_cvtss_f32(s);
  return double(kPeakIters) * 12 * 8 * 2;
}

__attribute__((target("avx512f"))) inline double fma_loop_avx512() {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(float(i) * 1e-3f);
  const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-4f);
  for (int64_t it = 0; it < kPeakIters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], m, c);
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  g_peak_sink = _mm512_reduce_add_ps(s);
  return double(kPeakIters) * 12 * 16 * 2;
}

// vdpbf16ps: 16 lanes x 2 products x 2 flops per instruction.
// The FMA loop with each FMA's other factor loaded from L1 (an 8 KiB buffer, 64 bytes a load), as
// a GEMV tile that multiplies one weight vector by x vectors it loads: where this runs at half
// the register-only loop, one 64-byte load a cycle bounds such a tile (an Ice Lake Xeon).
__attribute__((target("avx512f"))) inline double fma_load_loop_avx512() {
  alignas(64) static thread_local float buf[2048];
  for (int i = 0; i < 2048; ++i) buf[i] = float(i % 7) * 1e-3f;
  __m512 a[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm512_setzero_ps();
  const __m512 m = _mm512_set1_ps(0.999f);
  constexpr int64_t kIters = kPeakIters * 12 / 16;
  for (int64_t it = 0; it < kIters; ++it) {
    const float* p = buf + (it & 7) * 256;
    for (int i = 0; i < 16; ++i) a[i] = _mm512_fmadd_ps(m, _mm512_load_ps(p + 16 * i), a[i]);
  }
  __m512 s = a[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, a[i]);
  g_peak_sink = _mm512_reduce_add_ps(s);
  return double(kIters) * 16 * 16 * 2;
}

__attribute__((target("avx512f,avx512bf16"))) inline double dpbf16_loop() {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(float(i) * 1e-3f);
  const __m512i m = _mm512_set1_epi32(0x3f803f80);  // (1.0, 1.0) in bf16
  for (int64_t it = 0; it < kPeakIters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbf16_ps(a[i], (__m512bh)m, (__m512bh)m);
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  g_peak_sink = _mm512_reduce_add_ps(s);
  return double(kPeakIters) * 12 * 16 * 4;
}

// TDPBF16PS into 4 accumulator tiles (16 x 16 f32) from two operand tiles loaded once: each
// multiply is 16 x 16 x 32 multiply-adds. Only on the AMX target, whose detection has asked the
// kernel for the tile state.
__attribute__((target("amx-tile,amx-bf16"))) inline double amx_loop() {
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16};
  } config;
  alignas(64) static const uint16_t zeros[16 * 32] = {};  // the products do not matter
  asm volatile("" : : "m"(config));  // all 64 bytes stored first: see amx::configure
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, zeros, 64);
  _tile_loadd(5, zeros, 64);
  const int64_t iters = kPeakIters / 4;
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 5);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_release();
  return double(iters) * 4 * 16 * 16 * 32 * 2;
}

inline double scalar_loop() {
  float a[12];
  for (int i = 0; i < 12; ++i) a[i] = float(i) * 1e-3f;
  for (int64_t it = 0; it < kPeakIters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = a[i] * 0.999f + 1e-4f;
  float s = 0;
  for (float v : a) s += v;
  g_peak_sink = s;
  return double(kPeakIters) * 12 * 2;
}

using PeakLoop = double (*)();

// The f32 FMA loop of a target.
inline PeakLoop f32_peak_loop(cpu::Target t) {
  if (t >= cpu::Target::kAVX512) return &fma_loop_avx512;
  if (t >= cpu::Target::kAVX2) return &fma_loop_avx2;
  return &scalar_loop;
}

// What bf16 matmuls run at on a target: AMX tiles, else vdpbf16ps where there is one, else the
// f32 FMA.
inline PeakLoop matmul_peak_loop(cpu::Target t) {
  if (t >= cpu::Target::kAMX) return &amx_loop;
  return t >= cpu::Target::kAVX512BF16 ? &dpbf16_loop : f32_peak_loop(t);
}

// GFLOP/s of `loop` on every thread of the pool at once: the median of 3 runs.
inline double peak_gflops(PeakLoop loop, ThreadPool& pool) {
  std::vector<double> runs;
  for (int r = 0; r < 3; ++r) {
    std::vector<double> f(size_t(pool.num_threads()));
    auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(pool.num_threads(), [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) f[size_t(i)] = loop();
    });
    double flops = 0;
    for (double v : f) flops += v;
    runs.push_back(
        flops / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9);
  }
  std::sort(runs.begin(), runs.end());
  return runs[1];
}

}  // namespace tformers::bench
