// A suite whose plugin cannot be found skips on a developer's machine, and fails where
// TFORMERS_REQUIRE_PLUGINS=1 says that everything is installed (scripts/test.sh): CI losing the
// plugin must not turn its tests into skips. The plugin is hidden by running this binary from
// outside the checkout (no .venv/ beside it) with no environment or variable that points at one.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/error_of.h"
#include "common/run_command.h"

namespace tformers {
namespace {

TEST(MissingDependency, AMissingPluginSkipsOrFailsUnderTformersRequirePlugins) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string hidden =
      "cd / && env -u TFORMERS_PJRT_PLUGIN_XLA_CPU -u TFORMERS_PJRT_TEST_DEVICE ";
  const std::string test = self + " --gtest_color=no --gtest_filter=" +
                           "PjrtBackendTest.BuffersRoundTripAndEveryByteIsCounted";

  const testing::Streams skipped =
      testing::run(hidden + "-u TFORMERS_REQUIRE_PLUGINS VIRTUAL_ENV=/nonexistent " + test);
  EXPECT_EQ(skipped.status, 0) << skipped.out << skipped.err;
  EXPECT_CONTAINS(skipped.out, "[  SKIPPED ] 1 test");
  EXPECT_CONTAINS(skipped.out, "is not installed");

  const testing::Streams failed =
      testing::run(hidden + "VIRTUAL_ENV=/nonexistent TFORMERS_REQUIRE_PLUGINS=1 " + test);
  EXPECT_NE(failed.status, 0) << failed.out << failed.err;
  EXPECT_CONTAINS(failed.out, "[  FAILED  ] 1 test");
  EXPECT_CONTAINS(failed.out, "TFORMERS_REQUIRE_PLUGINS=1");
}

}  // namespace
}  // namespace tformers
