// The PJRT device the op, backend and generation tests run on: XLA's CPU plugin ("xla-cpu"),
// or the device TFORMERS_PJRT_TEST_DEVICE names ("cuda" from scripts/device_check.sh on a
// machine with a GPU, "tpu" on a TPU VM). The tests that are about the CPU plugin itself (its
// compile cache entries, its serve and tensor-parallel runs) keep "xla-cpu".
#pragma once

#include <cstdlib>
#include <string>

#include "backends/pjrt/plugin_discovery.h"

namespace tformers::testing {

inline const std::string& pjrt_test_device() {
  static const std::string device = [] {
    const char* env = std::getenv("TFORMERS_PJRT_TEST_DEVICE");
    return std::string(env && *env ? env : "xla-cpu");
  }();
  return device;
}

// Why the tests cannot run: the device's plugin is not installed (naming the package that
// provides it); empty when it is.
inline std::string missing_pjrt_plugin() {
  const backends::pjrt::PluginProbe probe = backends::pjrt::probe_plugin(pjrt_test_device());
  if (!probe.path.empty()) return "";
  return "the PJRT plugin of device \"" + pjrt_test_device() + "\" is not installed (" +
         probe.package + ")";
}

}  // namespace tformers::testing
