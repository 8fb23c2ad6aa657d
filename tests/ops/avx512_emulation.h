// Scalar stand-ins for the AVX-512 intrinsics that src/backends/cpu/kernels_target_avx512.cc
// uses, so that avx512_emulated.cc can compile that file for a CPU without AVX-512 and the
// op-consistency tests can run its code (the Avx512Vec wrappers, its int8 GEMV tile, the
// vdpbf16ps prefill GEMM) against the references on any machine. Each function follows the
// instruction's definition in the Intel SDM, lane by lane; vdpbf16ps as the hardware does it:
// denormal bf16 inputs read as zero, the odd pair's product added first, then the even one's,
// each rounded to f32 (round to nearest even; the real instruction also flushes denormal
// results, which the tests' data never produce).
//
// Include it before anything else includes <immintrin.h> in the translation unit: it includes
// that header itself, then maps the _mm512_ names used by the kernel file onto these functions.
// An intrinsic the kernel file starts to use without a stand-in here fails to compile (GCC
// refuses to inline an AVX-512 intrinsic into a function built without AVX-512), so this list
// cannot silently fall behind.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "tformers/dtype.h"

// 64-byte vectors passed by value between functions built without AVX-512: GCC notes that the
// ABI would differ from AVX-512 code; every such function here is inline in one file.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace tformers::avx512_emulation {

typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef int16_t i16x32 __attribute__((vector_size(64)));
typedef uint16_t u16x32 __attribute__((vector_size(64)));

template <class To, class From>
inline To bits(const From& v) {
  static_assert(sizeof(To) == sizeof(From));
  To r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}

inline __m512 loadu_ps(const float* p) {
  __m512 r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
inline void storeu_ps(float* p, __m512 v) { std::memcpy(p, &v, sizeof v); }
inline __m512i loadu_si512(const void* p) {
  __m512i r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
inline __m512 add_ps(__m512 a, __m512 b) { return a + b; }
inline __m512 mul_ps(__m512 a, __m512 b) { return a * b; }
inline __m512 fmadd_ps(__m512 a, __m512 b, __m512 c) {
  for (int i = 0; i < 16; ++i) c[i] = __builtin_fmaf(a[i], b[i], c[i]);  // one rounding
  return c;
}
inline __m512 set1_ps(float x) { return __m512{} + x; }
inline __m512 setzero_ps() { return __m512{}; }
inline __m512i set1_epi32(int x) { return bits<__m512i>(i32x16{} + x); }
inline __m512 castsi512_ps(__m512i v) { return bits<__m512>(v); }
inline __m512i and_si512(__m512i a, __m512i b) { return a & b; }
// The shifts are always inlined: the MXFP4 tiles call them often enough that GCC would otherwise
// keep an out-of-line copy, whose 64-byte vector return draws a -Wpsabi warning that the pragma
// above cannot silence (it carries no source location).
__attribute__((always_inline)) inline __m512i slli_epi32(__m512i a, unsigned n) {
  return n > 31 ? __m512i{} : bits<__m512i>(bits<u32x16>(a) << n);
}
__attribute__((always_inline)) inline __m512i srli_epi32(__m512i a, unsigned n) {
  return n > 31 ? __m512i{} : bits<__m512i>(bits<u32x16>(a) >> n);
}
inline __m512i max_epu32(__m512i a, __m512i b) {
  const u32x16 x = bits<u32x16>(a), y = bits<u32x16>(b);
  return bits<__m512i>(x > y ? x : y);
}
// Lane i = a[idx[i] & 15] (vpermps reads the low 4 bits of each index).
inline __m512 permutexvar_ps(__m512i idx, __m512 a) {
  const u32x16 k = bits<u32x16>(idx);
  __m512 r;
  for (int i = 0; i < 16; ++i) r[i] = a[k[i] & 15];
  return r;
}
inline __m512 cvtepi32_ps(__m512i a) {
  const i32x16 v = bits<i32x16>(a);
  __m512 r;
  for (int i = 0; i < 16; ++i) r[i] = float(v[i]);  // round to nearest even, as MXCSR's default
  return r;
}
// The 16 bytes of a, sign-extended to 32-bit lanes.
inline __m512i cvtepi8_epi32(__m128i a) {
  int8_t e[16];
  std::memcpy(e, &a, sizeof e);
  i32x16 r;
  for (int i = 0; i < 16; ++i) r[i] = e[i];
  return bits<__m512i>(r);
}
// The 16 bytes of a, zero-extended to 32-bit lanes.
inline __m512i cvtepu8_epi32(__m128i a) {
  uint8_t e[16];
  std::memcpy(e, &a, sizeof e);
  i32x16 r;
  for (int i = 0; i < 16; ++i) r[i] = e[i];
  return bits<__m512i>(r);
}
// a in the low 256 bits; the upper ones are undefined for the instruction, zero here.
inline __m512i castsi256_si512(__m256i a) {
  __m512i r{};
  std::memcpy(&r, &a, sizeof a);
  return r;
}
// a with its 256-bit half `imm` (0 low, 1 high) replaced by b.
inline __m512i inserti64x4(__m512i a, __m256i b, int imm) {
  std::memcpy(reinterpret_cast<char*>(&a) + 32 * (imm & 1), &b, sizeof b);
  return a;
}
inline __m512i set1_epi8(char x) {
  __m512i r;
  std::memset(&r, x, sizeof r);
  return r;
}
inline __m512i set1_epi16(short x) { return bits<__m512i>(i16x32{} + x); }
inline __m512i srli_epi16(__m512i a, unsigned n) {
  return n > 15 ? __m512i{} : bits<__m512i>(bits<u16x32>(a) >> n);
}
inline __m512i add_epi16(__m512i a, __m512i b) {  // wraps
  return bits<__m512i>(bits<u16x32>(a) + bits<u16x32>(b));
}
inline __m512i add_epi32(__m512i a, __m512i b) {  // wraps
  return bits<__m512i>(bits<u32x16>(a) + bits<u32x16>(b));
}
inline __m512i sub_epi32(__m512i a, __m512i b) {  // wraps
  return bits<__m512i>(bits<u32x16>(a) - bits<u32x16>(b));
}
// The low 32 bits of each lane's product.
inline __m512i mullo_epi32(__m512i a, __m512i b) {
  return bits<__m512i>(bits<u32x16>(a) * bits<u32x16>(b));
}
// Word i = saturate16(a[2i] b[2i] + a[2i+1] b[2i+1]) with a's bytes unsigned and b's signed.
inline __m512i maddubs_epi16(__m512i a, __m512i b) {
  uint8_t ua[64];
  int8_t sb[64];
  std::memcpy(ua, &a, sizeof ua);
  std::memcpy(sb, &b, sizeof sb);
  i16x32 r;
  for (int i = 0; i < 32; ++i) {
    const int32_t t = ua[2 * i] * sb[2 * i] + ua[2 * i + 1] * sb[2 * i + 1];
    r[i] = int16_t(t > 32767 ? 32767 : t < -32768 ? -32768 : t);
  }
  return bits<__m512i>(r);
}
// Lane i = a[2i] b[2i] + a[2i+1] b[2i+1], signed words to a 32-bit sum (wrapping only for
// 4 * -32768^2, which the kernels never form).
inline __m512i madd_epi16(__m512i a, __m512i b) {
  const i16x32 x = bits<i16x32>(a), y = bits<i16x32>(b);
  i32x16 r;
  for (int i = 0; i < 16; ++i)
    r[i] = int32_t(uint32_t(x[2 * i] * y[2 * i]) + uint32_t(x[2 * i + 1] * y[2 * i + 1]));
  return bits<__m512i>(r);
}
// Lane i = src[i] + the 4 products a[4i + j] b[4i + j] (a's bytes unsigned, b's signed),
// wrapping (vpdpbusd, AVX-512 VNNI).
inline __m512i dpbusd_epi32(__m512i src, __m512i a, __m512i b) {
  uint8_t ua[64];
  int8_t sb[64];
  std::memcpy(ua, &a, sizeof ua);
  std::memcpy(sb, &b, sizeof sb);
  u32x16 r = bits<u32x16>(src);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 4; ++j) r[i] += uint32_t(ua[4 * i + j] * sb[4 * i + j]);
  return bits<__m512i>(r);
}
inline __m512i setzero_si512() { return __m512i{}; }
// Byte i from p where bit i of k is set, else 0; bytes not selected are not read.
inline __m512i maskz_loadu_epi8(uint64_t k, const void* p) {
  uint8_t b[64] = {};
  for (int i = 0; i < 64; ++i)
    if ((k >> i) & 1) b[i] = static_cast<const uint8_t*>(p)[i];
  __m512i r;
  std::memcpy(&r, b, sizeof r);
  return r;
}
// Lane i from b where bit i of k is set, else from a.
inline __m512 mask_blend_ps(uint16_t k, __m512 a, __m512 b) {
  __m512 r;
  for (int i = 0; i < 16; ++i) r[i] = (k >> i) & 1 ? b[i] : a[i];
  return r;
}
// 16 halves (IEEE binary16) to f32, exactly.
inline __m512 cvtph_ps(__m256i a) {
  uint16_t h[16];
  std::memcpy(h, &a, sizeof h);
  __m512 r;
  for (int i = 0; i < 16; ++i) r[i] = tformers::f16_to_f32(h[i]);
  return r;
}
inline float reduce_add_ps(__m512 a) {
  float s = 0.0f;
  for (int i = 0; i < 16; ++i) s += a[i];
  return s;
}
inline float bf16_daz(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;  // denormal (or zero) -> signed zero
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// dst[i] = src[i] + a[2i+1] b[2i+1] + a[2i] b[2i], the bf16 halves of each 32-bit lane.
inline __m512 dpbf16_ps(__m512 src, __m512bh a, __m512bh b) {
  uint16_t ha[32], hb[32];
  std::memcpy(ha, &a, sizeof ha);
  std::memcpy(hb, &b, sizeof hb);
  for (int i = 0; i < 16; ++i) {
    float t = src[i];
    t += bf16_daz(ha[2 * i + 1]) * bf16_daz(hb[2 * i + 1]);
    t += bf16_daz(ha[2 * i]) * bf16_daz(hb[2 * i]);
    src[i] = t;
  }
  return src;
}

}  // namespace tformers::avx512_emulation

#define _mm512_loadu_ps tformers::avx512_emulation::loadu_ps
#define _mm512_storeu_ps tformers::avx512_emulation::storeu_ps
#define _mm512_loadu_si512 tformers::avx512_emulation::loadu_si512
#define _mm512_add_ps tformers::avx512_emulation::add_ps
#define _mm512_mul_ps tformers::avx512_emulation::mul_ps
#define _mm512_fmadd_ps tformers::avx512_emulation::fmadd_ps
#define _mm512_set1_ps tformers::avx512_emulation::set1_ps
#define _mm512_setzero_ps tformers::avx512_emulation::setzero_ps
#define _mm512_set1_epi32 tformers::avx512_emulation::set1_epi32
#define _mm512_castsi512_ps tformers::avx512_emulation::castsi512_ps
#define _mm512_and_si512 tformers::avx512_emulation::and_si512
#define _mm512_slli_epi32 tformers::avx512_emulation::slli_epi32
#define _mm512_srli_epi32 tformers::avx512_emulation::srli_epi32
#define _mm512_max_epu32 tformers::avx512_emulation::max_epu32
#define _mm512_permutexvar_ps tformers::avx512_emulation::permutexvar_ps
#define _mm512_cvtepi32_ps tformers::avx512_emulation::cvtepi32_ps
#define _mm512_cvtepi8_epi32 tformers::avx512_emulation::cvtepi8_epi32
#define _mm512_reduce_add_ps tformers::avx512_emulation::reduce_add_ps
#define _mm512_cvtepu8_epi32 tformers::avx512_emulation::cvtepu8_epi32
#define _mm512_castsi256_si512 tformers::avx512_emulation::castsi256_si512
#define _mm512_inserti64x4 tformers::avx512_emulation::inserti64x4
#define _mm512_set1_epi8 tformers::avx512_emulation::set1_epi8
#define _mm512_set1_epi16 tformers::avx512_emulation::set1_epi16
#define _mm512_srli_epi16 tformers::avx512_emulation::srli_epi16
#define _mm512_add_epi16 tformers::avx512_emulation::add_epi16
#define _mm512_add_epi32 tformers::avx512_emulation::add_epi32
#define _mm512_sub_epi32 tformers::avx512_emulation::sub_epi32
#define _mm512_mullo_epi32 tformers::avx512_emulation::mullo_epi32
#define _mm512_maddubs_epi16 tformers::avx512_emulation::maddubs_epi16
#define _mm512_madd_epi16 tformers::avx512_emulation::madd_epi16
#define _mm512_dpbusd_epi32 tformers::avx512_emulation::dpbusd_epi32
#define _mm512_setzero_si512 tformers::avx512_emulation::setzero_si512
#define _mm512_mask_blend_ps tformers::avx512_emulation::mask_blend_ps
#define _mm512_maskz_loadu_epi8 tformers::avx512_emulation::maskz_loadu_epi8
#define _mm512_cvtph_ps tformers::avx512_emulation::cvtph_ps
#define _mm512_dpbf16_ps tformers::avx512_emulation::dpbf16_ps
