// Private to the CPU kernels: the per-target dispatch table and the kernel bodies that every
// target shares. Each target translation unit (kernels.cc for scalar, kernels_target_<name>.cc
// for the others) includes this header and instantiates the shared bodies with its own vector
// primitives, so the same algorithm is compiled once per instruction set.
//
// Everything below the table sits in an anonymous namespace on purpose: the same template
// compiled with -mavx2 in one file and -mavx512f in another must never be merged by the linker
// (an ODR violation that would let AVX-512 code run on an AVX2 machine).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "tformers/dtype.h"

namespace tformers::cpu {

// A paged KV pool as attention reads it (kernels.h's paged_attention): sequence s's position j
// of KV head h is row j % block_size of block blocks[s * table_blocks + j / block_size], whose
// rows of that head lie together. Token t of batch row b belongs to sequence rows[b * T + t], or
// to sequence b without rows.
struct KvPages {
  const int32_t* blocks;
  int64_t block_size, table_blocks;
  const int32_t* rows = nullptr;
};

struct KernelTable {
  void (*linear)(const float* x, const void* w, DType wt, const void* bias, float* y, int64_t M,
                 int64_t N, int64_t K, ThreadPool& pool, LinearRows rows);
  void (*linear_int8)(const float* x, const int8_t* w, const float* scale, const float* bias,
                      float* y, int64_t M, int64_t N, int64_t K, ThreadPool& pool, LinearRows rows);
  void (*quantize_int8)(const void* w, DType wt, int8_t* q, float* scale, int64_t N, int64_t K,
                        ThreadPool& pool);
  void (*linear_int4)(const float* x, const uint8_t* w, const uint16_t* scale, const uint8_t* zero,
                      const float* bias, float* y, int64_t M, int64_t N, int64_t K,
                      ThreadPool& pool, LinearRows rows);
  void (*quantize_int4)(const void* w, DType wt, uint8_t* tiles, uint16_t* scale, int64_t N,
                        int64_t K, ThreadPool& pool);
  void (*linear_mxfp4)(const float* x, const uint8_t* codes, const uint8_t* scales,
                       const float* bias, float* y, int64_t M, int64_t N, int64_t K,
                       ThreadPool& pool, LinearRows rows);
  void (*embedding)(const void* table, DType dt, const int32_t* ids, int64_t n, int64_t D,
                    float* out, ThreadPool& pool);
  void (*rms_norm)(const float* x, const void* w, DType wt, float* y, int64_t M, int64_t D,
                   float eps, bool unit_offset, ThreadPool& pool);
  void (*rope)(float* x, const int32_t* pos, const float* inv_freq, int64_t M, int64_t H, int64_t D,
               int64_t rotary_dim, bool interleaved, ThreadPool& pool);
  void (*silu_mul)(const float* gate, const float* up, float* y, int64_t n, ThreadPool& pool);
  void (*gelu_tanh_mul)(const float* gate, const float* up, float* y, int64_t n, ThreadPool& pool);
  void (*scale)(const float* x, float factor, float* y, int64_t n, ThreadPool& pool);
  void (*softcap)(const float* x, float cap, float* y, int64_t n, ThreadPool& pool);
  void (*add)(const float* a, const float* b, float* y, int64_t n, ThreadPool& pool);
  void (*cache_write)(void* cache, DType cache_type, const float* src, int64_t B, int64_t T,
                      int64_t Hkv, int64_t S, int64_t D, int64_t start, ThreadPool& pool);
  // pos (B,T), when given, places each query instead of start + t (see paged_attention). With
  // pages, k_cache and v_cache are paged pools read in place and S bounds the positions (the
  // tables' blocks times block_size). sinks (Hq) or null as kernels.h's attention.
  void (*attention)(const float* q, const void* k_cache, const void* v_cache, DType cache_type,
                    const int32_t* key_mask, float* out, int64_t B, int64_t T, int64_t Hq,
                    int64_t Hkv, int64_t S, int64_t D, int64_t start, float scale, int64_t window,
                    float softcap, const float* sinks, const int32_t* pos, const KvPages* pages,
                    ThreadPool& pool);
  // kernels.h's causal_conv1d and gated_delta_rule, their RecurrentRows as arrays.
  void (*causal_conv1d)(const float* x, const float* w, float* const* state, const uint8_t* fresh,
                        const uint8_t* real, float* y, int64_t B, int64_t T, int64_t C, int64_t K,
                        ThreadPool& pool);
  void (*gated_delta_rule)(const float* q, const float* k, const float* v, const float* g,
                           const float* beta, float* const* state, const uint8_t* fresh,
                           const uint8_t* real, float* y, int64_t B, int64_t T, int64_t Hk,
                           int64_t H, int64_t Dk, int64_t Dv, ThreadPool& pool);
};

// paged_attention (kernels.h) through a given target's attention kernel (the op tests run every
// target's).
void paged_attention_with(const KernelTable& kernels, const float* q, const void* k_pool,
                          const void* v_pool, DType cache_type, const int32_t* blocks,
                          const int32_t* rows, const int32_t* pos, float* out, int64_t B, int64_t T,
                          int64_t Hq, int64_t Hkv, int64_t BS, int64_t MB, int64_t D, float scale,
                          int64_t window, float softcap, const float* sinks, ThreadPool& pool);

// int8 quantization at load (kernels.h). The scalar one (kernels.cc) quantizes any block and is
// the reference; the AVX2 one (kernels_target_avx2.cc) does full blocks itself, gives the same
// bytes, and also serves the AVX-512 tables (every AVX-512 CPU has AVX2).
void quantize_int8_scalar(const void* w, DType wt, int8_t* q, float* scale, int64_t N, int64_t K,
                          ThreadPool& pool);
void quantize_int8_avx2(const void* w, DType wt, int8_t* q, float* scale, int64_t N, int64_t K,
                        ThreadPool& pool);
// One block of len <= kInt8Block values (row-contiguous) into q and its scale.
void quantize_block_scalar(const void* w, DType wt, int64_t len, int8_t* q, float* scale);

// int4 quantization at load (kernels.h), the same way: the scalar one is the reference, the AVX2
// one gives its bytes and serves the AVX-512 tables too.
void quantize_int4_scalar(const void* w, DType wt, uint8_t* tiles, uint16_t* scale, int64_t N,
                          int64_t K, ThreadPool& pool);
void quantize_int4_avx2(const void* w, DType wt, uint8_t* tiles, uint16_t* scale, int64_t N,
                        int64_t K, ThreadPool& pool);
// One block of len <= kInt4Block f32 values into 32 codes (padding 0) and its f16 scale.
void quantize_int4_block(const float* v, int64_t len, uint8_t* codes, uint16_t* scale);
// Row j's 32 codes of a block into its tile.
void put_int4_row(const uint8_t* codes, int64_t j, uint8_t* tile);

// One table per target; only the ones the CPU supports are ever selected (kernels.cc).
const KernelTable& scalar_kernels();
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();
const KernelTable& avx512bf16_kernels();
const KernelTable& amx_kernels();
// The table of target t (which the caller has checked the CPU supports: building or calling a
// table the CPU lacks may execute instructions it does not have).
const KernelTable& kernels_for(Target t);

// Per-thread scratch buffers that only grow (64-byte aligned), so steady-state calls allocate
// nothing. They live in kernels.cc, compiled for the baseline target, so that target files
// instantiate no std::vector code: the linker keeps one copy of each template instantiation and
// could hand an AVX-512-compiled one to baseline callers.
enum class Scratch {
  kScores,
  kSlots,
  kQueries,
  kRope,
  kPackedX,
  kPackedXScales,
  kPanel,
  kPagedKV,
  kRowPointers,
  kShiftedProbabilities,
  kWidenedRow,
  kConvWindow,
  kDeltaRow,
  kCount
};
void* thread_scratch(Scratch slot, size_t bytes);
template <class T>
T* thread_scratch(Scratch slot, size_t n) {
  return static_cast<T*>(thread_scratch(slot, n * sizeof(T)));
}

namespace {

// Elementwise work below this many elements runs on the calling thread: waking the pool costs
// more than the work.
constexpr int64_t kElementwiseGrain = 1 << 14;

// One stored value (f32, bf16 bits or an int8 code) as f32. f16 weights are widened to f32
// before they reach a template of these (linear_f16, norm_row).
inline float value_f32(float v) { return v; }
inline float value_f32(uint16_t v) { return bf16_to_f32(v); }
inline float value_f32(int8_t v) { return float(v); }

// f16 bits as f32, exactly as f16_to_f32, without branches, so that loops of it vectorize: the
// exponent and mantissa moved to f32's places are the value over 2^112 (subnormals included,
// as f32 subnormals), then scaled; an all-ones exponent (inf, NaN) keeps its payload.
inline float f16_as_f32(uint16_t h) {
  const uint32_t em = uint32_t(h & 0x7fffu) << 13, sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t finite = std::bit_cast<uint32_t>(std::bit_cast<float>(em) * 0x1p112f);
  return std::bit_cast<float>(sign | (em >= (0x7c00u << 13) ? em | 0x7f800000u : finite));
}
// MXFP4 (kernels.h): an e2m1 code's value and an e8m0 scale's, exactly. Scale 0 is 2^-127, an
// f32 subnormal; every other scale byte s puts s in f32's exponent field.
inline float e2m1_to_f32(uint8_t code) {
  static constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kValues[code & 15];
}
inline float e8m0_to_f32(uint8_t s) {
  return s == 0 ? 0x1p-127f : std::bit_cast<float>(uint32_t(s) << 23);
}

inline void widen_f16(const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_as_f32(h[i]);
}

// ---- Shared kernel bodies. `Ops` supplies the target's vector primitive:
//   float sum_sq(const float* x, int64_t n)

template <class Ops>
void embedding_impl(const void* table, DType dt, const int32_t* ids, int64_t n, int64_t D,
                    float* out, ThreadPool& pool) {
  pool.parallel_for(
      n,
      [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r) {
          float* o = out + r * D;
          if (dt == DType::bf16) {
            const uint16_t* src = static_cast<const uint16_t*>(table) + int64_t(ids[r]) * D;
            for (int64_t i = 0; i < D; ++i) o[i] = bf16_to_f32(src[i]);
          } else if (dt == DType::f16) {
            widen_f16(static_cast<const uint16_t*>(table) + int64_t(ids[r]) * D, o, D);
          } else {
            const float* src = static_cast<const float*>(table) + int64_t(ids[r]) * D;
            std::memcpy(o, src, size_t(D) * sizeof(float));
          }
        }
      },
      std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(D, 1)));
}

// yr = xr * inv * w (or * (1 + w)) over D values: rms_norm's output row.
template <bool kUnitOffset, class W>
void norm_row(const float* xr, float inv, const W* w, float* yr, int64_t D) {
  for (int64_t i = 0; i < D; ++i) {
    const float wi = value_f32(w[i]);
    yr[i] = xr[i] * inv * (kUnitOffset ? 1.0f + wi : wi);
  }
}

template <bool kUnitOffset>
void norm_row(const float* xr, float inv, const void* w, DType wt, float* yr, int64_t D) {
  if (wt == DType::bf16) {
    norm_row<kUnitOffset>(xr, inv, static_cast<const uint16_t*>(w), yr, D);
  } else if (wt == DType::f16) {
    float* wf = thread_scratch<float>(Scratch::kWidenedRow, size_t(D));
    widen_f16(w, wf, D);
    norm_row<kUnitOffset>(xr, inv, wf, yr, D);
  } else {
    norm_row<kUnitOffset>(xr, inv, static_cast<const float*>(w), yr, D);
  }
}

template <class Ops>
void rms_norm_impl(const float* x, const void* w, DType wt, float* y, int64_t M, int64_t D,
                   float eps, bool unit_offset, ThreadPool& pool) {
  pool.parallel_for(
      M,
      [&](int64_t b, int64_t e, int) {
        for (int64_t m = b; m < e; ++m) {
          const float* xr = x + m * D;
          const float inv = 1.0f / std::sqrt(Ops::sum_sq(xr, D) / float(D) + eps);
          if (unit_offset)
            norm_row<true>(xr, inv, w, wt, y + m * D, D);
          else
            norm_row<false>(xr, inv, w, wt, y + m * D, D);
        }
      },
      std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(D, 1)));
}

// Rotates the pairs (r[kA * i], r[kA * i + b]) for i < n by the angles of cs ([cos (n),
// sin (n)]): kA = 1, b = n for rotate-half, kA = 2, b = 1 for interleaved pairs. kA is a
// template argument so that each layout's loop is compiled (and vectorized) on its own.
template <int64_t kA>
inline void rotate_pairs(float* r, int64_t b, const float* cs, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x1 = r[kA * i], x2 = r[kA * i + b];
    r[kA * i] = x1 * cs[i] - x2 * cs[n + i];
    r[kA * i + b] = x2 * cs[i] + x1 * cs[n + i];
  }
}

template <class Ops>
void rope_impl(float* x, const int32_t* pos, const float* inv_freq, int64_t M, int64_t H, int64_t D,
               int64_t rotary_dim, bool interleaved, ThreadPool& pool) {
  const int64_t half = rotary_dim / 2;
  pool.parallel_for(
      M,
      [&](int64_t b, int64_t e, int) {
        // cos/sin of one position, shared by its H heads: [cos (half), sin (half)].
        float* cs = thread_scratch<float>(Scratch::kRope, size_t(2 * half));
        for (int64_t m = b; m < e; ++m) {
          const float p = float(pos[m]);
          for (int64_t i = 0; i < half; ++i) {
            const float angle = p * inv_freq[i];  // f32, as Transformers computes it
            cs[i] = std::cos(angle);
            cs[half + i] = std::sin(angle);
          }
          for (int64_t h = 0; h < H; ++h) {
            float* r = x + (m * H + h) * D;
            if (interleaved)
              rotate_pairs<2>(r, 1, cs, half);
            else
              rotate_pairs<1>(r, half, cs, half);
          }
        }
      },
      std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(H * D, 1)));
}

template <class Ops>
void add_impl(const float* a, const float* b, float* y, int64_t n, ThreadPool& pool) {
  pool.parallel_for(
      n,
      [&](int64_t lo, int64_t hi, int) {
        for (int64_t i = lo; i < hi; ++i) y[i] = a[i] + b[i];
      },
      kElementwiseGrain);
}

template <class Ops>
void scale_impl(const float* x, float factor, float* y, int64_t n, ThreadPool& pool) {
  pool.parallel_for(
      n,
      [&](int64_t lo, int64_t hi, int) {
        for (int64_t i = lo; i < hi; ++i) y[i] = x[i] * factor;
      },
      kElementwiseGrain);
}

// The causal convolution token by token, per batch row and block of channels, so that each token's
// channels are contiguous: a window of the last K-1 real inputs per channel (the state's rows, or
// zeros for a new sequence), padding tokens skipped. A token's y sums w[K-1] x, then w[j] win[j]
// for j < K-1 (the order the StableHLO lowering follows).
template <class Ops>
void causal_conv1d_impl(const float* x, const float* w, float* const* state, const uint8_t* fresh,
                        const uint8_t* real, float* y, int64_t B, int64_t T, int64_t C, int64_t K,
                        ThreadPool& pool) {
  constexpr int64_t kChannels = 64;
  const int64_t keep = K - 1, blocks = (C + kChannels - 1) / kChannels;
  pool.parallel_for(B * blocks, [&](int64_t lo, int64_t hi, int) {
    // The window's rows (keep of them, a ring) and the taps, both channel-contiguous.
    float* scratch = thread_scratch<float>(Scratch::kConvWindow, size_t((keep + K) * kChannels));
    float* win = scratch;
    float* taps = scratch + keep * kChannels;
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t b = u / blocks, c0 = u % blocks * kChannels, n = std::min(kChannels, C - c0);
      float* st = state[b] ? state[b] + c0 : nullptr;
      for (int64_t i = 0; i < keep; ++i)
        for (int64_t c = 0; c < n; ++c)
          win[i * kChannels + c] = fresh[b] || !st ? 0.0f : st[i * C + c];
      for (int64_t j = 0; j < K; ++j)
        for (int64_t c = 0; c < n; ++c) taps[j * kChannels + c] = w[(c0 + c) * K + j];
      int64_t oldest = 0;  // the ring's first row
      for (int64_t t = 0; t < T; ++t) {
        float* out = y + (b * T + t) * C + c0;
        if (!real[b * T + t]) {
          std::fill(out, out + n, 0.0f);
          continue;
        }
        const float* xt = x + (b * T + t) * C + c0;
        for (int64_t c = 0; c < n; ++c) out[c] = taps[keep * kChannels + c] * xt[c];
        for (int64_t j = 0; j < keep; ++j) {
          const float* row = win + (oldest + j) % keep * kChannels;
          const float* tap = taps + j * kChannels;
          for (int64_t c = 0; c < n; ++c) out[c] += tap[c] * row[c];
        }
        std::copy(xt, xt + n, win + oldest * kChannels);  // the newest replaces the oldest
        oldest = (oldest + 1) % keep;
      }
      if (st)
        for (int64_t i = 0; i < keep; ++i)
          std::copy(win + (oldest + i) % keep * kChannels,
                    win + (oldest + i) % keep * kChannels + n, st + i * C);
    }
  });
}

// The gated delta rule token by token, per (row, value head): the head's Dk x Dv state read and
// written twice a token, its rows Dv contiguous values.
template <class Ops>
void gated_delta_rule_impl(const float* q, const float* k, const float* v, const float* g,
                           const float* beta, float* const* state, const uint8_t* fresh,
                           const uint8_t* real, float* y, int64_t B, int64_t T, int64_t Hk,
                           int64_t H, int64_t Dk, int64_t Dv, ThreadPool& pool) {
  const int64_t group = H / Hk;
  pool.parallel_for(B * H, [&](int64_t lo, int64_t hi, int) {
    float* delta = thread_scratch<float>(Scratch::kDeltaRow, size_t(Dv));
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / H, h = bh % H, hk = h / group;
      float* st = state[b] ? state[b] + h * Dk * Dv : nullptr;
      if (st && fresh[b]) std::fill(st, st + Dk * Dv, 0.0f);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t row = b * T + t;
        float* out = y + (row * H + h) * Dv;
        std::fill(out, out + Dv, 0.0f);
        if (!real[row] || !st) continue;
        const float* qt = q + (row * Hk + hk) * Dk;
        const float* kt = k + (row * Hk + hk) * Dk;
        const float* vt = v + (row * H + h) * Dv;
        const float decay = std::exp(g[row * H + h]), b_t = beta[row * H + h];
        // Decay the state and read what it holds for k: delta = (decay S)^T k, then
        // beta (v - delta); S += k delta^T; y = S^T q.
        std::fill(delta, delta + Dv, 0.0f);
        for (int64_t i = 0; i < Dk; ++i) {
          float* s = st + i * Dv;
          const float ki = kt[i];
          for (int64_t j = 0; j < Dv; ++j) {
            s[j] *= decay;
            delta[j] += ki * s[j];
          }
        }
        for (int64_t j = 0; j < Dv; ++j) delta[j] = b_t * (vt[j] - delta[j]);
        for (int64_t i = 0; i < Dk; ++i) {
          float* s = st + i * Dv;
          const float ki = kt[i], qi = qt[i];
          for (int64_t j = 0; j < Dv; ++j) {
            s[j] += ki * delta[j];
            out[j] += qi * s[j];
          }
        }
      }
    }
  });
}

template <class Ops>
void cache_write_impl(void* cache, DType cache_type, const float* src, int64_t B, int64_t T,
                      int64_t Hkv, int64_t S, int64_t D, int64_t start, ThreadPool& pool) {
  // One unit is one (b, t, h) row of D values.
  pool.parallel_for(
      B * T * Hkv,
      [&](int64_t lo, int64_t hi, int) {
        for (int64_t u = lo; u < hi; ++u) {
          const int64_t h = u % Hkv, t = (u / Hkv) % T, b = u / (Hkv * T);
          const float* s = src + u * D;  // src (B,T,Hkv,D) is exactly unit-major
          const int64_t dst = ((b * Hkv + h) * S + start + t) * D;
          if (cache_type == DType::bf16) {
            uint16_t* d = static_cast<uint16_t*>(cache) + dst;
            for (int64_t i = 0; i < D; ++i) d[i] = f32_to_bf16(s[i]);
          } else {
            std::memcpy(static_cast<float*>(cache) + dst, s, size_t(D) * sizeof(float));
          }
        }
      },
      std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(D, 1)));
}

// Generic vectors of 8 floats (GCC vector extensions): one source that every kernel file compiles
// to its own instruction set, for code that needs no target-specific primitive. The scalar file
// (no AVX) gets a -Wpsabi note that passing them by value has another ABI there; they never cross
// a translation unit (anonymous namespace, inlined), so the note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));
constexpr int64_t kF32x8 = 8;

inline f32x8 load_f32x8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_f32x8(float* p, f32x8 v) { std::memcpy(p, &v, sizeof v); }
inline float hsum_f32x8(f32x8 v) {
  float s = 0.0f;
  for (int i = 0; i < kF32x8; ++i) s += v[i];
  return s;
}

inline float dot_f32(const float* a, const float* b, int64_t n) {
  f32x8 acc = {};
  int64_t i = 0;
  for (; i + kF32x8 <= n; i += kF32x8) acc += load_f32x8(a + i) * load_f32x8(b + i);
  float s = hsum_f32x8(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// A linear of f16 weights (and bias), which no target's GEMV or GEMM reads: each weight row is
// widened to f32 once, then multiplied by every row of x. Correct on every target, and each row
// of y independent of M as LinearRows asks; not fast (README: float16 on the CPU).
inline void linear_f16(const float* x, const void* w, const void* bias, float* y, int64_t M,
                       int64_t N, int64_t K, ThreadPool& pool) {
  pool.parallel_for(
      N,
      [&](int64_t n0, int64_t n1, int) {
        float* row = thread_scratch<float>(Scratch::kWidenedRow, size_t(K));
        for (int64_t n = n0; n < n1; ++n) {
          widen_f16(static_cast<const uint16_t*>(w) + n * K, row, K);
          const float b = bias ? f16_as_f32(static_cast<const uint16_t*>(bias)[n]) : 0.0f;
          for (int64_t m = 0; m < M; ++m) y[m * N + n] = dot_f32(x + m * K, row, K) + b;
        }
      },
      16);
}

// The largest of x[0, n), -inf for none; NaNs are passed over, as std::max(m, NaN) does.
inline float max_f32(const float* x, int64_t n) {
  f32x8 m = f32x8{} - INFINITY;
  int64_t i = 0;
  for (; i + kF32x8 <= n; i += kF32x8) {
    const f32x8 v = load_f32x8(x + i);
    m = v > m ? v : m;
  }
  float r = -INFINITY;
  for (int l = 0; l < kF32x8; ++l) r = std::max(r, m[l]);
  for (; i < n; ++i) r = std::max(r, x[i]);
  return r;
}

// exp of each lane, within 2^-21 (a few ulp) of std::exp for -87 <= x < 88 (Cephes' expf: 2^n
// times a degree-7 polynomial of x - n ln 2, ln 2 split in two for an exact product); exactly 0
// below -87, where exp(x) < 2^-125 (the probabilities of attention, which must be 0 for a masked
// slot). Ops.ExpF32x8 checks both.
inline f32x8 exp_f32x8(f32x8 x) {
  const f32x8 in = x;
  x = x < -87.0f ? f32x8{} - 87.0f : x;
  x = x > 88.0f ? f32x8{} + 88.0f : x;
  const f32x8 magic = f32x8{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const f32x8 n = (x * 1.44269504088896341f + magic) - magic;
  const f32x8 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  f32x8 p = 1.9875691500e-4f * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const i32x8 bits = (__builtin_convertvector(n, i32x8) + 127) << 23;
  f32x8 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const f32x8 y = p * scale;
  return in < -87.0f ? f32x8{} : y;
}

// tanh of each lane, within 2^-21 relative of std::tanh (Cephes' tanhf: an odd polynomial up to
// |x| = 0.625, where 1 - 2 / (exp(2|x|) + 1) would lose the small result to cancellation, that
// form above; exactly +-1 from |x| of about 9 on, infinities included, as exp_f32x8 clamps at
// 88). Ops.TanhF32x8 checks it.
inline f32x8 tanh_f32x8(f32x8 x) {
  const f32x8 ax = x < 0.0f ? -x : x;
  const f32x8 big = 1.0f - 2.0f / (exp_f32x8(ax + ax) + 1.0f);
  const f32x8 z = x * x;
  f32x8 p = -5.70498872745e-3f * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const f32x8 small = p * z * x + x;
  return ax > 0.625f ? (x < 0.0f ? -big : big) : small;
}

// y[i] = f(a[i], b[i]) for i < n, 8 at a time; the last few go through the same f, padded with
// zeros (with std::exp per element a 3072-wide MLP row of silu_mul took 17 us on one AVX2 core).
template <class F>
inline void map_f32x8(const float* a, const float* b, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kF32x8 <= n; i += kF32x8) store_f32x8(y + i, f(load_f32x8(a + i), load_f32x8(b + i)));
  if (i < n) {
    f32x8 va{}, vb{};
    const size_t bytes = size_t(n - i) * sizeof(float);
    std::memcpy(&va, a + i, bytes);
    std::memcpy(&vb, b + i, bytes);
    const f32x8 r = f(va, vb);
    std::memcpy(y + i, &r, bytes);
  }
}

// y = tanh(x / cap) * cap for n values; y may alias x.
inline void softcap_f32(const float* x, float* y, int64_t n, float cap) {
  map_f32x8(x, x, y, n, [cap](f32x8 v, f32x8) { return tanh_f32x8(v / cap) * cap; });
}

// y = silu(gate) * up = gate / (1 + exp(-gate)) * up. exp_f32x8's clamping keeps the limits:
// gate > 87 gives gate * up, and gate < -88 gives about -0.
template <class Ops>
void silu_mul_impl(const float* gate, const float* up, float* y, int64_t n, ThreadPool& pool) {
  pool.parallel_for(
      n,
      [&](int64_t b, int64_t e, int) {
        map_f32x8(gate + b, up + b, y + b, e - b,
                  [](f32x8 g, f32x8 u) { return g / (1.0f + exp_f32x8(-g)) * u; });
      },
      kElementwiseGrain);
}

// y = gelu_tanh(gate) * up. 0.5 g (1 + tanh(t)) = g / (1 + exp(-2t)): the same form as silu's,
// which for negative g keeps its relative accuracy where 1 + tanh(t) would cancel. 2t =
// g (2 sqrt(2 / pi) + 2 sqrt(2 / pi) 0.044715 g^2); the limits are silu's (g for large g, about
// -0 for very negative g, also when g^2 overflows).
template <class Ops>
void gelu_tanh_mul_impl(const float* gate, const float* up, float* y, int64_t n, ThreadPool& pool) {
  pool.parallel_for(
      n,
      [&](int64_t b, int64_t e, int) {
        map_f32x8(gate + b, up + b, y + b, e - b, [](f32x8 g, f32x8 u) {
          const f32x8 t2 = g * (1.5957691216057308f + 0.0713548162726f * (g * g));
          return g / (1.0f + exp_f32x8(-t2)) * u;
        });
      },
      kElementwiseGrain);
}

template <class Ops>
void softcap_impl(const float* x, float cap, float* y, int64_t n, ThreadPool& pool) {
  pool.parallel_for(
      n, [&](int64_t b, int64_t e, int) { softcap_f32(x + b, y + b, e - b, cap); },
      kElementwiseGrain);
}

// Query rows handled together against one KV head: each key and value row is loaded (and
// widened from bf16) once for all of them.
constexpr int kQuerySet = 4;

// 16 values of a value row as two f32 vectors, and back. bf16 rows are widened without
// shuffles (GCC 12 lowers a generic 8 x u16 -> 8 x i32 conversion to 5 instructions on AVX2,
// against 2 here for 16 values): the 32-bit lane holding values 2i and 2i+1 gives 2i after a
// left shift by 16 and 2i+1 after masking the low half, so the vectors hold the even and the odd
// columns, interleaved again when stored.
inline void load_cols16(const uint16_t* p, f32x8& a, f32x8& b) {
  i32x8 w;
  std::memcpy(&w, p, sizeof w);
  const i32x8 even = w << 16, odd = w & int32_t(0xffff0000u);
  std::memcpy(&a, &even, sizeof a);
  std::memcpy(&b, &odd, sizeof b);
}
inline void store_cols16(float* out, f32x8 even, f32x8 odd, uint16_t) {
  store_f32x8(out, __builtin_shufflevector(even, odd, 0, 8, 1, 9, 2, 10, 3, 11));
  store_f32x8(out + 8, __builtin_shufflevector(even, odd, 4, 12, 5, 13, 6, 14, 7, 15));
}
inline void load_cols16(const float* p, f32x8& a, f32x8& b) {
  a = load_f32x8(p);
  b = load_f32x8(p + 8);
}
inline void store_cols16(float* out, f32x8 a, f32x8 b, float) {
  store_f32x8(out, a);
  store_f32x8(out + 8, b);
}

// The key or value rows of one KV head that attention reads, row j counted from the first slot
// read. A static cache's rows lie one after another. A paged pool's rows are reached through one
// pointer per slot, laid out from the block table for each unit of work, so that the pool is read
// where it lies: copying every row's keys and values out of their blocks at each step cost as
// much memory traffic as the attention itself.
template <class KV>
struct DenseRows {
  using Value = KV;
  const KV* base;
  int64_t D;
  const KV* operator[](int64_t j) const { return base + j * D; }
  DenseRows from(int64_t j) const { return {base + j * D, D}; }
  void prefetch(int64_t j, int64_t n) const {  // rows [j, j + n)
    const char* p = reinterpret_cast<const char*>(base + j * D);
    for (int64_t b = 0; b < n * D * int64_t(sizeof(KV)); b += 64) __builtin_prefetch(p + b);
  }
};
template <class KV>
struct PagedRows {
  using Value = KV;
  const KV* const* rows;  // slot j's row at rows[j - first]
  int64_t first;
  int64_t D;
  const KV* operator[](int64_t j) const { return rows[j - first]; }
  PagedRows from(int64_t j) const { return {rows, first - j, D}; }
  void prefetch(int64_t j, int64_t n) const {
    for (int64_t r = j; r < j + n; ++r) {
      const char* p = reinterpret_cast<const char*>((*this)[r]);
      for (int64_t b = 0; b < D * int64_t(sizeof(KV)); b += 64) __builtin_prefetch(p + b);
    }
  }
};

// The row pointers of slots [lo, hi) of batch row b, KV head h, of a paged pool whose elements are
// KV, into rows: PagedRows{rows, lo}. `seq` is the sequence's row of the block table.
template <class KV>
PagedRows<KV> page_rows(const void* pool, const KvPages& pages, int64_t seq, int64_t h, int64_t Hkv,
                        int64_t D, int64_t lo, int64_t hi, const KV** rows) {
  const KV* base = static_cast<const KV*>(pool);
  const int64_t bs = pages.block_size;
  const int32_t* table = pages.blocks + seq * pages.table_blocks;
  for (int64_t j = lo; j < hi;) {
    const int64_t n = std::min(hi - j, bs - j % bs);  // the rest of j's block
    const KV* row = base + ((int64_t(table[j / bs]) * Hkv + h) * bs + j % bs) * D;
    for (int64_t i = 0; i < n; ++i) rows[j - lo + i] = row + i * D;
    j += n;
  }
  return {rows, lo, D};
}

// out[g] = inv[g] * sum over the slots j in `slots` of p[g * L + j] * v[j], for N rows.
//
// The slots go a chunk at a time, and within a chunk the columns go 16 (32 for N <= 2) at a
// time, with those columns of every row in registers for the whole chunk: a chunk's value rows
// (8 KiB of bf16 at head_dim 128) stay in L1 while each column block rereads them, and out is
// loaded and stored once per chunk. While the first column block of a chunk runs, the next
// chunk's rows are prefetched: its later column blocks would otherwise each walk memory with a
// stride of a whole row. Measured on one AVX2 core: adding into out in memory for every slot
// held prefill attention at 17 GFLOP/s; whole columns over all slots at once reached 49 GFLOP/s
// but, its column blocks striding through memory, read a 4096-slot context's K and V at 7 GB/s
// (10 GB/s in chunks).
//
// Two chunkings: where other query rows (prefill) read the same value rows again, 32 slots; where
// each value row is read by one call only (decode), chunks of 8 slots fetched 32 slots ahead, so
// that each burst of prefetches is a quarter as long. 28 layers of bf16 caches at used length
// 4096 (decode), the two builds alternated in one process (bench_ab): attention 1.06-1.29x faster
// on one core and 1.03-1.17x on two, with 2 or 4 query rows per KV head; prefill of 512 and 2048
// tokens was 2-4 % slower with the short chunks, so it keeps the long ones (bench/RESULTS.md).
struct SlotChunks {
  int64_t len;    // slots per chunk
  int64_t ahead;  // a chunk's first slot to the first slot whose rows it prefetches
};
constexpr SlotChunks kRereadChunks{32, 32}, kStreamedChunks{8, 32};

// Adds the chunk's sums into out[g][d, d + 16 kBlocks), which holds bf16 columns in the
// even/odd order of load_cols16 until weighted_sum puts them back in order.
//
// kRun: the chunk's slots are consecutive (slots[i] = slots[0] + i), as in decode and prefill
// without masked or underflowed slots, so the compiler steps pointers to the rows and
// probabilities instead of reading the slot list.
template <int N, int kBlocks, bool kRun, class Rows>
inline void weighted_sum_cols(const float* p, int64_t L, const int32_t* slots, int64_t n,
                              const int32_t* prefetch, int64_t n_prefetch, Rows v, int64_t D,
                              int64_t d, float* const* out_rows) {
  using KV = typename Rows::Value;
  float* out[N];  // a local copy: stores through out[g] could otherwise alias out_rows
  std::memcpy(out, out_rows, sizeof out);
  f32x8 acc[N][kBlocks][2];
#pragma GCC unroll 4
  for (int g = 0; g < N; ++g)
#pragma GCC unroll 4
    for (int c = 0; c < kBlocks; ++c) {
      acc[g][c][0] = load_f32x8(out[g] + d + 16 * c);
      acc[g][c][1] = load_f32x8(out[g] + d + 16 * c + 8);
    }
  const int64_t row_bytes = D * int64_t(sizeof(KV));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = kRun ? slots[0] + i : slots[i];
    if (i < n_prefetch)
      for (int64_t b = 0; b < row_bytes; b += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(v[prefetch[i]]) + b);
    f32x8 vj[kBlocks][2];
#pragma GCC unroll 4
    for (int c = 0; c < kBlocks; ++c) load_cols16(v[j] + d + 16 * c, vj[c][0], vj[c][1]);
#pragma GCC unroll 4
    for (int g = 0; g < N; ++g) {
      const float pg = p[g * L + j];
#pragma GCC unroll 4
      for (int c = 0; c < kBlocks; ++c) {
        acc[g][c][0] += pg * vj[c][0];
        acc[g][c][1] += pg * vj[c][1];
      }
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < N; ++g)
#pragma GCC unroll 4
    for (int c = 0; c < kBlocks; ++c) {
      store_f32x8(out[g] + d + 16 * c, acc[g][c][0]);
      store_f32x8(out[g] + d + 16 * c + 8, acc[g][c][1]);
    }
}

template <int N, class Rows>
void weighted_sum(const float* p, int64_t L, const int32_t* slots, int64_t n, Rows v, int64_t D,
                  const float* inv, SlotChunks chunks, float* const* out) {
  constexpr int kBlocks = N <= 2 ? 2 : 1;  // 8 accumulators either way
  const int64_t vec_cols = D / 16 * 16;
  for (int g = 0; g < N; ++g) std::fill(out[g], out[g] + D, 0.0f);
  for (int64_t c0 = 0; c0 < n; c0 += chunks.len) {
    const int64_t len = std::min(chunks.len, n - c0);
    // The rows to prefetch: [ahead, ahead + n_ahead) in slots, past the chunk.
    const int64_t ahead = std::min(n, c0 + chunks.ahead);
    const int64_t n_ahead = std::min(chunks.len, n - ahead);
    int64_t d = 0;
    // Consecutive slots (they increase): every column block takes the run path and the next loop
    // finds none left. Two loops rather than a test per block: with the test, prefill attention
    // ran 0.96x (median of 6 alternated bench_ab runs, 512 queries).
    if (slots[c0 + len - 1] - slots[c0] == len - 1)
      for (; d + 16 * kBlocks <= vec_cols; d += 16 * kBlocks)
        weighted_sum_cols<N, kBlocks, true>(p, L, slots + c0, len, slots + ahead,
                                            d == 0 ? n_ahead : 0, v, D, d, out);
    for (; d + 16 * kBlocks <= vec_cols; d += 16 * kBlocks)
      weighted_sum_cols<N, kBlocks, false>(p, L, slots + c0, len, slots + ahead,
                                           d == 0 ? n_ahead : 0, v, D, d, out);
    for (; d < vec_cols; d += 16)
      weighted_sum_cols<N, 1, false>(p, L, slots + c0, len, slots + ahead, d == 0 ? n_ahead : 0, v,
                                     D, d, out);
    for (; d < D; ++d)
      for (int g = 0; g < N; ++g)
        for (int64_t i = c0; i < c0 + len; ++i)
          out[g][d] += p[g * L + slots[i]] * value_f32(v[slots[i]][d]);
  }
  // Columns back in order (bf16), scaled by 1 / sum.
  for (int g = 0; g < N; ++g) {
    for (int64_t d = 0; d < vec_cols; d += 16)
      store_cols16(out[g] + d, load_f32x8(out[g] + d) * inv[g], load_f32x8(out[g] + d + 8) * inv[g],
                   typename Rows::Value{});
    for (int64_t d = vec_cols; d < D; ++d) out[g][d] *= inv[g];
  }
}

// The sums of 4 vectors' lanes, in one vector (a transposing reduction: 4 adds for 4 sums).
inline f32x4 hsum4(f32x8 a0, f32x8 a1, f32x8 a2, f32x8 a3) {
  const f32x8 u0 = __builtin_shufflevector(a0, a1, 0, 8, 2, 10, 4, 12, 6, 14) +
                   __builtin_shufflevector(a0, a1, 1, 9, 3, 11, 5, 13, 7, 15);
  const f32x8 u1 = __builtin_shufflevector(a2, a3, 0, 8, 2, 10, 4, 12, 6, 14) +
                   __builtin_shufflevector(a2, a3, 1, 9, 3, 11, 5, 13, 7, 15);
  const f32x8 v = __builtin_shufflevector(u0, u1, 0, 1, 8, 9, 4, 5, 12, 13) +
                  __builtin_shufflevector(u0, u1, 2, 3, 10, 11, 6, 7, 14, 15);
  return __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
}

// x (n values) with each full block of blk values reordered as its even then its odd values
// (the order in which bf16 pairs widen without shuffles); the tail stays in order.
inline void pack_even_odd(const float* x, int64_t n, int64_t blk, float* out) {
  const int64_t full = n / blk * blk;
  for (int64_t b = 0; b < full; b += blk)
    for (int64_t i = 0; i < blk / 2; ++i) {
      out[b + i] = x[b + 2 * i];
      out[b + blk / 2 + i] = x[b + 2 * i + 1];
    }
  std::memcpy(out + full, x + full, size_t(n - full) * sizeof(float));
}

// A query row in the column order load_cols16 gives KV rows: per 16 columns the even then the
// odd ones for bf16, as is for f32.
inline void pack_query(const float* q, int64_t D, float* out, uint16_t) {
  pack_even_odd(q, D, 16, out);
}
inline void pack_query(const float* q, int64_t D, float* out, float) {
  std::memcpy(out, q, size_t(D) * sizeof(float));
}

// Keys scored per step for N query rows: 2 * N * kKeyBlock sums, at most 8, so that each key
// vector is widened once for all rows and nothing spills (16 vector registers on AVX2).
template <int N>
constexpr int kKeyBlock = N == 1   ? 4
                          : N == 2 ? 2
                                   : 1;

// scores[g * L + b] = qp[g] . k[j + b] over the first D / 16 * 16 columns, for the KB consecutive
// key rows k[j .. j + KB); qp in pack_query's order. Each 16-column step widens KB key vectors once
// and feeds 2 * N * KB independent sums, and one transposing reduction gives 4 sums at a time
// instead of a horizontal sum per query row and key.
//
// The first and the second 8 columns of each step (bf16: the even and the odd ones) go to sums of
// their own, added at the end, whatever N and KB are: a score's bits then depend on the query row
// and the key alone, not on the rows that share its set or on whether its key falls in a whole
// block, so a prompt's rows get the same bits however its chunks cut it (the scalar target takes
// this kernel for prefill too).
template <int N, int KB, class Rows>
inline void key_block_scores(const float* const* qp, Rows k, int64_t j, int64_t D, int64_t L,
                             float* scores) {
  const int64_t vec_cols = D / 16 * 16;
  constexpr int kSums = (N * KB + 3) / 4 * 4;
  f32x8 acc[kSums] = {}, odd[kSums] = {};
  for (int64_t d = 0; d < vec_cols; d += 16) {
#pragma GCC unroll 8
    for (int b = 0; b < KB; ++b) {
      f32x8 e, o;
      load_cols16(k[j + b] + d, e, o);
#pragma GCC unroll 4
      for (int g = 0; g < N; ++g) {
        acc[g * KB + b] += e * load_f32x8(qp[g] + d);
        odd[g * KB + b] += o * load_f32x8(qp[g] + d + 8);
      }
    }
  }
  for (int i = 0; i < kSums; ++i) acc[i] += odd[i];
#pragma GCC unroll 4
  for (int i = 0; i < kSums; i += 4) {
    const f32x4 r = hsum4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
    if constexpr (KB % 4 == 0) {  // sums i .. i + 3: one query row, 4 consecutive keys
      std::memcpy(scores + i / KB * L + i % KB, &r, sizeof r);
    } else {
#pragma GCC unroll 4
      for (int l = 0; l < 4; ++l)
        if (i + l < N * KB) scores[(i + l) / KB * L + (i + l) % KB] = r[l];
    }
  }
}

// Scores of keys [0, L) into scores (N rows of stride L). The keys go KB at a time from two
// halves of the range in turn: two sequential streams, which one core's prefetchers fetch
// faster than one (bench_ab attention at used length 4096: 1.04-1.06x against one stream, four
// were no better than one), each block prefetching its stream's rows 8 keys (2 KiB of bf16 at
// head_dim 128) ahead. The last D % 16 columns are added in a pass of their own.
template <int N, class Rows>
void key_scores(const float* const* qp, Rows k, int64_t L, int64_t D, float* scores) {
  constexpr int KB = kKeyBlock<N>;
  auto block = [&](int64_t j, int64_t end) {
    if (j + KB + 8 <= end) k.prefetch(j + 8, KB);
    key_block_scores<N, KB>(qp, k, j, D, L, scores + j);
  };
  const int64_t half = L / KB / 2 * KB;
  for (int64_t j = 0; j < half; j += KB) {
    block(j, half);
    block(half + j, 2 * half);
  }
  int64_t j = 2 * half;
  for (; j + KB <= L; j += KB) block(j, L);
  for (; j < L; ++j) key_block_scores<N, 1>(qp, k, j, D, L, scores + j);
  if (D % 16)
    for (int64_t i = 0; i < L; ++i)
      for (int g = 0; g < N; ++g)
        for (int64_t d = D / 16 * 16; d < D; ++d)
          scores[g * L + i] += qp[g][d] * value_f32(k[i][d]);
}

// [lo, hi): the union of n rows' slot ranges [first[r], len[r]) (each starting at or before the
// others' ends, as consecutive queries' do).
inline std::pair<int64_t, int64_t> slot_union(const int64_t* first, const int64_t* len, int64_t n) {
  int64_t lo = first[0], hi = 0;
  for (int64_t r = 0; r < n; ++r) {
    lo = std::min(lo, first[r]);
    hi = std::max(hi, len[r]);
  }
  return {lo, hi};
}

// One row of raw scores q . k of slots [0, L) (counted from the first slot read) made into
// unnormalised probabilities in place: the scale, the soft cap, -inf outside [b, e) (the window
// and the causal limit) and where the mask is 0, then exp(s - max) with the row's max subtracted
// so that large logits cannot overflow. Returns their sum, plus exp(sink - max) for the row's
// attention sink (-inf: none), which also counts in the max; a row that sees no key gets zeros
// and 0. Shared by the row-set kernel below and the x86 targets' blocked prefill attention.
//
// The sum runs in kF32x8 lanes fixed by the slot: row[j] is slot `first_slot + j` and goes to lane
// (first_slot + j) % kF32x8. A call's first slot is the earliest window start of the rows that
// share it, so with lanes counted from the row's start a row's sum, and its bits, would depend on
// those rows: a prompt's chunk after a prefix hit (or cut elsewhere) would not give the whole
// prompt's bits with a sliding window.
inline float row_probabilities(float* row, int64_t L, int64_t b, int64_t e, const int32_t* mask,
                               float scale, float softcap, int64_t first_slot, float sink) {
  for (int64_t i = b; i < e; ++i) row[i] *= scale;
  // The soft cap costs nothing measurable in decode (K and V reads dominate) and 7-12 % of
  // prefill attention (512 queries over 1024 slots, same heads, alternated in one process).
  if (softcap > 0.0f) softcap_f32(row + b, row + b, e - b, softcap);
  std::fill(row, row + b, -INFINITY);      // before the window
  std::fill(row + e, row + L, -INFINITY);  // causal
  if (mask)
    for (int64_t i = b; i < e; ++i)
      if (mask[i] == 0) row[i] = -INFINITY;
  const float key_max = max_f32(row + b, e - b);
  if (key_max == -INFINITY) {
    std::fill(row, row + L, 0.0f);
    return 0.0f;
  }
  const float mx = std::max(key_max, sink);
  f32x8 acc{};
  // The slots before the first whole lane group, in their lanes (the others -inf: exp 0).
  const int64_t lane = first_slot % kF32x8;
  int64_t j = lane == 0 ? 0 : std::min(L, kF32x8 - lane);
  if (j > 0) {
    f32x8 x = f32x8{} - INFINITY;
    std::memcpy(reinterpret_cast<float*>(&x) + lane, row, size_t(j) * sizeof(float));
    x = exp_f32x8(x - mx);
    std::memcpy(row, reinterpret_cast<const float*>(&x) + lane, size_t(j) * sizeof(float));
    acc += x;
  }
  for (; j + kF32x8 <= L; j += kF32x8) {
    const f32x8 x = exp_f32x8(load_f32x8(row + j) - mx);
    store_f32x8(row + j, x);
    acc += x;
  }
  if (j < L) {  // the last few scores through the same exp, padded with -inf (exp 0)
    f32x8 x = f32x8{} - INFINITY;
    std::memcpy(&x, row + j, size_t(L - j) * sizeof(float));
    x = exp_f32x8(x - mx);
    std::memcpy(row + j, &x, size_t(L - j) * sizeof(float));
    acc += x;
  }
  // Without a sink the sum keeps its bits: exp(-inf) adds 0.
  return hsum_f32x8(acc) + std::exp(sink - mx);
}

// N query rows sharing one KV head; row g sees slots [first[g], len[g]) where mask is non-zero,
// with the attention sink sink[g] (-inf: none). Two passes (scores, then the weighted sum of
// values) with each row's max subtracted before exp so large logits cannot overflow. Scratch:
// scores (N, max len), slots (max len), packed (N, D).
template <int N, class Rows>
void attend_set(const float* const* q, const int64_t* first, const int64_t* len, const float* sink,
                Rows k, Rows v, const int32_t* mask, int64_t D, float scale, float softcap,
                float* scores, int32_t* slots, float* packed, SlotChunks chunks,
                float* const* out) {
  // Only slots [lo, hi), the union of the rows' ranges, are read (a sliding window bounds lo);
  // from here on k, v, mask, scores and slot numbers count from lo. Decode over 28 layers of
  // bf16 caches at used length 4096 (16 query, 8 KV heads of 128, one AVX-512 core of a shared
  // host): 29 ms with a window of 1024 against 124 ms without.
  const auto [lo, hi] = slot_union(first, len, N);
  k = k.from(lo);
  v = v.from(lo);
  if (mask) mask += lo;
  const int64_t L = hi - lo;
  float sum[N];
  // Raw scores of every slot (masked ones too, so that key blocks stay whole; their scores are
  // replaced below), then the scale, the soft cap, the window, the causal limit and the mask.
  float* qp[N];
  for (int g = 0; g < N; ++g) {
    qp[g] = packed + g * D;
    pack_query(q[g], D, qp[g], typename Rows::Value{});
  }
  key_scores<N>(qp, k, L, D, scores);
  // Probabilities in place of the scores, and the slots that any row attends to: a masked slot's
  // value row is never read.
  for (int g = 0; g < N; ++g)
    sum[g] = row_probabilities(scores + g * L, L, first[g] - lo, len[g] - lo, mask, scale, softcap,
                               lo, sink[g]);
  int64_t n = 0;
  for (int64_t j = 0; j < L; ++j) {
    bool any = false;
    for (int g = 0; g < N; ++g) any |= scores[g * L + j] != 0.0f;
    if (any) slots[n++] = int32_t(j);
  }
  float inv[N];
  for (int g = 0; g < N; ++g) inv[g] = sum[g] == 0.0f ? 0.0f : 1.0f / sum[g];  // no key: zeros
  weighted_sum<N>(scores, L, slots, n, v, D, inv, chunks, out);
}

// What attend_set needs besides its rows and the KV head's cache.
struct AttendArgs {
  const int32_t* mask;
  int64_t D;
  float scale, softcap;
  float *scores, *packed;
  int32_t* slots;
  SlotChunks chunks;
};

template <class Rows>
void attend_rows(int n, const float* const* q, const int64_t* first, const int64_t* len,
                 const float* sink, Rows k, Rows v, const AttendArgs& a, float* const* out) {
  auto run = [&](auto set) {
    constexpr int N = decltype(set)::value;
    attend_set<N>(q, first, len, sink, k, v, a.mask, a.D, a.scale, a.softcap, a.scores, a.slots,
                  a.packed, a.chunks, out);
  };
  switch (n) {
    case 4:
      return run(std::integral_constant<int, 4>{});
    case 3:
      return run(std::integral_constant<int, 3>{});
    case 2:
      return run(std::integral_constant<int, 2>{});
    default:
      return run(std::integral_constant<int, 1>{});
  }
}

// The query block that unit order i of `blocks` runs: 0, last, 1, last - 1, ... A causal query's
// cost grows with its position and the pool hands out contiguous chunks of units, so each chunk
// gets early and late blocks alike.
inline int64_t interleaved_block(int64_t i, int64_t blocks) {
  return i % 2 == 0 ? i / 2 : blocks - 1 - i / 2;
}

// Queries [t0, t1) of batch row b, all of one sequence: `seq`, its row of a paged pool's block
// table (b without pages).
struct QueryBlock {
  int64_t b, t0, t1, seq;
};

// A call's query blocks of at most tb queries, each batch row's in interleaved_block order. A
// row's queries are cut every tb from its start and, where a row packs several sequences
// (KvPages::rows), also where the sequence changes: a block reads one sequence's keys. A padding
// query (negative position) stays in the block before it; padding that opens a row is a block of
// row b's with no query. Without packing a block's queries do not depend on the other rows.
inline std::vector<QueryBlock> query_blocks(int64_t B, int64_t T, int64_t tb, const int32_t* pos,
                                            const KvPages* pages) {
  std::vector<QueryBlock> out;
  for (int64_t b = 0; b < B; ++b) {
    const size_t first = out.size();
    for (int64_t t = 0; t < T; ++t) {
      const bool live = !pos || pos[b * T + t] >= 0;
      const int64_t seq = pages && pages->rows && live ? pages->rows[b * T + t] : b;
      if (out.size() == first || out.back().t1 - out.back().t0 == tb ||
          (live && seq != out.back().seq))
        out.push_back({b, t, t, seq});
      ++out.back().t1;
    }
    // Interleaved in place: the row's blocks in the order 0, last, 1, last - 1, ...
    const std::vector<QueryBlock> row(out.begin() + int64_t(first), out.end());
    for (size_t i = 0; i < row.size(); ++i)
      out[first + i] = row[size_t(interleaved_block(int64_t(i), int64_t(row.size())))];
  }
  return out;
}

// Query t of batch row b sits at position pos[b, t] when positions are given (negative for
// padding), else at start + t; it sees slots [first_slot(p, window), p + 1): causal, and with a
// window only (p - window, p].
inline int64_t query_position(int64_t b, int64_t t, int64_t T, const int32_t* pos, int64_t start) {
  return pos ? pos[b * T + t] : start + t;
}
inline int64_t first_slot(int64_t p, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, p + 1 - window) : 0;
}

// f(row, first, len, sink) for the query rows of batch row b, queries [t0, t1), query heads of
// KV head kvh, in that order: row is the offset of its q and out rows, it sees slots
// [first, len), and sink is its head's attention sink (-inf without sinks). A padding query
// (negative position) gets zeros in out instead.
template <class F>
inline void for_each_query(int64_t b, int64_t t0, int64_t t1, int64_t kvh, int64_t group, int64_t T,
                           int64_t Hq, int64_t D, const int32_t* pos, int64_t start, int64_t window,
                           const float* sinks, float* out, F&& f) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      const int64_t row = ((b * T + t) * Hq + h) * D;
      const int64_t p = query_position(b, t, T, pos, start);
      if (p < 0) {
        std::fill(out + row, out + row + D, 0.0f);
        continue;
      }
      f(row, first_slot(p, window), p + 1, sinks ? sinks[h] : -INFINITY);
    }
}

// [lo, hi): the slots that queries [t0, t1) of batch row b read (for_each_query's ranges); empty
// when they are all padding.
inline std::pair<int64_t, int64_t> query_slots(int64_t b, int64_t t0, int64_t t1, int64_t T,
                                               const int32_t* pos, int64_t start, int64_t window) {
  int64_t lo = INT64_MAX, hi = 0;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t p = query_position(b, t, T, pos, start);
    if (p < 0) continue;
    lo = std::min(lo, first_slot(p, window));
    hi = std::max(hi, p + 1);
  }
  return hi > 0 ? std::pair{lo, hi} : std::pair<int64_t, int64_t>{0, 0};
}

// f(keys, values) with the rows of KV head kvh of sequence `seq`, as DenseRows of a static cache
// (B, Hkv, S, D) whose batch row it is, or with pages as PagedRows over the slots [lo, hi) of a
// paged pool (their pointers in this thread's kRowPointers scratch).
template <class F>
void with_kv_rows(const void* k_cache, const void* v_cache, DType cache_type, const KvPages* pages,
                  int64_t seq, int64_t kvh, int64_t Hkv, int64_t S, int64_t D, int64_t lo,
                  int64_t hi, F&& f) {
  auto run = [&](auto tag) {
    using KV = decltype(tag);
    const KV* k = static_cast<const KV*>(k_cache);
    const KV* v = static_cast<const KV*>(v_cache);
    if (!pages) {
      const int64_t base = (seq * Hkv + kvh) * S * D;
      return f(DenseRows<KV>{k + base, D}, DenseRows<KV>{v + base, D});
    }
    const KV** rows = static_cast<const KV**>(
        thread_scratch(Scratch::kRowPointers, size_t(2 * (hi - lo)) * sizeof(const KV*)));
    f(page_rows(k, *pages, seq, kvh, Hkv, D, lo, hi, rows),
      page_rows(v, *pages, seq, kvh, Hkv, D, lo, hi, rows + (hi - lo)));
  };
  if (cache_type == DType::bf16)
    run(uint16_t{});
  else
    run(float{});
}

template <class Ops>
void attention_impl(const float* q, const void* k_cache, const void* v_cache, DType cache_type,
                    const int32_t* key_mask, float* out, int64_t B, int64_t T, int64_t Hq,
                    int64_t Hkv, int64_t S, int64_t D, int64_t start, float scale, int64_t window,
                    float softcap, const float* sinks, const int32_t* pos, const KvPages* pages,
                    ThreadPool& pool) {
  const int64_t group = Hq / Hkv;
  // Slots a query can reach: below start + T, or below S when positions are given.
  const int64_t reach = pos ? S : start + T;
  // A unit is one KV head of one batch row and a block of tb consecutive queries: its
  // tb * group query rows go through attend_set kQuerySet at a time. Units are ordered
  // (b, block', kv head) with block' interleaving early and late blocks (0, last, 1, ...)
  // because a causal query's cost grows with t and the pool hands out contiguous chunks.
  const int64_t tb = std::max<int64_t>(1, kQuerySet / group);
  const std::vector<QueryBlock> blocks = query_blocks(B, T, tb, pos, pages);
  // One set holds all of a head's query rows: each value row is read once, from memory.
  const SlotChunks chunks = T * group <= kQuerySet ? kStreamedChunks : kRereadChunks;
  pool.parallel_for(int64_t(blocks.size()) * Hkv, [&](int64_t lo, int64_t hi, int) {
    AttendArgs args{.mask = nullptr,
                    .D = D,
                    .scale = scale,
                    .softcap = softcap,
                    .scores = thread_scratch<float>(Scratch::kScores, size_t(kQuerySet * reach)),
                    .packed = thread_scratch<float>(Scratch::kQueries, size_t(kQuerySet * D)),
                    .slots = thread_scratch<int32_t>(Scratch::kSlots, size_t(reach)),
                    .chunks = chunks};
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t kvh = u % Hkv;
      // Plain variables: the lambda below captures them (see attention_x86).
      const QueryBlock& qb = blocks[size_t(u / Hkv)];
      const int64_t b = qb.b, t0 = qb.t0, t1 = qb.t1;
      args.mask = key_mask ? key_mask + b * S : nullptr;
      const auto [slot_lo, slot_hi] =
          pages ? query_slots(b, t0, t1, T, pos, start, window) : std::pair<int64_t, int64_t>{};
      with_kv_rows(k_cache, v_cache, cache_type, pages, qb.seq, kvh, Hkv, S, D, slot_lo, slot_hi,
                   [&](auto k, auto v) {
                     const float* qs[kQuerySet];
                     float* os[kQuerySet];
                     int64_t first[kQuerySet], len[kQuerySet];
                     float sink[kQuerySet];
                     int n = 0;
                     auto flush = [&] {
                       attend_rows(n, qs, first, len, sink, k, v, args, os);
                       n = 0;
                     };
                     for_each_query(
                         b, t0, t1, kvh, group, T, Hq, D, pos, start, window, sinks, out,
                         [&](int64_t row, int64_t row_first, int64_t row_len, float row_sink) {
                           qs[n] = q + row;
                           os[n] = out + row;
                           first[n] = row_first;
                           len[n] = row_len;
                           sink[n] = row_sink;
                           if (++n == kQuerySet) flush();
                         });
                     if (n > 0) flush();
                   });
    }
  });
}

// Builds a table from a target's linear kernels (and attention, where it has its own) and its
// vector primitives.
template <class Ops>
KernelTable make_table(decltype(KernelTable::linear) linear,
                       decltype(KernelTable::linear_int8) linear_int8,
                       decltype(KernelTable::quantize_int8) quantize_int8,
                       decltype(KernelTable::linear_int4) linear_int4,
                       decltype(KernelTable::quantize_int4) quantize_int4,
                       decltype(KernelTable::linear_mxfp4) linear_mxfp4,
                       decltype(KernelTable::attention) attention = &attention_impl<Ops>) {
  return KernelTable{linear,
                     linear_int8,
                     quantize_int8,
                     linear_int4,
                     quantize_int4,
                     linear_mxfp4,
                     &embedding_impl<Ops>,
                     &rms_norm_impl<Ops>,
                     &rope_impl<Ops>,
                     &silu_mul_impl<Ops>,
                     &gelu_tanh_mul_impl<Ops>,
                     &scale_impl<Ops>,
                     &softcap_impl<Ops>,
                     &add_impl<Ops>,
                     &cache_write_impl<Ops>,
                     attention,
                     &causal_conv1d_impl<Ops>,
                     &gated_delta_rule_impl<Ops>};
}

}  // namespace
}  // namespace tformers::cpu
