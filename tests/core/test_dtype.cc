// bf16 and f16 conversions against references that are not our bit tricks: the CPU's own F16C
// instructions for f16, and a round-to-nearest-even written with double arithmetic for bf16.
#include <cpuid.h>
#include <gtest/gtest.h>
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "tformers/dtype.h"
#include "tformers/error.h"
#include "tformers/tensor.h"

namespace tformers {
namespace {

__attribute__((target("f16c"))) uint16_t hw_f32_to_f16(float f) {
  return uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

// bf16 by definition: the two bf16 values around f, the nearer one, ties to the even mantissa.
uint16_t bf16_by_definition(float f) {
  if (std::isnan(f)) return 0;  // compared separately
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t lo = uint16_t(u >> 16);
  uint16_t hi = uint16_t(lo + 1);
  double dlo = bf16_to_f32(lo), dhi = bf16_to_f32(hi), d = f;
  if ((u & 0xffffu) == 0) return lo;
  // Past the largest finite value the upper neighbour is infinity; its distance is measured as
  // if the exponent continued, as IEEE rounding does.
  if (std::isinf(dhi)) dhi = std::ldexp(1.0, 128) * (f < 0 ? -1 : 1);
  double elo = std::fabs(d - dlo), ehi = std::fabs(d - dhi);
  if (elo < ehi) return lo;
  if (ehi < elo) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(DType, Bf16RoundsToNearestEven) {
  std::mt19937 rng(1);
  for (int i = 0; i < 2000000; ++i) {
    float f = std::bit_cast<float>(uint32_t(rng()));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_bf16(f), bf16_by_definition(f)) << std::hexfloat << f;
  }
  // Exact ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7; even mantissa wins.
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), f32_to_bf16(1.0f));
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), f32_to_bf16(1.0f + 4 * 0x1p-8f));
  for (uint32_t h = 0; h < 65536; ++h) {  // every bf16 survives the round trip
    float f = bf16_to_f32(uint16_t(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), h);
    }
  }
}

TEST(DType, F16MatchesTheHardware) {
  // CPUID, not __builtin_cpu_supports: clang 14's does not know "f16c".
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_F16C))
    GTEST_SKIP() << "this CPU has no F16C to compare with";
  for (uint32_t h = 0; h < 65536; ++h) {
    float mine = f16_to_f32(uint16_t(h)), hw = hw_f16_to_f32(uint16_t(h));
    if (std::isnan(hw)) {
      ASSERT_TRUE(std::isnan(mine)) << h;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(mine), std::bit_cast<uint32_t>(hw)) << h;
    }
  }
  std::mt19937 rng(2);
  for (int i = 0; i < 2000000; ++i) {
    // Half the draws near f16's range, where rounding, subnormals and overflow happen.
    float f = (i & 1) ? std::bit_cast<float>(uint32_t(rng()))
                      : std::ldexp(float(int32_t(rng())) / 2147483648.0f, int(rng() % 40) - 26);
    uint16_t hw = hw_f32_to_f16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), hw) << std::hexfloat << f;
  }
}

TEST(DType, ParseNamesAndRejectUnknown) {
  EXPECT_EQ(parse_dtype("torch.bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("float32"), DType::f32);
  EXPECT_EQ(parse_dtype("fp16"), DType::f16);
  EXPECT_THROW(parse_dtype("float64"), InvalidArgumentError);
}

TEST(Tensor, ConvertsAndReshapes) {
  Tensor t = Tensor::from_vector<float>({2, 3}, DType::f32, {1, 2.5f, -3, 65504, 1e-8f, 0.1f});
  Tensor h = t.to(DType::f16);
  EXPECT_EQ(h.dtype(), DType::f16);
  EXPECT_FLOAT_EQ(h.item_f32(1), 2.5f);
  EXPECT_FLOAT_EQ(h.item_f32(3), 65504.0f);
  EXPECT_EQ(t.reshape({3, 2}).dim(0), 3);
  EXPECT_THROW(t.reshape({4, 2}), InvalidArgumentError);
  EXPECT_THROW(Tensor::zeros({-1}, DType::f32), InvalidArgumentError);
  // 2 x 2^62 int32 is 2^65 bytes: the product wrapped to 0 and a 64-byte buffer came back.
  EXPECT_THROW(Tensor::zeros({2, int64_t(1) << 62}, DType::i32), InvalidArgumentError);
  EXPECT_THROW(Tensor::zeros({int64_t(1) << 31, int64_t(1) << 31, 4}, DType::f32),
               InvalidArgumentError);
  EXPECT_EQ(Tensor::zeros({0, int64_t(1) << 62}, DType::f32).numel(), 0);
}

}  // namespace
}  // namespace tformers
