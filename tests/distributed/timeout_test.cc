// Where the collective timeout comes from, and the values it refuses.
#include <gtest/gtest.h>

#include <cstdlib>

#include "distributed/process_group.h"
#include "distributed/tp_model.h"
#include "tformers/error.h"

namespace tformers::distributed {
namespace {

template <typename F>
std::string invalid_argument_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an InvalidArgumentError";
  return "";
}

// One test: the setting is process-wide (a second test would depend on the order they run in),
// and once set it wins over the environment.
TEST(CollectiveTimeout, EnvironmentThenSetting) {
  unsetenv("TFORMERS_TP_TIMEOUT");
  EXPECT_EQ(collective_timeout(), kDefaultCollectiveTimeout);
  setenv("TFORMERS_TP_TIMEOUT", "abc", 1);
  EXPECT_EQ(invalid_argument_of([] { collective_timeout(); }),
            "TFORMERS_TP_TIMEOUT = 'abc' is not a number of seconds");
  setenv("TFORMERS_TP_TIMEOUT", "-3", 1);
  EXPECT_EQ(invalid_argument_of([] { collective_timeout(); }),
            "TFORMERS_TP_TIMEOUT = -3 is not a valid collective timeout: give a number of "
            "seconds > 0");
  setenv("TFORMERS_TP_TIMEOUT", "2.5", 1);
  EXPECT_EQ(collective_timeout(), 2.5);
  EXPECT_EQ(invalid_argument_of([] { set_collective_timeout(0); }),
            "DistributedConfig::timeout = 0 is not a valid collective timeout: give a number of "
            "seconds > 0");
  set_collective_timeout(9);
  EXPECT_EQ(collective_timeout(), 9);
  unsetenv("TFORMERS_TP_TIMEOUT");

  // DistributedConfig::timeout reaches the collectives when a model is split (one rank here).
  DistributedConfig dc{.tp_size = 1, .timeout = 7.5};
  TpModel tp(dc, {}, {{"w", {4, 4}}});
  EXPECT_EQ(collective_timeout(), 7.5);
  dc.timeout = -1;
  EXPECT_NE(invalid_argument_of([&] {
              TpModel(dc, {}, {{"w", {4, 4}}});
            }).find("DistributedConfig::timeout = -1"),
            std::string::npos);
}

}  // namespace
}  // namespace tformers::distributed
