// The load progress bar: its line, when it draws, and that it erases itself.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "core/progress.h"

namespace tformers {
namespace {

std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[256];
  while (size_t n = std::fread(buf, 1, sizeof buf, f)) s.append(buf, n);
  return s;
}

TEST(Progress, LineShowsStagePercentBarBytesAndTime) {
  EXPECT_EQ(format_progress("loading weights", int64_t(512) << 20, int64_t(1024) << 20, 1.5, 10),
            "loading weights   50% [#####.....] 512/1024 MB  1.5 s");
  EXPECT_EQ(format_progress("quantizing to int8", 0, int64_t(3) << 20, 0.0, 4),
            "quantizing to int8    0% [....] 0/3 MB  0.0 s");
}

TEST(Progress, CountsOfAUnitAreShownAsCounted) {
  EXPECT_EQ(format_progress("perplexity 46.31", 76, 152, 3.5, 10, "windows"),
            "perplexity 46.31   50% [#####.....] 76/152 windows  3.5 s");
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar(f, /*enabled=*/true, /*delay_s=*/0.0, "windows");
    bar.update("scoring", 3, 4);
  }
  const std::string out = contents(f);
  std::fclose(f);
  EXPECT_NE(out.find("] 3/4 windows  "), std::string::npos) << out;
}

TEST(Progress, FractionIsClampedAndAnEmptyTotalIsZero) {
  EXPECT_NE(format_progress("x", 5, 4, 0, 4).find("100% [####]"), std::string::npos);
  EXPECT_NE(format_progress("x", 0, 0, 0, 4).find("  0% [....]"), std::string::npos);
}

TEST(Progress, DrawsAfterTheDelayAndErasesItselfOnFinish) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar(f, /*enabled=*/true, /*delay_s=*/0.0);
    bar.update("loading weights", 1 << 20, 2 << 20);
    EXPECT_TRUE(bar.drawn());
    bar.update("loading weights", 2 << 20, 2 << 20);  // the final state is always drawn
  }
  const std::string out = contents(f);
  std::fclose(f);
  const std::string half = "\rtformers: loading weights   50% [";
  const std::string full = "\rtformers: loading weights  100% [";
  ASSERT_NE(out.find(half), std::string::npos) << out;
  ASSERT_NE(out.find(full), std::string::npos) << out;
  // The destructor overwrote the line with spaces and returned to its start.
  const size_t last = out.rfind('\r', out.size() - 2);
  ASSERT_NE(last, std::string::npos);
  EXPECT_EQ(out.back(), '\r');
  EXPECT_EQ(out.substr(last + 1, out.size() - last - 2).find_first_not_of(' '), std::string::npos)
      << out;
}

TEST(Progress, SilentWhenDisabledOrFast) {
  for (bool enabled : {false, true}) {
    std::FILE* f = std::tmpfile();
    ASSERT_NE(f, nullptr);
    {
      ProgressBar bar(f, enabled, /*delay_s=*/enabled ? 3600.0 : 0.0);
      bar.update("loading weights", 1, 2);
      bar.update("loading weights", 2, 2);
      EXPECT_FALSE(bar.drawn());
    }
    EXPECT_EQ(contents(f), "") << "enabled=" << enabled;
    std::fclose(f);
  }
}

}  // namespace
}  // namespace tformers
