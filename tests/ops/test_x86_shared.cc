// The code the AVX2 and AVX-512 kernels share (src/backends/cpu/kernels_x86.h), instantiated here
// with a 16-float generic vector, the width of AVX-512: the decode GEMV (its streams, tiles, x
// repacking and bf16 pairs of 32), the prefill GEMM (its 32-column panels, 8-row tiles, K blocks
// and L2 groups) and rms_norm's sum of squares run as the AVX-512 target runs them, on any AVX2
// machine, against the scalar references. The AVX-512 target's own code (Avx512Vec, its int8 GEMV
// tile, its BF16 GEMM) runs in Ops.* over emulated intrinsics (avx512_emulated.cc), and natively on
// a machine with AVX-512. The int8 GEMV tile here is a plain loop, so that the GEMV's handling of
// int8 rows and block scales is checked too.
//
// kernels_x86.h packs GEMM panels with 8-wide AVX2 helpers, so it is compiled here for AVX2 (as
// both targets that use it are) and the tests skip on a CPU without it.
//
// Tolerances: the GEMV's and GEMM's as in test_kernels.cc (x stays f32 and the products are exact,
// so only the summation order differs from the reference). The sum of squares against the
// deterministic bound of an f32 sum of n products, each product and each addition rounded once:
// |error| <= (n + 1) u sum_i x_i^2 with u = 2^-24, which correct code cannot exceed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "ops/avx2_region.h"
#include "tformers/dtype.h"
TFORMERS_AVX2_BEGIN
#include "backends/cpu/kernels_x86.h"
TFORMERS_AVX2_END
#include "ops/ops_test_util.h"

namespace tformers::cpu {
namespace {

typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));

// The vector type of kernels_x86.h with 16 lanes, in GCC vector extensions.
struct Generic16 {
  using T = f32x16;
  static constexpr int kWidth = 16, kMR = 8, kGemvAcc = 4;
  static constexpr int64_t kGroup = 4;
  static T load(const float* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(float* p, T v) { std::memcpy(p, &v, sizeof v); }
  static T add(T a, T b) { return a + b; }
  static T fmadd(T a, T b, T c) { return a * b + c; }
  static T broadcast(const float* p) { return T{} + *p; }
  static T zero() { return T{}; }
  static float hsum(T v) {
    float s = 0.0f;
    for (int i = 0; i < kWidth; ++i) s += v[i];
    return s;
  }
  static void load_pairs(const uint16_t* p, T& even, T& odd) {
    i32x16 w;
    std::memcpy(&w, p, sizeof w);
    const i32x16 e = w << 16, o = w & int32_t(0xffff0000u);
    std::memcpy(&even, &e, sizeof even);
    std::memcpy(&odd, &o, sizeof odd);
  }
  static void load_pairs(const float* p, T& lo, T& hi) {
    lo = load(p);
    hi = load(p + kWidth);
  }
  static constexpr int kInt8Streams = 2;
  struct Int8X {
    Int8X row(int64_t, int64_t) const { return {}; }
  };
  static Int8X prepare_int8_x(const float*, int64_t, int64_t) { return {}; }
  template <int S, int MR>
  static void gemv_tile_q8(const float* x, Int8X, const int8_t* const (&w)[S],
                           const float* const (&scale)[S], int64_t K, float (&out)[S][MR]) {
    for (int s = 0; s < S; ++s)
      for (int i = 0; i < MR; ++i) {
        double acc = 0.0;
        for (int64_t k = 0; k < K; ++k)
          acc += double(x[i * K + k]) * w[s][k] * scale[s][k / kInt8Block];
        out[s][i] = float(acc);
      }
  }
};

std::string shape(const LinearCase& c) {
  return "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K);
}

// `product(x, w, scale, bias, y, M, N, K, pool)` (the GEMV or the GEMM at 16 lanes) against the
// references on `cases`, f32, bf16 and int8 weights, 1 and 3 threads.
template <class Product>
void check_linear(Product product, const std::vector<LinearCase>& cases, unsigned seed) {
  std::mt19937 rng(seed);
  ThreadPool pool1(1), pool3(3);
  for (ThreadPool* pool : {&pool1, &pool3})
    for (const auto& c : cases) {
      const std::string what = shape(c) + " threads=" + std::to_string(pool->num_threads());
      std::vector<float> x = random_f32(rng, size_t(c.M * c.K));
      std::vector<float> y(size_t(c.M * c.N)), want(y.size());
      for (DType dt : {DType::f32, DType::bf16}) {
        Tensor w = random_tensor(rng, size_t(c.N * c.K), dt),
               b = random_tensor(rng, size_t(c.N), dt);
        std::fill(y.begin(), y.end(), NAN);
        if (dt == DType::bf16)
          product(x.data(), w.h.data(), nullptr, c.bias ? b.h.data() : nullptr, y.data(), c.M, c.N,
                  c.K, *pool);
        else
          product(x.data(), w.f.data(), nullptr, c.bias ? b.f.data() : nullptr, y.data(), c.M, c.N,
                  c.K, *pool);
        ref::linear(x.data(), w.data(), dt, c.bias ? b.data() : nullptr, want.data(), c.M, c.N,
                    c.K);
        expect_close(y, want, nmse_tolerance(c.K), std::string(dtype_name(dt)) + " " + what);
      }
      std::uniform_int_distribution<int> qdist(-127, 127);
      std::vector<int8_t> q(size_t(c.N * c.K));
      for (auto& v : q) v = int8_t(qdist(rng));
      std::vector<float> scale = random_f32(rng, size_t(c.N * int8_blocks(c.K)), 1e-3f, 1e-2f);
      std::vector<float> b = random_f32(rng, size_t(c.N));
      std::fill(y.begin(), y.end(), NAN);
      product(x.data(), q.data(), scale.data(), c.bias ? b.data() : nullptr, y.data(), c.M, c.N,
              c.K, *pool);
      ref::linear_int8(x.data(), q.data(), scale.data(), c.bias ? b.data() : nullptr, want.data(),
                       c.M, c.N, c.K);
      expect_close(y, want, nmse_tolerance(2 * c.K + 2), "int8 " + what);
    }
}

constexpr const char* kNoAvx2 = "this CPU has no AVX2, which kernels_x86.h needs";

TEST(X86Shared, GemvAt16Lanes) {
  if (detected_target() < Target::kAVX2) GTEST_SKIP() << kNoAvx2;
  check_linear([](auto&&... args) { gemv<Generic16>(args...); },
               {std::begin(kLinearCases), std::end(kLinearCases)}, 77);
}

// The GEMM on the shapes of Ops.Linear and on a few that cross its blocks at 16 lanes: several
// 32-column panels with a partial last one (N), more than one L2 group of 4 panels (N > 128),
// more than one 8-row tile with a partial last one (M), and K over kKC = 256 with a tail.
TEST(X86Shared, GemmAt16Lanes) {
  if (detected_target() < Target::kAVX2) GTEST_SKIP() << kNoAvx2;
  std::vector<LinearCase> cases(std::begin(kLinearCases), std::end(kLinearCases));
  cases.insert(cases.end(), {{9, 161, 600, true}, {17, 33, 257, false}, {8, 32, 256, true}});
  check_linear([](auto&&... args) { gemm<Generic16>(args...); }, cases, 79);
}

TEST(X86Shared, SumSqAt16Lanes) {
  if (detected_target() < Target::kAVX2) GTEST_SKIP() << kNoAvx2;
  std::mt19937 rng(78);
  using Ops = X86Ops<Generic16>;
  for (int64_t n : {1, 15, 16, 17, 31, 32, 33, 64, 65, 128, 200}) {
    const std::string what = "n=" + std::to_string(n);
    std::vector<float> x = random_f32(rng, size_t(n));
    double want = 0;
    for (float v : x) want += double(v) * v;
    const double bound = double(n + 1) * 0x1p-24;  // relative to the sum of |terms|
    EXPECT_NEAR(Ops::sum_sq(x.data(), n), want, bound * want) << what;
  }
}

}  // namespace
}  // namespace tformers::cpu
