// Runs a callable that must throw exactly E and returns the message, for tests that check error
// classes and what their messages name.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

namespace tformers::testing {

// Runs f, expects an E, and returns its message (empty and a test failure otherwise).
template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a different exception type, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an exception, none was thrown";
  return "";
}

}  // namespace tformers::testing

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)
