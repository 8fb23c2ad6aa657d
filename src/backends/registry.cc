#include "backends/registry.h"

#include <array>
#include <cstdio>
#include <memory>

#include "backends/cpu/cpu_backend.h"
#include "backends/pjrt/pjrt_api.h"
#include "backends/pjrt/plugin_discovery.h"
#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "tformers/accelerator.h"
#include "tformers/error.h"

namespace tformers {

namespace backends {

namespace {

Backend& cpu_backend() {
  static std::unique_ptr<Backend> backend = make_cpu_backend();
  return *backend;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

[[noreturn]] void no_device(const std::string& device) {
  pjrt::PluginProbe p = pjrt::probe_plugin(device);
  std::string msg = "device_map=\"" + device + "\": no usable " + device + " runtime. ";
  if (p.path.empty())
    msg += "No PJRT plugin was found; looked in " + join(p.looked) + ". Install it (" + p.package +
           ") or set " + pjrt::plugin_env_var(device) +
           " to the plugin library, or use device_map=\"cpu\".";
  else
    msg += "Found " + p.path + ", but " + p.problem + ". Use device_map=\"cpu\".";
  throw DeviceError(msg);
}

// "PJRT C API 0.81, XLA 2, StableHLO 1.13.3 (minimum 0.9.0)", or why the plugin did not load.
std::string describe_plugin(const std::string& path) {
  auto version = [](const std::array<int64_t, 3>& v) {
    return std::to_string(v[0]) + "." + std::to_string(v[1]) + "." + std::to_string(v[2]);
  };
  try {
    const pjrt::Plugin& plugin = pjrt::Plugin::load(path);
    return "PJRT C API " + std::to_string(plugin.api_major()) + "." +
           std::to_string(plugin.api_minor()) + ", XLA " + std::to_string(plugin.xla_version()) +
           ", StableHLO " + version(plugin.stablehlo_current_version()) + " (minimum " +
           version(plugin.stablehlo_minimum_version()) + ")";
  } catch (const Error& e) {
    return std::string("failed to load: ") + e.what();
  }
}

}  // namespace

Backend& backend_for(const std::string& device_map, bool verbose) {
  if (device_map == "cpu") return cpu_backend();
  if (device_map == "auto") {
    // Accelerators first, as Transformers does; unlike Transformers we say what we picked.
    if (verbose)
      std::fprintf(stderr, "tformers: device_map=\"auto\" picked cpu (%s); no accelerator found\n",
                   std::string(cpu::target_name(cpu::active_target())).c_str());
    return cpu_backend();
  }
  for (const std::string& pjrt_device : pjrt::plugin_devices())
    if (device_map == pjrt_device) no_device(device_map);
  throw InvalidArgumentError(
      "device_map=\"" + device_map +
      "\" is not a device: use \"cpu\", \"auto\", \"tpu\", \"cuda\" or \"xla-cpu\"");
}

}  // namespace backends

namespace accelerator {

bool is_available() { return false; }  // no PJRT lowering yet: see describe_backends()
int device_count() { return 0; }
std::string current_accelerator() { return ""; }

std::vector<std::string> describe_backends() {
  std::vector<std::string> out;
  out.push_back("cpu: available, kernels " + std::string(cpu::target_name(cpu::active_target())) +
                " (best on this CPU: " + std::string(cpu::target_name(cpu::detected_target())) +
                "), " + std::to_string(ThreadPool::global().num_threads()) + " threads");
  for (const std::string& dev : backends::pjrt::plugin_devices()) {
    backends::pjrt::PluginProbe p = backends::pjrt::probe_plugin(dev);
    if (p.path.empty()) {
      out.push_back(dev + ": not found (looked in " + backends::join(p.looked) + ")");
    } else if (dev == "xla-cpu") {
      // Only the CPU plugin is initialized here: libtpu and the CUDA plugin probe their hardware
      // (libtpu also the cloud metadata server) when initialized, too slow for `env`.
      out.push_back(dev + ": " + p.path + " found, " + backends::describe_plugin(p.path) +
                    "; unusable: " + p.problem);
    } else {
      out.push_back(dev + ": " + p.path + " found, unusable: " + p.problem);
    }
  }
  return out;
}

}  // namespace accelerator

}  // namespace tformers
