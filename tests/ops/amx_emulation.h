// Stand-ins for what the AMX target adds to the AVX-512 BF16 kernels (kernels_target_avx512.cc
// with TF_AMX): the tile instructions and the AVX-512 intrinsics only its linear uses, so that
// amx_emulated.cc can compile that code for a CPU without AMX or AVX-512 and the op-consistency
// tests can check its blocking, packing, padding and stores on any AVX2 machine. The tiles are a
// thread's 8 registers of up to 16 rows of 64 bytes, shaped by the loaded configuration; a tile
// multiply's sums are
// rounded as tile_dpbf16ps says (the tests compare this table with the reference and with
// itself, not with the AMX target's bits).
//
// Include it after avx512_emulation.h, before the kernel file.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "ops/avx512_emulation.h"
#include "tformers/dtype.h"

namespace tformers::amx_emulation {

using avx512_emulation::bits;
using avx512_emulation::i32x16;
using avx512_emulation::u16x32;
typedef uint16_t u16x16 __attribute__((vector_size(32)));

struct Tiles {
  uint8_t rows[8] = {};
  uint16_t colsb[8] = {};
  alignas(64) unsigned char data[8][16][64] = {};
};
inline thread_local Tiles tiles;

// ldtilecfg's 64-byte operand: palette, start row, 14 reserved bytes, 16 widths, 16 row counts.
inline void tile_loadconfig(const void* config) {
  const unsigned char* c = static_cast<const unsigned char*>(config);
  for (int t = 0; t < 8; ++t) {
    std::memcpy(&tiles.colsb[t], c + 16 + 2 * t, 2);
    tiles.rows[t] = c[48 + t];
  }
}
inline void tile_release() { tiles = Tiles{}; }
inline void tile_zero(int t) { std::memset(tiles.data[t], 0, sizeof tiles.data[t]); }
inline void tile_loadd(int t, const void* base, long stride) {
  for (int r = 0; r < tiles.rows[t]; ++r)
    std::memcpy(tiles.data[t][r], static_cast<const char*>(base) + r * stride, tiles.colsb[t]);
}
inline void tile_stored(int t, void* base, long stride) {
  for (int r = 0; r < tiles.rows[t]; ++r)
    std::memcpy(static_cast<char*>(base) + r * stride, tiles.data[t][r], tiles.colsb[t]);
}
inline float bf16_at(const unsigned char* row, int i) {
  uint16_t h;
  std::memcpy(&h, row + 2 * i, 2);
  return bf16_to_f32(h);
}
// c (rows of a, colsb of b / 4 floats) += a (pairs of k per row) x b (a pair row per k pair).
inline void tile_dpbf16ps(int c, int a, int b) {
  const int m_rows = tiles.rows[a], pairs = tiles.colsb[a] / 4, n_cols = tiles.colsb[b] / 4;
  for (int m = 0; m < m_rows; ++m)
    for (int n = 0; n < n_cols; ++n) {
      float acc;
      std::memcpy(&acc, tiles.data[c][m] + 4 * n, 4);
      // One tile multiply's products summed in double (each exact there), then added to the
      // accumulator with one rounding: a model, not the hardware's order (whose bits no f32
      // sequence tried gives), with fewer roundings than a chain of f32 adds.
      double sum = 0.0;
      for (int k = 0; k < 2 * pairs; ++k)
        sum += double(bf16_at(tiles.data[a][m], k)) *
               double(bf16_at(tiles.data[b][k / 2], 2 * n + k % 2));
      acc = float(double(acc) + sum);
      std::memcpy(tiles.data[c][m] + 4 * n, &acc, 4);
    }
}

// The AVX-512 intrinsics of the AMX linear that avx512_emulation.h has no stand-in for.
// Element by element through scalars: clang takes no address of a vector's element.

// 16 elements of type T from p where k marks them, zero elsewhere.
template <class V, class T>
inline V masked_load16(__mmask16 k, const void* p) {
  V r{};
  for (int i = 0; i < 16; ++i) {
    T e = 0;
    if (k >> i & 1) std::memcpy(&e, static_cast<const T*>(p) + i, sizeof e);
    r[i] = e;
  }
  return r;
}
inline __m512 maskz_loadu_ps(__mmask16 k, const void* p) {
  return masked_load16<__m512, float>(k, p);
}
inline void mask_storeu_ps(void* p, __mmask16 k, __m512 v) {
  for (int i = 0; i < 16; ++i) {
    const float e = v[i];
    if (k >> i & 1) std::memcpy(static_cast<float*>(p) + i, &e, 4);
  }
}
inline void storeu_si512(void* p, __m512i v) { std::memcpy(p, &v, sizeof v); }
inline __m512i setr_epi32(int e0, int e1, int e2, int e3, int e4, int e5, int e6, int e7, int e8,
                          int e9, int e10, int e11, int e12, int e13, int e14, int e15) {
  return bits<__m512i>(
      i32x16{e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15});
}
// bf16 i of the result: b's lane i below 16, a's lane i - 16 above (nearest even).
inline __m512bh cvtne2ps_pbh(__m512 a, __m512 b) {
  u16x32 r;
  for (int i = 0; i < 16; ++i) {
    r[i] = f32_to_bf16(b[i]);
    r[16 + i] = f32_to_bf16(a[i]);
  }
  return bits<__m512bh>(r);
}
inline void i32scatter_epi32(void* base, __m512i index, __m512i v, int scale) {
  const i32x16 ix = bits<i32x16>(index), x = bits<i32x16>(v);
  for (int i = 0; i < 16; ++i) {
    const int32_t e = x[i];
    std::memcpy(static_cast<char*>(base) + int64_t(ix[i]) * scale, &e, 4);
  }
}
inline __m512 i32gather_ps(__m512i index, const void* base, int scale) {
  const i32x16 ix = bits<i32x16>(index);
  __m512 r;
  for (int i = 0; i < 16; ++i) {
    float e;
    std::memcpy(&e, static_cast<const char*>(base) + int64_t(ix[i]) * scale, 4);
    r[i] = e;
  }
  return r;
}
inline __m256i maskz_loadu_epi16(__mmask16 k, const void* p) {
  return bits<__m256i>(masked_load16<u16x16, uint16_t>(k, p));
}
inline __m512i cvtepu16_epi32(__m256i a) {
  const u16x16 h = bits<u16x16>(a);
  i32x16 r;
  for (int i = 0; i < 16; ++i) r[i] = h[i];
  return bits<__m512i>(r);
}

inline __m512i or_si512(__m512i a, __m512i b) {
  return bits<__m512i>(bits<i32x16>(a) | bits<i32x16>(b));
}

}  // namespace tformers::amx_emulation

// Some of these names are macros in the compilers' headers.
#undef _tile_loadconfig
#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#undef _tile_release
#undef _mm512_maskz_loadu_ps
#undef _mm512_mask_storeu_ps
#undef _mm512_storeu_si512
#undef _mm512_setr_epi32
#undef _mm512_cvtne2ps_pbh
#undef _mm512_i32scatter_epi32
#undef _mm512_i32gather_ps
#undef _mm256_maskz_loadu_epi16
#undef _mm512_cvtepu16_epi32
#undef _mm512_or_si512
#define _tile_loadconfig tformers::amx_emulation::tile_loadconfig
#define _tile_release tformers::amx_emulation::tile_release
#define _tile_zero tformers::amx_emulation::tile_zero
#define _tile_loadd tformers::amx_emulation::tile_loadd
#define _tile_stored tformers::amx_emulation::tile_stored
#define _tile_dpbf16ps tformers::amx_emulation::tile_dpbf16ps
#define _mm512_maskz_loadu_ps tformers::amx_emulation::maskz_loadu_ps
#define _mm512_mask_storeu_ps tformers::amx_emulation::mask_storeu_ps
#define _mm512_storeu_si512 tformers::amx_emulation::storeu_si512
#define _mm512_setr_epi32 tformers::amx_emulation::setr_epi32
#define _mm512_cvtne2ps_pbh tformers::amx_emulation::cvtne2ps_pbh
#define _mm512_i32scatter_epi32 tformers::amx_emulation::i32scatter_epi32
#define _mm512_i32gather_ps tformers::amx_emulation::i32gather_ps
#define _mm256_maskz_loadu_epi16 tformers::amx_emulation::maskz_loadu_epi16
#define _mm512_cvtepu16_epi32 tformers::amx_emulation::cvtepu16_epi32
#define _mm512_or_si512 tformers::amx_emulation::or_si512
