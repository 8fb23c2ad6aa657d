// The linear-attention kernels (Gated DeltaNet): a causal depthwise convolution and the gated delta
// rule, each over a recurrent state that the static cache holds per batch row (graph.h's
// kCausalConv1d and kGatedDeltaRule). Both run the recurrent form token by token: the state of a
// value head is Dk x Dv floats, read and written twice per token while it sits in the core's cache,
// and its arithmetic (about 6 Dk Dv flops a token) is small beside the layer's projections, so the
// chunked form that GPUs use (fla's) buys a CPU nothing at these sizes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels.h"

namespace tformers::cpu {

namespace {

// Whether token t of row b is real (not left padding): its key-mask slot is set.
bool real_token(const int32_t* key_mask, int64_t S, int64_t b, int64_t slot) {
  return slot < S && key_mask[b * S + slot] != 0;
}

}  // namespace

void causal_conv1d(const float* x, const float* w, float* state, const int32_t* key_mask,
                   float* y, int64_t B, int64_t T, int64_t C, int64_t K, int64_t S, int64_t start,
                   ThreadPool& pool) {
  const int64_t keep = K - 1;
  // u(i) for i in [0, keep + T): the state's rows (zeros for a new sequence), then x (a padding
  // token's as zeros). Channels are independent, so threads take blocks of them.
  pool.parallel_for(
      B * C,
      [&](int64_t lo, int64_t hi, int) {
        std::vector<float> u(static_cast<size_t>(keep + T));
        for (int64_t bc = lo; bc < hi; ++bc) {
          const int64_t b = bc / C, c = bc % C;
          float* st = state + b * keep * C + c;
          for (int64_t i = 0; i < keep; ++i) u[size_t(i)] = start == 0 ? 0.0f : st[i * C];
          for (int64_t t = 0; t < T; ++t)
            u[size_t(keep + t)] =
                real_token(key_mask, S, b, start + t) ? x[(b * T + t) * C + c] : 0.0f;
          const float* wc = w + c * K;
          for (int64_t t = 0; t < T; ++t) {
            float acc = 0;
            for (int64_t j = 0; j < K; ++j) acc += wc[j] * u[size_t(t + j)];
            y[(b * T + t) * C + c] = acc;
          }
          for (int64_t i = 0; i < keep; ++i) st[i * C] = u[size_t(T + i)];
        }
      },
      64);
}

void gated_delta_rule(const float* q, const float* k, const float* v, const float* g,
                      const float* beta, float* state, const int32_t* key_mask, float* y,
                      int64_t B, int64_t T, int64_t Hk, int64_t H, int64_t Dk, int64_t Dv,
                      int64_t S, int64_t start, ThreadPool& pool) {
  const int64_t group = H / Hk;
  pool.parallel_for(B * H, [&](int64_t lo, int64_t hi, int) {
    std::vector<float> kv(static_cast<size_t>(Dv));
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / H, h = bh % H, hk = h / group;
      float* st = state + bh * Dk * Dv;
      if (start == 0) std::fill(st, st + Dk * Dv, 0.0f);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t row = b * T + t;
        float* out = y + (row * H + h) * Dv;
        if (!real_token(key_mask, S, b, start + t)) {
          std::fill(out, out + Dv, 0.0f);
          continue;
        }
        const float* qt = q + (row * Hk + hk) * Dk;
        const float* kt = k + (row * Hk + hk) * Dk;
        const float* vt = v + (row * H + h) * Dv;
        const float decay = std::exp(g[row * H + h]), b_t = beta[row * H + h];
        // Decay the state and read what it holds for k: kv = (decay S)^T k.
        std::fill(kv.begin(), kv.end(), 0.0f);
        for (int64_t i = 0; i < Dk; ++i) {
          float* s = st + i * Dv;
          const float ki = kt[i];
          for (int64_t j = 0; j < Dv; ++j) {
            s[j] *= decay;
            kv[size_t(j)] += ki * s[j];
          }
        }
        // delta = beta (v - kv); S += k delta^T; y = S^T q.
        for (int64_t j = 0; j < Dv; ++j) kv[size_t(j)] = b_t * (vt[j] - kv[size_t(j)]);
        std::fill(out, out + Dv, 0.0f);
        for (int64_t i = 0; i < Dk; ++i) {
          float* s = st + i * Dv;
          const float ki = kt[i], qi = qt[i];
          for (int64_t j = 0; j < Dv; ++j) {
            s[j] += ki * kv[size_t(j)];
            out[j] += qi * s[j];
          }
        }
      }
    }
  });
}

}  // namespace tformers::cpu
