// The linear-attention kernels (kernels.h's causal_conv1d and gated_delta_rule) of every target
// against their definitions written out here: a window of the last K-1 real inputs, and the
// gated delta rule's update per token, over rows that start, continue, skip padding in the middle
// or keep no state at all.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels_impl.h"
#include "core/cpu_features.h"
#include "core/thread_pool.h"

namespace tformers::cpu {
namespace {

std::vector<float> draw(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Rows: 0 continues its state, with padding in the middle; 1 starts a sequence after left
// padding; 2 is a padding row with no state.
constexpr int64_t B = 3, T = 6;
const std::vector<uint8_t> kFresh = {0, 1, 0};
const std::vector<uint8_t> kReal = {1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0};

struct Rows {
  std::vector<float> states;  // B rows of `each`, the last row unused (no state)
  std::vector<float*> ptr;
  Rows(std::vector<float> s, int64_t each) : states(std::move(s)) {
    ptr = {states.data(), states.data() + each, nullptr};
  }
};

double worst(const std::vector<float>& got, const std::vector<float>& want) {
  double w = 0;
  for (size_t i = 0; i < got.size(); ++i)
    w = std::max(w, std::abs(double(got[i]) - want[i]) / (1.0 + std::abs(double(want[i]))));
  return w;
}

TEST(Ops, CausalConv1dFollowsItsDefinitionOnEveryTarget) {
  constexpr int64_t C = 70, K = 4;  // channels past one block of 64
  std::mt19937 rng(5);
  const std::vector<float> x = draw(rng, B * T * C, -1, 1), w = draw(rng, C * K, -1, 1);
  const std::vector<float> init = draw(rng, B * (K - 1) * C, -1, 1);
  // The definition: u = the state's rows (zeros when fresh), then the real tokens' x.
  std::vector<float> want_y(size_t(B * T * C), 0.0f), want_state = init;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 0; c < C; ++c) {
      std::vector<float> u;
      for (int64_t i = 0; i < K - 1; ++i)
        u.push_back(kFresh[b] ? 0.0f : init[(b * (K - 1) + i) * C + c]);
      for (int64_t t = 0; t < T; ++t) {
        if (!kReal[b * T + t]) continue;
        u.push_back(x[(b * T + t) * C + c]);
        double acc = 0;
        for (int64_t j = 0; j < K; ++j) acc += double(w[c * K + j]) * u[u.size() - K + j];
        want_y[(b * T + t) * C + c] = float(acc);
      }
      for (int64_t i = 0; i < K - 1; ++i)
        want_state[(b * (K - 1) + i) * C + c] = u[u.size() - (K - 1) + i];
    }
  ThreadPool pool(3);
  for (Target t : supported_targets()) {
    Rows rows(init, (K - 1) * C);
    std::vector<float> y(size_t(B * T * C), 7.0f);
    kernels_for(t).causal_conv1d(x.data(), w.data(), rows.ptr.data(), kFresh.data(), kReal.data(),
                                 y.data(), B, T, C, K, pool);
    EXPECT_LT(worst(y, want_y), 1e-5) << target_name(t);
    EXPECT_LT(worst(rows.states, want_state), 1e-6) << target_name(t);
  }
}

TEST(Ops, GatedDeltaRuleFollowsItsDefinitionOnEveryTarget) {
  constexpr int64_t Hk = 2, H = 4, Dk = 5, Dv = 19;  // value heads sharing key heads
  std::mt19937 rng(6);
  const std::vector<float> q = draw(rng, B * T * Hk * Dk, -1, 1),
                           k = draw(rng, B * T * Hk * Dk, -0.5, 0.5);
  const std::vector<float> v = draw(rng, B * T * H * Dv, -2, 2),
                           g = draw(rng, B * T * H, -1, -0.05f);
  const std::vector<float> beta = draw(rng, B * T * H, 0.1f, 0.9f);
  const int64_t each = H * Dk * Dv;
  const std::vector<float> init = draw(rng, size_t(B * each), -1, 1);
  std::vector<float> want_y(size_t(B * T * H * Dv), 0.0f), want_state = init;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> S(size_t(Dk * Dv));
      for (int64_t i = 0; i < Dk * Dv; ++i)
        S[size_t(i)] = kFresh[b] ? 0.0 : init[b * each + h * Dk * Dv + i];
      const int64_t hk = h / (H / Hk);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t row = b * T + t;
        if (!kReal[row]) continue;
        const float* kt = &k[(row * Hk + hk) * Dk];
        const float* qt = &q[(row * Hk + hk) * Dk];
        for (double& s : S) s *= std::exp(double(g[row * H + h]));
        for (int64_t j = 0; j < Dv; ++j) {
          double kv = 0;
          for (int64_t i = 0; i < Dk; ++i) kv += S[size_t(i * Dv + j)] * kt[i];
          const double delta = beta[row * H + h] * (v[(row * H + h) * Dv + j] - kv);
          double out = 0;
          for (int64_t i = 0; i < Dk; ++i) {
            S[size_t(i * Dv + j)] += kt[i] * delta;
            out += S[size_t(i * Dv + j)] * qt[i];
          }
          want_y[(row * H + h) * Dv + j] = float(out);
        }
      }
      for (int64_t i = 0; i < Dk * Dv; ++i)
        want_state[b * each + h * Dk * Dv + i] = float(S[size_t(i)]);
    }
  ThreadPool pool(3);
  for (Target t : supported_targets()) {
    Rows rows(init, each);
    std::vector<float> y(size_t(B * T * H * Dv), 7.0f);
    kernels_for(t).gated_delta_rule(q.data(), k.data(), v.data(), g.data(), beta.data(),
                                    rows.ptr.data(), kFresh.data(), kReal.data(), y.data(), B, T,
                                    Hk, H, Dk, Dv, pool);
    EXPECT_LT(worst(y, want_y), 1e-5) << target_name(t);
    EXPECT_LT(worst(rows.states, want_state), 1e-5) << target_name(t);
  }
}

}  // namespace
}  // namespace tformers::cpu
