// AVX2 + FMA kernels (compiled with -mavx2 -mfma -mf16c; selected only when the CPU has them).
//
// linear has two paths (kernels_x86.h's takes_gemm picks):
// - decode rows, or M < kGemmMinRows: the GEMV of kernels_x86.h (4 streams per core, bf16 pairs
//   of 16 values, 4 x rows per pass), with this target's int8 tile: x rounded to int16 per block
//   and vpmaddwd.
// - otherwise (prefill): the GEMM of kernels_x86.h with 6 x 16 register tiles.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <type_traits>

#include "backends/cpu/kernels_x86.h"

namespace tformers::cpu {
namespace {

// ---------------------------------------------------------------- linear, decode path (GEMV)

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// x rows for int8 weights, rounded to int16 once per call with one scale per 32-value block:
// q (M, K) with x ~ s[b] * q (|q| <= 32767), s (M, int8_blocks(K)). The rounding error is at most
// 2^-16 of the block's largest |x|, far below the int8 weights' own (2^-8 of theirs), and it lets
// the GEMV multiply with vpmaddwd: 16 weights per instruction, no int-to-float conversion per
// weight. Only full blocks are used; the tail of K stays f32.
struct XQ16 {
  const int16_t* q = nullptr;
  const float* s = nullptr;
  XQ16 row(int64_t m, int64_t K) const {
    return {q ? q + m * K : nullptr, s ? s + m * int8_blocks(K) : nullptr};
  }
};

void quantize_x16(const float* x, int64_t K, int16_t* q, float* s) {
  const int64_t full = K / kInt8Block * kInt8Block;
  for (int64_t k = 0; k < full; k += kInt8Block) {
    __m256 v[4];
    for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(x + k + 8 * j);
    const float amax = abs_max(v);
    s[k / kInt8Block] = amax / 32767.0f;
    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 32767.0f / amax : 0.0f);
    __m256i i32[4];
    for (int j = 0; j < 4; ++j) i32[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inv));  // nearest
    // packs works within 128-bit lanes: (a0 b0 | a1 b1) -> reorder the 64-bit quarters.
    __m256i p01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i32[0], i32[1]), 0xd8);
    __m256i p23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i32[2], i32[3]), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k), p01);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k + 16), p23);
  }
}

// The M rows of x rounded on the calling thread: (M, K) int16 values, then (M, nb) f32 scales.
XQ16 quantize_x(const float* x, int64_t M, int64_t K) {
  const int64_t nb = int8_blocks(K);
  char* p = thread_scratch<char>(Scratch::kPackedX, size_t(M * K * 2 + M * nb * 4 + 64));
  int16_t* q = reinterpret_cast<int16_t*>(p);
  float* s = reinterpret_cast<float*>(p + (M * K * 2 + 63) / 64 * 64);
  for (int64_t m = 0; m < M; ++m) quantize_x16(x + m * K, K, q + m * K, s + m * nb);
  return {q, s};
}

// 32 int8 weights widened to int16, as two vectors of 16.
inline void widen32(const int8_t* w, __m256i& lo, __m256i& hi) {
  const __m128i* p = reinterpret_cast<const __m128i*>(w);
  lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(p));
  hi = _mm256_cvtepi8_epi16(_mm_loadu_si128(p + 1));
}

// The exact integer dot product of one block (widened weights) with x's int16 block, as 8 partial
// int32 sums.
inline __m256i block_dot(__m256i w_lo, __m256i w_hi, const int16_t* xq) {
  const __m256i* xp = reinterpret_cast<const __m256i*>(xq);
  return _mm256_add_epi32(_mm256_madd_epi16(w_lo, _mm256_loadu_si256(xp)),
                          _mm256_madd_epi16(w_hi, _mm256_loadu_si256(xp + 1)));
}

// int8 weights: S rows (each its own stream) with their block scales against MR x rows (f32 x for
// the tail, int16 xq for full blocks). Each block is an exact integer dot product (|sum| < 2^27)
// times scale_w * scale_x. Groups of 8 blocks reduce their 8 partial-sum vectors (hadd) to one
// vector of 8 block sums, converted and scaled at once: converting and scaling every block on its
// own cost enough instructions to hold one thread at 70 % of the read bandwidth, the grouped form
// reaches 86 % (standalone, Qwen3-0.6B linears; bench/RESULTS.md). The streams take turns a group
// (256 bytes) at a time, so only one stream's partial sums are live at once.
template <int S, int MR>
inline void gemv_tile_q8(const float* x, XQ16 xq, const int8_t* const (&w)[S],
                         const float* const (&scale)[S], int64_t K, int64_t nb,
                         float (&out)[S][MR]) {
  constexpr int64_t kGroup = 8 * kInt8Block;
  __m256 acc[S][MR];
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) acc[s][i] = _mm256_setzero_ps();
  const int64_t full = K / kInt8Block * kInt8Block;
  int64_t k = 0;
  for (; k + kGroup <= full; k += kGroup) {
    const int64_t b = k / kInt8Block;
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) {
#pragma GCC unroll 4
      for (int l = 0; l < 4; ++l) prefetch_ahead(w[s] + k + 64 * l);
      __m256i h[MR][4];  // h[i][j]: blocks 2j and 2j+1 of the group, pairwise summed
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        __m256i a_lo, a_hi, b_lo, b_hi;
        widen32(w[s] + k + 2 * j * kInt8Block, a_lo, a_hi);
        widen32(w[s] + k + (2 * j + 1) * kInt8Block, b_lo, b_hi);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
          const int16_t* xi = xq.q + i * K + k + 2 * j * kInt8Block;
          h[i][j] =
              _mm256_hadd_epi32(block_dot(a_lo, a_hi, xi), block_dot(b_lo, b_hi, xi + kInt8Block));
        }
      }
      const __m256 sw = _mm256_loadu_ps(scale[s] + b);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        // (blocks 0-3 | 4-7) per 128-bit lane: low and high halves of each block's 8 partial sums.
        const __m256i lo = _mm256_hadd_epi32(h[i][0], h[i][1]);
        const __m256i hi = _mm256_hadd_epi32(h[i][2], h[i][3]);
        const __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20),
                                              _mm256_permute2x128_si256(lo, hi, 0x31));
        acc[s][i] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums),
                            _mm256_mul_ps(sw, _mm256_loadu_ps(xq.s + i * nb + b)), acc[s][i]);
      }
    }
  }
  for (; k < full; k += kInt8Block) {  // the blocks after the last full group
    const int64_t b = k / kInt8Block;
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) {
      if (!(b & 1)) prefetch_ahead(w[s] + k);
      __m256i w_lo, w_hi;
      widen32(w[s] + k, w_lo, w_hi);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i)
        acc[s][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_dot(w_lo, w_hi, xq.q + i * K + k)),
                                    _mm256_set1_ps(scale[s][b] * xq.s[i * nb + b]), acc[s][i]);
    }
  }
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      float r = hsum(acc[s][i]), t = 0.0f;
      for (int64_t j = full; j < K; ++j) t += x[i * K + j] * float(w[s][j]);
      if (full < K) r += t * scale[s][full / kInt8Block];
      out[s][i] = r;
    }
}

// The vector type of kernels_x86.h. GEMM: 6 x 16 register tiles (12 accumulators of the 16 ymm
// registers), 8 panels of 16 rows per L2 block.
struct Avx2Vec {
  using T = __m256;
  static constexpr int kWidth = 8, kMR = 6;
  // 2 accumulators per (row, x row) in gemv_tile, so that a decode pass of 4 x rows fits.
  static constexpr int kGemvAcc = 2;
  static constexpr int64_t kGroup = 8;
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static T zero() { return _mm256_setzero_ps(); }
  static float hsum(T v) { return cpu::hsum(v); }
  // bf16: (even | odd) as in the GEMV's x (kernels_x86.h); f32: in order.
  static void load_pairs(const uint16_t* p, T& even, T& odd) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xffff0000u))));
  }
  static void load_pairs(const float* p, T& lo, T& hi) {
    lo = _mm256_loadu_ps(p);
    hi = _mm256_loadu_ps(p + 8);
  }
  // int8 weights: x rounded to int16 per block (XQ16) and the vpmaddwd tile.
  using Int8X = XQ16;
  static constexpr int kInt8Streams = kStreams / 2;  // rows and their scales: 4 streams
  static XQ16 prepare_int8_x(const float* x, int64_t M, int64_t K) { return quantize_x(x, M, K); }
  template <int S, int MR>
  static void gemv_tile_q8(const float* x, XQ16 xq, const int8_t* const (&w)[S],
                           const float* const (&scale)[S], int64_t K, float (&out)[S][MR]) {
    cpu::gemv_tile_q8<S, MR>(x, xq, w, scale, K, int8_blocks(K), out);
  }
  // int4: one x row reads 2 row groups' tiles and their scales (4 streams, as the int8 GEMV); two
  // x rows read one group (their 8 partial sums and accumulators and 4 broadcasts of x fill the
  // 16 registers; with two groups GCC spilled).
  template <int MR>
  static constexpr int kInt4Streams = MR == 1 ? 2 : 1;
  template <int S, int MR, bool kZero>
  static void gemv_int4_tile(Int4X x, int64_t nb, const uint8_t* const (&w)[S],
                             const uint16_t* const (&scale)[S], const uint8_t* const (&zero)[S],
                             float (&out)[S][MR][kInt4Rows]) {
    gemv_int4_tile_ymm<S, MR, kZero>(x, nb, w, scale, zero, out);
  }
};
using Avx2Ops = X86Ops<Avx2Vec>;

// ---------------------------------------------------------------- linear, MXFP4 weights

// 2^(s - 128) for every e8m0 scale byte s: the scale of codes looked up as twice their e2m1
// value (Mxfp4Avx2), exact in f32 (subnormals for s < 2).
constexpr auto kHalfE8m0 = [] {
  std::array<float, 256> t{};
  for (uint32_t s = 0; s < 256; ++s)
    t[s] = std::bit_cast<float>(s >= 2 ? (s - 1) << 23 : uint32_t(0x00200000) << s);
  return t;
}();

// The MXFP4 format of kernels_x86.h's linear_mxfp4_x86. A group is 2 blocks: 32 bytes of codes,
// split into low and high nibbles and looked up with vpshufb as twice their e2m1 value (an
// integer in [-12, 12]: exact in int8), then widened to f32 8 at a time (vpmovsxbd, vcvtdq2ps).
// Each block's 4 products with x sum into one vector, which its scale then adds to the row's sum:
// per block, about 15 instructions decode a weight row and each x row takes 5 FMAs. The vpshufb
// and the widening share one shuffle port on Intel cores, which bounds a block of one x row at
// about 7 cycles (2.3 ns on a Sapphire Rapids core: 7 GB/s of weights).
struct Mxfp4Avx2 {
  using T = __m256;
  static constexpr int64_t kGroupBlocks = 2;
  // 4 x rows: their accumulators, a block's 4 weight vectors, its scale, the constants and the
  // partial sums in flight fill the 16 registers.
  static constexpr int kRows = 4, kCols = 1;
  static constexpr int kGemvRows = 4;
  template <int R>
  static constexpr int kGemvStreams = R == 1   ? kStreams
                                      : R == 2 ? 2
                                               : 1;
  static T zero() { return _mm256_setzero_ps(); }
  static float reduce(T v) { return hsum(v); }

  // Vector v of block b: lane l holds x[32 b + 16 (v % 2) + 2 l + v / 2] (even k in vectors 0
  // and 1, odd k in 2 and 3, as the low and high nibbles hold them).
  static void pack_x(const float* x, int64_t K, float* xp) {
    for (int64_t b = 0; b < mx_groups<Mxfp4Avx2>(K) * kGroupBlocks; ++b)
      for (int64_t v = 0; v < 4; ++v)
        for (int64_t l = 0; l < 8; ++l) {
          const int64_t k = 32 * b + 16 * (v % 2) + 2 * l + v / 2;
          xp[32 * b + 8 * v + l] = k < K ? x[k] : 0.0f;
        }
  }

  // Byte i of q (64 bytes): twice the e2m1 value of the low nibble of code byte i of the group
  // (i < 32), then of the high nibbles; `left` blocks from the group on, only they are read.
  static void decode(const uint8_t* c, int64_t left, int8_t* q) {
    const __m256i raw =
        left >= kGroupBlocks
            ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c))
            : _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
    const __m256i twice = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                                           0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    __m256i* out = reinterpret_cast<__m256i*>(q);
    _mm256_store_si256(out, _mm256_shuffle_epi8(twice, _mm256_and_si256(raw, nibble)));
    _mm256_store_si256(
        out + 1, _mm256_shuffle_epi8(twice, _mm256_and_si256(_mm256_srli_epi16(raw, 4), nibble)));
  }

  static __m256 widen8(const int8_t* q) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
  }

  // Block b of a group (its bytes at q + 16 L, L = b % 2) with scale byte s against R x rows.
  template <int R>
  static void block(const int8_t* q, int64_t b, uint8_t s, const float* xp, int64_t kp,
                    T (&acc)[R]) {
    const int64_t L = b % kGroupBlocks;
    const __m256 w[4] = {widen8(q + 16 * L), widen8(q + 16 * L + 8), widen8(q + 32 + 16 * L),
                         widen8(q + 32 + 16 * L + 8)};
    const __m256 sc = _mm256_broadcast_ss(&kHalfE8m0[s]);
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const float* xb = xp + i * kp + 32 * b;
      __m256 p = _mm256_mul_ps(w[0], _mm256_loadu_ps(xb));
#pragma GCC unroll 4
      for (int v = 1; v < 4; ++v) p = _mm256_fmadd_ps(w[v], _mm256_loadu_ps(xb + 8 * v), p);
      acc[i] = _mm256_fmadd_ps(p, sc, acc[i]);
    }
  }

  template <int S, int R>
  static void tile(const float* xp, int64_t kp, const uint8_t* const (&codes)[S],
                   const uint8_t* const (&scales)[S], int64_t g0, int64_t g1, int64_t nb,
                   int64_t ahead, T (&acc)[S][R]) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t left = nb - kGroupBlocks * g, b = kGroupBlocks * g;
#pragma GCC unroll 16
      for (int s = 0; s < S; ++s) {
        const uint8_t* c = codes[s] + 32 * g;
        if (g % 2 == 0) prefetch_at(c, ahead);
        alignas(32) int8_t q[64];
        decode(c, left, q);
        block(q, b, scales[s][b], xp, kp, acc[s]);
        if (left > 1) block(q, b + 1, scales[s][b + 1], xp, kp, acc[s]);
      }
    }
  }
};

// ---------------------------------------------------------------- linear: GEMV or GEMM

template <class W, class B>
void linear_t(const float* x, const W* w, const float* scale, const B* bias, float* y, int64_t M,
              int64_t N, int64_t K, ThreadPool& pool, LinearRows rows) {
  if (takes_gemm(M, rows))
    gemm<Avx2Vec>(x, w, scale, bias, y, M, N, K, pool);
  else
    gemv<Avx2Vec>(x, w, scale, bias, y, M, N, K, pool);
}

void linear_avx2(const float* x, const void* w, DType wt, const void* bias, float* y, int64_t M,
                 int64_t N, int64_t K, ThreadPool& pool, LinearRows rows) {
  if (wt == DType::f16) return linear_f16(x, w, bias, y, M, N, K, pool);
  if (wt == DType::bf16)
    linear_t(x, static_cast<const uint16_t*>(w), nullptr, static_cast<const uint16_t*>(bias), y, M,
             N, K, pool, rows);
  else
    linear_t(x, static_cast<const float*>(w), nullptr, static_cast<const float*>(bias), y, M, N, K,
             pool, rows);
}

void linear_int8_avx2(const float* x, const int8_t* w, const float* scale, const float* bias,
                      float* y, int64_t M, int64_t N, int64_t K, ThreadPool& pool,
                      LinearRows rows) {
  linear_t(x, w, scale, bias, y, M, N, K, pool, rows);
}

void linear_int4_avx2(const float* x, const uint8_t* w, const uint16_t* scale, const uint8_t* zero,
                      const float* bias, float* y, int64_t M, int64_t N, int64_t K,
                      ThreadPool& pool, LinearRows rows) {
  linear_int4_x86<Avx2Vec>(x, w, scale, zero, bias, y, M, N, K, rows, pool);
}

void linear_mxfp4_avx2(const float* x, const uint8_t* codes, const uint8_t* scales,
                       const float* bias, float* y, int64_t M, int64_t N, int64_t K,
                       ThreadPool& pool, LinearRows) {
  linear_mxfp4_x86<Mxfp4Avx2>(x, codes, scales, bias, y, M, N, K, pool);
}

// 32 consecutive weights as f32.
inline void load32(const void* w, DType wt, __m256 (&v)[4]) {
  for (int j = 0; j < 4; ++j)
    v[j] = wt == DType::bf16 ? load8(static_cast<const uint16_t*>(w) + 8 * j)
                             : load8(static_cast<const float*>(w) + 8 * j);
}

}  // namespace

// The bytes of quantize_int8_scalar (the same scale; cvtps rounds to nearest even as its kRound
// trick does, and |v * inv| <= 127 needs no clamp), 5x faster: the Qwen3-0.6B LM head in bf16
// at 6.2 GB/s on one thread against 1.1 for the scalar kernel (bench_kernels, bench/RESULTS.md).
// A partial last block goes to the scalar block.
void quantize_int8_avx2(const void* w, DType wt, int8_t* q, float* scale, int64_t N, int64_t K,
                        ThreadPool& pool) {
  const int64_t nb = int8_blocks(K), full = K / kInt8Block, es = int64_t(dtype_size(wt));
  pool.parallel_for(N, [&](int64_t n0, int64_t n1, int) {
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t b = 0; b < full; ++b) {
        const int64_t k0 = b * kInt8Block;
        __m256 v[4];
        load32(static_cast<const char*>(w) + (n * K + k0) * es, wt, v);
        const float amax = abs_max(v);
        scale[n * nb + b] = amax / 127.0f;
        const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i i32[4];
        for (int j = 0; j < 4; ++j) i32[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inv));
        // packs interleave the 128-bit lanes: dwords (0 4 1 5 2 6 3 7) put them back in order.
        const __m256i i8 = _mm256_packs_epi16(_mm256_packs_epi32(i32[0], i32[1]),
                                              _mm256_packs_epi32(i32[2], i32[3]));
        _mm256_storeu_si256(
            reinterpret_cast<__m256i*>(q + n * K + k0),
            _mm256_permutevar8x32_epi32(i8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
      }
      if (full < nb)
        quantize_block_scalar(static_cast<const char*>(w) + (n * K + full * kInt8Block) * es, wt,
                              K - full * kInt8Block, q + n * K + full * kInt8Block,
                              scale + n * nb + full);
    }
  });
}

// The bytes of quantize_int4_scalar for full blocks (the same signed extreme, the first of equal
// magnitudes; IEEE division and round to nearest even as its kRound trick), the partial last block
// through its scalar block.
void quantize_int4_avx2(const void* w, DType wt, uint8_t* tiles, uint16_t* scale, int64_t N,
                        int64_t K, ThreadPool& pool) {
  const int64_t nb = int4_blocks(K), full = K / kInt4Block, es = int64_t(dtype_size(wt));
  pool.parallel_for(N, [&](int64_t n0, int64_t n1, int) {
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t j = n % kInt4Rows;
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t k0 = b * kInt4Block, at = (n / kInt4Rows) * nb + b;
        const char* src = static_cast<const char*>(w) + (n * K + k0) * es;
        uint16_t* sc = scale + at * kInt4Rows + j;
        uint8_t* tile = tiles + at * kInt4TileBytes;
        if (b == full) {  // the partial last block
          float v[kInt4Block];
          uint8_t codes[kInt4Block];
          convert(src, wt, v, DType::f32, size_t(K - k0));
          quantize_int4_block(v, K - k0, codes, sc);
          put_int4_row(codes, j, tile);
          continue;
        }
        __m256 v[4];
        load32(src, wt, v);
        const float amax = abs_max(v);
        // The first value of that magnitude, with its sign.
        const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        const __m256 target = _mm256_set1_ps(amax);
        float m = 0.0f;
        for (int q = 0; q < 4; ++q) {
          const int hits =
              _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v[q], abs_mask), target, _CMP_EQ_OQ));
          if (hits) {
            alignas(32) float lane[8];
            _mm256_store_ps(lane, v[q]);
            m = lane[__builtin_ctz(unsigned(hits))];
            break;
          }
        }
        *sc = f32_to_f16(m / -8.0f);
        const float d = f16_to_f32(*sc);
        __m256i c[4];
        for (int q = 0; q < 4; ++q) {
          __m256 r = d == 0.0f ? _mm256_setzero_ps()
                               : _mm256_round_ps(_mm256_div_ps(v[q], _mm256_set1_ps(d)),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
          r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-8.0f)), _mm256_set1_ps(7.0f));
          c[q] = _mm256_cvtps_epi32(_mm256_add_ps(r, _mm256_set1_ps(8.0f)));
        }
        // 32 code bytes in order (packs interleave lanes: dwords 0 4 1 5 2 6 3 7 undo it), then
        // dword pairs (2 v, 2 v + 1), each 4 codes, merged into the 4 bytes of part v, row j.
        const __m256i bytes = _mm256_permutevar8x32_epi32(
            _mm256_packus_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3])),
            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        const __m256i split =
            _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
        int32_t parts[4];
        _mm_storeu_si128(reinterpret_cast<__m128i*>(parts),
                         _mm_or_si128(_mm256_castsi256_si128(split),
                                      _mm_slli_epi32(_mm256_extracti128_si256(split, 1), 4)));
        for (int p = 0; p < 4; ++p) std::memcpy(tile + 32 * p + 4 * j, &parts[p], 4);
      }
    }
  });
}

const KernelTable& avx2_kernels() {
  static const KernelTable t = make_table<Avx2Ops>(
      &linear_avx2, &linear_int8_avx2, &quantize_int8_avx2, &linear_int4_avx2, &quantize_int4_avx2,
      &linear_mxfp4_avx2, &attention_x86<Avx2Vec, Avx2Ops>);
  return t;
}

}  // namespace tformers::cpu
