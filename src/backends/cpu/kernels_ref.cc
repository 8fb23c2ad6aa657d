// Scalar references for every CPU kernel: the ground truth of the op-consistency tests. They are
// written for clarity, not speed, and accumulate in double so that they sit closer to the exact
// result than any optimized target; the tests then measure each target's own rounding error.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels.h"

namespace tformers::cpu::ref {

namespace {
// Element i of a float tensor stored as f32, bf16 or f16.
double load(const void* p, DType t, int64_t i) {
  if (t == DType::bf16) return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  if (t == DType::f16) return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
}  // namespace

void linear(const float* x, const void* w, DType wt, const void* bias, float* y, int64_t M,
            int64_t N, int64_t K) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double acc = bias ? load(bias, wt, n) : 0.0;
      for (int64_t k = 0; k < K; ++k) acc += double(x[m * K + k]) * load(w, wt, n * K + k);
      y[m * N + n] = float(acc);
    }
  }
}

void linear_int8(const float* x, const int8_t* w, const float* scale, const float* bias, float* y,
                 int64_t M, int64_t N, int64_t K) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double acc = bias ? double(bias[n]) : 0.0;
      for (int64_t k = 0; k < K; ++k)
        acc += double(x[m * K + k]) * double(w[n * K + k]) *
               double(scale[n * int8_blocks(K) + k / kInt8Block]);
      y[m * N + n] = float(acc);
    }
  }
}

void linear_int4(const float* x, const uint8_t* w, const uint16_t* scale, const uint8_t* zero,
                 const float* bias, float* y, int64_t M, int64_t N, int64_t K) {
  const int64_t nb = int4_blocks(K);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double acc = bias ? double(bias[n]) : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        // scale and zero of (n, k / 32) sit at [n / 8, k / 32, n % 8].
        const int64_t at = ((n / kInt4Rows) * nb + k / kInt4Block) * kInt4Rows + n % kInt4Rows;
        const double z = zero ? zero[at] : 8.0;
        acc += double(x[m * K + k]) * f16_to_f32(scale[at]) * (int4_code(w, K, n, k) - z);
      }
      y[m * N + n] = float(acc);
    }
  }
}

void linear_mxfp4(const float* x, const uint8_t* codes, const uint8_t* scales, const float* bias,
                  float* y, int64_t M, int64_t N, int64_t K) {
  static constexpr double kE2m1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  const int64_t nb = K / kMxfp4Block;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double acc = bias ? double(bias[n]) : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t byte = codes[n * K / 2 + k / 2];
        const int code = k % 2 == 0 ? byte & 15 : byte >> 4;
        const double w = (code & 8 ? -1.0 : 1.0) * kE2m1[code & 7];
        acc += double(x[m * K + k]) * std::ldexp(w, int(scales[n * nb + k / kMxfp4Block]) - 127);
      }
      y[m * N + n] = float(acc);
    }
  }
}

void embedding(const void* table, DType dt, const int32_t* ids, int64_t n, int64_t D, float* out) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < D; ++i)
      out[r * D + i] = float(load(table, dt, int64_t(ids[r]) * D + i));
}

void rms_norm(const float* x, const void* w, DType wt, float* y, int64_t M, int64_t D, float eps,
              bool unit_offset) {
  for (int64_t m = 0; m < M; ++m) {
    double ss = 0.0;
    for (int64_t i = 0; i < D; ++i) ss += double(x[m * D + i]) * x[m * D + i];
    const double inv = 1.0 / std::sqrt(ss / double(D) + double(eps));
    for (int64_t i = 0; i < D; ++i)
      y[m * D + i] = float(x[m * D + i] * inv * ((unit_offset ? 1.0 : 0.0) + load(w, wt, i)));
  }
}

void rope(float* x, const int32_t* pos, const float* inv_freq, int64_t M, int64_t H, int64_t D,
          int64_t rotary_dim, bool interleaved) {
  const int64_t half = rotary_dim / 2;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t h = 0; h < H; ++h) {
      float* r = x + (m * H + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        // The angle is rounded to f32 as Transformers does (inv_freq @ positions in float32);
        // cos and sin are then evaluated exactly.
        const double angle = float(float(pos[m]) * inv_freq[i]);
        const double c = std::cos(angle), s = std::sin(angle);
        float& a = r[interleaved ? 2 * i : i];
        float& b = r[interleaved ? 2 * i + 1 : half + i];
        const double x1 = a, x2 = b;
        a = float(x1 * c - x2 * s);
        b = float(x2 * c + x1 * s);
      }
    }
  }
}

void silu_mul(const float* gate, const float* up, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    y[i] = float(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void gelu_tanh_mul(const float* gate, const float* up, float* y, int64_t n) {
  const double k = std::sqrt(2.0 / M_PI);
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    y[i] = float(0.5 * g * (1.0 + std::tanh(k * (g + 0.044715 * g * g * g))) * up[i]);
  }
}

void scale(const float* x, float factor, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float(double(x[i]) * factor);
}

void softcap(const float* x, float cap, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float(std::tanh(double(x[i]) / cap) * cap);
}

void add(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void cache_write(void* cache, DType cache_type, const float* src, int64_t B, int64_t T, int64_t Hkv,
                 int64_t S, int64_t D, int64_t start) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t i = 0; i < D; ++i) {
          const float v = src[((b * T + t) * Hkv + h) * D + i];
          const int64_t dst = ((b * Hkv + h) * S + start + t) * D + i;
          if (cache_type == DType::bf16)
            static_cast<uint16_t*>(cache)[dst] = f32_to_bf16(v);
          else
            static_cast<float*>(cache)[dst] = v;
        }
}

void attention(const float* q, const void* k_cache, const void* v_cache, DType cache_type,
               const int32_t* key_mask, float* out, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
               int64_t S, int64_t D, int64_t start, float scale, int64_t window, float softcap,
               const float* sinks) {
  const int64_t group = Hq / Hkv;
  std::vector<double> scores(size_t(start + T));
  std::vector<double> acc(static_cast<size_t>(D));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < Hq; ++h) {
        const float* qr = q + ((b * T + t) * Hq + h) * D;
        float* o = out + ((b * T + t) * Hq + h) * D;
        const int64_t base = (b * Hkv + h / group) * S * D;
        const int64_t L = start + t + 1;
        double mx = -INFINITY;
        for (int64_t j = 0; j < L; ++j) {
          const bool outside_window = window > 0 && j <= start + t - window;
          if (outside_window || (key_mask && key_mask[b * S + j] == 0)) {
            scores[j] = -INFINITY;
            continue;
          }
          double s = 0.0;
          for (int64_t i = 0; i < D; ++i)
            s += double(qr[i]) * load(k_cache, cache_type, base + j * D + i);
          scores[j] = s * scale;
          if (softcap > 0) scores[j] = std::tanh(scores[j] / softcap) * softcap;
          mx = std::max(mx, scores[j]);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        double sum = 0.0;
        if (mx != -INFINITY) {
          // The sink joins the max and the denominator, and weighs no value.
          if (sinks) {
            mx = std::max(mx, double(sinks[h]));
            sum = std::exp(double(sinks[h]) - mx);
          }
          for (int64_t j = 0; j < L; ++j) {
            if (scores[j] == -INFINITY) continue;
            const double p = std::exp(scores[j] - mx);
            sum += p;
            for (int64_t i = 0; i < D; ++i)
              acc[i] += p * load(v_cache, cache_type, base + j * D + i);
          }
        }
        for (int64_t i = 0; i < D; ++i) o[i] = sum > 0 ? float(acc[i] / sum) : 0.0f;
      }
    }
  }
}

namespace {
// Sequence b's whole table (MB * BS positions) of one pool, as a static cache (1,Hkv,MB*BS,D) in
// the pool's dtype.
std::vector<char> unpage(const void* pool_data, DType t, const int32_t* table, int64_t b,
                         int64_t Hkv, int64_t BS, int64_t MB, int64_t D) {
  const int64_t elem = int64_t(dtype_size(t)), S = MB * BS;
  std::vector<char> out(size_t(Hkv * S * D * elem));
  for (int64_t h = 0; h < Hkv; ++h)
    for (int64_t j = 0; j < S; ++j)
      std::memcpy(out.data() + ((h * S + j) * D) * elem,
                  static_cast<const char*>(pool_data) +
                      ((int64_t(table[b * MB + j / BS]) * Hkv + h) * BS + j % BS) * D * elem,
                  size_t(D * elem));
  return out;
}
}  // namespace

void paged_cache_write(void* pool_data, DType cache_type, const float* src, const int32_t* table,
                       const int32_t* rows, const int32_t* pos, int64_t B, int64_t T, int64_t Hkv,
                       int64_t BS, int64_t MB, int64_t D) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = pos[b * T + t], seq = rows ? rows[b * T + t] : b;
      if (p < 0) continue;
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t i = 0; i < D; ++i) {
          const float v = src[((b * T + t) * Hkv + h) * D + i];
          const int64_t dst = ((int64_t(table[seq * MB + p / BS]) * Hkv + h) * BS + p % BS) * D + i;
          if (cache_type == DType::bf16)
            static_cast<uint16_t*>(pool_data)[dst] = f32_to_bf16(v);
          else
            static_cast<float*>(pool_data)[dst] = v;
        }
    }
}

void paged_attention(const float* q, const void* k_pool, const void* v_pool, DType cache_type,
                     const int32_t* table, const int32_t* rows, const int32_t* pos, float* out,
                     int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t BS, int64_t MB,
                     int64_t D, float scale, int64_t window, float softcap, const float* sinks) {
  // Each query through the static reference, over its sequence's blocks laid out in order
  // (laid out again where the sequence changes).
  int64_t unpaged = -1;
  std::vector<char> k, v;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = (b * T + t) * Hq * D, p = pos[b * T + t];
      if (p < 0) {
        std::fill(out + row, out + row + Hq * D, 0.0f);
        continue;
      }
      if (const int64_t seq = rows ? rows[b * T + t] : b; seq != unpaged) {
        k = unpage(k_pool, cache_type, table, seq, Hkv, BS, MB, D);
        v = unpage(v_pool, cache_type, table, seq, Hkv, BS, MB, D);
        unpaged = seq;
      }
      attention(q + row, k.data(), v.data(), cache_type, nullptr, out + row, 1, 1, Hq, Hkv, MB * BS,
                D, p, scale, window, softcap, sinks);
    }
}

}  // namespace tformers::cpu::ref
