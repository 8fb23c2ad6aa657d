// AVX-512 (F/BW/VL/DQ) kernels: the vector type of kernels_x86.h at 512 bits, and what is only
// this target's. Selected only when the CPU reports AVX-512; this file is also compiled a second
// time as the AVX-512 BF16 target (kernels_target_avx512bf16.cc includes it with TF_AVX512_BF16
// set), where the prefill path with bf16 weights uses vdpbf16ps instead of converting weights to
// f32, and a third time as the AMX target (kernels_target_amx.cc: TF_AVX512_BF16 and TF_AMX),
// whose linears with bf16 weights run on AMX tiles (amx::linear below).
//
// linear (kernels_x86.h's takes_gemm picks):
// - decode rows, or M < kGemmMinRows: the GEMV of kernels_x86.h (4 streams per core, bf16 pairs
//   of 32 values, 4 x rows per pass); int8 weights widen to f32 exactly here and x stays f32, so
//   products and sums round in f32 as the reference's do, in another order.
// - otherwise (prefill): the GEMM of kernels_x86.h with 8 x 32 register tiles. With BF16
//   and bf16 weights: the panel keeps bf16 pairs along k and x is rounded to bf16 once per call;
//   vdpbf16ps multiplies pairs and accumulates in f32 (x rounding adds at most 2^-8 relative
//   error per product, see the op-consistency test's tolerance). vdpbf16ps ignores MXCSR: it
//   reads denormal bf16 inputs as zero and flushes denormal results, where the reference keeps
//   them (values below 2^-126, which activations and weights do not reach in practice).
// GCC 12's AVX-512 headers build "undefined" vectors by self-initialization (__m512i __Y = __Y),
// which -Wall reports at every inlined call although the value is never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "backends/cpu/kernels_x86.h"

namespace tformers::cpu {
namespace {

// ---------------------------------------------------------------- linear, decode path (GEMV)

// int8 weights: 32 values in order (x is not repacked for them), widened exactly.
inline void load32(const int8_t* p, __m512& lo, __m512& hi) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(b)));
  hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(b, 1)));
}

// int8 weights: S rows (each its own stream) with their block scales against MR x rows (f32);
// each 32-value block is summed unscaled, then added times its scale.
template <int S, int MR>
inline void gemv_tile_q8(const float* x, const int8_t* const (&w)[S],
                         const float* const (&scale)[S], int64_t K, float (&out)[S][MR]) {
  __m512 acc[S][MR];
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) acc[s][i] = _mm512_setzero_ps();
  const int64_t full = K / kInt8Block * kInt8Block;
  for (int64_t k = 0; k < full; k += kInt8Block) {
    const int64_t b = k / kInt8Block;
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) {
      if (!(b & 1)) prefetch_ahead(w[s] + k);  // one line per two blocks
      __m512 w0, w1;
      load32(w[s] + k, w0, w1);
      const __m512 sc = _mm512_set1_ps(scale[s][b]);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const float* xi = x + i * K + k;
        __m512 p = _mm512_mul_ps(w0, _mm512_loadu_ps(xi));
        p = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xi + 16), p);
        acc[s][i] = _mm512_fmadd_ps(p, sc, acc[s][i]);
      }
    }
  }
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      float r = _mm512_reduce_add_ps(acc[s][i]), t = 0.0f;
      for (int64_t k = full; k < K; ++k)
        t = std::fma(x[i * K + k], float(w[s][k]), t);  // as gemv_tile
      if (full < K) r += t * scale[s][full / kInt8Block];
      out[s][i] = r;
    }
}

// int4 weights, two row groups at once: lanes 0-7 of a 512-bit vector are group a's rows, lanes
// 8-15 group b's, so every instruction of the AVX2 tile (kernels_x86.h's gemv_int4_tile) does
// two tiles' work, for one insert per tile part. Same integer sums, scales and order as there.
inline __m512i load_halves(const void* a, const void* b) {
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(a))),
      _mm256_loadu_si256(static_cast<const __m256i*>(b)), 1);
}

template <int MR, bool kZero>
inline void gemv_int4_pair(Int4X x, int64_t nb, const uint8_t* const (&w)[2],
                           const uint16_t* const (&scale)[2], const uint8_t* const (&zero)[2],
                           float (&out)[2][MR][kInt4Rows]) {
  const __m512i mask = _mm512_set1_epi8(0x0f);
#if !defined(TF_AVX512_BF16)
  const __m512i ones = _mm512_set1_epi16(1);
#endif
  const int64_t kp = nb * kInt4Block;
  __m512 acc[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t *ta = w[0] + b * kInt4TileBytes, *tb = w[1] + b * kInt4TileBytes;
    __m512i p[MR];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      if (v < 2) {
        prefetch_ahead(ta + 64 * v);
        prefetch_ahead(tb + 64 * v);
      }
      const __m512i raw = load_halves(ta + 32 * v, tb + 32 * v);
      const __m512i lo = _mm512_and_si512(raw, mask);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const int8_t* xb = x.q + i * kp + b * kInt4Block + 8 * v;
        int32_t xl, xh;
        std::memcpy(&xl, xb, 4);
        std::memcpy(&xh, xb + 4, 4);
#if defined(TF_AVX512_BF16)
        // VNNI (every AVX-512 BF16 CPU has it): vpdpbusd multiplies the same unsigned codes by
        // signed x and adds each lane's 4 products straight into 32 bits, for 2 instructions
        // where vpmaddubsw, the 16-bit adds and the final vpmaddwd took 3 to 4.
        if (v == 0) p[i] = _mm512_setzero_si512();
        p[i] = _mm512_dpbusd_epi32(p[i], lo, _mm512_set1_epi32(xl));
        p[i] = _mm512_dpbusd_epi32(p[i], hi, _mm512_set1_epi32(xh));
#else
        const __m512i d = _mm512_add_epi16(_mm512_maddubs_epi16(lo, _mm512_set1_epi32(xl)),
                                           _mm512_maddubs_epi16(hi, _mm512_set1_epi32(xh)));
        p[i] = v == 0 ? d : _mm512_add_epi16(p[i], d);
#endif
      }
    }
    const __m512 ws = _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(scale[0] + b * kInt4Rows))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(scale[1] + b * kInt4Rows)), 1));
    __m512i z{};
    if constexpr (kZero)
      z = _mm512_cvtepu8_epi32(
          _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(zero[0] + b * 8)),
                             _mm_loadl_epi64(reinterpret_cast<const __m128i*>(zero[1] + b * 8))));
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512i xsum = _mm512_set1_epi32(x.sum[i * nb + b]);
      const __m512i zx = kZero ? _mm512_mullo_epi32(z, xsum) : _mm512_slli_epi32(xsum, 3);
#if defined(TF_AVX512_BF16)
      const __m512i dot = _mm512_sub_epi32(p[i], zx);
#else
      const __m512i dot = _mm512_sub_epi32(_mm512_madd_epi16(p[i], ones), zx);
#endif
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                               _mm512_mul_ps(ws, _mm512_set1_ps(x.s[i * nb + b])), acc[i]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    float all[2 * kInt4Rows];
    _mm512_storeu_ps(all, acc[i]);
    std::memcpy(out[0][i], all, sizeof out[0][i]);
    std::memcpy(out[1][i], all + kInt4Rows, sizeof out[1][i]);
  }
}

#if defined(TF_AVX512_BF16)
// ---- int8 weights with VNNI (every AVX-512 BF16 CPU has it), as llama.cpp's Q8_0 x Q8_0: x is
// rounded to int8 per block of 32 as for int4 (quantize_x8_block) and each block's exact integer
// sum is scaled by both block scales. vpdpbusd wants one unsigned operand, so x is kept as
// u = x + 128 and w . x = w . u - 128 sum(w), sum(w) coming from a vpdpbusd of w by ones that
// serves every x row. 64 weights (two blocks) a step: 16 lanes, lanes 0-7 the first block's sums
// and 8-15 the second's, each scaled lane by lane, so no horizontal sums until the row's end.
// Against the f32 tile below (each weight widened to f32 and multiplied per x row) this is
// about half the vector instructions per weight.
struct Q8X {
  const uint8_t* u;  // (M, kp): x + 128 per value, 128 (x = 0) past K
  const float* s;    // (M, kp / 32): x's block scales, 0 past K
  const float* s16;  // (M, kp / 64, 16): per step, lanes 0-7 block 2c's scale, 8-15 2c+1's
  int64_t kp;        // values per row: K rounded up to whole steps of 64
  Q8X row(int64_t m, int64_t) const { return {u + m * kp, s + m * kp / 32, s16 + m * kp / 4, kp}; }
};

// Two block scales as the 16 lanes of a step (8 of each).
inline __m512 step_scales(float s0, float s1) {
  return _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(s0), _mm512_set1_ps(s1));
}

// x rows for Q8X on the calling thread: prepare_int4_x's int8 blocks (in its kPackedX scratch)
// for whole steps, made unsigned in place, and the step scales in kPackedXScales.
inline Q8X prepare_q8_x(const float* x, int64_t M, int64_t K) {
  const int64_t steps = (int8_blocks(K) + 1) / 2, kp = 64 * steps;
  const Int4X q = prepare_int4_x(x, M, K, 2 * steps);
  uint8_t* u = reinterpret_cast<uint8_t*>(const_cast<int8_t*>(q.q));
  for (int64_t i = 0; i < M * kp; ++i) u[i] ^= 0x80;
  float* s16 = thread_scratch<float>(Scratch::kPackedXScales, size_t(M * steps * 16));
  for (int64_t c = 0; c < M * steps; ++c)
    _mm512_storeu_ps(s16 + c * 16, step_scales(q.s[2 * c], q.s[2 * c + 1]));
  return {u, q.s, s16, kp};
}

template <int S, int MR>
inline void gemv_tile_q8_vnni(Q8X x, const int8_t* const (&w)[S], const float* const (&scale)[S],
                              int64_t K, float (&out)[S][MR]) {
  const __m512i ones = _mm512_set1_epi8(1);
  const int64_t nb = int8_blocks(K), steps = x.kp / 64;
  __m512 acc[S][MR];
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) acc[s][i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < steps; ++c) {
    // The last step may pass K: its weights past K load as zeros (nothing past the row is read),
    // and a block past K has weight scale 0 (x's is 0 there too).
    const int64_t left = K - 64 * c;
    const __mmask64 live = left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) {
      prefetch_ahead(w[s] + 64 * c);
      const __m512i wv = _mm512_maskz_loadu_epi8(live, w[s] + 64 * c);
      const __m512i wsum =
          _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, wv), 7);
      const __m512 ws = step_scales(scale[s][2 * c], 2 * c + 1 < nb ? scale[s][2 * c + 1] : 0.0f);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const __m512i d =
            _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                                 _mm512_loadu_si512(x.u + i * x.kp + 64 * c), wv),
                             wsum);
        acc[s][i] = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(d), _mm512_mul_ps(ws, _mm512_loadu_ps(x.s16 + (i * steps + c) * 16)),
            acc[s][i]);
      }
    }
  }
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) out[s][i] = _mm512_reduce_add_ps(acc[s][i]);
}
// n f32 values rounded to bf16 (stored at out, 2 bytes each) with the bits of f32_to_bf16 (nearest
// even, NaN kept quiet), 8 at a time with AVX2 integer operations. One row of a 512 x 1024 prefill
// input took 1.3 us this way; the scalar conversion on the calling thread alone had cost 0.4-0.9 ms
// per linear call, a quarter of a 512 x 1024 x 1024 GEMM's time on two threads.
void round_to_bf16(const float* x, int64_t n, char* out) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i half = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i up = _mm256_add_epi32(
        u, _mm256_add_epi32(half, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
    const __m256i r = _mm256_srli_epi32(
        _mm256_blendv_epi8(up, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan), 16);
    // 8 x 32 -> 8 x 16 bits: packus works within 128-bit lanes, so take lanes 0 and 2.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; ++i) {
    const uint16_t h = f32_to_bf16(x[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

// ---- bf16 weights with vdpbf16ps in the decode GEMV: x rounded to bf16 once per call (as the
// GEMM rounds it), each 32-bit lane of a step multiplying one pair of x by the same pair of a
// weight row, as they lie in memory, and adding both products into f32. Against widening the
// weights to f32 (gemv_tile) that is a quarter of the multiply instructions per weight and no
// shifts, which is what a batch of decode rows is bound by (each weight byte feeds every row).

// x rows rounded to bf16 for gemv_tile_dpbf16, a row every K floats of out (its first half used),
// so that the GEMV's row offsets stay those of f32 x.
inline void round_x_rows(const float* x, int64_t M, int64_t K, float* out) {
  for (int64_t m = 0; m < M; ++m) round_to_bf16(x + m * K, K, reinterpret_cast<char*>(out + m * K));
}

// S weight rows (bf16, each its own stream) against MR x rows rounded by round_x_rows (stride K
// floats): out[s][i] = w[s] . x_i. Steps of 64 values into two accumulators per (row, x row),
// then the rest in steps of 32 whose loads stop at K; each sum depends only on K.
template <int S, int MR>
inline void gemv_tile_dpbf16(const float* x, const uint16_t* const (&w)[S], int64_t K,
                             float (&out)[S][MR]) {
  __m512 acc[S][MR][2];
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) acc[s][i][0] = acc[s][i][1] = _mm512_setzero_ps();
  auto xrow = [&](int i) { return reinterpret_cast<const char*>(x + i * K); };
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) {
      prefetch_ahead(w[s] + k);
      prefetch_ahead(w[s] + k + 32);
      const __m512i w0 = _mm512_loadu_si512(w[s] + k), w1 = _mm512_loadu_si512(w[s] + k + 32);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const char* xi = xrow(i) + 2 * k;
        acc[s][i][0] =
            _mm512_dpbf16_ps(acc[s][i][0], (__m512bh)_mm512_loadu_si512(xi), (__m512bh)w0);
        acc[s][i][1] =
            _mm512_dpbf16_ps(acc[s][i][1], (__m512bh)_mm512_loadu_si512(xi + 64), (__m512bh)w1);
      }
    }
  }
  for (; k < K; k += 32) {  // values past K load as zeros and add nothing
    const int64_t left = K - k;
    const __mmask64 live = left >= 32 ? ~__mmask64{0} : (__mmask64{1} << (2 * left)) - 1;
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) {
      const __m512i wv = _mm512_maskz_loadu_epi8(live, w[s] + k);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i)
        acc[s][i][0] = _mm512_dpbf16_ps(
            acc[s][i][0], (__m512bh)_mm512_maskz_loadu_epi8(live, xrow(i) + 2 * k), (__m512bh)wv);
    }
  }
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
      out[s][i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[s][i][0], acc[s][i][1]));
}
#else
// int8 weights take x as f32: nothing to prepare.
struct F32X {
  F32X row(int64_t, int64_t) const { return {}; }
};
#endif

// The vector type of kernels_x86.h. GEMM: 8 x 32 register tiles (16 accumulators of the 32 zmm
// registers), 4 panels of 32 rows per L2 block.
struct Avx512Vec {
  using T = __m512;
  static constexpr int kWidth = 16, kMR = 8;
  static constexpr int64_t kGroup = 4;
  // 4 accumulators per (row, x row) in gemv_tile: 16 for a decode pass of 4 x rows.
  static constexpr int kGemvAcc = 4;
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static T zero() { return _mm512_setzero_ps(); }
  static float hsum(T v) { return _mm512_reduce_add_ps(v); }
  // bf16: (even | odd) as in the GEMV's x (kernels_x86.h); f32: in order.
  static void load_pairs(const uint16_t* p, T& even, T& odd) {
    const __m512i v = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
  }
  static void load_pairs(const float* p, T& lo, T& hi) {
    lo = _mm512_loadu_ps(p);
    hi = _mm512_loadu_ps(p + 16);
  }
#if defined(TF_AVX512_BF16)
  // 4 rows at once on one thread (8 streams with their scales): on a Zen 5 core 1.03x faster
  // than 2 rows (bench_ab linear-int8, 3 runs of 30 rounds: 2 rows at 0.968, 0.967, 0.969); with
  // several threads gemv reads 2 per thread (kSharedRowStreams in kernels_x86.h).
  static constexpr int kInt8Streams = kStreams;
  using Int8X = Q8X;
  static Q8X prepare_int8_x(const float* x, int64_t M, int64_t K) { return prepare_q8_x(x, M, K); }
  // bf16 weights: the GEMV rounds x to bf16 and multiplies pairs with vdpbf16ps (kernels_x86.h's
  // Bf16Dot).
  static constexpr bool kBf16Dot = true;
  static void prepare_bf16_x(const float* x, int64_t M, int64_t K, float* out) {
    round_x_rows(x, M, K, out);
  }
  template <int S, int MR>
  static void gemv_tile_bf16(const float* x, const uint16_t* const (&w)[S], int64_t K,
                             float (&out)[S][MR]) {
    gemv_tile_dpbf16<S, MR>(x, w, K, out);
  }
  template <int S, int MR>
  static void gemv_tile_q8(const float*, Q8X xq, const int8_t* const (&w)[S],
                           const float* const (&scale)[S], int64_t K, float (&out)[S][MR]) {
    gemv_tile_q8_vnni<S, MR>(xq, w, scale, K, out);
  }
#else
  static constexpr int kInt8Streams = kStreams / 2;
  using Int8X = F32X;
  static F32X prepare_int8_x(const float*, int64_t, int64_t) { return {}; }
  template <int S, int MR>
  static void gemv_tile_q8(const float* x, F32X, const int8_t* const (&w)[S],
                           const float* const (&scale)[S], int64_t K, float (&out)[S][MR]) {
    cpu::gemv_tile_q8<S, MR>(x, w, scale, K, out);
  }
#endif
  // int4: two row groups at a time (gemv_int4_pair) for one or two x rows; a group left over
  // alone goes through the 256-bit tile. With the VNNI tile on a Zen 5 core, 4 groups for one x
  // row were within 1 % of 2 (bench_ab linear-int4, 1 and 2 threads), 6 and 8 slower.
  template <int MR>
  static constexpr int kInt4Streams = 2;
  template <int S, int MR, bool kZero>
  static void gemv_int4_tile(Int4X x, int64_t nb, const uint8_t* const (&w)[S],
                             const uint16_t* const (&scale)[S], const uint8_t* const (&zero)[S],
                             float (&out)[S][MR][kInt4Rows]) {
    if constexpr (S == 2)
      gemv_int4_pair<MR, kZero>(x, nb, w, scale, zero, out);
    else
      gemv_int4_tile_ymm<S, MR, kZero>(x, nb, w, scale, zero, out);
  }
};
using Avx512Ops = X86Ops<Avx512Vec>;

// ---------------------------------------------------------------- linear, MXFP4 weights

// The MXFP4 format of kernels_x86.h's linear_mxfp4_x86. A group is 4 blocks: 64 bytes of codes,
// one load whose 128-bit lane L is block L, so lane 4 L + j holds bytes 4 j .. 4 j + 3 of block
// L. Shifted right by 4 v (v < 8), a lane's low 4 bits are the code of k = 8 j + v of its block,
// and vpermps, which reads only those bits, looks it up among the 16 e2m1 values: 7 shifts and 8
// lookups give a group's 128 exact weights, every lane within one block. A group's 8 products
// with x then sum into one vector p whose lanes 4 L .. 4 L + 3 belong to block L, and one FMA by
// the 4 blocks' scales (spread over their lanes by one more vpermps from the 16 scales of 4
// groups, converted at once) adds p to the row's sum: per group about 17 instructions decode a
// weight row and each x row takes 9 FMAs. (One block per vector, as vpmovzxbd of its 16 bytes
// gives, would cost a scale FMA per block.)
struct Mxfp4Avx512 {
  using T = __m512;
  static constexpr int64_t kGroupBlocks = 4;
  // The GEMM's tiles: 2 weight rows by 4 x rows (16 accumulators and 16 partial sums), each x
  // vector loaded feeding two FMAs. On a Sapphire Rapids core (KVM), which issues about one
  // 64-byte load a cycle beside its FMAs (bench_kernels' FMA with a load each), this tile and one
  // of 1 weight row by 8 x rows both ran at half the FMA peak with their data in L1 (104 and 106
  // GFLOP/s), the first bound by decoding, the second by loading x; 4 x rows keep a chunk's x
  // (16 KiB) in L1 where 8 would fill it.
  static constexpr int kRows = 4, kCols = 2;
  static constexpr int kGemvRows = 4;
  template <int R>
  static constexpr int kGemvStreams = R == 1 ? kStreams : 2;
  static T zero() { return _mm512_setzero_ps(); }
  static float reduce(T v) { return _mm512_reduce_add_ps(v); }

  // Vector v of group g: lane 4 L + j holds x[128 g + 32 L + 8 j + v].
  static void pack_x(const float* x, int64_t K, float* xp) {
    for (int64_t g = 0; g < mx_groups<Mxfp4Avx512>(K); ++g)
      for (int64_t v = 0; v < 8; ++v)
        for (int64_t lane = 0; lane < 16; ++lane) {
          const int64_t k = 128 * g + 32 * (lane / 4) + 8 * (lane % 4) + v;
          xp[128 * g + 16 * v + lane] = k < K ? x[k] : 0.0f;
        }
  }

  // The codes of a group with `left` blocks in the row from it on; nothing past them is read,
  // and the lanes of missing blocks are code 0 (weight 0, against x padded with zeros). Always
  // inlined, as scales below: an outlined part returning a vector would pass it in memory.
  __attribute__((always_inline)) static __m512i codes(const uint8_t* p, int64_t left) {
    if (left >= kGroupBlocks) return _mm512_loadu_si512(p);
    return _mm512_maskz_loadu_epi8((__mmask64{1} << (16 * left)) - 1, p);
  }

  // The scales 2^(s - 127) of 16 blocks, `left` of them in the row (the rest 2^-127): s in f32's
  // exponent field, and 2^-127 (a subnormal) for s = 0, which is the smallest value max leaves.
  __attribute__((always_inline)) static __m512 scales(const uint8_t* p, int64_t left) {
    alignas(16) uint8_t bytes[16] = {};
    if (left < 16) {
      std::memcpy(bytes, p, size_t(left));
      p = bytes;
    }
    const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_castsi512_ps(
        _mm512_max_epu32(_mm512_slli_epi32(s, 23), _mm512_set1_epi32(0x00400000)));
  }

  template <int S, int R>
  static void tile(const float* xp, int64_t kp, const uint8_t* const (&codes_at)[S],
                   const uint8_t* const (&scales_at)[S], int64_t g0, int64_t g1, int64_t nb,
                   int64_t ahead, T (&acc)[S][R]) {
    static constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    // Lane 4 L + j: L, the block of the group whose scale it takes.
    static constexpr int32_t kBlockOfLane[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
    const __m512 values = _mm512_loadu_ps(kE2m1);
    const __m512i block_of_lane = _mm512_loadu_si512(kBlockOfLane);
    for (int64_t g = g0; g < g1; g += 4) {
      __m512 set_scales[S];
#pragma GCC unroll 16
      for (int s = 0; s < S; ++s) set_scales[s] = scales(scales_at[s] + 4 * g, nb - 4 * g);
      for (int64_t h = g; h < std::min(g + 4, g1); ++h) {
        const int64_t left = nb - kGroupBlocks * h;
        const __m512i spread = _mm512_add_epi32(block_of_lane, _mm512_set1_epi32(int(4 * (h - g))));
        __m512i raw[S];
#pragma GCC unroll 16
        for (int s = 0; s < S; ++s) {
          const uint8_t* c = codes_at[s] + 64 * h;
          prefetch_at(c, ahead);
          raw[s] = codes(c, left);
        }
        T p[S][R];
#pragma GCC unroll 8
        for (int v = 0; v < 8; ++v) {
          __m512 w[S];
#pragma GCC unroll 16
          for (int s = 0; s < S; ++s)
            w[s] =
                _mm512_permutexvar_ps(v == 0 ? raw[s] : _mm512_srli_epi32(raw[s], 4 * v), values);
#pragma GCC unroll 16
          for (int i = 0; i < R; ++i) {
            __m512 xv = _mm512_loadu_ps(xp + i * kp + 128 * h + 16 * v);
            if constexpr (S > 1) in_register(xv);  // one load for the S rows
#pragma GCC unroll 16
            for (int s = 0; s < S; ++s)
              p[s][i] = v == 0 ? _mm512_mul_ps(w[s], xv) : _mm512_fmadd_ps(w[s], xv, p[s][i]);
          }
        }
#pragma GCC unroll 16
        for (int s = 0; s < S; ++s) {
          const __m512 sc = _mm512_permutexvar_ps(spread, set_scales[s]);
#pragma GCC unroll 16
          for (int i = 0; i < R; ++i) acc[s][i] = _mm512_fmadd_ps(p[s][i], sc, acc[s][i]);
        }
      }
    }
  }
};

// ---------------------------------------------------------------- linear, prefill path (GEMM)

#if defined(TF_AVX512_BF16)
// ---- bf16 x bf16 -> f32 prefill with vdpbf16ps. Pairs along k: a 32-bit lane holds (k, k+1).
// The blocking and the register tile are the f32 GEMM's (kernels_x86.h).
constexpr int kPairNR = kNR<Avx512Vec>;

// panel (ceil(kc/2), kPairNR) u32: lane j of pair row p = (w[n0+j][k0+2p], w[n0+j][k0+2p+1]).
void pack_panel_pairs(const uint16_t* w, int64_t K, int64_t n0, int rows, int64_t k0, int64_t kc,
                      uint32_t* panel) {
  const int64_t pairs = (kc + 1) / 2;
  int64_t p = 0;
  if (rows == kPairNR) {
    // 8 pairs (16 bf16) of 8 rows at a time: a 32-bit transposition.
    for (; 2 * (p + 8) <= kc; p += 8) {
      for (int part = 0; part < kPairNR / 8; ++part) {
        __m256 r[8];
        for (int j = 0; j < 8; ++j)
          r[j] = _mm256_castsi256_ps(_mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(w + (n0 + part * 8 + j) * K + k0 + 2 * p)));
        transpose8(r);
        for (int pp = 0; pp < 8; ++pp)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + (p + pp) * kPairNR + part * 8),
                              _mm256_castps_si256(r[pp]));
      }
    }
  }
  for (; p < pairs; ++p)
    for (int j = 0; j < kPairNR; ++j) {
      uint32_t lo = 0, hi = 0;
      if (j < rows) {
        const uint16_t* wr = w + (n0 + j) * K + k0;
        lo = wr[2 * p];
        hi = 2 * p + 1 < kc ? wr[2 * p + 1] : 0;
      }
      panel[p * kPairNR + j] = lo | (hi << 16);
    }
}

// acc (MR rows x kPairNR columns, zeroed here) = the sums over pair rows [p0, p1) of x's pairs
// (MR rows of stride ldx) times the panel's. Always inlined, so acc stays in registers.
template <int MR>
__attribute__((always_inline)) inline void dot_pairs(const uint32_t* x, int64_t ldx,
                                                     const uint32_t* panel, int64_t p0, int64_t p1,
                                                     __m512 (&acc)[MR][2]) {
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t p = p0; p < p1; ++p) {
    const __m512i b0 = _mm512_loadu_si512(panel + p * kPairNR),
                  b1 = _mm512_loadu_si512(panel + p * kPairNR + 16);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512i a = _mm512_set1_epi32(int(x[i * ldx + p]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], (__m512bh)a, (__m512bh)b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], (__m512bh)a, (__m512bh)b1);
    }
  }
}

template <int MR>
void gemm_tile_bf16(const uint32_t* x, int64_t ldx, const uint32_t* panel, int64_t kc, float* y,
                    int64_t ldy, int cols, bool accumulate) {
  __m512 c[MR][2];
  dot_pairs<MR>(x, ldx, panel, 0, (kc + 1) / 2, c);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
    store_tile_row<Avx512Vec>(y + i * ldy, c[i][0], c[i][1], cols, accumulate);
}

// bf16 weights: the panel is pack_panel_pairs' (kKC / 2 pair rows of kPairNR lanes).
struct Bf16Panels {
  static constexpr int kMR = Avx512Vec::kMR;
  static constexpr int64_t kWords = kKC / 2 * kPairNR;  // u32 per panel
  const uint16_t* w;
  int64_t K;
  void pack(int64_t n0, int rows, int64_t k0, int64_t kc, uint32_t* panel) const {
    pack_panel_pairs(w, K, n0, rows, k0, kc, panel);
  }
  template <int MR>
  static void tile(const uint32_t* x, int64_t ldx, const uint32_t* panel, int64_t kc, float* y,
                   int64_t ldy, int cols, bool accumulate) {
    gemm_tile_bf16<MR>(x, ldx, panel, kc, y, ldy, cols, accumulate);
  }
};

// ---- int8 and int4 weights with vdpbf16ps. Their codes (q, or c - zero in [-16, 15]) are small
// integers, exact in bf16, so the panel holds them unscaled as bf16 pairs and the scales apply
// per 32-value block: each block's products are summed by vdpbf16ps into accumulators of their
// own, which are then multiplied by the block's column scales and added to the tile's sums (one
// FMA per 16 vdpbf16ps). Rounding is then that of bf16 weights: x to bf16 once, products exact,
// sums in f32. 6 x 32 tiles: 12 sums and 12 block sums of the 32 zmm registers.

// The unscaled codes of a K-major f32 panel (kc, kPairNR) as bf16 pairs along k (exact: small
// integers in f32 are bf16 in their high half), zero past kc. 256-bit operations, which every
// AVX-512 target has.
void pairs_from_f32_panel(const float* f, int64_t kc, uint32_t* panel) {
  const __m256i high = _mm256_set1_epi32(int(0xffff0000u));
  for (int64_t p = 0; p < (kc + 1) / 2; ++p)
    for (int j = 0; j < kPairNR; j += 8) {
      const __m256i lo =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(f + 2 * p * kPairNR + j));
      const __m256i hi =
          2 * p + 1 < kc
              ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(f + (2 * p + 1) * kPairNR + j))
              : _mm256_setzero_si256();
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + p * kPairNR + j),
                          _mm256_or_si256(_mm256_srli_epi32(lo, 16), _mm256_and_si256(hi, high)));
    }
}

template <int MR>
void gemm_tile_bf16_scaled(const uint32_t* x, int64_t ldx, const uint32_t* panel,
                           const float* scales, int64_t kc, float* y, int64_t ldy, int cols,
                           bool accumulate) {
  constexpr int64_t kBlockPairs = kInt4Block / 2;  // = kInt8Block / 2
  const int64_t pairs = (kc + 1) / 2;
  __m512 c[MR][2];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) c[i][0] = c[i][1] = _mm512_setzero_ps();
  for (int64_t b = 0; b * kBlockPairs < pairs; ++b) {
    __m512 t[MR][2];
    dot_pairs<MR>(x, ldx, panel, b * kBlockPairs, std::min(pairs, (b + 1) * kBlockPairs), t);
    const __m512 s0 = _mm512_loadu_ps(scales + b * kPairNR),
                 s1 = _mm512_loadu_ps(scales + b * kPairNR + 16);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      c[i][0] = _mm512_fmadd_ps(t[i][0], s0, c[i][0]);
      c[i][1] = _mm512_fmadd_ps(t[i][1], s1, c[i][1]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
    store_tile_row<Avx512Vec>(y + i * ldy, c[i][0], c[i][1], cols, accumulate);
}

// A panel of int8 or int4 weights: the codes' pairs (kKC / 2 rows of kPairNR), then the scales
// (kKC / 32 rows of kPairNR f32), then the K-major f32 codes they were made from.
constexpr int64_t kScaledPairWords = kKC / 2 * kPairNR, kScaleWords = kKC / 32 * kPairNR;
struct ScaledPanels {
  static constexpr int kMR = 6;
  static constexpr int64_t kWords = kScaledPairWords + kScaleWords + kKC * kPairNR;
  template <int MR>
  static void tile(const uint32_t* x, int64_t ldx, const uint32_t* panel, int64_t kc, float* y,
                   int64_t ldy, int cols, bool accumulate) {
    gemm_tile_bf16_scaled<MR>(x, ldx, panel,
                              reinterpret_cast<const float*>(panel + kScaledPairWords), kc, y, ldy,
                              cols, accumulate);
  }
  static float* scales(uint32_t* panel) {
    return reinterpret_cast<float*>(panel + kScaledPairWords);
  }
  static float* codes(uint32_t* panel) { return scales(panel) + kScaleWords; }
};

struct Int8Panels : ScaledPanels {
  const int8_t* w;
  const float* scale;
  int64_t K;
  void pack(int64_t n0, int rows, int64_t k0, int64_t kc, uint32_t* panel) const {
    float* f = codes(panel);
    pack_panel<Avx512Vec>(w, nullptr, K, n0, rows, k0, kc, f);
    pairs_from_f32_panel(f, kc, panel);
    const int64_t nb = int8_blocks(K);
    float* s = scales(panel);
    for (int64_t b = 0; b < int8_blocks(kc); ++b)
      for (int j = 0; j < kPairNR; ++j)
        s[b * kPairNR + j] = j < rows ? scale[(n0 + j) * nb + k0 / kInt8Block + b] : 0.0f;
  }
};

struct Int4Panels : ScaledPanels {
  const uint8_t* w;
  const uint16_t* scale;
  const uint8_t* zero;
  int64_t K;
  void pack(int64_t n0, int rows, int64_t k0, int64_t kc, uint32_t* panel) const {
    float* f = codes(panel);
    pack_panel_int4<Avx512Vec>(w, nullptr, zero, K, n0, rows, k0, kc, f);
    pairs_from_f32_panel(f, kc, panel);
    const int64_t nb = int4_blocks(K);
    float* s = scales(panel);
    for (int64_t b = 0; b < int4_blocks(kc); ++b)
      for (int part = 0; part < kPairNR / kInt4Rows; ++part) {
        const __m256 v =
            part * kInt4Rows < rows
                ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
                      scale + ((n0 / kInt4Rows + part) * nb + k0 / kInt4Block + b) * kInt4Rows)))
                : _mm256_setzero_ps();
        _mm256_storeu_ps(s + b * kPairNR + part * kInt4Rows, v);
      }
  }
};

// Rows [m0, m1) of x (M, K) rounded to bf16 pairs in xb (M, ceil(K/2)) u32, a pair's first value
// in its low half (a bf16 row in order, padded with a zero when K is odd).
void round_rows_to_pairs(const float* x, int64_t m0, int64_t m1, int64_t K, uint32_t* xb) {
  const int64_t kp = (K + 1) / 2;
  for (int64_t m = m0; m < m1; ++m) {
    char* row = reinterpret_cast<char*>(xb + m * kp);  // written through char: no aliasing
    round_to_bf16(x + m * K, K, row);
    if (K % 2) std::memset(row + 2 * K, 0, 2);
  }
}

// Columns [p0 * kPairNR, p1 * kPairNR) of y (M, N) = xb @ w (N, K)^T + bias on the calling
// thread, with xb the bf16 pairs of round_rows_to_pairs and Panels' packing and register tile
// (Bf16Panels, Int8Panels, Int4Panels, ValuePanels).
template <class Panels, class B>
void pairs_panel_range(const uint32_t* xb, const Panels& panels_of, const B* bias, float* y,
                       int64_t M, int64_t N, int64_t K, int64_t p0, int64_t p1) {
  const int64_t kp = (K + 1) / 2;
  uint32_t* panel =
      thread_scratch<uint32_t>(Scratch::kPanel, size_t(Avx512Vec::kGroup * Panels::kWords));
  for (int64_t g0 = p0; g0 < p1; g0 += Avx512Vec::kGroup) {
    const int64_t g1 = std::min(p1, g0 + Avx512Vec::kGroup);
    for (int64_t k0 = 0; k0 < K; k0 += kKC) {
      const int64_t kc = std::min(kKC, K - k0);
      for (int64_t p = g0; p < g1; ++p)
        panels_of.pack(p * kPairNR, int(std::min<int64_t>(kPairNR, N - p * kPairNR)), k0, kc,
                       panel + (p - g0) * Panels::kWords);
      for (int64_t m = 0; m < M; m += Panels::kMR) {
        with_tile_rows<Panels::kMR>(int(std::min<int64_t>(Panels::kMR, M - m)), [&](auto r) {
          for (int64_t p = g0; p < g1; ++p)
            Panels::template tile<r()>(xb + m * kp + k0 / 2, kp, panel + (p - g0) * Panels::kWords,
                                       kc, y + m * N + p * kPairNR, N,
                                       int(std::min<int64_t>(kPairNR, N - p * kPairNR)), k0 > 0);
        });
      }
    }
    finish_columns(bias, y, M, N, K, g0 * kPairNR, std::min(N, g1 * kPairNR));
  }
}

// y (M, N) = x (M, K) @ w (N, K)^T + bias with x rounded to bf16, both steps split over the pool.
template <class Panels, class B>
void gemm_pairs(const float* x, const Panels& panels_of, const B* bias, float* y, int64_t M,
                int64_t N, int64_t K, ThreadPool& pool) {
  uint32_t* xb = thread_scratch<uint32_t>(Scratch::kPackedX, size_t(M * ((K + 1) / 2)));
  pool.parallel_for(
      M, [&](int64_t m0, int64_t m1, int) { round_rows_to_pairs(x, m0, m1, K, xb); }, 16);
  pool.parallel_for((N + kPairNR - 1) / kPairNR,
                    [&](int64_t p0, int64_t p1, int) {
                      pairs_panel_range(xb, panels_of, bias, y, M, N, K, p0, p1);
                    },
                    Avx512Vec::kGroup);
}

// ---- Prefill attention over a bf16 cache with vdpbf16ps: the blocked kernel of kernels_x86.h
// with both GEMMs in bf16 pairs, q and the probabilities rounded to bf16 once (as the linears'
// inputs are), the keys and values as they are stored. Twice the f32 FMA rate, for one rounding
// of each factor (2^-9 relative); an f32 cache keeps the f32 GEMMs.

// Value rows as the B panel of p @ v: lane j of pair row p = (v[k0 + 2p][n0 + j],
// v[k0 + 2p + 1][n0 + j]); rows whose live flag is 0 (and the one past kc) are zeros, never read.
struct ValuePanels : Bf16Panels {
  const uint16_t* v;
  const uint8_t* live;
  int64_t D;
  void pack(int64_t n0, int cols, int64_t k0, int64_t kc, uint32_t* panel) const {
    for (int64_t p = 0; p < (kc + 1) / 2; ++p) {
      const int64_t j = k0 + 2 * p;
      const uint16_t* a = live[j] ? v + j * D + n0 : nullptr;
      const uint16_t* b = 2 * p + 1 < kc && live[j + 1] ? v + (j + 1) * D + n0 : nullptr;
      uint32_t* out = panel + p * kPairNR;
      if (cols == kPairNR) {
        for (int c = 0; c < kPairNR; c += 8) {
          const __m256i lo =
              a ? _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + c)))
                : _mm256_setzero_si256();
          const __m256i hi =
              b ? _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + c)))
                : _mm256_setzero_si256();
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c),
                              _mm256_or_si256(lo, _mm256_slli_epi32(hi, 16)));
        }
      } else {
        for (int c = 0; c < kPairNR; ++c)
          out[c] = c < cols ? uint32_t(a ? a[c] : 0) | uint32_t(b ? b[c] : 0) << 16 : 0;
      }
    }
  }
};

struct Bf16AttentionGemms {
  template <class V, class KV>
  static void scores(const float* xq, int64_t R, const KV* k, int64_t L, int64_t D, float* s) {
    if constexpr (!std::is_same_v<KV, uint16_t>) {
      F32AttentionGemms::scores<V>(xq, R, k, L, D, s);
    } else {
      uint32_t* qb = thread_scratch<uint32_t>(Scratch::kPackedX, size_t(R * ((D + 1) / 2)));
      round_rows_to_pairs(xq, 0, R, D, qb);
      const float* no_bias = nullptr;
      pairs_panel_range(qb, Bf16Panels{.w = k, .K = D}, no_bias, s, R, L, D, 0,
                        (L + kPairNR - 1) / kPairNR);
    }
  }
  template <class V, class KV>
  static void weighted(const float* p, int64_t R, const KV* v, const uint8_t* live, int64_t L,
                       int64_t D, float* o) {
    if constexpr (!std::is_same_v<KV, uint16_t>) {
      F32AttentionGemms::weighted<V>(p, R, v, live, L, D, o);
    } else {
      uint32_t* pb = thread_scratch<uint32_t>(Scratch::kPackedX, size_t(R * ((L + 1) / 2)));
      round_rows_to_pairs(p, 0, R, L, pb);
      const float* no_bias = nullptr;
      pairs_panel_range(pb, ValuePanels{{}, v, live, D}, no_bias, o, R, D, L, 0,
                        (D + kPairNR - 1) / kPairNR);
    }
  }
};
#endif

#if defined(TF_AMX)
// ---------------------------------------------------------------- linear, bf16 weights on AMX
//
// On the AMX target every linear with bf16 weights, decode rows and prompt rows alike, runs on
// the tiles: a tile multiply (TDPBF16PS) takes 16 rows of 32 bf16 weights as they lie in memory
// and 16 pairs of k of 16 x rows, and adds the 16 x 16 dot products into f32, 16 times the
// multiply-adds of a vdpbf16ps per instruction. Each output y[m][n] is one accumulator that
// takes the 32-value steps of k in order and is never split over lanes or passes, so its bits
// depend on K alone: 1 row and 16 rows agree (as the GEMV's rows do on the other targets), and so
// do a prompt's rows and a decode row's. The weights are the tile's first operand (C^T = W x^T),
// so they stream from memory unpacked; x is packed once per call, rounded to bf16 (as the
// AVX-512 BF16 target rounds it).
namespace amx {

// ldtilecfg's 64-byte operand (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Every tile has 16 rows: an accumulator (16 weight rows by `cols` x rows of f32), 16 weight rows
// of 32 bf16, or 16 pairs of k of `cols` x rows. cols is M below 16 x rows (tiles 0, 1 and 3 are
// then rows16_times_x's accumulator and x), so that a decode step of few rows packs and
// multiplies no zero rows, else 16. Loaded at the start of each task and released at its end, so
// that the tile state never outlives a call (a hub kernel on the same thread may use the tiles
// too) and a parked worker has none to save; keeping it per thread ran a one-row decode step
// 0.99x as fast.
inline void configure(int64_t cols) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = uint16_t(t == 0 || t == 1 || t == 3 ? 4 * cols : 64);
  }
  // GCC 12's _tile_loadconfig gives its asm only 8 bytes of the operand as memory it reads, so
  // the stores of the rows and widths could be dropped as dead: this empty asm reads all 64.
  asm volatile("" : : "m"(c));
  _tile_loadconfig(&c);
}

constexpr int64_t kStep = 32;        // bf16 values of k per tile row
constexpr int64_t kXTile = 16 * 16;  // u32 per packed x tile
// x rows per group: a group's packed x (128 rows of 2 K bytes) stays in L2 while each weight
// block of a task meets it, and each weight block is read once per group.
constexpr int64_t kGroupRows = 128;

// Lane i's offset i * stride, for the gathers and scatters below.
inline __m512i lane_offsets(int64_t stride) {
  return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                            _mm512_set1_epi32(int(stride)));
}

// xp: x rounded to bf16 in tiles of (16 pairs of k) x (cols x rows), tile (b, q) for rows
// [16 b, 16 b + cols) and k in [32 q, 32 q + 32) at (b * chunks + q) * 16 * cols, entry
// p * cols + j the pair (x[16 b + j][32 q + 2 p], x[16 b + j][32 q + 2 p + 1]); rows past M and
// k past K are zero. This packs the row blocks [b0, b1).
void pack_x(const float* x, int64_t M, int64_t K, int64_t cols, uint32_t* xp, int64_t b0,
            int64_t b1) {
  const int64_t chunks = (K + kStep - 1) / kStep, tile = 16 * cols;
  std::memset(xp + b0 * chunks * tile, 0, size_t((b1 - b0) * chunks * tile) * sizeof(uint32_t));
  const __m512i column = lane_offsets(cols);
  for (int64_t m = 16 * b0; m < std::min(M, 16 * b1); ++m)
    for (int64_t q = 0; q < chunks; ++q) {
      const int64_t left = K - q * kStep;
      const __mmask16 lo = left >= 16 ? 0xffff : __mmask16((1u << left) - 1);
      const __mmask16 hi = left >= 32   ? 0xffff
                           : left <= 16 ? 0
                                        : __mmask16((1u << (left - 16)) - 1);
      const float* xr = x + m * K + q * kStep;
      // bf16 i of the result is k = i: the second operand fills the low half.
      const __m512bh pairs =
          _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, xr + 16), _mm512_maskz_loadu_ps(lo, xr));
      uint32_t* to = xp + (m / 16 * chunks + q) * tile + m % 16;
      if (cols == 1)
        _mm512_storeu_si512(to, (__m512i)pairs);
      else
        _mm512_i32scatter_epi32(to, column, (__m512i)pairs, 4);
    }
}

// The bias of the weight rows [n, n + 16) that `live` marks, as f32 (zero without a bias).
inline __m512 bias_lanes(const float* bias, int64_t n, __mmask16 live) {
  return bias ? _mm512_maskz_loadu_ps(live, bias + n) : _mm512_setzero_ps();
}
inline __m512 bias_lanes(const uint16_t* bias, int64_t n, __mmask16 live) {
  if (!bias) return _mm512_setzero_ps();
  const __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, bias + n));
  return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
}

// Adds one accumulator tile's sums, stored in c with rows of ldc floats (16 weight rows from n,
// x rows from m), into y, each with its bias: rows of y past M and columns past N are not
// written. A tile row is a weight row, a y row an x row: each y row gathers its 16 sums from
// a column of c (a scalar transposition took about a third of a 512-row prefill linear).
template <class B>
inline void put_tile(const float (&c)[16][16], int64_t ldc, const B* bias, float* y, int64_t M,
                     int64_t N, int64_t n, int64_t m) {
  const int64_t rows = std::min<int64_t>(16, N - n), cols = std::min<int64_t>(16, M - m);
  if (rows <= 0) return;  // the second half of a last block of 16 rows or fewer
  const __mmask16 live = rows == 16 ? __mmask16(0xffff) : __mmask16((1u << rows) - 1);
  const __m512 b = bias_lanes(bias, n, live);
  const __m512i column = lane_offsets(ldc);
  for (int64_t j = 0; j < cols; ++j)
    _mm512_mask_storeu_ps(y + (m + j) * N + n, live,
                          _mm512_add_ps(_mm512_i32gather_ps(column, &c[0][j], 4), b));
}

// Up to 16 x rows (decode): 16 weight rows at a (stride lda elements, k in [0, chunks * 32))
// against the M x rows into tile 0, with two sets of operand tiles (4 and 1 for even steps of k,
// 6 and 3 for odd ones) so that a step's loads need not wait for the multiply before it
// (bench_ab linear-bf16, one row: 0.86-0.94x of the AVX-512 BF16 GEMV, against 0.74x for 32
// rows with one set of operands; 32 rows with two sets measured 0.97x of this).
template <class B>
inline void rows16_times_x(const uint16_t* a, int64_t lda, const uint32_t* xp, int64_t chunks,
                           const B* bias, float* y, int64_t M, int64_t N, int64_t n) {
  _tile_zero(0);
  int64_t q = 0;
  for (; q + 2 <= chunks; q += 2) {
    const uint16_t* aq = a + q * kStep;
    _tile_loadd(4, aq, lda * 2);
    _tile_loadd(1, xp + q * 16 * M, 4 * M);
    _tile_loadd(6, aq + kStep, lda * 2);
    _tile_loadd(3, xp + (q + 1) * 16 * M, 4 * M);
    _tile_dpbf16ps(0, 4, 1);
    _tile_dpbf16ps(0, 6, 3);
  }
  if (q < chunks) {
    _tile_loadd(4, a + q * kStep, lda * 2);
    _tile_loadd(1, xp + q * 16 * M, 4 * M);
    _tile_dpbf16ps(0, 4, 1);
  }
  alignas(64) float c[16][16];
  _tile_stored(0, c, 4 * M);
  put_tile(c, M, bias, y, M, N, n, 0);
}

// More x rows (a prompt, or many decode rows): 32 weight rows at a (tiles 4 and 5) against x row
// blocks b and, with kTwo, b + 1 (tiles 6 and 7), into tile 2 h + t for weight half h and x
// block b + t: four multiplies for four loads, where 16 weight rows against two x blocks would
// load three tiles for two.
template <bool kTwo, class B>
inline void rows32_times_x(const uint16_t* a, int64_t lda, const uint32_t* xp, int64_t chunks,
                           int64_t b, const B* bias, float* y, int64_t M, int64_t N, int64_t n) {
  _tile_zero(0);
  _tile_zero(2);
  if constexpr (kTwo) {
    _tile_zero(1);
    _tile_zero(3);
  }
  const uint32_t* x0 = xp + b * chunks * kXTile;
  const uint32_t* x1 = x0 + chunks * kXTile;
  for (int64_t q = 0; q < chunks; ++q) {
    const uint16_t* aq = a + q * kStep;
    _tile_loadd(4, aq, lda * 2);
    _tile_loadd(5, aq + 16 * lda, lda * 2);
    _tile_loadd(6, x0 + q * kXTile, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if constexpr (kTwo) {
      _tile_loadd(7, x1 + q * kXTile, 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  // The tile numbers of _tile_stored are immediates.
  alignas(64) float c[16][16];
  _tile_stored(0, c, 64);
  put_tile(c, 16, bias, y, M, N, n, 16 * b);
  _tile_stored(2, c, 64);
  put_tile(c, 16, bias, y, M, N, n + 16, 16 * b);
  if constexpr (kTwo) {
    _tile_stored(1, c, 64);
    put_tile(c, 16, bias, y, M, N, n, 16 * b + 16);
    _tile_stored(3, c, 64);
    put_tile(c, 16, bias, y, M, N, n + 16, 16 * b + 16);
  }
}

// How linear cuts its work: x's rows in blocks of 16, packed as tiles `cols` wide (M below 16
// rows), and w's rows in blocks of 16 (decode) or 32.
struct LinearPlan {
  int64_t chunks, width, row_blocks, rows, cols;
  LinearPlan(int64_t M, int64_t K)
      : chunks((K + kStep - 1) / kStep),
        width(chunks * kStep),
        row_blocks((M + 15) / 16),
        rows(M <= 16 ? 16 : 32),
        cols(std::min<int64_t>(M, 16)) {}
  size_t packed_x() const { return size_t(row_blocks * chunks * 16 * cols); }
};

// The weight row blocks [b0, b1) of y (M, N) = x (M, K) @ w (N, K)^T + bias against every x row,
// with x packed (pack_x) in xp, on tiles configured for plan.cols.
template <class B>
void linear_blocks(const LinearPlan& plan, const uint32_t* xp, const uint16_t* w, const B* bias,
                   float* y, int64_t M, int64_t N, int64_t K, int64_t b0, int64_t b1) {
  const int64_t rows = plan.rows, width = plan.width, chunks = plan.chunks;
  for (int64_t g = 0; g < plan.row_blocks; g += kGroupRows / 16) {
    const int64_t g1 = std::min(plan.row_blocks, g + kGroupRows / 16);
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t n = blk * rows;
      // A block the tiles cannot read in place (fewer rows, or rows whose last step would run
      // past them) is copied with zeros around it.
      const uint16_t* a = w + n * K;
      int64_t lda = K;
      if (N - n < rows || K != width) {
        uint16_t* pad = thread_scratch<uint16_t>(Scratch::kPanel, size_t(rows * width));
        std::memset(pad, 0, size_t(rows * width) * sizeof(uint16_t));
        for (int64_t r = 0; r < std::min(rows, N - n); ++r)
          std::memcpy(pad + r * width, w + (n + r) * K, size_t(K) * sizeof(uint16_t));
        a = pad;
        lda = width;
      }
      if (rows == 16) {
        rows16_times_x(a, lda, xp, chunks, bias, y, M, N, n);
        continue;
      }
      for (int64_t b = g; b < g1; b += 2) {
        if (b + 1 < g1)
          rows32_times_x<true>(a, lda, xp, chunks, b, bias, y, M, N, n);
        else
          rows32_times_x<false>(a, lda, xp, chunks, b, bias, y, M, N, n);
      }
    }
  }
}

// y (M, N) = x (M, K) @ w (N, K)^T + bias for every M.
template <class B>
void linear(const float* x, const uint16_t* w, const B* bias, float* y, int64_t M, int64_t N,
            int64_t K, ThreadPool& pool) {
  const LinearPlan plan(M, K);
  // The calling thread's scratch: workers only use it during this call. A prompt's row blocks
  // are packed by the pool.
  uint32_t* xp = thread_scratch<uint32_t>(Scratch::kPackedX, plan.packed_x());
  if (plan.row_blocks == 1)
    pack_x(x, M, K, plan.cols, xp, 0, 1);
  else
    pool.parallel_for(plan.row_blocks,
                      [&](int64_t b0, int64_t b1, int) { pack_x(x, M, K, plan.cols, xp, b0, b1); });
  pool.parallel_for((N + plan.rows - 1) / plan.rows, [&](int64_t b0, int64_t b1, int) {
    configure(plan.cols);
    linear_blocks(plan, xp, w, bias, y, M, N, K, b0, b1);
    _tile_release();
  });
}

// ---- Prefill attention over a bf16 cache on the tiles: attention_x86's blocked kernel with both
// products as tile multiplies, q and the probabilities rounded to bf16 once (as the AVX-512 BF16
// target rounds them). Each score is one accumulator over the 32-value steps of the head in order
// (the linear above, with the keys as weights), and each output one accumulator over 32-slot
// steps counted from attend_block_gemm's kKC-aligned start, so a query row's bits depend on
// neither the other rows of its unit nor where its prompt was cut, as on the other targets.

// s (R, L) = q (R, D) @ k (L, D)^T on the calling thread.
inline void attention_scores(const float* q, int64_t R, const uint16_t* k, int64_t L, int64_t D,
                             float* s) {
  const LinearPlan plan(R, D);
  uint32_t* xp = thread_scratch<uint32_t>(Scratch::kPackedX, plan.packed_x());
  pack_x(q, R, D, plan.cols, xp, 0, plan.row_blocks);
  const float* no_bias = nullptr;
  configure(plan.cols);
  linear_blocks(plan, xp, k, no_bias, s, R, L, D, 0, (L + plan.rows - 1) / plan.rows);
  _tile_release();
}

// o (R, D) = p (R, L) @ v (L, D), reading only the rows of v whose live flag is set, on the calling
// thread. p's rows as bf16 pairs of slots are the first operand (16 query rows by 32 slots); v is
// packed once into the AVX-512 BF16 GEMM's value panels (ValuePanels: 16 slot pairs by 32
// columns for each 32 slots, zeros for the rows not read), whose left and right 16 columns are
// the second operand's tiles. Two row blocks against one panel's two column blocks: four
// accumulators for four loads, rows padded with zeros to an even count of 16-row blocks.
inline void attention_values(const float* p, int64_t R, const uint16_t* v, const uint8_t* live,
                             int64_t L, int64_t D, float* o) {
  const int64_t chunks = (L + kStep - 1) / kStep, lp = chunks * 16;  // u32 per packed p row
  const int64_t mb = (R + 31) / 32 * 2;                              // 16-row blocks
  static_assert(kPairNR == 32, "a value panel is two tiles of 16 columns");
  const int64_t panels = (D + kPairNR - 1) / kPairNR, panel_words = 16 * kPairNR;
  uint32_t* pb = thread_scratch<uint32_t>(Scratch::kPackedX, size_t(mb * 16 * lp));
  for (int64_t r = 0; r < R; ++r) {
    char* row = reinterpret_cast<char*>(pb + r * lp);  // written through char: no aliasing
    round_to_bf16(p + r * L, L, row);
    std::memset(row + 2 * L, 0, size_t(2 * (2 * lp - L)));
  }
  std::memset(pb + R * lp, 0, size_t((mb * 16 - R) * lp) * sizeof(uint32_t));
  // Panel (q, u): slots [32 q, 32 q + 32) by columns [32 u, 32 u + 32); a last chunk's pair rows
  // past its slots are zeros.
  uint32_t* vb = thread_scratch<uint32_t>(Scratch::kPanel, size_t(chunks * panels * panel_words));
  const ValuePanels values{{}, v, live, D};
  for (int64_t q = 0; q < chunks; ++q) {
    const int64_t kc = std::min(kStep, L - q * kStep), pairs = (kc + 1) / 2;
    for (int64_t u = 0; u < panels; ++u) {
      uint32_t* panel = vb + (q * panels + u) * panel_words;
      values.pack(u * kPairNR, int(std::min<int64_t>(kPairNR, D - u * kPairNR)), q * kStep, kc,
                  panel);
      std::memset(panel + pairs * kPairNR, 0, size_t((16 - pairs) * kPairNR) * sizeof(uint32_t));
    }
  }
  configure(16);
  alignas(64) float c[4][16][16];
  for (int64_t m = 0; m < mb; m += 2)
    for (int64_t u = 0; u < panels; ++u) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t q = 0; q < chunks; ++q) {
        const uint32_t* panel = vb + (q * panels + u) * panel_words;
        _tile_loadd(4, pb + 16 * m * lp + 16 * q, 4 * lp);
        _tile_loadd(5, pb + 16 * (m + 1) * lp + 16 * q, 4 * lp);
        _tile_loadd(6, panel, 4 * kPairNR);
        _tile_loadd(7, panel + 16, 4 * kPairNR);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c[0], 64);
      _tile_stored(1, c[1], 64);
      _tile_stored(2, c[2], 64);
      _tile_stored(3, c[3], 64);
      for (int i = 0; i < 4; ++i) {
        const int64_t r0 = 16 * (m + i / 2), d0 = kPairNR * u + 16 * (i % 2);
        const int64_t rows = std::min<int64_t>(16, R - r0), cols = std::min<int64_t>(16, D - d0);
        for (int64_t r = 0; r < rows; ++r)
          if (cols > 0) std::memcpy(o + (r0 + r) * D + d0, c[i][r], size_t(cols) * sizeof(float));
      }
    }
  _tile_release();
}

}  // namespace amx

// The AMX target's attention products: the tiles over a bf16 cache, the f32 GEMMs over an f32 one.
struct AmxAttentionGemms {
  template <class V, class KV>
  static void scores(const float* xq, int64_t R, const KV* k, int64_t L, int64_t D, float* s) {
    if constexpr (std::is_same_v<KV, uint16_t>)
      amx::attention_scores(xq, R, k, L, D, s);
    else
      F32AttentionGemms::scores<V>(xq, R, k, L, D, s);
  }
  template <class V, class KV>
  static void weighted(const float* p, int64_t R, const KV* v, const uint8_t* live, int64_t L,
                       int64_t D, float* o) {
    if constexpr (std::is_same_v<KV, uint16_t>)
      amx::attention_values(p, R, v, live, L, D, o);
    else
      F32AttentionGemms::weighted<V>(p, R, v, live, L, D, o);
  }
};
#endif

template <class W, class B>
void linear_t(const float* x, const W* w, const float* scale, const B* bias, float* y, int64_t M,
              int64_t N, int64_t K, ThreadPool& pool, LinearRows rows) {
#if defined(TF_AMX)
  if constexpr (sizeof(W) == 2) return amx::linear(x, w, bias, y, M, N, K, pool);
#endif
  if (!takes_gemm(M, rows)) return gemv<Avx512Vec>(x, w, scale, bias, y, M, N, K, pool);
#if defined(TF_AVX512_BF16)
  if constexpr (sizeof(W) == 2)
    return gemm_pairs(x, Bf16Panels{.w = w, .K = K}, bias, y, M, N, K, pool);
  if constexpr (std::is_same_v<W, int8_t>)
    return gemm_pairs(x, Int8Panels{{}, w, scale, K}, bias, y, M, N, K, pool);
#endif
  gemm<Avx512Vec>(x, w, scale, bias, y, M, N, K, pool);
}

void linear_avx512(const float* x, const void* w, DType wt, const void* bias, float* y, int64_t M,
                   int64_t N, int64_t K, ThreadPool& pool, LinearRows rows) {
  if (wt == DType::f16) return linear_f16(x, w, bias, y, M, N, K, pool);
  if (wt == DType::bf16)
    linear_t(x, static_cast<const uint16_t*>(w), nullptr, static_cast<const uint16_t*>(bias), y, M,
             N, K, pool, rows);
  else
    linear_t(x, static_cast<const float*>(w), nullptr, static_cast<const float*>(bias), y, M, N, K,
             pool, rows);
}

void linear_int8_avx512(const float* x, const int8_t* w, const float* scale, const float* bias,
                        float* y, int64_t M, int64_t N, int64_t K, ThreadPool& pool,
                        LinearRows rows) {
  linear_t(x, w, scale, bias, y, M, N, K, pool, rows);
}

void linear_mxfp4_avx512(const float* x, const uint8_t* codes, const uint8_t* scales,
                         const float* bias, float* y, int64_t M, int64_t N, int64_t K,
                         ThreadPool& pool, LinearRows) {
  linear_mxfp4_x86<Mxfp4Avx512>(x, codes, scales, bias, y, M, N, K, pool);
}

// int4: the GEMV with gemv_int4_pair, the GEMM with this target's 8 x 32 register tiles over
// panels unpacked from the tiles.
void linear_int4_avx512(const float* x, const uint8_t* w, const uint16_t* scale,
                        const uint8_t* zero, const float* bias, float* y, int64_t M, int64_t N,
                        int64_t K, ThreadPool& pool, LinearRows rows) {
#if defined(TF_AVX512_BF16)
  if (takes_gemm(M, rows))
    return gemm_pairs(x, Int4Panels{{}, w, scale, zero, K}, bias, y, M, N, K, pool);
#endif
  linear_int4_x86<Avx512Vec>(x, w, scale, zero, bias, y, M, N, K, rows, pool);
}

}  // namespace

#if defined(TF_AMX)
const KernelTable& amx_kernels() {
#elif defined(TF_AVX512_BF16)
const KernelTable& avx512bf16_kernels() {
#else
const KernelTable& avx512_kernels() {
#endif
#if defined(TF_AMX)
  using AttentionGemms = AmxAttentionGemms;
#elif defined(TF_AVX512_BF16)
  using AttentionGemms = Bf16AttentionGemms;
#else
  using AttentionGemms = F32AttentionGemms;
#endif
  static const KernelTable t =
      make_table<Avx512Ops>(&linear_avx512, &linear_int8_avx512, &quantize_int8_avx2,
                            &linear_int4_avx512, &quantize_int4_avx2, &linear_mxfp4_avx512,
                            &attention_x86<Avx512Vec, Avx512Ops, AttentionGemms>);
  return t;
}

}  // namespace tformers::cpu
