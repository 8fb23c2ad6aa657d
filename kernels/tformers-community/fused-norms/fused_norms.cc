// tformers-community/fused-norms: RMSNorm and SiLU-and-mul for the CPU (major version 1), plus
// rotary embeddings and decode attention (major version 2, FUSED_NORMS_MAJOR=2).
//
// One source, compiled once per variant with that variant's instruction-set flags: the
// __AVX512F__ / __AVX2__ paths below are picked by the compiler, and tformers picks the variant
// the CPU can run. The library talks to tformers only through kernel_abi.h; it is built with
// -fno-exceptions and every function is noexcept, so nothing can throw across the C ABI.
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "tformers/kernel_abi.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#ifndef FUSED_NORMS_MAJOR
#define FUSED_NORMS_MAJOR 1
#endif

namespace {

int fail(const TfKernelCall* c, const char* fmt, ...) noexcept {
  if (c->error && c->error_size) {
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(c->error, c->error_size, fmt, args);
    va_end(args);
  }
  return 1;
}

int64_t numel(const TfKernelTensor& t) noexcept {
  int64_t n = 1;
  for (int32_t i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

bool same_shape(const TfKernelTensor& a, const TfKernelTensor& b) noexcept {
  if (a.ndim != b.ndim) return false;
  for (int32_t i = 0; i < a.ndim; ++i)
    if (a.shape[i] != b.shape[i]) return false;
  return true;
}

inline float bf16_value(uint16_t h) noexcept {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---- RMSNorm: y (M,D) = x (M,D) / sqrt(mean(x^2) + eps) * w (D) ------------------------------

struct RmsArgs {
  const float* x;
  const void* w;
  bool w_bf16;
  float* y;
  int64_t D;
  float eps;
};

float sum_squares(const float* x, int64_t D) noexcept {
  int64_t i = 0;
  float s = 0.0f;
#if defined(__AVX512F__)
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  for (; i + 32 <= D; i += 32) {
    __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    acc0 = _mm512_fmadd_ps(a, a, acc0);
    acc1 = _mm512_fmadd_ps(b, b, acc1);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(acc0, acc1));
  for (float l : lanes) s += l;
#elif defined(__AVX2__)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= D; i += 16) {
    __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    acc0 = _mm256_fmadd_ps(a, a, acc0);
    acc1 = _mm256_fmadd_ps(b, b, acc1);
  }
  __m256 acc = _mm256_add_ps(acc0, acc1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  s = _mm_cvtss_f32(h);
#endif
  for (; i < D; ++i) s += x[i] * x[i];
  return s;
}

void rms_rows(void* arg, int64_t begin, int64_t end) noexcept {
  const RmsArgs& a = *static_cast<const RmsArgs*>(arg);
  for (int64_t m = begin; m < end; ++m) {
    const float* x = a.x + m * a.D;
    float* y = a.y + m * a.D;
    // The mean in double, as the built-in reference does, so the two agree to f32 rounding.
    const float inv = float(1.0 / std::sqrt(double(sum_squares(x, a.D)) / double(a.D) + a.eps));
    int64_t i = 0;
    if (a.w_bf16) {
      const auto* w = static_cast<const uint16_t*>(a.w);
      for (; i < a.D; ++i) y[i] = x[i] * inv * bf16_value(w[i]);
      continue;
    }
    const auto* w = static_cast<const float*>(a.w);
#if defined(__AVX512F__)
    const __m512 vi = _mm512_set1_ps(inv);
    for (; i + 16 <= a.D; i += 16)
      _mm512_storeu_ps(
          y + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vi), _mm512_loadu_ps(w + i)));
#elif defined(__AVX2__)
    const __m256 vi = _mm256_set1_ps(inv);
    for (; i + 8 <= a.D; i += 8)
      _mm256_storeu_ps(
          y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi), _mm256_loadu_ps(w + i)));
#endif
    for (; i < a.D; ++i) y[i] = x[i] * inv * w[i];
  }
}

int rms_norm(const TfKernelCall* c) noexcept {
  if (c->num_inputs != 2 || c->num_float_attrs != 1)
    return fail(c, "RMSNorm takes (x, weight; eps), got %d inputs and %d attributes", c->num_inputs,
                c->num_float_attrs);
  const TfKernelTensor &x = c->inputs[0], &w = c->inputs[1], &y = *c->output;
  if (x.dtype != TF_KERNEL_F32 || y.dtype != TF_KERNEL_F32 ||
      (w.dtype != TF_KERNEL_F32 && w.dtype != TF_KERNEL_BF16))
    return fail(c, "RMSNorm: x and y must be f32 and weight f32 or bf16");
  if (x.ndim < 1 || w.ndim != 1 || w.shape[0] != x.shape[x.ndim - 1] || !same_shape(x, y))
    return fail(c, "RMSNorm: weight (D) must match the last dimension of x, and y the shape of x");
  RmsArgs a{static_cast<const float*>(x.data), w.data,     w.dtype == TF_KERNEL_BF16,
            static_cast<float*>(y.data),       w.shape[0], c->float_attrs[0]};
  const int64_t rows = a.D ? numel(x) / a.D : 0;
  c->parallel_for(c->host, rows, 1, rms_rows, &a);
  return 0;
}

// ---- SiLU and mul: y = silu(gate) * up ---------------------------------------------------------

struct SiluArgs {
  const float *gate, *up;
  float* y;
};

void silu_range(void* arg, int64_t begin, int64_t end) noexcept {
  const SiluArgs& a = *static_cast<const SiluArgs*>(arg);
  for (int64_t i = begin; i < end; ++i) {
    const float g = a.gate[i];
    a.y[i] = g / (1.0f + std::exp(-g)) * a.up[i];
  }
}

int silu_and_mul(const TfKernelCall* c) noexcept {
  if (c->num_inputs != 2)
    return fail(c, "SiLUAndMul takes (gate, up), got %d inputs", c->num_inputs);
  const TfKernelTensor &g = c->inputs[0], &u = c->inputs[1], &y = *c->output;
  if (g.dtype != TF_KERNEL_F32 || u.dtype != TF_KERNEL_F32 || y.dtype != TF_KERNEL_F32 ||
      !same_shape(g, u) || !same_shape(g, y))
    return fail(c, "SiLUAndMul: gate, up and y must be f32 tensors of one shape");
  SiluArgs a{static_cast<const float*>(g.data), static_cast<const float*>(u.data),
             static_cast<float*>(y.data)};
  c->parallel_for(c->host, numel(g), 1024, silu_range, &a);
  return 0;
}

#if FUSED_NORMS_MAJOR >= 2

// ---- Rotary embedding: x (B,T,H,D) by position_ids (B,T), rotate-half layout ----------------

struct RopeArgs {
  const float* x;
  const int32_t* pos;
  const float* inv_freq;
  float* y;
  int64_t H, D;
};

void rope_rows(void* arg, int64_t begin, int64_t end) noexcept {
  const RopeArgs& a = *static_cast<const RopeArgs*>(arg);
  const int64_t half = a.D / 2;
  for (int64_t m = begin; m < end; ++m)  // m indexes (b, t)
    for (int64_t i = 0; i < half; ++i) {
      // The angle rounded to f32 as Transformers computes it; cos and sin in double.
      const double angle = float(float(a.pos[m]) * a.inv_freq[i]);
      const double cs = std::cos(angle), sn = std::sin(angle);
      for (int64_t h = 0; h < a.H; ++h) {
        const float* x = a.x + (m * a.H + h) * a.D;
        float* y = a.y + (m * a.H + h) * a.D;
        const double x1 = x[i], x2 = x[half + i];
        y[i] = float(x1 * cs - x2 * sn);
        y[half + i] = float(x2 * cs + x1 * sn);
      }
    }
}

int rotary_embedding(const TfKernelCall* c) noexcept {
  if (c->num_inputs != 2) return fail(c, "RotaryEmbedding takes (x, position_ids)");
  const TfKernelTensor &x = c->inputs[0], &p = c->inputs[1], &y = *c->output;
  if (x.dtype != TF_KERNEL_F32 || p.dtype != TF_KERNEL_I32 || x.ndim != 4 || p.ndim != 2 ||
      p.shape[0] != x.shape[0] || p.shape[1] != x.shape[1] || !same_shape(x, y) ||
      c->num_float_attrs * 2 != x.shape[3])
    return fail(c, "RotaryEmbedding: x (B,T,H,D) f32, position_ids (B,T) i32, inv_freq (D/2)");
  RopeArgs a{static_cast<const float*>(x.data),
             static_cast<const int32_t*>(p.data),
             c->float_attrs,
             static_cast<float*>(y.data),
             x.shape[2],
             x.shape[3]};
  c->parallel_for(c->host, x.shape[0] * x.shape[1], 1, rope_rows, &a);
  return 0;
}

// ---- Attention over a static f32 cache, one new token per row (decode) ------------------------

struct AttnArgs {
  const float *q, *k, *v;
  const int32_t* mask;
  float* out;
  int64_t B, Hq, Hkv, S, D, start;
  float scale;
};

void attn_heads(void* arg, int64_t begin, int64_t end) noexcept {
  const AttnArgs& a = *static_cast<const AttnArgs*>(arg);
  const int64_t group = a.Hq / a.Hkv, L = a.start + 1;
  for (int64_t bh = begin; bh < end; ++bh) {  // (b, h) with T = 1
    const int64_t b = bh / a.Hq, h = bh % a.Hq;
    const float* q = a.q + bh * a.D;
    float* o = a.out + bh * a.D;
    const float* kb = a.k + (b * a.Hkv + h / group) * a.S * a.D;
    const float* vb = a.v + (b * a.Hkv + h / group) * a.S * a.D;
    // Online softmax: one pass with a running max and sum, so no scratch of length L is needed;
    // attention() has checked D <= 512.
    double mx = -INFINITY, sum = 0.0, acc[512];
    for (int64_t i = 0; i < a.D; ++i) acc[i] = 0.0;
    for (int64_t j = 0; j < L; ++j) {
      if (a.mask && a.mask[b * a.S + j] == 0) continue;
      double s = 0.0;
      for (int64_t i = 0; i < a.D; ++i) s += double(q[i]) * kb[j * a.D + i];
      s *= a.scale;
      const double nm = s > mx ? s : mx;
      const double fix = std::exp(mx - nm), p = std::exp(s - nm);
      sum = sum * fix + p;
      for (int64_t i = 0; i < a.D; ++i) acc[i] = acc[i] * fix + p * vb[j * a.D + i];
      mx = nm;
    }
    // A query that sees no key gets zeros, as the built-in attention.
    for (int64_t i = 0; i < a.D; ++i) o[i] = sum > 0 ? float(acc[i] / sum) : 0.0f;
  }
}

int attention(const TfKernelCall* c) noexcept {
  if (c->num_inputs != 5 || c->num_float_attrs != 1)
    return fail(c,
                "Attention takes (query, key_cache, value_cache, cache_position, "
                "attention_mask; scale)");
  const TfKernelTensor &q = c->inputs[0], &k = c->inputs[1], &v = c->inputs[2], &pos = c->inputs[3],
                       &mask = c->inputs[4], &out = *c->output;
  if (q.dtype != TF_KERNEL_F32 || k.dtype != TF_KERNEL_F32 || v.dtype != TF_KERNEL_F32 ||
      pos.dtype != TF_KERNEL_I32 || mask.dtype != TF_KERNEL_I32 || q.ndim != 4 || k.ndim != 4 ||
      !same_shape(k, v) || !same_shape(q, out) || mask.ndim != 2)
    return fail(c, "Attention: query (B,T,Hq,D) f32, caches (B,Hkv,S,D) f32, mask (B,S) i32");
  if (q.shape[1] != 1) return fail(c, "Attention: this kernel handles decode (T = 1) only");
  if (q.shape[3] > 512) return fail(c, "Attention: head_dim above 512 is not supported");
  AttnArgs a{static_cast<const float*>(q.data),
             static_cast<const float*>(k.data),
             static_cast<const float*>(v.data),
             static_cast<const int32_t*>(mask.data),
             static_cast<float*>(out.data),
             q.shape[0],
             q.shape[2],
             k.shape[1],
             k.shape[2],
             q.shape[3],
             *static_cast<const int32_t*>(pos.data),
             c->float_attrs[0]};
  if (a.Hkv <= 0 || a.Hq % a.Hkv != 0 || a.start < 0 || a.start >= a.S)
    return fail(c, "Attention: bad heads or cache position %lld", (long long)a.start);
  c->parallel_for(c->host, a.B * a.Hq, 1, attn_heads, &a);
  return 0;
}

#endif

const TfKernelEntry kKernels[] = {
    {"RMSNorm", "x:f32,weight:f32|bf16;eps:f32->y:f32",
     TF_KERNEL_MODE_PREFILL | TF_KERNEL_MODE_DECODE, rms_norm},
    {"SiLUAndMul", "gate:f32,up:f32;->y:f32", TF_KERNEL_MODE_PREFILL | TF_KERNEL_MODE_DECODE,
     silu_and_mul},
#if FUSED_NORMS_MAJOR >= 2
    {"RotaryEmbedding", "x:f32,position_ids:i32;inv_freq:f32->y:f32",
     TF_KERNEL_MODE_PREFILL | TF_KERNEL_MODE_DECODE, rotary_embedding},
    {"Attention",
     "query:f32,key_cache:f32,value_cache:f32,cache_position:i32,attention_mask:i32;scale:f32->"
     "out:f32",
     TF_KERNEL_MODE_DECODE, attention},
#endif
};

const TfKernelTable kTable = {
    TF_KERNEL_ABI_VERSION,
    sizeof(TfKernelTable),
    "fused-norms",
#if FUSED_NORMS_MAJOR >= 2
    "2.0.0",
#else
    "1.0.0",
#endif
    sizeof kKernels / sizeof kKernels[0],
    kKernels,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const TfKernelTable* tformers_kernel_table(void) {
  return &kTable;
}
