// Dispatch of the CPU kernels to the active target, and the scalar target: portable C++ compiled
// with the baseline flags only, written so the compiler can vectorize it (independent partial
// sums instead of one serial accumulator).
#include "backends/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "backends/cpu/kernels_impl.h"
#include "core/cpu_features.h"

namespace tformers::cpu {

namespace {

struct ScalarOps {
  static constexpr int kLanes = 8;
  template <class W>
  static float dot_t(const float* a, const W* b, int64_t n) {
    float acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * value_f32(b[i + l]);
    float s = 0.0f;
    for (int l = 0; l < kLanes; ++l) s += acc[l];
    for (; i < n; ++i) s += a[i] * value_f32(b[i]);
    return s;
  }
  static float sum_sq(const float* x, int64_t n) { return dot_t(x, x, n); }
};

// Up to kRows rows of x against one weight row at a time, so each weight row streamed from
// memory is used kRows times. scale (N), when given, multiplies each output channel before the
// bias is added (int8 weights).
template <class W, class B>
void linear_scalar_t(const float* x, const W* w, const float* scale, const B* bias, float* y,
                     int64_t M, int64_t N, int64_t K, ThreadPool& pool) {
  constexpr int kRows = 4;
  pool.parallel_for(
      N,
      [&](int64_t n0, int64_t n1, int) {
        for (int64_t m0 = 0; m0 < M; m0 += kRows) {
          const int rows = int(std::min<int64_t>(kRows, M - m0));
          for (int64_t n = n0; n < n1; ++n) {
            const W* wr = w + n * K;
            const float b = bias ? value_f32(bias[n]) : 0.0f;
            const float sc = scale ? scale[n] : 1.0f;
            for (int r = 0; r < rows; ++r)
              y[(m0 + r) * N + n] = ScalarOps::dot_t(x + (m0 + r) * K, wr, K) * sc + b;
          }
        }
      },
      16);
}

void linear_scalar(const float* x, const void* w, DType wt, const void* bias, float* y, int64_t M,
                   int64_t N, int64_t K, ThreadPool& pool, LinearRows) {
  if (wt == DType::f16) return linear_f16(x, w, bias, y, M, N, K, pool);
  if (wt == DType::bf16)
    linear_scalar_t(x, static_cast<const uint16_t*>(w), nullptr, static_cast<const uint16_t*>(bias),
                    y, M, N, K, pool);
  else
    linear_scalar_t(x, static_cast<const float*>(w), nullptr, static_cast<const float*>(bias), y, M,
                    N, K, pool);
}

void linear_int8_scalar(const float* x, const int8_t* w, const float* scale, const float* bias,
                        float* y, int64_t M, int64_t N, int64_t K, ThreadPool& pool, LinearRows) {
  const int64_t nb = int8_blocks(K);
  pool.parallel_for(
      N,
      [&](int64_t n0, int64_t n1, int) {
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = n0; n < n1; ++n) {
            float acc = bias ? bias[n] : 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
              const int64_t k0 = b * kInt8Block, len = std::min(kInt8Block, K - k0);
              acc += scale[n * nb + b] * ScalarOps::dot_t(x + m * K + k0, w + n * K + k0, len);
            }
            y[m * N + n] = acc;
          }
      },
      16);
}

// One tile's 8 x 32 weights as exact f32 (an f16 scale times a code difference of at most 16
// fits f32's mantissa): out[j * 32 + i] is row j's weight at k = 32 b + i.
void dequantize_tile(const uint8_t* tile, const uint16_t* scale, const uint8_t* zero, float* out) {
  for (int64_t j = 0; j < kInt4Rows; ++j) {
    const float s = f16_to_f32(scale[j]), z = zero ? float(zero[j]) : 8.0f;
    for (int64_t v = 0; v < 4; ++v)
      for (int64_t t = 0; t < 4; ++t) {
        const uint8_t byte = tile[32 * v + 4 * j + t];
        out[j * kInt4Block + 8 * v + t] = s * (float(byte & 15) - z);
        out[j * kInt4Block + 8 * v + 4 + t] = s * (float(byte >> 4) - z);
      }
  }
}

// Tile by tile: each tile is dequantized once and used by every row of x; y accumulates the
// blocks' dot products in block order, then gets the bias.
void linear_int4_scalar(const float* x, const uint8_t* w, const uint16_t* scale,
                        const uint8_t* zero, const float* bias, float* y, int64_t M, int64_t N,
                        int64_t K, ThreadPool& pool, LinearRows) {
  const int64_t nb = int4_blocks(K);
  pool.parallel_for(
      N / kInt4Rows,
      [&](int64_t g0, int64_t g1, int) {
        float tile[kInt4Rows * kInt4Block];
        for (int64_t g = g0; g < g1; ++g) {
          const int64_t n0 = g * kInt4Rows;
          for (int64_t m = 0; m < M; ++m)
            std::fill(y + m * N + n0, y + m * N + n0 + kInt4Rows, 0.0f);
          for (int64_t b = 0; b < nb; ++b) {
            const int64_t at = g * nb + b, k0 = b * kInt4Block;
            dequantize_tile(w + at * kInt4TileBytes, scale + at * kInt4Rows,
                            zero ? zero + at * kInt4Rows : nullptr, tile);
            const int64_t len = std::min(kInt4Block, K - k0);
            for (int64_t m = 0; m < M; ++m)
              for (int64_t j = 0; j < kInt4Rows; ++j)
                y[m * N + n0 + j] += ScalarOps::dot_t(x + m * K + k0, tile + j * kInt4Block, len);
          }
          if (bias)
            for (int64_t m = 0; m < M; ++m)
              for (int64_t j = 0; j < kInt4Rows; ++j) y[m * N + n0 + j] += bias[n0 + j];
        }
      },
      2);
}

// One weight row at a time: each block is decoded once to its exact e2m1 values and used by
// every row of x, whose sum gets the block's dot product times the block's scale; y accumulates
// the blocks in order, then gets the bias.
void linear_mxfp4_scalar(const float* x, const uint8_t* codes, const uint8_t* scales,
                         const float* bias, float* y, int64_t M, int64_t N, int64_t K,
                         ThreadPool& pool, LinearRows) {
  const int64_t nb = K / kMxfp4Block;
  pool.parallel_for(
      N,
      [&](int64_t n0, int64_t n1, int) {
        float w[kMxfp4Block];
        for (int64_t n = n0; n < n1; ++n) {
          for (int64_t m = 0; m < M; ++m) y[m * N + n] = 0.0f;
          for (int64_t b = 0; b < nb; ++b) {
            const uint8_t* block = codes + (n * nb + b) * (kMxfp4Block / 2);
            for (int64_t i = 0; i < kMxfp4Block / 2; ++i) {
              w[2 * i] = e2m1_to_f32(block[i] & 15);
              w[2 * i + 1] = e2m1_to_f32(block[i] >> 4);
            }
            const float s = e8m0_to_f32(scales[n * nb + b]);
            for (int64_t m = 0; m < M; ++m)
              y[m * N + n] += ScalarOps::dot_t(x + m * K + b * kMxfp4Block, w, kMxfp4Block) * s;
          }
          if (bias)
            for (int64_t m = 0; m < M; ++m) y[m * N + n] += bias[n];
        }
      },
      4);
}

const KernelTable& table() { return kernels_for(active_target()); }

}  // namespace

const KernelTable& kernels_for(Target t) {
  switch (t) {
    case Target::kAMX:
      return amx_kernels();
    case Target::kAVX512BF16:
      return avx512bf16_kernels();
    case Target::kAVX512:
      return avx512_kernels();
    case Target::kAVX2:
      return avx2_kernels();
    case Target::kScalar:
      break;
  }
  return scalar_kernels();
}

void* thread_scratch(Scratch slot, size_t bytes) {
  struct Buffer {
    void* data = nullptr;
    size_t size = 0;
    ~Buffer() { ::operator delete(data, std::align_val_t(64)); }
  };
  thread_local Buffer buffers[int(Scratch::kCount)];
  Buffer& b = buffers[int(slot)];
  if (b.size < bytes) {
    ::operator delete(b.data, std::align_val_t(64));
    b.data = nullptr;  // stays valid if the allocation below throws
    b.size = 0;
    b.data = ::operator new(bytes, std::align_val_t(64));
    b.size = bytes;
  }
  return b.data;
}

const KernelTable& scalar_kernels() {
  static const KernelTable t =
      make_table<ScalarOps>(&linear_scalar, &linear_int8_scalar, &quantize_int8_scalar,
                            &linear_int4_scalar, &quantize_int4_scalar, &linear_mxfp4_scalar);
  return t;
}

void linear(const float* x, const void* w, DType wt, const void* bias, float* y, int64_t M,
            int64_t N, int64_t K, ThreadPool& pool, LinearRows rows) {
  table().linear(x, w, wt, bias, y, M, N, K, pool, rows);
}
void linear_int8(const float* x, const int8_t* w, const float* scale, const float* bias, float* y,
                 int64_t M, int64_t N, int64_t K, ThreadPool& pool, LinearRows rows) {
  table().linear_int8(x, w, scale, bias, y, M, N, K, pool, rows);
}

void linear_int4(const float* x, const uint8_t* w, const uint16_t* scale, const uint8_t* zero,
                 const float* bias, float* y, int64_t M, int64_t N, int64_t K, ThreadPool& pool,
                 LinearRows rows) {
  table().linear_int4(x, w, scale, zero, bias, y, M, N, K, pool, rows);
}

void linear_mxfp4(const float* x, const uint8_t* codes, const uint8_t* scales, const float* bias,
                  float* y, int64_t M, int64_t N, int64_t K, ThreadPool& pool, LinearRows rows) {
  table().linear_mxfp4(x, codes, scales, bias, y, M, N, K, pool, rows);
}

void put_int4_row(const uint8_t* codes, int64_t j, uint8_t* tile) {
  for (int64_t v = 0; v < 4; ++v)
    for (int64_t t = 0; t < 4; ++t)
      tile[32 * v + 4 * j + t] = uint8_t(codes[8 * v + t] | codes[8 * v + 4 + t] << 4);
}

void pack_int4_tiles(const uint8_t* codes, int64_t stride, int64_t K, uint8_t* tiles) {
  for (int64_t b = 0; b < int4_blocks(K); ++b, tiles += kInt4TileBytes)
    for (int64_t j = 0; j < kInt4Rows; ++j) {
      uint8_t block[kInt4Block] = {};
      const int64_t k0 = b * kInt4Block;
      std::copy(codes + j * stride + k0, codes + j * stride + std::min(K, k0 + kInt4Block), block);
      put_int4_row(block, j, tiles);
    }
}

void quantize_int4_block(const float* v, int64_t len, uint8_t* codes, uint16_t* scale) {
  float m = 0.0f;
  for (int64_t i = 0; i < len; ++i)
    if (std::fabs(v[i]) > std::fabs(m)) m = v[i];
  *scale = f32_to_f16(m / -8.0f);
  const float d = f16_to_f32(*scale);
  // |v / d| <= 8 up to the scale's rounding, so adding and subtracting 1.5 * 2^23 rounds to the
  // nearest integer, ties to even (as quantize_block_scalar).
  constexpr float kRound = 12582912.0f;
  for (int64_t i = 0; i < len; ++i) {
    const float r = d == 0.0f ? 0.0f : (v[i] / d + kRound) - kRound;
    codes[i] = uint8_t(std::clamp(r, -8.0f, 7.0f) + 8.0f);
  }
  std::fill(codes + len, codes + kInt4Block, uint8_t(0));  // padding
}

void quantize_int4_scalar(const void* w, DType wt, uint8_t* tiles, uint16_t* scale, int64_t N,
                          int64_t K, ThreadPool& pool) {
  const int64_t nb = int4_blocks(K), es = int64_t(dtype_size(wt));
  pool.parallel_for(N, [&](int64_t n0, int64_t n1, int) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t k0 = b * kInt4Block, len = std::min(kInt4Block, K - k0);
        float v[kInt4Block];
        convert(static_cast<const char*>(w) + (n * K + k0) * es, wt, v, DType::f32, size_t(len));
        uint8_t codes[kInt4Block];
        const int64_t at = (n / kInt4Rows) * nb + b;
        quantize_int4_block(v, len, codes, scale + at * kInt4Rows + n % kInt4Rows);
        put_int4_row(codes, n % kInt4Rows, tiles + at * kInt4TileBytes);
      }
  });
}

void quantize_int4(const void* w, DType wt, uint8_t* tiles, uint16_t* scale, int64_t N, int64_t K,
                   ThreadPool& pool) {
  table().quantize_int4(w, wt, tiles, scale, N, K, pool);
}

void quantize_block_scalar(const void* w, DType wt, int64_t len, int8_t* q, float* scale) {
  float v[kInt8Block];
  if (wt == DType::bf16)
    for (int64_t i = 0; i < len; ++i) v[i] = bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
  else
    std::memcpy(v, w, size_t(len) * sizeof(float));
  float amax = 0.0f;
  for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(v[i]));
  *scale = amax / 127.0f;
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  // |v * inv| <= 127 (up to rounding), so adding and subtracting 1.5 * 2^23 rounds to the nearest
  // integer, ties to even, in a form the compiler vectorizes.
  constexpr float kRound = 12582912.0f;
  for (int64_t i = 0; i < len; ++i) {
    const float r = (v[i] * inv + kRound) - kRound;
    q[i] = int8_t(std::clamp(r, -127.0f, 127.0f));
  }
}

void quantize_int8_scalar(const void* w, DType wt, int8_t* q, float* scale, int64_t N, int64_t K,
                          ThreadPool& pool) {
  const int64_t nb = int8_blocks(K), es = int64_t(dtype_size(wt));
  pool.parallel_for(N, [&](int64_t n0, int64_t n1, int) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t k0 = b * kInt8Block;
        quantize_block_scalar(static_cast<const char*>(w) + (n * K + k0) * es, wt,
                              std::min(kInt8Block, K - k0), q + n * K + k0, scale + n * nb + b);
      }
  });
}

void quantize_int8(const void* w, DType wt, int8_t* q, float* scale, int64_t N, int64_t K,
                   ThreadPool& pool) {
  table().quantize_int8(w, wt, q, scale, N, K, pool);
}

void embedding(const void* tbl, DType dt, const int32_t* ids, int64_t n, int64_t D, float* out,
               ThreadPool& pool) {
  table().embedding(tbl, dt, ids, n, D, out, pool);
}
void rms_norm(const float* x, const void* w, DType wt, float* y, int64_t M, int64_t D, float eps,
              bool unit_offset, ThreadPool& pool) {
  table().rms_norm(x, w, wt, y, M, D, eps, unit_offset, pool);
}
void rope(float* x, const int32_t* pos, const float* inv_freq, int64_t M, int64_t H, int64_t D,
          int64_t rotary_dim, bool interleaved, ThreadPool& pool) {
  table().rope(x, pos, inv_freq, M, H, D, rotary_dim, interleaved, pool);
}
void silu_mul(const float* gate, const float* up, float* y, int64_t n, ThreadPool& pool) {
  table().silu_mul(gate, up, y, n, pool);
}
void causal_conv1d(const float* x, const float* w, const RecurrentRows& rows, float* y, int64_t B,
                   int64_t T, int64_t C, int64_t K, ThreadPool& pool) {
  table().causal_conv1d(x, w, rows.state.data(), rows.fresh.data(), rows.real.data(), y, B, T, C, K,
                        pool);
}
void gated_delta_rule(const float* q, const float* k, const float* v, const float* g,
                      const float* beta, const RecurrentRows& rows, float* y, int64_t B, int64_t T,
                      int64_t Hk, int64_t H, int64_t Dk, int64_t Dv, ThreadPool& pool) {
  table().gated_delta_rule(q, k, v, g, beta, rows.state.data(), rows.fresh.data(), rows.real.data(),
                           y, B, T, Hk, H, Dk, Dv, pool);
}
void gelu_tanh_mul(const float* gate, const float* up, float* y, int64_t n, ThreadPool& pool) {
  table().gelu_tanh_mul(gate, up, y, n, pool);
}
void scale(const float* x, float factor, float* y, int64_t n, ThreadPool& pool) {
  table().scale(x, factor, y, n, pool);
}
void softcap(const float* x, float cap, float* y, int64_t n, ThreadPool& pool) {
  table().softcap(x, cap, y, n, pool);
}
void add(const float* a, const float* b, float* y, int64_t n, ThreadPool& pool) {
  table().add(a, b, y, n, pool);
}
void cache_write(void* cache, DType cache_type, const float* src, int64_t B, int64_t T, int64_t Hkv,
                 int64_t S, int64_t D, int64_t start, ThreadPool& pool) {
  table().cache_write(cache, cache_type, src, B, T, Hkv, S, D, start, pool);
}
void attention(const float* q, const void* k_cache, const void* v_cache, DType cache_type,
               const int32_t* key_mask, float* out, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
               int64_t S, int64_t D, int64_t start, float scale, int64_t window, float softcap,
               const float* sinks, ThreadPool& pool) {
  table().attention(q, k_cache, v_cache, cache_type, key_mask, out, B, T, Hq, Hkv, S, D, start,
                    scale, window, softcap, sinks, nullptr, nullptr, pool);
}
void attention(const float* q, const void* k_cache, const void* v_cache, DType cache_type,
               const int32_t* key_mask, float* out, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
               int64_t S, int64_t D, int64_t start, float scale, ThreadPool& pool) {
  attention(q, k_cache, v_cache, cache_type, key_mask, out, B, T, Hq, Hkv, S, D, start, scale, 0,
            0.0f, nullptr, pool);
}

void paged_cache_write(void* pool_data, DType cache_type, const float* src, const int32_t* table,
                       const int32_t* rows, const int32_t* pos, int64_t B, int64_t T, int64_t Hkv,
                       int64_t BS, int64_t MB, int64_t D, ThreadPool& pool) {
  // One unit is one (b, t, h) row of D values, as cache_write.
  pool.parallel_for(
      B * T * Hkv,
      [&](int64_t lo, int64_t hi, int) {
        for (int64_t u = lo; u < hi; ++u) {
          const int64_t h = u % Hkv, bt = u / Hkv, b = bt / T;
          const int64_t p = pos[bt];
          if (p < 0) continue;
          const int64_t seq = rows ? rows[bt] : b;
          const int64_t dst = ((int64_t(table[seq * MB + p / BS]) * Hkv + h) * BS + p % BS) * D;
          const float* s = src + u * D;
          if (cache_type == DType::bf16) {
            uint16_t* d = static_cast<uint16_t*>(pool_data) + dst;
            for (int64_t i = 0; i < D; ++i) d[i] = f32_to_bf16(s[i]);
          } else {
            std::memcpy(static_cast<float*>(pool_data) + dst, s, size_t(D) * sizeof(float));
          }
        }
      },
      std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(D, 1)));
}

void paged_attention(const float* q, const void* k_pool, const void* v_pool, DType cache_type,
                     const int32_t* blocks, const int32_t* rows, const int32_t* pos, float* out,
                     int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t BS, int64_t MB,
                     int64_t D, float scale, int64_t window, float softcap, const float* sinks,
                     ThreadPool& pool) {
  paged_attention_with(table(), q, k_pool, v_pool, cache_type, blocks, rows, pos, out, B, T, Hq,
                       Hkv, BS, MB, D, scale, window, softcap, sinks, pool);
}

void paged_attention(const float* q, const void* k_pool, const void* v_pool, DType cache_type,
                     const int32_t* blocks, const int32_t* pos, float* out, int64_t B, int64_t T,
                     int64_t Hq, int64_t Hkv, int64_t BS, int64_t MB, int64_t D, float scale,
                     int64_t window, float softcap, ThreadPool& pool) {
  paged_attention(q, k_pool, v_pool, cache_type, blocks, nullptr, pos, out, B, T, Hq, Hkv, BS, MB,
                  D, scale, window, softcap, nullptr, pool);
}

void paged_attention_with(const KernelTable& kernels, const float* q, const void* k_pool,
                          const void* v_pool, DType cache_type, const int32_t* blocks,
                          const int32_t* rows, const int32_t* pos, float* out, int64_t B, int64_t T,
                          int64_t Hq, int64_t Hkv, int64_t BS, int64_t MB, int64_t D, float scale,
                          int64_t window, float softcap, const float* sinks, ThreadPool& pool) {
  const KvPages pages{.blocks = blocks, .block_size = BS, .table_blocks = MB, .rows = rows};
  kernels.attention(q, k_pool, v_pool, cache_type, nullptr, out, B, T, Hq, Hkv, MB * BS, D, 0,
                    scale, window, softcap, sinks, pos, &pages, pool);
}

}  // namespace tformers::cpu
