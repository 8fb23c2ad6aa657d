// The linear-attention kernels (Gated DeltaNet): a causal depthwise convolution and the gated delta
// rule, each over a recurrent state per sequence that the static cache holds per batch row or a
// paged step finds by slot (graph.h's kCausalConv1d, kGatedDeltaRule and their paged forms).
// Both run the recurrent form token by token: the state of a
// value head is Dk x Dv floats, read and written twice per token while it sits in the core's cache,
// and its arithmetic (about 6 Dk Dv flops a token) is small beside the layer's projections, so the
// chunked form that GPUs use (fla's) buys a CPU nothing at these sizes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels.h"

namespace tformers::cpu {

void causal_conv1d(const float* x, const float* w, const RecurrentRows& rows, float* y, int64_t B,
                   int64_t T, int64_t C, int64_t K, ThreadPool& pool) {
  const int64_t keep = K - 1;
  // Per channel (channels are independent, so threads take blocks of them) a window of the last
  // K - 1 real inputs, starting from the state's (zeros for a new sequence); padding tokens are
  // skipped.
  pool.parallel_for(
      B * C,
      [&](int64_t lo, int64_t hi, int) {
        std::vector<float> win(static_cast<size_t>(keep));
        for (int64_t bc = lo; bc < hi; ++bc) {
          const int64_t b = bc / C, c = bc % C;
          float* st = rows.state[size_t(b)] ? rows.state[size_t(b)] + c : nullptr;
          const bool fresh = rows.fresh[size_t(b)] != 0;
          for (int64_t i = 0; i < keep; ++i) win[size_t(i)] = fresh || !st ? 0.0f : st[i * C];
          const float* wc = w + c * K;
          for (int64_t t = 0; t < T; ++t) {
            float& out = y[(b * T + t) * C + c];
            if (!rows.real[size_t(b * T + t)]) {
              out = 0;
              continue;
            }
            const float xt = x[(b * T + t) * C + c];
            float acc = wc[keep] * xt;
            for (int64_t j = 0; j < keep; ++j) acc += wc[j] * win[size_t(j)];
            out = acc;
            std::copy(win.begin() + 1, win.end(), win.begin());
            win[size_t(keep - 1)] = xt;
          }
          if (st)
            for (int64_t i = 0; i < keep; ++i) st[i * C] = win[size_t(i)];
        }
      },
      64);
}

void gated_delta_rule(const float* q, const float* k, const float* v, const float* g,
                      const float* beta, const RecurrentRows& rows, float* y, int64_t B, int64_t T,
                      int64_t Hk, int64_t H, int64_t Dk, int64_t Dv, ThreadPool& pool) {
  const int64_t group = H / Hk;
  pool.parallel_for(B * H, [&](int64_t lo, int64_t hi, int) {
    std::vector<float> kv(static_cast<size_t>(Dv));
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / H, h = bh % H, hk = h / group;
      float* st = rows.state[size_t(b)];
      if (st) st += h * Dk * Dv;
      if (st && rows.fresh[size_t(b)]) std::fill(st, st + Dk * Dv, 0.0f);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t row = b * T + t;
        float* out = y + (row * H + h) * Dv;
        if (!rows.real[size_t(row)] || !st) {
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
