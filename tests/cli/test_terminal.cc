// The command line's terminal helpers: escaping of strings from files, when output may be
// styled, and the one-line message main gives for every kind of exception (issue 20's hostile
// inputs end in one of these).
#include <gtest/gtest.h>
#include <pty.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <new>
#include <optional>
#include <stdexcept>
#include <system_error>

#include "../../apps/errors.h"
#include "../../apps/terminal.h"

namespace tformers::cli {
namespace {

TEST(EscapeForTerminal, ControlBytesAndInvalidUtf8AreShownAsHex) {
  EXPECT_EQ(escape_for_terminal("model.layers.0.q_proj"), "model.layers.0.q_proj");
  EXPECT_EQ(escape_for_terminal("a\x1b[2Jb"), "a\\x1b[2Jb");
  EXPECT_EQ(escape_for_terminal("bell\a\rdel\x7f"), "bell\\x07\\x0ddel\\x7f");
  EXPECT_EQ(escape_for_terminal("lines\n\ttab"), "lines\n\ttab");
  // UTF-8 text is kept; C1 controls (U+009B is a CSI on some terminals), stray continuation
  // bytes, overlongs and truncated sequences are not.
  EXPECT_EQ(escape_for_terminal("Ġthe é 中 😀"), "Ġthe é 中 😀");
  EXPECT_EQ(escape_for_terminal("\xc2\x9b"
                                "31m"),
            "\\xc2\\x9b31m");
  EXPECT_EQ(escape_for_terminal("\x80\xc0\xaf\xe4\xb8"), "\\x80\\xc0\\xaf\\xe4\\xb8");
  EXPECT_EQ(escape_for_terminal("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
}

// Styling (chat's dimmed reasoning) goes to a terminal only, and not under a non-empty NO_COLOR.
TEST(StyledTerminal, ATerminalWithoutNoColor) {
  int master = -1, terminal = -1, pipe_ends[2] = {-1, -1};
  ASSERT_EQ(openpty(&master, &terminal, nullptr, nullptr, nullptr), 0);
  ASSERT_EQ(pipe(pipe_ends), 0);
  const char* set = std::getenv("NO_COLOR");
  const std::optional<std::string> saved = set ? std::optional<std::string>(set) : std::nullopt;
  unsetenv("NO_COLOR");
  EXPECT_TRUE(styled_terminal(terminal));
  EXPECT_FALSE(styled_terminal(pipe_ends[1]));
  setenv("NO_COLOR", "", 1);
  EXPECT_TRUE(styled_terminal(terminal));
  setenv("NO_COLOR", "1", 1);
  EXPECT_FALSE(styled_terminal(terminal));
  if (saved)
    setenv("NO_COLOR", saved->c_str(), 1);
  else
    unsetenv("NO_COLOR");
  for (int fd : {master, terminal, pipe_ends[0], pipe_ends[1]}) close(fd);
}

template <typename E>
std::string message_of(const E& e) {
  try {
    throw e;
  } catch (...) {
    return current_error_message();
  }
}

TEST(CurrentErrorMessage, EveryStandardExceptionIsNamedWithAHint) {
  EXPECT_EQ(message_of(InvalidArgumentError("generate: bad")), "generate: bad");
  EXPECT_NE(message_of(std::bad_alloc()).find("out of memory; try a smaller model"),
            std::string::npos);
  const std::string len = message_of(std::length_error("vector::_M_default_append"));
  EXPECT_NE(len.find("too large to allocate (vector::_M_default_append)"), std::string::npos);
  EXPECT_NE(len.find("config.json"), std::string::npos);
  const std::string fs = message_of(std::filesystem::filesystem_error(
      "cannot open", "/x/model.safetensors", std::make_error_code(std::errc::permission_denied)));
  EXPECT_NE(fs.find("file system: "), std::string::npos) << fs;
  EXPECT_NE(fs.find("/x/model.safetensors"), std::string::npos) << fs;
  const std::string sys = message_of(
      std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again), "thread"));
  EXPECT_NE(sys.find("system: thread"), std::string::npos) << sys;
  EXPECT_EQ(message_of(std::invalid_argument("stoi")), "invalid argument: stoi");
  EXPECT_EQ(message_of(std::runtime_error("odd")), "unexpected failure: odd");
  EXPECT_NE(message_of(42).find("not a std::exception"), std::string::npos);
}

}  // namespace
}  // namespace tformers::cli
