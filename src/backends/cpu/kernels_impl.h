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
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backends/cpu/kernels.h"
#include "core/thread_pool.h"
#include "tformers/dtype.h"

namespace tformers::cpu {

struct KernelTable {
  void (*linear)(const float* x, const void* w, DType wt, const void* bias, float* y, int64_t M,
                 int64_t N, int64_t K, ThreadPool& pool);
  void (*embedding)(const void* table, DType dt, const int32_t* ids, int64_t n, int64_t D,
                    float* out, ThreadPool& pool);
  void (*rms_norm)(const float* x, const void* w, DType wt, float* y, int64_t M, int64_t D,
                   float eps, ThreadPool& pool);
  void (*rope)(float* x, const int32_t* pos, const float* inv_freq, int64_t M, int64_t H, int64_t D,
               ThreadPool& pool);
  void (*silu_mul)(const float* gate, const float* up, float* y, int64_t n, ThreadPool& pool);
  void (*add)(const float* a, const float* b, float* y, int64_t n, ThreadPool& pool);
  void (*cache_write)(void* cache, DType cache_type, const float* src, int64_t B, int64_t T,
                      int64_t Hkv, int64_t S, int64_t D, int64_t start, ThreadPool& pool);
  void (*attention)(const float* q, const void* k_cache, const void* v_cache, DType cache_type,
                    const int32_t* key_mask, float* out, int64_t B, int64_t T, int64_t Hq,
                    int64_t Hkv, int64_t S, int64_t D, int64_t start, float scale,
                    ThreadPool& pool);
};

// One table per target; only the ones the CPU supports are ever selected (kernels.cc).
const KernelTable& scalar_kernels();
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();
const KernelTable& avx512bf16_kernels();

// Per-thread scratch buffers that only grow (64-byte aligned), so steady-state calls allocate
// nothing. They live in kernels.cc, compiled for the baseline target, so that target files
// instantiate no std::vector code: the linker keeps one copy of each template instantiation and
// could hand an AVX-512-compiled one to baseline callers.
enum class Scratch { kScores, kRope, kPackedX, kPanel, kCount };
void* thread_scratch(Scratch slot, size_t bytes);
template <class T>
T* thread_scratch(Scratch slot, size_t n) {
  return static_cast<T*>(thread_scratch(slot, n * sizeof(T)));
}

namespace {

// Elementwise work below this many elements runs on the calling thread: waking the pool costs
// more than the work.
constexpr int64_t kElementwiseGrain = 1 << 14;

// ---- Shared kernel bodies. `Ops` supplies the target's vector primitives:
//   float dot(const float* a, const float* b, int64_t n)
//   float dot(const float* a, const uint16_t* b, int64_t n)      b holds bf16
//   void axpy(float a, const float* x, float* y, int64_t n)      y += a * x
//   void axpy(float a, const uint16_t* x, float* y, int64_t n)   x holds bf16
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
          } else {
            const float* src = static_cast<const float*>(table) + int64_t(ids[r]) * D;
            std::memcpy(o, src, size_t(D) * sizeof(float));
          }
        }
      },
      std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(D, 1)));
}

template <class Ops>
void rms_norm_impl(const float* x, const void* w, DType wt, float* y, int64_t M, int64_t D,
                   float eps, ThreadPool& pool) {
  pool.parallel_for(
      M,
      [&](int64_t b, int64_t e, int) {
        for (int64_t m = b; m < e; ++m) {
          const float* xr = x + m * D;
          float* yr = y + m * D;
          float inv = 1.0f / std::sqrt(Ops::sum_sq(xr, D) / float(D) + eps);
          if (wt == DType::bf16) {
            const uint16_t* wr = static_cast<const uint16_t*>(w);
            for (int64_t i = 0; i < D; ++i) yr[i] = xr[i] * inv * bf16_to_f32(wr[i]);
          } else {
            const float* wr = static_cast<const float*>(w);
            for (int64_t i = 0; i < D; ++i) yr[i] = xr[i] * inv * wr[i];
          }
        }
      },
      std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(D, 1)));
}

template <class Ops>
void rope_impl(float* x, const int32_t* pos, const float* inv_freq, int64_t M, int64_t H, int64_t D,
               ThreadPool& pool) {
  const int64_t half = D / 2;
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
            for (int64_t i = 0; i < half; ++i) {
              const float x1 = r[i], x2 = r[half + i];
              r[i] = x1 * cs[i] - x2 * cs[half + i];
              r[half + i] = x2 * cs[i] + x1 * cs[half + i];
            }
          }
        }
      },
      std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(H * D, 1)));
}

template <class Ops>
void silu_mul_impl(const float* gate, const float* up, float* y, int64_t n, ThreadPool& pool) {
  pool.parallel_for(
      n,
      [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) {
          const float g = gate[i];
          y[i] = g / (1.0f + std::exp(-g)) * up[i];
        }
      },
      kElementwiseGrain);
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

// One query row against its visible keys: two passes (scores, then the weighted sum of values)
// with the max subtracted before exp so large logits cannot overflow.
template <class Ops, class KV>
void attend_one(const float* q, const KV* k, const KV* v, const int32_t* mask, int64_t L, int64_t D,
                float scale, float* scores, float* out) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < L; ++j) {
    if (mask && mask[j] == 0) {
      scores[j] = -INFINITY;
      continue;
    }
    const float s = Ops::dot(q, k + j * D, D) * scale;
    scores[j] = s;
    mx = std::max(mx, s);
  }
  std::fill(out, out + D, 0.0f);
  if (mx == -INFINITY) return;  // sees no key: zeros by contract
  float sum = 0.0f;
  for (int64_t j = 0; j < L; ++j) {
    if (scores[j] == -INFINITY) continue;
    const float p = std::exp(scores[j] - mx);
    sum += p;
    Ops::axpy(p, v + j * D, out, D);
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < D; ++i) out[i] *= inv;
}

template <class Ops>
void attention_impl(const float* q, const void* k_cache, const void* v_cache, DType cache_type,
                    const int32_t* key_mask, float* out, int64_t B, int64_t T, int64_t Hq,
                    int64_t Hkv, int64_t S, int64_t D, int64_t start, float scale,
                    ThreadPool& pool) {
  const int64_t group = Hq / Hkv;
  // Units are (b, t', h) with h innermost, so one thread handles the heads of a KV group
  // together and re-reads that group's keys from cache. t' interleaves early and late queries
  // (0, T-1, 1, T-2, ...) because a causal query's cost grows with t and the pool hands out
  // contiguous chunks.
  pool.parallel_for(B * T * Hq, [&](int64_t lo, int64_t hi, int) {
    float* scores = thread_scratch<float>(Scratch::kScores, size_t(start + T));
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t h = u % Hq, tt = (u / Hq) % T, b = u / (Hq * T);
      const int64_t t = (tt % 2 == 0) ? tt / 2 : T - 1 - tt / 2;
      const int64_t kvh = h / group;
      const int64_t L = start + t + 1;  // causal: slots [0, start + t]
      const float* qr = q + ((b * T + t) * Hq + h) * D;
      float* o = out + ((b * T + t) * Hq + h) * D;
      const int32_t* mask = key_mask ? key_mask + b * S : nullptr;
      const int64_t base = (b * Hkv + kvh) * S * D;
      if (cache_type == DType::bf16) {
        attend_one<Ops>(qr, static_cast<const uint16_t*>(k_cache) + base,
                        static_cast<const uint16_t*>(v_cache) + base, mask, L, D, scale, scores, o);
      } else {
        attend_one<Ops>(qr, static_cast<const float*>(k_cache) + base,
                        static_cast<const float*>(v_cache) + base, mask, L, D, scale, scores, o);
      }
    }
  });
}

// Builds a table from a target's linear kernel and its vector primitives.
template <class Ops>
KernelTable make_table(decltype(KernelTable::linear) linear) {
  return KernelTable{linear,
                     &embedding_impl<Ops>,
                     &rms_norm_impl<Ops>,
                     &rope_impl<Ops>,
                     &silu_mul_impl<Ops>,
                     &add_impl<Ops>,
                     &cache_write_impl<Ops>,
                     &attention_impl<Ops>};
}

}  // namespace
}  // namespace tformers::cpu
