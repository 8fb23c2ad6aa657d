// Overflow-checked size arithmetic: wrapped products must throw, not pass later checks.
#include "core/checked.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace tformers {
namespace {

template <typename F>
std::string format_error_of(F&& f) {
  try {
    f();
  } catch (const FormatError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a FormatError";
  return "";
}

TEST(Checked, MulAddProductCast) {
  EXPECT_EQ(checked_mul<int64_t>(1 << 20, 1 << 20, "x"), int64_t(1) << 40);
  EXPECT_EQ(
      format_error_of([] { checked_mul<int64_t>(int64_t(1) << 62, 4, "config.json: a * b"); }),
      "config.json: a * b: 4611686018427387904 * 4 overflows");
  EXPECT_EQ(format_error_of([] { checked_add<size_t>(SIZE_MAX, 1, "n"); }),
            "n: 18446744073709551615 + 1 overflows");
  EXPECT_EQ(checked_product<int64_t>({2, 3, 4}, "shape"), 24);
  EXPECT_EQ(checked_product<int64_t>({}, "shape"), 1);
  EXPECT_NE(format_error_of([] {
              checked_product<int64_t>({1 << 30, 1 << 30, 1 << 30}, "s");
            }),
            "");
  EXPECT_EQ(checked_cast<int32_t>(int64_t(7), "id"), 7);
  EXPECT_EQ(format_error_of([] { checked_cast<int32_t>(int64_t(1) << 40, "vocab id"); }),
            "vocab id: 1099511627776 does not fit in 32-bit signed integer");
  EXPECT_EQ(format_error_of([] { checked_cast<uint64_t>(int64_t(-1), "size"); }),
            "size: -1 does not fit in 64-bit unsigned integer");
}

}  // namespace
}  // namespace tformers
