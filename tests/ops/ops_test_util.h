// Helpers of the op-consistency tests (test_kernels.cc, test_x86_shared.cc): the error measure
// and its tolerances (explained at the top of test_kernels.cc), random inputs, and the linear
// shapes every GEMV and GEMM path is checked on.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tformers/dtype.h"

namespace tformers::cpu {
namespace {

constexpr double kU = 0x1p-24;     // f32 unit roundoff
constexpr double kUbf16 = 0x1p-8;  // bf16 unit roundoff

double nmse_tolerance(int64_t K, bool x_in_bf16 = false) {
  double tol = 16.0 * kU * kU * double(K + 16);
  if (x_in_bf16) tol += kUbf16 * kUbf16;
  return tol;
}

struct ErrorStats {
  double nmse = 0, max_rel = 0;
};

ErrorStats compare(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  ErrorStats s;
  s.nmse = den > 0 ? num / den : num;
  const double rms = std::sqrt(den / double(std::max<size_t>(1, want.size())));
  for (size_t i = 0; i < got.size(); ++i) {
    const double rel = std::abs(double(got[i]) - want[i]) / (std::abs(double(want[i])) + rms);
    if (!(rel <= s.max_rel)) s.max_rel = rel;  // also catches NaN
  }
  return s;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double nmse_tol,
                  const std::string& what) {
  ErrorStats s = compare(got, want);
  EXPECT_LE(s.nmse, nmse_tol) << what;
  EXPECT_LE(s.max_rel, 8.0 * std::sqrt(nmse_tol)) << what;
}

// Random values; `dt` bf16 or f16 means they are rounded to it and stored as such.
struct Tensor {
  DType dt = DType::f32;
  std::vector<float> f;     // values as f32 (exact for bf16 and f16 storage)
  std::vector<uint16_t> h;  // bf16 or f16 storage
  const void* data() const { return dt == DType::f32 ? (const void*)f.data() : h.data(); }
  void* data() { return dt == DType::f32 ? (void*)f.data() : h.data(); }
};

Tensor random_tensor(std::mt19937& rng, size_t n, DType dt, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Tensor t;
  t.dt = dt;
  t.f.resize(n);
  for (auto& v : t.f) v = dist(rng);
  if (dt == DType::bf16) {
    t.h.resize(n);
    for (size_t i = 0; i < n; ++i) {
      t.h[i] = f32_to_bf16(t.f[i]);
      t.f[i] = bf16_to_f32(t.h[i]);
    }
  } else if (dt == DType::f16) {
    t.h.resize(n);
    for (size_t i = 0; i < n; ++i) {
      t.h[i] = f32_to_f16(t.f[i]);
      t.f[i] = f16_to_f32(t.h[i]);
    }
  }
  return t;
}

std::vector<float> random_f32(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  return random_tensor(rng, n, DType::f32, lo, hi).f;
}

struct LinearCase {
  int64_t M, N, K;
  bool bias;
};

// Odd K (not a multiple of 8/16/32), N = 1, M = 1 (decode), small M (GEMV with 2-row tiles),
// M above the GEMM threshold with row and column tails, K above one panel (2048), 2-3 rows over
// K with whole groups of 8 int8 blocks, then a block or a tail; and for the GEMV's streams (rows
// in 4 parts side by side, 2 parts for 2 x rows, at most 1 MiB of weights per part): rows that
// do not divide into the parts, and rows of 64K values, which make each part's span limit cut a
// task into several blocks.
inline const LinearCase kLinearCases[] = {
    {1, 1, 1, false},    {1, 3, 5, true},      {1, 37, 100, false}, {1, 64, 1024, true},
    {1, 9, 2111, false}, {2, 17, 33, true},    {3, 40, 77, false},  {4, 16, 16, false},
    {5, 33, 130, true},  {7, 50, 257, false},  {13, 70, 300, true}, {9, 20, 2100, false},
    {16, 64, 64, false}, {2, 24, 520, true},   {3, 5, 800, false},  {1, 300, 40, true},
    {2, 301, 64, false}, {1, 150, 65536, true}};

}  // namespace
}  // namespace tformers::cpu
