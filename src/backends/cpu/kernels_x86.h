// Private to the x86 kernel files (kernels_target_avx2.cc and kernels_target_avx512.cc, which
// both have AVX2): the code they share, written once over a vector type `V` — the Ops of
// kernels_impl.h, the decode GEMV and the prefill GEMM — and the 8-wide helpers the GEMM's weight
// panels are packed with. Like kernels_impl.h, everything sits in an anonymous namespace so that
// each target's copy stays its own. tests/ops/test_x86_shared.cc instantiates the GEMV, the GEMM
// and the sum of squares at 16 lanes with generic vectors, so that much of the AVX-512 target's
// logic is checked on any AVX2 machine.
//
// V supplies: T (the vector), kWidth (floats in T), kMR (x rows per GEMM tile), kGroup (GEMM
// panels per L2 block); load / load_pairs (2 x kWidth values:
// bf16 as even | odd, f32 in order) / store / add / fmadd / broadcast / zero / hsum; its int8
// GEMV tile: Int8X (x prepared for it, with row(m, K)), prepare_int8_x, gemv_tile_q8 and
// kInt8Streams (int8 rows read at once for one x row); and, for
// int4, gemv_int4_tile and kInt4Streams<MR> (row groups read side by side for MR x rows).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <type_traits>
#include <utility>

#include "backends/cpu/kernels_impl.h"
#include "core/cpu_features.h"

namespace tformers::cpu {
namespace {

// 8 values in order as f32 (exact).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const int8_t* p) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

// The largest |value| of one block of 32 (in four vectors).
inline float abs_max(const __m256 (&v)[4]) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 m =
      _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                    _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  return _mm_cvtss_f32(m4);
}

// 8x8 transpose of r[0..7] in place.
inline void transpose8(__m256 (&r)[8]) {
  __m256 t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  __m256 u[8];
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// The Ops of kernels_impl.h with kWidth-wide vectors.
template <class V>
struct X86Ops {
  using T = typename V::T;

  static float sum_sq(const float* x, int64_t n) {
    constexpr int w = V::kWidth;
    T s0 = V::zero(), s1 = V::zero(), s2 = V::zero(), s3 = V::zero();
    int64_t i = 0;
    for (; i + 4 * w <= n; i += 4 * w) {
      const T a0 = V::load(x + i), a1 = V::load(x + i + w), a2 = V::load(x + i + 2 * w),
              a3 = V::load(x + i + 3 * w);
      s0 = V::fmadd(a0, a0, s0);
      s1 = V::fmadd(a1, a1, s1);
      s2 = V::fmadd(a2, a2, s2);
      s3 = V::fmadd(a3, a3, s3);
    }
    for (; i + w <= n; i += w) {
      const T a = V::load(x + i);
      s0 = V::fmadd(a, a, s0);
    }
    float s = V::hsum(V::add(V::add(s0, s1), V::add(s2, s3)));
    for (; i < n; ++i) s += x[i] * x[i];
    return s;
  }
};

// The x86 targets' linears: the GEMM from kGemmMinRows rows of x, unless the rows are decode
// rows, which take the GEMV at any M.
constexpr int64_t kGemmMinRows = 4;
inline bool takes_gemm(int64_t M, LinearRows rows) {
  return rows == LinearRows::kAny && M >= kGemmMinRows;
}

// ---- The decode GEMV (decode rows, or M < kGemmMinRows): each weight row is streamed once.
//
// bf16 weights are widened without shuffles: a 32-bit lane holding two bf16 values w[2i], w[2i+1]
// gives w[2i] as f32 after a left shift by 16 and w[2i+1] after masking the low half, so
// V::load_pairs gives a block of kPairBlock weights as (even | odd) vectors, and x is repacked
// once per call into the same order (pack_even_odd). f32 weights load in order and use x as is.
// int8 weights go through the target's own tile, V::gemv_tile_q8, with x prepared for it once per
// call (V::prepare_int8_x); this file only streams their rows and scales.
template <class V>
constexpr int64_t kPairBlock = 2 * V::kWidth;

// A target that multiplies bf16 weights by x rounded to bf16 in its GEMV (AVX-512 BF16) has
// V::prepare_bf16_x (x rows into the packed-x scratch, at the same row offsets as f32 x) and
// V::gemv_tile_bf16 (gemv_tile's contract).
template <class V>
concept Bf16Dot = requires {
  V::kBf16Dot;
};

// Each weight row is one sequential stream (rows are contiguous), with a software prefetch
// kPrefetch bytes ahead in it. On AMD Zen the hint is NTA (each weight is used once per call; NTA
// keeps it from evicting activations): over the Qwen3-0.6B linears mmap'd from a checkpoint, one
// thread, 4 interleaved rows (4 streams 2 KiB apart, the first design) read 79 % of what a plain
// read loop gets from the same mapping; one row at a time with a T0 prefetch 86 %, with NTA 96 %
// (512 B ahead: 88 %, 1536 B: 82 %). On Intel it is T0 (cpu::weight_prefetch() says why). The
// hint is read once into a namespace-scope constant: a function-local static would put an
// initialisation guard, and with it a possible call, in every tile loop (a trial build that did
// so ran the 16-row GEMV at half speed). bench/RESULTS.md has the numbers. The constant is set
// while the library loads, where an exception would end the process, so a bad
// TFORMERS_CPU_PREFETCH gives T0 here and its error from the CPU backend's constructor, which
// asks again before any kernel runs.
constexpr int64_t kPrefetch = 1024;
inline const bool kPrefetchNta = [] {
  try {
    return cpu::weight_prefetch() == cpu::WeightPrefetch::kNonTemporal;
  } catch (const std::exception&) {
    return false;
  }
}();

// The line `ahead` bytes past p, with the weights' hint.
inline void prefetch_at(const void* p, int64_t ahead) {
  const char* q = static_cast<const char*>(p) + ahead;
  if (kPrefetchNta)
    _mm_prefetch(q, _MM_HINT_NTA);
  else
    _mm_prefetch(q, _MM_HINT_T0);
}

inline void prefetch_ahead(const void* p) { prefetch_at(p, kPrefetch); }

// One core reads more when it follows several streams far apart than one: over the same mmap'd
// Qwen3-0.6B linears, a read loop over 4 parts of each matrix side by side gets 1.4x the
// bandwidth of the same loop over one stream (20.9 against 14.6 GB/s, one thread; 35.0 against
// 25.3 with two), because the hardware prefetchers then keep 4 streams in flight. So the GEMV
// reads kStreams rows at once, each from its own quarter of a task's rows: 17.5 GB/s against
// 12.0 for one row at a time (one thread, AVX2; 2 or 8 streams were slower than 4). An int8 row
// brings a second stream, its block scales, so int8 reads half as many rows at once: against 4
// rows over the 28 Qwen3-0.6B layers' int8 linears, alternated in one process (bench_ab
// linear-int8), 0.99-1.07x in 7 runs on one thread (median 1.02x; two copies of one build give
// 0.99-1.01x) and 1.02x on two, where 8 rows were 0.83x. A target's own int8 tile may want
// another count (V::kInt8Streams; the AVX-512 BF16 target's VNNI tile reads 4 on one thread).
// With several threads reading at once, each reads at most kStreams / 2 int8 rows: on a 2-core
// Zen 5, 4 rows (and their 4 scale streams) per thread were 1.03x faster than 2 on one thread
// but 0.94x on two, while bf16 rows were the same at 4 or 2 on two threads (bench_ab, 3 runs).
constexpr int kStreams = 4;
template <class V, class W>
constexpr int kRowStreams = std::is_same_v<W, int8_t> ? V::kInt8Streams : kStreams;
template <class V, class W>
constexpr int kSharedRowStreams = std::is_same_v<W, int8_t>
                                      ? std::min(V::kInt8Streams, kStreams / 2)
                                      : kStreams;

// Keeps a loaded vector in a register. GCC folds a load into every instruction that uses it as a
// memory operand, so a vector used by several FMAs is loaded once per FMA; where loads, not
// FMAs, bound a tile (one 64-byte load a cycle on an Ice Lake Xeon), that is the tile's speed.
// Vectors wider than the target's registers (the op tests' 16-lane generic vectors on AVX2) stay
// the compiler's to place.
template <class T>
inline void in_register(T& v) {
#if defined(__AVX512F__)
  asm("" : "+v"(v));
#else
  if constexpr (sizeof(T) <= 32) asm("" : "+x"(v));
#endif
}

// gemv_tile's sums for 4 accumulators per (row, x row) and a tile of several weight rows and x
// rows, with the registers of two: the k loop runs twice, over the even blocks of kPairBlock
// (whose (even | odd) halves gemv_tile adds into accumulators 0 and 1) and then the odd ones
// (accumulators 2 and 3), so every accumulator takes the same products in the same order and a
// row's bits are gemv_tile's. Each x vector then feeds S weight rows from a register, and each
// weight vector MR x rows: on an Ice Lake Xeon, tiles of 2 weight rows by 4 x rows ran at 0.68
// of the FMA peak from L2 in a standalone loop, against 0.33-0.44 for gemv_tile's one row of 4
// (loads of x bound it). The second pass reads the rows from L1 (S rows of K bf16 values: 18 KiB
// for S = 3 at K = 3072). Passes of
// 2 x rows, bound by memory, keep gemv_tile: with this tile they ran 0.90-0.96x.
template <class V, int S, int MR, class W>
inline void gemv_tile_halves(const float* x, const W* const (&w)[S], int64_t K,
                             float (&out)[S][MR]) {
  using T = typename V::T;
  constexpr int64_t blk = kPairBlock<V>, vw = V::kWidth;
  const int64_t full = K / blk * blk;
  T half[S][MR];
  for (int64_t h = 0; h < 2; ++h) {
    T acc[S][MR][2];
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) acc[s][i][0] = acc[s][i][1] = V::zero();
    for (int64_t k = h * blk; k + blk <= full; k += 2 * blk) {
      T lo[S], hi[S];
#pragma GCC unroll 16
      for (int s = 0; s < S; ++s) {
        if (h == 0)  // the even block and the odd one after it
#pragma GCC unroll 4
          for (int64_t b = 0; b < 2 * blk * int64_t(sizeof(W)); b += 64)
            prefetch_ahead(reinterpret_cast<const char*>(w[s] + k) + b);
        V::load_pairs(w[s] + k, lo[s], hi[s]);
      }
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        T x0 = V::load(x + i * K + k), x1 = V::load(x + i * K + k + vw);
        in_register(x0);
        in_register(x1);
#pragma GCC unroll 16
        for (int s = 0; s < S; ++s) {
          acc[s][i][0] = V::fmadd(lo[s], x0, acc[s][i][0]);
          acc[s][i][1] = V::fmadd(hi[s], x1, acc[s][i][1]);
        }
      }
    }
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const T pair = V::add(acc[s][i][0], acc[s][i][1]);
        half[s][i] = h == 0 ? pair : V::add(half[s][i], pair);
      }
  }
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      float r = V::hsum(half[s][i]);
      for (int64_t t = full; t < K; ++t) r = std::fma(x[i * K + t], value_f32(w[s][t]), r);
      out[s][i] = r;
    }
}

// S weight rows (each its own stream) against MR packed x rows (stride K): out[s][i] = w[s] . x_i.
// Two blocks of kPairBlock per step (one cache line of bf16 per row with AVX2, two with AVX-512)
// into V::kGemvAcc accumulators per (row, x row), so that FMA latency never limits the streams:
// 4 on AVX-512; 2 on AVX2, whose 16 registers then hold the sums of 4 x rows (8) besides the
// step's 4 weight vectors.
template <class V, int S, int MR, class W>
inline void gemv_tile(const float* x, const W* const (&w)[S], int64_t K, float (&out)[S][MR]) {
  using T = typename V::T;
  constexpr int64_t blk = kPairBlock<V>, vw = V::kWidth;
  constexpr int A = V::kGemvAcc;
  static_assert(A == 2 || A == 4);
  if constexpr (A == 4 && S > 1 && MR > 2) {
    gemv_tile_halves<V>(x, w, K, out);
    return;
  }
  T acc[S][MR][4];
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int a = 0; a < A; ++a) acc[s][i][a] = V::zero();
  const int64_t full = K / blk * blk;
  int64_t k = 0;
  for (; k + 2 * blk <= full; k += 2 * blk) {
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) {
#pragma GCC unroll 4
      for (int64_t b = 0; b < 2 * blk * int64_t(sizeof(W)); b += 64)
        prefetch_ahead(reinterpret_cast<const char*>(w[s] + k) + b);
      T lo0, hi0, lo1, hi1;
      V::load_pairs(w[s] + k, lo0, hi0);
      V::load_pairs(w[s] + k + blk, lo1, hi1);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const float* xi = x + i * K + k;
        acc[s][i][0] = V::fmadd(lo0, V::load(xi), acc[s][i][0]);
        acc[s][i][1] = V::fmadd(hi0, V::load(xi + vw), acc[s][i][1]);
        acc[s][i][2 % A] = V::fmadd(lo1, V::load(xi + 2 * vw), acc[s][i][2 % A]);
        acc[s][i][3 % A] = V::fmadd(hi1, V::load(xi + 3 * vw), acc[s][i][3 % A]);
      }
    }
  }
  if (k < full) {  // one block left
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) {
      T lo, hi;
      V::load_pairs(w[s] + k, lo, hi);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        acc[s][i][0] = V::fmadd(lo, V::load(x + i * K + k), acc[s][i][0]);
        acc[s][i][1] = V::fmadd(hi, V::load(x + i * K + k + vw), acc[s][i][1]);
      }
    }
  }
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const T pair = V::add(acc[s][i][0], acc[s][i][1]);
      float r = V::hsum(A == 4 ? V::add(pair, V::add(acc[s][i][2], acc[s][i][3])) : pair);
      // std::fma, not r += x * w: the compiler may contract that into an FMA in one unrolling
      // and not in another, and a row must get the same bits in every pass width.
      for (int64_t t = full; t < K; ++t) r = std::fma(x[i * K + t], value_f32(w[s][t]), r);
      out[s][i] = r;
    }
}

// y rows [n0, n1) for MR rows of x (packed, stride K; xq, the same rows for the int8 tile), y
// stride N, plus bias[n]; scale is the int8 block scales (N, int8_blocks(K)), null for float
// weights. Blocks of rows are cut into S equal parts read side by side (kStreams), each part at
// most kStreamSpan bytes of weights: streams far apart alias (4 streams 256 MiB apart read about
// half the bandwidth of 4 streams 2 MiB apart; core/stream_read.h). The rows left over go one at
// a time.
constexpr int64_t kStreamSpan = int64_t(1) << 20;

template <class V, int S, int MR, class W, class B>
void gemv_rows(const float* x, typename V::Int8X xq, const W* w, const float* scale, const B* bias,
               float* y, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  const int64_t nb = int8_blocks(K);
  const int64_t max_part = std::max<int64_t>(1, kStreamSpan / std::max<int64_t>(1, K * sizeof(W)));
  for (int64_t first = n0; first < n1;) {
    const int64_t part = std::min(max_part, (n1 - first) / S);
    if (part == 0) {
      if constexpr (S > 1) gemv_rows<V, 1, MR>(x, xq, w, scale, bias, y, N, K, first, n1);
      return;
    }
    for (int64_t r = 0; r < part; ++r) {
      const W* rows[S];
      const float* scales[S];
      int64_t n[S];
#pragma GCC unroll 16
      for (int s = 0; s < S; ++s) {
        n[s] = first + s * part + r;
        rows[s] = w + n[s] * K;
        scales[s] = scale ? scale + n[s] * nb : nullptr;
      }
      float out[S][MR];
      if constexpr (std::is_same_v<W, int8_t>)
        V::template gemv_tile_q8<S, MR>(x, xq, rows, scales, K, out);
      else if constexpr (std::is_same_v<W, uint16_t> && Bf16Dot<V>)
        V::template gemv_tile_bf16<S, MR>(x, rows, K, out);
      else
        gemv_tile<V, S, MR>(x, rows, K, out);
#pragma GCC unroll 16
      for (int s = 0; s < S; ++s) {
        const float b = bias ? value_f32(bias[n[s]]) : 0.0f;
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) y[i * N + n[s]] = out[s][i] + b;
      }
    }
    first += S * part;
  }
}

// The passes of a decode GEMV over a thread's weight rows [n0, n1) (row_bytes each) for M x rows:
// 4 x rows at a time (each weight read once per pass), then a pair, then the last one, as
// f(m, c0, c1, mr) with mr a std::integral_constant of 4, 2 or 1 and [c0, c1) the rows. With
// several passes the rows are cut into chunks of kGemvChunkBytes and every pass runs over a chunk
// before the next, so the first pass reads it from memory and the others from L2. 192 KiB leaves
// room for x and the scratch in the smallest L2 of the x86 CPUs we run on (256 KiB on Intel's
// client cores); it is not tuned.
constexpr int64_t kGemvChunkBytes = int64_t(192) << 10;

template <class F>
void for_each_decode_pass(int64_t M, int64_t n0, int64_t n1, int64_t row_bytes, F&& f) {
  const int64_t passes = M / 4 + (M % 4) / 2 + M % 2;
  const int64_t chunk =
      passes > 1 ? std::max<int64_t>(kStreams, kGemvChunkBytes / std::max<int64_t>(1, row_bytes))
                 : n1 - n0;
  for (int64_t c0 = n0; c0 < n1; c0 += chunk) {
    const int64_t c1 = std::min(n1, c0 + chunk);
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) f(m, c0, c1, std::integral_constant<int, 4>{});
    if (m + 2 <= M) {
      f(m, c0, c1, std::integral_constant<int, 2>{});
      m += 2;
    }
    if (m < M) f(m, c0, c1, std::integral_constant<int, 1>{});
  }
}

// Weight rows a pass of 4 x rows reads side by side: 3 where gemv_tile_halves runs them (f32 and
// bf16 weights widened to f32 on AVX-512), one elsewhere (the int8 tiles, the AVX-512 BF16 tile,
// AVX2's 16 registers). With 3, 24 accumulators, 6 weight vectors, 2 of x and the bf16 mask want
// 33 registers and GCC keeps one accumulator in memory; against 2 rows, on an Ice Lake Xeon
// (bench_ab linear-bf16, 9 rounds), it ran 1.07-1.09x at 4, 8, 16 and 32 rows and the lm_head:
// the first pass, from memory, gains a stream, and each x vector feeds one more row.
template <class V, class W>
constexpr int kFourRowStreams =
    V::kGemvAcc == 4 && !std::is_same_v<W, int8_t> && !(sizeof(W) == 2 && Bf16Dot<V>) ? 3 : 1;

// y (M, N) = x (M, K) @ w (N, K)^T + bias for decode rows, in for_each_decode_pass's passes. A
// row's sums depend only on K, not on how many x rows share a pass (gemv_tile and the int8 tiles
// keep accumulators per x row), so every M gives a row the same bits: the serving engine's batch
// invariance rests on that.
template <class V, class W, class B>
void gemv(const float* x, const W* w, const float* scale, const B* bias, float* y, int64_t M,
          int64_t N, int64_t K, ThreadPool& pool) {
  const float* xp = x;
  if constexpr (sizeof(W) == 2) {
    // Packed on the calling thread; workers only read it during this call.
    float* p = thread_scratch<float>(Scratch::kPackedX, size_t(M * K));
    if constexpr (Bf16Dot<V>)
      V::prepare_bf16_x(x, M, K, p);
    else
      for (int64_t m = 0; m < M; ++m) pack_even_odd(x + m * K, K, kPairBlock<V>, p + m * K);
    xp = p;
  }
  typename V::Int8X xq{};
  if constexpr (std::is_same_v<W, int8_t>) xq = V::prepare_int8_x(x, M, K);
  const bool shared = pool.num_threads() > 1;
  pool.parallel_for(
      N,
      [&](int64_t n0, int64_t n1, int) {
        for_each_decode_pass(
            M, n0, n1, K * int64_t(sizeof(W)), [&](int64_t m, int64_t c0, int64_t c1, auto mr) {
              const float* xm = xp + m * K;
              float* ym = y + m * N;
              if constexpr (mr() > 1)  // kFourRowStreams of 4 rows, or kStreams / 2 of 2
                gemv_rows<V, mr() == 4 ? kFourRowStreams<V, W> : kStreams / 2, mr()>(
                    xm, xq.row(m, K), w, scale, bias, ym, N, K, c0, c1);
              else if (shared)
                gemv_rows<V, kSharedRowStreams<V, W>, 1>(xm, xq.row(m, K), w, scale, bias, ym, N, K,
                                                         c0, c1);
              else
                gemv_rows<V, kRowStreams<V, W>, 1>(xm, xq.row(m, K), w, scale, bias, ym, N, K, c0,
                                                   c1);
            });
      },
      32);
}

// ---- The prefill GEMM. Weights are converted, kNR = 2 vectors of rows at a time, into an f32
// panel (K-major, kNR values per k) kept in L2, and an MR x kNR register tile runs every row
// block of x against it, so each weight byte from memory feeds M multiply-adds.

// Blocking: a group of V::kGroup panels of kKC k values each (128 KiB of f32 for both targets)
// stays in L2 while every kMR-row block of x (at most 8 x 256 f32 = 8 KiB, in L1) meets all of
// them. kKC is even so that bf16 k pairs (the AVX-512 BF16 panels) never straddle two panels.
constexpr int64_t kKC = 256;

template <class V>
constexpr int kNR = 2 * V::kWidth;  // panel width: output columns per register tile

// panel (kc, kNR) f32 = w rows [n0, n0 + rows) x k in [k0, k0 + kc); missing rows are zero.
// scale: the int8 block scales (N, int8_blocks(K)), null for float weights and for int8 codes
// left unscaled; k0 is a multiple of kKC and k of 8, so 8 consecutive values share one block
// scale.
template <class V, class W>
void pack_panel(const W* w, const float* scale, int64_t K, int64_t n0, int rows, int64_t k0,
                int64_t kc, float* panel) {
  constexpr int nr = kNR<V>;
  const int64_t nb = int8_blocks(K);
  auto weight = [&](int64_t n, int64_t k) {
    if constexpr (std::is_same_v<W, int8_t>)
      if (scale) return value_f32(w[n * K + k]) * scale[n * nb + k / kInt8Block];
    return value_f32(w[n * K + k]);
  };
  int64_t k = 0;
  if (rows == nr) {
    for (; k + 8 <= kc; k += 8) {
      for (int part = 0; part < nr / 8; ++part) {
        __m256 r[8];
        for (int j = 0; j < 8; ++j) {
          const int64_t n = n0 + part * 8 + j;
          r[j] = load8(w + n * K + k0 + k);
          if constexpr (std::is_same_v<W, int8_t>)
            if (scale)
              r[j] = _mm256_mul_ps(r[j], _mm256_set1_ps(scale[n * nb + (k0 + k) / kInt8Block]));
        }
        transpose8(r);  // r[kk] = 8 rows at k + kk
        for (int kk = 0; kk < 8; ++kk) _mm256_storeu_ps(panel + (k + kk) * nr + part * 8, r[kk]);
      }
    }
  }
  for (; k < kc; ++k)
    for (int j = 0; j < nr; ++j) panel[k * nr + j] = j < rows ? weight(n0 + j, k0 + k) : 0.0f;
}

template <class V>
inline void store_tile_row(float* yr, typename V::T c0, typename V::T c1, int cols,
                           bool accumulate) {
  if (cols == kNR<V>) {
    if (accumulate) {
      c0 = V::add(c0, V::load(yr));
      c1 = V::add(c1, V::load(yr + V::kWidth));
    }
    V::store(yr, c0);
    V::store(yr + V::kWidth, c1);
  } else {
    alignas(64) float tmp[kNR<V>];
    V::store(tmp, c0);
    V::store(tmp + V::kWidth, c1);
    for (int j = 0; j < cols; ++j) yr[j] = accumulate ? yr[j] + tmp[j] : tmp[j];
  }
}

// Register tiles (here and in the target files' GEMVs) are arrays indexed by loop counters;
// `#pragma GCC unroll` makes GCC unroll those loops early enough to keep the arrays in registers
// (at -O3 it otherwise stores every accumulator to the stack on each k step, which halves the
// GEMM speed).

// y tile (MR, cols) (+)= x (MR, kc; stride ldx) @ panel (kc, kNR).
template <class V, int MR>
void gemm_tile(const float* x, int64_t ldx, const float* panel, int64_t kc, float* y, int64_t ldy,
               int cols, bool accumulate) {
  constexpr int nr = kNR<V>;
  typename V::T c[MR][2];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) c[i][0] = c[i][1] = V::zero();
  for (int64_t k = 0; k < kc; ++k) {
    const typename V::T b0 = V::load(panel + k * nr), b1 = V::load(panel + k * nr + V::kWidth);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const typename V::T a = V::broadcast(x + i * ldx + k);
      c[i][0] = V::fmadd(a, b0, c[i][0]);
      c[i][1] = V::fmadd(a, b1, c[i][1]);
    }
  }
  // Fully unrolled so that GCC keeps c in registers (a rolled loop indexing c makes it an
  // in-memory array, stored on every k step).
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) store_tile_row<V>(y + i * ldy, c[i][0], c[i][1], cols, accumulate);
}

// f(std::integral_constant<int, mr>) for a run-time mr in [1, MR]: the register tiles need their
// row count at compile time.
template <int MR, class F>
inline void with_tile_rows(int mr, F&& f) {
  if constexpr (MR > 1)
    if (mr < MR) return with_tile_rows<MR - 1>(mr, std::forward<F>(f));
  f(std::integral_constant<int, MR>{});
}

// Finishes columns [n0, n1) of y: zero when K == 0, then the bias.
template <class B>
void finish_columns(const B* bias, float* y, int64_t M, int64_t N, int64_t K, int64_t n0,
                    int64_t n1) {
  for (int64_t m = 0; m < M; ++m) {
    float* yr = y + m * N;
    if (K == 0) std::fill(yr + n0, yr + n1, 0.0f);
    if (bias)
      for (int64_t n = n0; n < n1; ++n) yr[n] += value_f32(bias[n]);
  }
}

// Columns [p0 * kNR, p1 * kNR) of y (M, N) = x (M, K) @ w (N, K)^T + bias on the calling thread,
// with pack(n0, rows, k0, kc, panel) writing the f32 panel of w rows [n0, n0 + rows) (rows <= kNR;
// the rest zero) and k in [k0, k0 + kc).
template <class V, class Pack, class B>
void gemm_panel_range(const float* x, const Pack& pack, const B* bias, float* y, int64_t M,
                      int64_t N, int64_t K, int64_t p0, int64_t p1) {
  constexpr int nr = kNR<V>;
  float* panel = thread_scratch<float>(Scratch::kPanel, size_t(V::kGroup * kKC * nr));
  for (int64_t g0 = p0; g0 < p1; g0 += V::kGroup) {
    const int64_t g1 = std::min(p1, g0 + V::kGroup);
    for (int64_t k0 = 0; k0 < K; k0 += kKC) {
      const int64_t kc = std::min(kKC, K - k0);
      for (int64_t p = g0; p < g1; ++p)
        pack(p * nr, int(std::min<int64_t>(nr, N - p * nr)), k0, kc, panel + (p - g0) * kKC * nr);
      // The x block (kMR rows x kc) stays in L1 while it meets every panel of the group.
      for (int64_t m = 0; m < M; m += V::kMR) {
        with_tile_rows<V::kMR>(int(std::min<int64_t>(V::kMR, M - m)), [&](auto mr) {
          for (int64_t p = g0; p < g1; ++p)
            gemm_tile<V, mr()>(x + m * K + k0, K, panel + (p - g0) * kKC * nr, kc,
                               y + m * N + p * nr, N, int(std::min<int64_t>(nr, N - p * nr)),
                               k0 > 0);
        });
      }
    }
    finish_columns(bias, y, M, N, K, g0 * nr, std::min(N, g1 * nr));
  }
}

// The same over all of y, the panels split over the pool.
template <class V, class Pack, class B>
void gemm_panels(const float* x, const Pack& pack, const B* bias, float* y, int64_t M, int64_t N,
                 int64_t K, ThreadPool& pool) {
  const int64_t panels = (N + kNR<V> - 1) / kNR<V>;
  pool.parallel_for(
      panels,
      [&](int64_t p0, int64_t p1, int) { gemm_panel_range<V>(x, pack, bias, y, M, N, K, p0, p1); },
      V::kGroup);
}

// y (M, N) = x (M, K) @ w (N, K)^T + bias, w in f32, bf16 or int8 (with its block scales).
template <class V, class W, class B>
void gemm(const float* x, const W* w, const float* scale, const B* bias, float* y, int64_t M,
          int64_t N, int64_t K, ThreadPool& pool) {
  gemm_panels<V>(
      x,
      [&](int64_t n0, int rows, int64_t k0, int64_t kc, float* panel) {
        pack_panel<V>(w, scale, K, n0, rows, k0, kc, panel);
      },
      bias, y, M, N, K, pool);
}

// ---- int4 weights (the tiles of kernels.h). Both paths unpack a tile's 32-byte part v the same
// way: the low nibbles give each row's codes at k = 8 v + t, the high ones at 8 v + 4 + t, t < 4,
// as 8 lanes of 4 bytes, lane j for row j.

// One block of 32 x values rounded to int8 at q with the scale *s = max|x| / 127 (x ~ s q, to
// nearest even; an all-zero block gets scale 0 and zeros), and the sum of those int8 values.
inline void quantize_x8_block(const float* x, int8_t* q, float* s, int32_t* sum) {
  __m256 v[4];
  for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(x + 8 * j);
  const float amax = abs_max(v);
  *s = amax / 127.0f;
  const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  __m256i i32[4];
  for (int j = 0; j < 4; ++j) i32[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inv));
  // packs interleave the 128-bit lanes: dwords (0 4 1 5 2 6 3 7) put them back in order.
  const __m256i i8 =
      _mm256_packs_epi16(_mm256_packs_epi32(i32[0], i32[1]), _mm256_packs_epi32(i32[2], i32[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(i8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  const __m256i t =
      _mm256_add_epi32(_mm256_add_epi32(i32[0], i32[1]), _mm256_add_epi32(i32[2], i32[3]));
  __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
  u = _mm_add_epi32(u, _mm_shuffle_epi32(u, _MM_SHUFFLE(1, 0, 3, 2)));
  u = _mm_add_epi32(u, _mm_shuffle_epi32(u, _MM_SHUFFLE(2, 3, 0, 1)));
  *sum = _mm_cvtsi128_si32(u);
}

// x rows for the int4 GEMV: per 32-value block, int8 values (padded with zeros past K), their
// scale and their sum, which the zero point's term needs (sum_k c_k x_k - z sum_k x_k).
struct Int4X {
  const int8_t* q;     // (M, nb * 32)
  const float* s;      // (M, nb)
  const int32_t* sum;  // (M, nb)
};

// The M rows of x rounded on the calling thread, into its kPackedX scratch, each row as nb
// blocks (at least int4_blocks(K); the blocks past K are zeros with scale 0).
inline Int4X prepare_int4_x(const float* x, int64_t M, int64_t K, int64_t nb) {
  const int64_t kp = nb * kInt4Block;
  char* p = thread_scratch<char>(Scratch::kPackedX, size_t(M * (kp + 8 * nb) + 64));
  int8_t* q = reinterpret_cast<int8_t*>(p);
  float* s = reinterpret_cast<float*>(p + (M * kp + 63) / 64 * 64);
  int32_t* sum = reinterpret_cast<int32_t*>(s + M * nb);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * kInt4Block;
      float padded[kInt4Block] = {};
      if ((b + 1) * kInt4Block > K) {  // the last, partial block, or one past K
        std::copy(xb, x + m * K + std::max(K, b * kInt4Block), padded);
        xb = padded;
      }
      quantize_x8_block(xb, q + m * kp + b * kInt4Block, s + m * nb + b, sum + m * nb + b);
    }
  return {q, s, sum};
}

// Vectors of 32-bit lanes, 4 bytes each, from one tile part: row j's codes at k = 8 v + t (lo)
// and 8 v + 4 + t (hi) in byte t of lane j.
inline void unpack_part(const uint8_t* part, __m256i& lo, __m256i& hi) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(part));
  const __m256i mask = _mm256_set1_epi8(0x0f);
  lo = _mm256_and_si256(raw, mask);
  hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
}

inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}

// S row groups (each its own stream of tiles, with its scales and zero points) against MR x rows:
// acc[s][i] gets the 8 rows' sums. Per tile and x row: vpmaddubsw multiplies codes (unsigned)
// by x (signed) in pairs and sums the 4 parts' pairs in int16 (16 products of at most 15 x 127
// per int16: 30480 < 2^15), vpmaddwd finishes each row's exact integer block sum, the zero
// point's term is subtracted, and the sum is scaled by the row's and x's block scales. The
// streams take turns part by part, so that each broadcast of x serves all of them and few vectors
// are live at once (with each stream's whole tile in turn, GCC spilled the partial sums out of
// AVX2's 16 registers).
template <int S, int MR, bool kZero>
inline void gemv_int4_tile(Int4X x, int64_t nb, const uint8_t* const (&w)[S],
                           const uint16_t* const (&scale)[S], const uint8_t* const (&zero)[S],
                           __m256 (&acc)[S][MR]) {
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t kp = nb * kInt4Block;
  for (int64_t b = 0; b < nb; ++b) {
    __m256i p[S][MR];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      __m256i xl[MR], xh[MR];
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const int8_t* xb = x.q + i * kp + b * kInt4Block + 8 * v;
        xl[i] = broadcast4(xb);
        xh[i] = broadcast4(xb + 4);
      }
#pragma GCC unroll 16
      for (int s = 0; s < S; ++s) {
        const uint8_t* tile = w[s] + b * kInt4TileBytes;
        if (v < 2) prefetch_ahead(tile + 64 * v);
        __m256i lo, hi;
        unpack_part(tile + 32 * v, lo, hi);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
          const __m256i d =
              _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl[i]), _mm256_maddubs_epi16(hi, xh[i]));
          p[s][i] = v == 0 ? d : _mm256_add_epi16(p[s][i], d);
        }
      }
    }
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) {
      const __m256 ws = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(scale[s] + b * kInt4Rows)));
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const __m256i xsum = _mm256_set1_epi32(x.sum[i * nb + b]);
        __m256i zx;
        if constexpr (kZero)
          zx = _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                                      reinterpret_cast<const __m128i*>(zero[s] + b * kInt4Rows))),
                                  xsum);
        else
          zx = _mm256_slli_epi32(xsum, 3);  // zero point 8
        const __m256i dot = _mm256_sub_epi32(_mm256_madd_epi16(p[s][i], ones), zx);
        acc[s][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                    _mm256_mul_ps(ws, _mm256_set1_ps(x.s[i * nb + b])), acc[s][i]);
      }
    }
  }
}

// gemv_int4_tile's sums stored, 8 rows per (stream, x row): the int4 GEMV tile of both AVX2 and,
// for a single stream, AVX-512 (which pairs streams in its 512-bit registers otherwise).
template <int S, int MR, bool kZero>
inline void gemv_int4_tile_ymm(Int4X x, int64_t nb, const uint8_t* const (&w)[S],
                               const uint16_t* const (&scale)[S], const uint8_t* const (&zero)[S],
                               float (&out)[S][MR][kInt4Rows]) {
  __m256 acc[S][MR];
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) acc[s][i] = _mm256_setzero_ps();
  gemv_int4_tile<S, MR, kZero>(x, nb, w, scale, zero, acc);
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) _mm256_storeu_ps(out[s][i], acc[s][i]);
}

// Row groups [g0, g1) for MR x rows (x.q etc. at the first of them), y stride N, through the
// target's tile V::gemv_int4_tile. As gemv_rows, the groups are cut into S parts read side by
// side, each at most kStreamSpan bytes of tiles; groups left over go one at a time.
template <class V, int S, int MR, bool kZero>
void gemv_int4_groups(Int4X x, const uint8_t* w, const uint16_t* scale, const uint8_t* zero,
                      const float* bias, float* y, int64_t N, int64_t K, int64_t g0, int64_t g1) {
  const int64_t nb = int4_blocks(K);
  const int64_t max_part = std::max<int64_t>(1, kStreamSpan / (nb * kInt4TileBytes));
  for (int64_t first = g0; first < g1;) {
    const int64_t part = std::min(max_part, (g1 - first) / S);
    if (part == 0) {
      if constexpr (S > 1)
        gemv_int4_groups<V, 1, MR, kZero>(x, w, scale, zero, bias, y, N, K, first, g1);
      return;
    }
    for (int64_t r = 0; r < part; ++r) {
      const uint8_t* tiles[S];
      const uint16_t* scales[S];
      const uint8_t* zeros[S];
      int64_t g[S];
#pragma GCC unroll 16
      for (int s = 0; s < S; ++s) {
        g[s] = first + s * part + r;
        tiles[s] = w + g[s] * nb * kInt4TileBytes;
        scales[s] = scale + g[s] * nb * kInt4Rows;
        zeros[s] = kZero ? zero + g[s] * nb * kInt4Rows : nullptr;
      }
      float out[S][MR][kInt4Rows];
      V::template gemv_int4_tile<S, MR, kZero>(x, nb, tiles, scales, zeros, out);
#pragma GCC unroll 16
      for (int s = 0; s < S; ++s) {
        const int64_t n0 = g[s] * kInt4Rows;
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i)
          for (int j = 0; j < kInt4Rows; ++j)
            y[i * N + n0 + j] = out[s][i][j] + (bias ? bias[n0 + j] : 0.0f);
      }
    }
    first += S * part;
  }
}

// y (M, N) for decode rows, as gemv, with V::kInt4Streams<MR> row groups read side by side.
template <class V, bool kZero>
void gemv_int4(const float* x, const uint8_t* w, const uint16_t* scale, const uint8_t* zero,
               const float* bias, float* y, int64_t M, int64_t N, int64_t K, ThreadPool& pool) {
  const Int4X xq = prepare_int4_x(x, M, K, int4_blocks(K));
  const int64_t nb = int4_blocks(K), kp = nb * kInt4Block;
  pool.parallel_for(
      N / kInt4Rows,
      [&](int64_t g0, int64_t g1, int) {
        for_each_decode_pass(M, g0, g1, nb * kInt4TileBytes,
                             [&](int64_t m, int64_t c0, int64_t c1, auto mr) {
                               gemv_int4_groups<V, V::template kInt4Streams<mr()>, mr(), kZero>(
                                   Int4X{xq.q + m * kp, xq.s + m * nb, xq.sum + m * nb}, w, scale,
                                   zero, bias, y + m * N, N, K, c0, c1);
                             });
      },
      4);
}

// panel (kc, kNR) f32 of int4 rows [n0, n0 + rows) (rows a multiple of 8; the rest zero) and k in
// [k0, k0 + kc), k0 a multiple of 32: each byte position t of a tile part's lanes is the 8 rows'
// codes at one k, exactly scale * (code - zero) in f32 (code - zero when scale is null).
template <class V>
void pack_panel_int4(const uint8_t* w, const uint16_t* scale, const uint8_t* zero, int64_t K,
                     int64_t n0, int rows, int64_t k0, int64_t kc, float* panel) {
  constexpr int nr = kNR<V>;
  const int64_t nb = int4_blocks(K);
  const __m256i byte = _mm256_set1_epi32(0xff);
  for (int part = 0; part < nr / kInt4Rows; ++part) {
    float* col = panel + part * kInt4Rows;
    if (part * kInt4Rows >= rows) {
      for (int64_t k = 0; k < kc; ++k) _mm256_storeu_ps(col + k * nr, _mm256_setzero_ps());
      continue;
    }
    const int64_t g = n0 / kInt4Rows + part;
    for (int64_t kb = 0; kb < kc; kb += kInt4Block) {
      const int64_t at = g * nb + (k0 + kb) / kInt4Block;
      const __m256 s = scale ? _mm256_cvtph_ps(_mm_loadu_si128(
                                   reinterpret_cast<const __m128i*>(scale + at * kInt4Rows)))
                             : _mm256_set1_ps(1.0f);
      const __m256i z = zero ? _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                                   reinterpret_cast<const __m128i*>(zero + at * kInt4Rows)))
                             : _mm256_set1_epi32(8);
      const int64_t len = std::min(kInt4Block, kc - kb);
      for (int v = 0; v < 4; ++v) {
        __m256i codes[2];
        unpack_part(w + at * kInt4TileBytes + 32 * v, codes[0], codes[1]);
        for (int h = 0; h < 2; ++h)
          for (int t = 0; t < 4; ++t) {
            const int64_t k = 8 * v + 4 * h + t;
            if (k >= len) continue;  // past K in the last block
            const __m256i c = _mm256_and_si256(_mm256_srli_epi32(codes[h], 8 * t), byte);
            _mm256_storeu_ps(col + (kb + k) * nr,
                             _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c, z)), s));
          }
      }
    }
  }
}

template <class V>
void gemm_int4(const float* x, const uint8_t* w, const uint16_t* scale, const uint8_t* zero,
               const float* bias, float* y, int64_t M, int64_t N, int64_t K, ThreadPool& pool) {
  gemm_panels<V>(
      x,
      [&](int64_t n0, int rows, int64_t k0, int64_t kc, float* panel) {
        pack_panel_int4<V>(w, scale, zero, K, n0, rows, k0, kc, panel);
      },
      bias, y, M, N, K, pool);
}

// The int4 linear of a target: the GEMM from kGemmMinRows rows of x that are not decode rows.
template <class V>
void linear_int4_x86(const float* x, const uint8_t* w, const uint16_t* scale, const uint8_t* zero,
                     const float* bias, float* y, int64_t M, int64_t N, int64_t K, LinearRows rows,
                     ThreadPool& pool) {
  if (takes_gemm(M, rows)) return gemm_int4<V>(x, w, scale, zero, bias, y, M, N, K, pool);
  if (zero)
    gemv_int4<V, true>(x, w, scale, zero, bias, y, M, N, K, pool);
  else
    gemv_int4<V, false>(x, w, scale, zero, bias, y, M, N, K, pool);
}

// ---- MXFP4 weights (kernels.h's linear_mxfp4), as the checkpoint stores them. A target's
// format P decodes groups of P::kGroupBlocks blocks of a weight row with its own instructions:
//   T, zero(), reduce(T): its f32 vector, and the sum of a vector's lanes;
//   kRows, kCols: the x rows and weight rows of the GEMM's tiles;
//   kGemvRows: the most x rows of the GEMV, which meets each weight row with x's rows whole (4
//     rows of K = 2880 fill an L1 of 48 KiB); kGemvStreams<R>: the weight rows a GEMV tile of R
//     x rows reads side by side;
//   pack_x(x, K, xp): one row of x in the order of the decoded weights (each block's values
//     come even k first, then odd, from one load of its codes), zeros up to whole groups;
//   tile<S, R>(xp, kp, codes, scales, g0, g1, nb, ahead, acc): groups [g0, g1) of S weight rows
//     (codes and scales of each row at codes[s], scales[s]; nb blocks a row) against R packed x
//     rows (stride kp), added into acc[s][i], prefetching the codes `ahead` bytes on; g0 is a
//     multiple of kMxChunk / kMxGroup<P>.
// A tile gives every (weight row, x row) pair the same operations in the same order whatever S
// and R are, and the GEMM below keeps each pair's vector whole between its calls, so the decode
// GEMV and the GEMM give a row the same bits: no path depends on the other rows.

template <class P>
constexpr int64_t kMxGroup = P::kGroupBlocks* kMxfp4Block;  // k values of a group

template <class P>
inline int64_t mx_groups(int64_t K) {
  return (K + kMxGroup<P> - 1) / kMxGroup<P>;
}

// Weight rows [n0, n1) against all M <= P::kGemvRows x rows at once: every weight byte is read
// once, S rows side by side as gemv_rows reads them (S parts of at most kStreamSpan bytes), the
// rows left over one at a time.
template <class P, int S, int R>
void mxfp4_rows(const float* xp, int64_t kp, const uint8_t* codes, const uint8_t* scales,
                const float* bias, float* y, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  const int64_t nb = K / kMxfp4Block, row_bytes = K / 2;
  const int64_t max_part = std::max<int64_t>(1, kStreamSpan / std::max<int64_t>(1, row_bytes));
  for (int64_t first = n0; first < n1;) {
    const int64_t part = std::min(max_part, (n1 - first) / S);
    if (part == 0) {
      if constexpr (S > 1) mxfp4_rows<P, 1, R>(xp, kp, codes, scales, bias, y, N, K, first, n1);
      return;
    }
    for (int64_t r = 0; r < part; ++r) {
      const uint8_t* c[S];
      const uint8_t* sc[S];
      int64_t n[S];
      typename P::T acc[S][R];
#pragma GCC unroll 16
      for (int s = 0; s < S; ++s) {
        n[s] = first + s * part + r;
        c[s] = codes + n[s] * row_bytes;
        sc[s] = scales + n[s] * nb;
#pragma GCC unroll 16
        for (int i = 0; i < R; ++i) acc[s][i] = P::zero();
      }
      P::template tile<S, R>(xp, kp, c, sc, 0, mx_groups<P>(K), nb, kPrefetch, acc);
#pragma GCC unroll 16
      for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
        for (int i = 0; i < R; ++i)
          y[i * N + n[s]] = P::reduce(acc[s][i]) + (bias ? bias[n[s]] : 0.0f);
    }
    first += S * part;
  }
}

// The GEMM works on blocks of kMxRows x rows (their packed rows stay in L2) by kMxCols weight
// rows, whose accumulator vectors live in scratch between chunks of kMxChunk k values: a tile's x
// rows of one chunk (16 KiB for 4 rows) stay in L1 while they meet each weight row of the block,
// whose chunk (8 KiB) is decoded once per tile of x rows, and so do the tile's accumulators, kept
// together (4 KiB with AVX-512). On a Sapphire Rapids core, with the data of one chunk in L1 the
// AVX-512 tiles ran at 104 GFLOP/s and the whole GEMM at 88 with chunks of 1024 (80 with 512,
// 87 with 2048; M = 32, N = 576, K = 2880).
constexpr int64_t kMxRows = 64, kMxCols = 16, kMxChunk = 1024;

// Groups [g0, g1) of weight rows [n, n + S) against R packed x rows, each pair's vector kept in
// acc between calls (x row i, weight row n + s at acc[s * R + i]; zeros when g0 is 0). A chunk
// of a row is too short for the hardware prefetchers, and the block's rows follow each other in
// memory: the tile prefetches the same chunk two rows on (K bytes), which the later tiles of x
// rows then find in the cache.
template <class P, int S, int R>
void mxfp4_tile_at(const float* xp, int64_t kp, const uint8_t* codes, const uint8_t* scales,
                   int64_t K, int64_t n, int64_t g0, int64_t g1, typename P::T* acc) {
  const int64_t nb = K / kMxfp4Block;
  const uint8_t* c[S];
  const uint8_t* sc[S];
  typename P::T a[S][R];
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s) {
    c[s] = codes + (n + s) * (K / 2);
    sc[s] = scales + (n + s) * nb;
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) a[s][i] = g0 == 0 ? P::zero() : acc[s * R + i];
  }
  P::template tile<S, R>(xp, kp, c, sc, g0, g1, nb, K, a);
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) acc[s * R + i] = a[s][i];
}

// Weight rows [n0, n1) against R packed x rows, P::kCols at a time (then one at a time): the
// accumulators of weight row n at acc + (n - n0) * R.
template <class P, int R>
void mxfp4_chunk(const float* xp, int64_t kp, const uint8_t* codes, const uint8_t* scales,
                 int64_t K, int64_t n0, int64_t n1, int64_t g0, int64_t g1, typename P::T* acc) {
  int64_t n = n0;
  for (; n + P::kCols <= n1; n += P::kCols)
    mxfp4_tile_at<P, P::kCols, R>(xp, kp, codes, scales, K, n, g0, g1, acc + (n - n0) * R);
  for (; n < n1; ++n)
    mxfp4_tile_at<P, 1, R>(xp, kp, codes, scales, K, n, g0, g1, acc + (n - n0) * R);
}

// Weight rows [n0, n1) (at most kMxCols) against `rows` packed x rows, into y (stride N); the
// accumulators of x rows [m, m + P::kRows) start at acc + m * kMxCols.
template <class P>
void mxfp4_block(const float* xp, int64_t kp, const uint8_t* codes, const uint8_t* scales,
                 const float* bias, float* y, int64_t rows, int64_t N, int64_t K, int64_t n0,
                 int64_t n1, typename P::T* acc) {
  const int64_t ng = mx_groups<P>(K), chunk = kMxChunk / kMxGroup<P>;
  // At least one pass, which zeros the accumulators when K is 0.
  for (int64_t g0 = 0; g0 < std::max<int64_t>(ng, 1); g0 += chunk) {
    const int64_t g1 = std::min(ng, g0 + chunk);
    for (int64_t m = 0; m < rows; m += P::kRows)
      with_tile_rows<P::kRows>(int(std::min<int64_t>(P::kRows, rows - m)), [&](auto mr) {
        mxfp4_chunk<P, mr()>(xp + m * kp, kp, codes, scales, K, n0, n1, g0, g1, acc + m * kMxCols);
      });
  }
  for (int64_t m = 0; m < rows; m += P::kRows) {
    const int64_t tile = std::min<int64_t>(P::kRows, rows - m);
    for (int64_t i = 0; i < tile; ++i)
      for (int64_t n = n0; n < n1; ++n)
        y[(m + i) * N + n] =
            P::reduce(acc[m * kMxCols + (n - n0) * tile + i]) + (bias ? bias[n] : 0.0f);
  }
}

template <class P>
void mxfp4_gemm(const float* xp, int64_t kp, const uint8_t* codes, const uint8_t* scales,
                const float* bias, float* y, int64_t M, int64_t N, int64_t K, ThreadPool& pool) {
  pool.parallel_for(
      N,
      [&](int64_t n0, int64_t n1, int) {
        auto* acc = thread_scratch<typename P::T>(Scratch::kPanel, size_t(kMxRows * kMxCols));
        for (int64_t m = 0; m < M; m += kMxRows)
          for (int64_t c = n0; c < n1; c += kMxCols)
            mxfp4_block<P>(xp + m * kp, kp, codes, scales, bias, y + m * N,
                           std::min(kMxRows, M - m), N, K, c, std::min(n1, c + kMxCols), acc);
      },
      kMxCols);
}

// The MXFP4 linear of a target: x packed once on the calling thread, then the GEMV for up to
// P::kGemvRows rows, the GEMM for more. Both give the same bits, so `rows` needs no say.
template <class P>
void linear_mxfp4_x86(const float* x, const uint8_t* codes, const uint8_t* scales,
                      const float* bias, float* y, int64_t M, int64_t N, int64_t K,
                      ThreadPool& pool) {
  if (M == 0) return;
  const int64_t kp = mx_groups<P>(K) * kMxGroup<P>;
  float* xp = thread_scratch<float>(Scratch::kPackedX, size_t(M * kp));
  for (int64_t m = 0; m < M; ++m) P::pack_x(x + m * K, K, xp + m * kp);
  if (M > P::kGemvRows) return mxfp4_gemm<P>(xp, kp, codes, scales, bias, y, M, N, K, pool);
  pool.parallel_for(
      N,
      [&](int64_t n0, int64_t n1, int) {
        with_tile_rows<P::kGemvRows>(int(M), [&](auto mr) {
          mxfp4_rows<P, P::template kGemvStreams<mr()>, mr()>(xp, kp, codes, scales, bias, y, N, K,
                                                              n0, n1);
        });
      },
      32);
}

// ---- Prefill attention as two GEMMs per block of query rows. The row-set kernel of
// kernels_impl.h (attention_impl) computes each score as a dot product of its own, reduced across
// lanes, and each value row times a few probabilities; for prefill that ran at about a tenth of
// the FMA peak. Here a unit is one KV head of one batch row and up to kAttnRows of its query rows
// (consecutive queries with all of the head's query heads each), and the GEMM's register tiles
// do both products:
//   scores (R, L) = q (R, D) @ k[lo, hi)^T,  row_probabilities per row,  out (R, D) = p @ v[lo, hi)
// with [lo, hi) the union of the rows' slots. A slot that a row does not see has probability
// exactly 0; one that no row of the unit sees (masked, or outside every window) may hold
// anything, NaN included, so its value row is never read: its panel row is zeros. Each output is
// one sum in slot order, as in the row-set kernel, and each row's probabilities sum in lanes fixed
// by the slot (row_probabilities), so a row's bits do not depend on the other rows of its unit:
// paged and static caches agree exactly (Ops.PagedAttention), and so do a prompt's chunks however
// it is cut, sliding windows included. Used from kAttnMinRows query rows per KV head; decode (a few
// rows) keeps the row-set kernel, which streams each key and value row once.
constexpr int64_t kAttnRows = 128, kAttnMinRows = 32;

// panel (kc, kNR) f32 = columns [n0, n0 + cols) of rows [k0, k0 + kc) of a row-major matrix with
// rows of ld values: the K-major panel is the rows' slices as they lie (columns past cols zero),
// and zeros for the rows whose flag in live is 0, which are not read.
template <class V, class W>
void pack_panel_rows(const W* a, const uint8_t* live, int64_t ld, int64_t n0, int cols, int64_t k0,
                     int64_t kc, float* panel) {
  constexpr int nr = kNR<V>;
  for (int64_t k = 0; k < kc; ++k) {
    const W* src = a + (k0 + k) * ld + n0;
    float* dst = panel + k * nr;
    if (!live[k0 + k])
      std::fill(dst, dst + nr, 0.0f);
    else if (cols == nr)
      for (int c = 0; c < nr; c += 8) _mm256_storeu_ps(dst + c, load8(src + c));
    else
      for (int j = 0; j < nr; ++j) dst[j] = j < cols ? value_f32(src[j]) : 0.0f;
  }
}

// The two products of attend_block_gemm in f32 (a target may bring its own, as AVX-512 BF16
// does for bf16 caches): scores (R, L) = xq (R, D) @ k (L, D)^T, and o (R, D) = p (R, L) @ v
// (L, D) reading only the rows of v whose live flag is set.
struct F32AttentionGemms {
  template <class V, class KV>
  static void scores(const float* xq, int64_t R, const KV* k, int64_t L, int64_t D, float* s) {
    const float* no_bias = nullptr;
    gemm_panel_range<V>(
        xq,
        [&](int64_t n0, int rows, int64_t k0, int64_t kc, float* panel) {
          pack_panel<V>(k, nullptr, D, n0, rows, k0, kc, panel);
        },
        no_bias, s, R, L, D, 0, (L + kNR<V> - 1) / kNR<V>);
  }
  template <class V, class KV>
  static void weighted(const float* p, int64_t R, const KV* v, const uint8_t* live, int64_t L,
                       int64_t D, float* o) {
    const float* no_bias = nullptr;
    gemm_panel_range<V>(
        p,
        [&](int64_t n0, int cols, int64_t k0, int64_t kc, float* panel) {
          pack_panel_rows<V>(v, live, D, n0, cols, k0, kc, panel);
        },
        no_bias, o, R, D, L, 0, (D + kNR<V> - 1) / kNR<V>);
  }
};

// R query rows xq (R, D) of one KV head, row r seeing slots [first[r], len[r]) where mask is
// non-zero, with the attention sink sink[r] (-inf: none), into o (R, D) through Gemms' two
// products. Scratch: scores (R, max len), inv (R), live (max len).
template <class V, class Gemms, class KV>
void attend_block_gemm(const float* xq, int64_t R, const int64_t* first, const int64_t* len,
                       const float* sink, const KV* k, const KV* v, const int32_t* mask, int64_t D,
                       float scale, float softcap, float* scores, float* inv, uint8_t* live,
                       float* o) {
  const auto [lo, hi] = slot_union(first, len, R);
  k += lo * D;
  v += lo * D;
  if (mask) mask += lo;
  const int64_t L = hi - lo;
  Gemms::template scores<V>(xq, R, k, L, D, scores);
  for (int64_t r = 0; r < R; ++r) {
    const float sum = row_probabilities(scores + r * L, L, first[r] - lo, len[r] - lo, mask, scale,
                                        softcap, lo, sink[r]);
    inv[r] = sum == 0.0f ? 0.0f : 1.0f / sum;  // no key: zeros
  }
  std::fill(live, live + L, uint8_t{0});
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < L; ++j) live[j] |= scores[r * L + j] != 0.0f;
  // The product with the values sums each output in blocks of kKC slots (and bf16 pairs of slots)
  // counted from the first slot it is given. With a sliding window lo moves with the unit's first
  // query, so the product starts at the multiple of kKC below it, over slots of probability 0
  // whose value rows are not read: a row's bits then do not depend on where its prompt was cut.
  const int64_t shift = lo % kKC;
  if (shift == 0) {
    Gemms::template weighted<V>(scores, R, v, live, L, D, o);
  } else {
    const int64_t Ls = L + shift;
    float* p = thread_scratch<float>(Scratch::kShiftedProbabilities, size_t(R * Ls + Ls));
    uint8_t* live_s = reinterpret_cast<uint8_t*>(p + R * Ls);
    for (int64_t r = 0; r < R; ++r) {
      std::fill(p + r * Ls, p + r * Ls + shift, 0.0f);
      std::memcpy(p + r * Ls + shift, scores + r * L, size_t(L) * sizeof(float));
    }
    std::fill(live_s, live_s + shift, uint8_t{0});
    std::memcpy(live_s + shift, live, size_t(L));
    Gemms::template weighted<V>(p, R, v - shift * D, live_s, Ls, D, o);
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t d = 0; d < D; ++d) o[r * D + d] *= inv[r];
}

// The attention kernel of the x86 targets (kernels.h's contract): the blocked GEMMs above for
// prefill, the row-set kernel of Ops otherwise. Over a paged pool the row-set kernel reads the
// blocks in place; the blocked kernel first copies a unit's slots out of their blocks into this
// thread's scratch, in slot order: its GEMMs pack keys and values into panels anyway, the copy is
// read by up to kAttnRows query rows, and it stays in the cache for them.
template <class V, class Ops, class Gemms = F32AttentionGemms>
void attention_x86(const float* q, const void* k_cache, const void* v_cache, DType cache_type,
                   const int32_t* key_mask, float* out, int64_t B, int64_t T, int64_t Hq,
                   int64_t Hkv, int64_t S, int64_t D, int64_t start, float scale, int64_t window,
                   float softcap, const float* sinks, const int32_t* pos, const KvPages* pages,
                   ThreadPool& pool) {
  const int64_t group = Hq / Hkv;
  // With positions (a paged step's), every call of several tokens takes the blocked path: a
  // prompt chunk's bits then do not depend on the length of the step it is in (the serving
  // engine's prefix hits and packed prefill steps rest on that).
  if (T == 1 || (!pos && T * group < kAttnMinRows))
    return attention_impl<Ops>(q, k_cache, v_cache, cache_type, key_mask, out, B, T, Hq, Hkv, S, D,
                               start, scale, window, softcap, sinks, pos, pages, pool);
  const int64_t reach = pos ? S : start + T;
  const int64_t tb = std::max<int64_t>(1, kAttnRows / group);  // queries per unit
  const int64_t rows = tb * group;
  const std::vector<QueryBlock> blocks = query_blocks(B, T, tb, pos, pages);
  pool.parallel_for(int64_t(blocks.size()) * Hkv, [&](int64_t u0, int64_t u1, int) {
    float* xq = thread_scratch<float>(Scratch::kQueries, size_t(rows * (2 * D + 2)));
    float* o = xq + rows * D;
    float* inv = o + rows * D;
    float* sink = inv + rows;
    float* scores = thread_scratch<float>(Scratch::kScores, size_t(rows * reach));
    int64_t* first = thread_scratch<int64_t>(Scratch::kSlots, size_t(3 * rows + (reach + 7) / 8));
    int64_t* len = first + rows;
    int64_t* dst = len + rows;
    uint8_t* live = reinterpret_cast<uint8_t*>(dst + rows);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t kvh = u % Hkv;
      const QueryBlock& qb = blocks[size_t(u / Hkv)];
      const int64_t b = qb.b, t0 = qb.t0, t1 = qb.t1;
      int64_t R = 0;
      for_each_query(b, t0, t1, kvh, group, T, Hq, D, pos, start, window, sinks, out,
                     [&](int64_t row, int64_t row_first, int64_t row_len, float row_sink) {
                       std::memcpy(xq + R * D, q + row, size_t(D) * sizeof(float));
                       first[R] = row_first;
                       len[R] = row_len;
                       sink[R] = row_sink;
                       dst[R++] = row;
                     });
      if (R == 0) continue;
      const int32_t* mask = key_mask ? key_mask + b * S : nullptr;
      // Plain variables, not a structured binding: the lambda below captures them, which clang
      // accepts only from version 16 (the fuzz build's clang is 14).
      const std::pair<int64_t, int64_t> range = slot_union(first, len, R);
      const int64_t lo = range.first, hi = range.second;
      with_kv_rows(k_cache, v_cache, cache_type, pages, qb.seq, kvh, Hkv, S, D, lo, hi,
                   [&](auto k, auto v) {
                     using KV = typename decltype(k)::Value;
                     if constexpr (std::is_same_v<decltype(k), DenseRows<KV>>) {
                       attend_block_gemm<V, Gemms>(xq, R, first, len, sink, k.base, v.base, mask, D,
                                                   scale, softcap, scores, inv, live, o);
                     } else {
                       // Slots [lo, hi) at their places in a copy of hi rows.
                       KV* kc = thread_scratch<KV>(Scratch::kPagedKV, size_t(2 * hi * D));
                       KV* vc = kc + hi * D;
                       for (int64_t j = lo; j < hi; ++j) {
                         std::memcpy(kc + j * D, k[j], size_t(D) * sizeof(KV));
                         std::memcpy(vc + j * D, v[j], size_t(D) * sizeof(KV));
                       }
                       attend_block_gemm<V, Gemms>(xq, R, first, len, sink, kc, vc, mask, D, scale,
                                                   softcap, scores, inv, live, o);
                     }
                   });
      for (int64_t r = 0; r < R; ++r)
        std::memcpy(out + dst[r], o + r * D, size_t(D) * sizeof(float));
    }
  });
}

}  // namespace
}  // namespace tformers::cpu
