// One way for a test to give up when an optional tool or plugin it needs is not installed (XLA's
// PJRT plugin, node's packages, mpirun): on a developer's machine the test skips and says what is
// missing; where TFORMERS_REQUIRE_PLUGINS=1 (scripts/test.sh exports it, after setup.sh has
// installed everything) the test fails instead, so that an environment that loses a dependency
// turns the suites that need it red rather than into quiet skips.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace tformers::testing {

inline bool dependencies_required() {
  const char* v = std::getenv("TFORMERS_REQUIRE_PLUGINS");
  return v && std::strcmp(v, "1") == 0;
}

}  // namespace tformers::testing

// Skips the running test because `what` (a string saying what is missing and how to install it)
// is missing, or fails it under TFORMERS_REQUIRE_PLUGINS=1. Returns from the calling function
// as GTEST_SKIP does, so it belongs in a test body or a SetUp.
#define TF_SKIP_MISSING_DEPENDENCY(what)                                                          \
  do {                                                                                            \
    const std::string tf_missing_ = (what);                                                       \
    if (::tformers::testing::dependencies_required())                                             \
      GTEST_FAIL() << tf_missing_ << " (TFORMERS_REQUIRE_PLUGINS=1: a missing dependency fails)"; \
    GTEST_SKIP() << tf_missing_;                                                                  \
  } while (0)
