// Public entry points wrap their bodies in with_tformers_errors: standard-library exceptions come
// out as tformers errors that say what was being done.
#include "core/std_errors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace tformers {
namespace {

template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    detail::with_tformers_errors("loading /m", f);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no exception";
  return "";
}

TEST(StdErrors, BecomeTformersErrors) {
  EXPECT_EQ(error_of<IoError>([] {
              throw std::filesystem::filesystem_error(
                  "directory_iterator", "/m/sub",
                  std::make_error_code(std::errc::permission_denied));
            }),
            "loading /m: Permission denied: /m/sub (check that it exists and that its folders can "
            "be read)");
  EXPECT_EQ(error_of<ResourceError>([] { throw std::bad_alloc(); }), "loading /m: out of memory");
  EXPECT_EQ(error_of<ResourceError>([] { std::vector<char>().reserve(SIZE_MAX); }),
            "loading /m: a size is beyond what can be allocated (vector::reserve)");
  EXPECT_EQ(error_of<InternalError>([] { throw std::invalid_argument("stoi"); }),
            "loading /m: unexpected error: stoi (this is a bug in tformers; please report it)");
  // tformers errors pass through unchanged, and so do results.
  EXPECT_EQ(error_of<NotFoundError>([] { throw NotFoundError("x"); }), "x");
  EXPECT_EQ(detail::with_tformers_errors("x", [] { return 7; }), 7);
}

}  // namespace
}  // namespace tformers
