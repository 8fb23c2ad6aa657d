#include "backends/registry.h"

#include <glob.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>

#include "backends/cpu/cpu_backend.h"
#include "backends/pjrt/pjrt_api.h"
#include "backends/pjrt/pjrt_backend.h"
#include "backends/pjrt/plugin_discovery.h"
#include "backends/pjrt/topology_backend.h"
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

[[noreturn]] void no_device(const pjrt::PluginProbe& p) {
  std::string msg = "device_map=\"" + p.device + "\": no usable " + p.device + " runtime. ";
  if (p.path.empty())
    msg += "No PJRT plugin was found; looked in " + join(p.looked) + ". Install it (" + p.package +
           ") or set " + pjrt::plugin_env_var(p.device) +
           " to the plugin library, or use device_map=\"cpu\".";
  else
    msg += "The plugin " + p.path + " cannot be used: " + p.problem + ". Use device_map=\"cpu\".";
  throw DeviceError(msg);
}

// The device files of an accelerator: a glob pattern and, for TPUs, the VFIO device that newer
// TPU hosts expose instead.
struct DeviceFiles {
  const char* pattern;
  const char* also;
};
DeviceFiles device_files(const std::string& device) {
  if (device == "tpu") return {"/dev/accel*", "/dev/vfio/0"};
  return {"/dev/nvidia[0-9]*", nullptr};
}

// Whether this machine has the hardware of PJRT device `device` (XLA's CPU runtime always). An
// accelerator's plugin is initialized only then: libtpu on a host without TPUs waits on the
// cloud metadata server before it fails.
bool hardware_present(const std::string& device) {
  if (device == "xla-cpu") return true;
  const DeviceFiles files = device_files(device);
  glob_t g{};
  const bool found = ::glob(files.pattern, 0, nullptr, &g) == 0 && g.gl_pathc > 0;
  globfree(&g);
  return found || (files.also && std::filesystem::exists(files.also));
}

// device_map="tpu-topology:v5e:2x2": compile for that TPU topology, run nothing.
constexpr std::string_view kTopologyPrefix = "tpu-topology:";

// The backend of PJRT device `device`, made on first use (one per device name, as the compile
// cache's keys need). They are never destroyed: their handles live inside the plugin, whose own
// static objects may already be destroyed when this library's are, at exit.
Backend& pjrt_backend(const std::string& device) {
  static std::mutex mu;
  static auto* made = new std::map<std::string, std::unique_ptr<Backend>>;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = made->find(device); it != made->end()) return *it->second;
  if (device.starts_with(kTopologyPrefix)) {
    const pjrt::PluginProbe p = pjrt::probe_plugin("tpu");
    if (p.path.empty() || !p.problem.empty()) no_device(p);
    pjrt::configure_libtpu_without_tpu();  // nothing of a real TPU is needed
    auto backend = std::make_unique<TopologyBackend>(pjrt::Plugin::load(p.path),
                                                     device.substr(kTopologyPrefix.size()));
    return *made->emplace(device, std::move(backend)).first->second;
  }
  const pjrt::PluginProbe p = pjrt::probe_plugin(device);
  if (p.path.empty() || !p.problem.empty()) no_device(p);
  if (!hardware_present(device)) {
    const DeviceFiles files = device_files(device);
    throw DeviceError("device_map=\"" + device + "\": found the PJRT plugin " + p.path +
                      ", but this machine has no " + device + " device (looked in " +
                      files.pattern + (files.also ? std::string(" and ") + files.also : "") +
                      "). Use device_map=\"cpu\".");
  }
  std::unique_ptr<Backend> backend;
  try {
    backend = make_pjrt_backend(device, p.path);
  } catch (const Error& e) {
    throw DeviceError("device_map=\"" + device + "\": the PJRT plugin " + p.path +
                      " did not start: " + e.what() + ". Use device_map=\"cpu\".");
  }
  return *made->emplace(device, std::move(backend)).first->second;
}

// device_map="auto": the first accelerator, as Transformers prefers them, whose hardware is here
// and whose plugin starts, else the CPU. Decided once per process; `why` says what was passed
// over.
struct AutoChoice {
  Backend* backend = nullptr;
  std::string why;
};

const AutoChoice& auto_choice() {
  static const AutoChoice choice = [] {
    AutoChoice c;
    for (const char* device : {"tpu", "cuda"}) {
      if (!hardware_present(device)) continue;
      try {
        c.backend = &pjrt_backend(device);
        return c;
      } catch (const Error& e) {
        c.why += std::string(c.why.empty() ? "" : "; ") + e.what();
      }
    }
    c.backend = &cpu_backend();
    if (c.why.empty()) c.why = "no accelerator found";
    return c;
  }();
  return choice;
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
    const AutoChoice& c = auto_choice();
    if (verbose) {
      if (c.backend == &cpu_backend())
        std::fprintf(stderr, "tformers: device_map=\"auto\" picked cpu (%s); %s\n",
                     std::string(cpu::target_name(cpu::active_target())).c_str(), c.why.c_str());
      else
        std::fprintf(stderr, "tformers: device_map=\"auto\" picked %s (%s)%s%s\n",
                     c.backend->name().c_str(), c.backend->device().str().c_str(),
                     c.why.empty() ? "" : "; passed over: ", c.why.c_str());
    }
    return *c.backend;
  }
  for (const std::string& pjrt_device : pjrt::plugin_devices())
    if (device_map == pjrt_device) return pjrt_backend(device_map);
  if (device_map.starts_with(kTopologyPrefix) && device_map.size() > kTopologyPrefix.size())
    return pjrt_backend(device_map);
  throw InvalidArgumentError(
      "device_map=\"" + device_map +
      "\" is not a device: use \"cpu\", \"auto\", \"tpu\", \"cuda\" or \"xla-cpu\" (or "
      "\"tpu-topology:NAME\" to compile for a TPU topology without running)");
}

}  // namespace backends

namespace accelerator {

bool is_available() { return !current_accelerator().empty(); }
// The devices tformers drives: a PJRT backend runs on one.
int device_count() { return is_available() ? 1 : 0; }
std::string current_accelerator() {
  const backends::Backend* b = backends::auto_choice().backend;
  return b->name() == "cpu" ? "" : b->name();
}

void set_python_site_packages(const std::vector<std::string>& dirs) {
  backends::pjrt::set_python_site_packages(dirs);
}

std::vector<std::string> describe_backends() {
  std::vector<std::string> out;
  out.push_back("cpu: available, kernels " + std::string(cpu::target_name(cpu::active_target())) +
                " (best on this CPU: " + std::string(cpu::target_name(cpu::detected_target())) +
                "), weight prefetch " +
                std::string(cpu::weight_prefetch_name(cpu::weight_prefetch())) + ", " +
                std::to_string(ThreadPool::global().num_threads()) + " threads");
  for (const std::string& dev : backends::pjrt::plugin_devices()) {
    backends::pjrt::PluginProbe p = backends::pjrt::probe_plugin(dev);
    if (p.path.empty()) {
      out.push_back(dev + ": not found (looked in " + backends::join(p.looked) + ")");
      continue;
    }
    std::string line = dev + ": " + p.path + " found, ";
    if (dev == "xla-cpu")
      // Only the CPU plugin is initialized here: libtpu and the CUDA plugin probe their hardware
      // (libtpu also the cloud metadata server) when initialized, too slow for `env`.
      line += backends::describe_plugin(p.path) + "; ";
    if (!p.problem.empty())
      line += "unusable: " + p.problem;
    else if (dev == "xla-cpu")
      line += "device_map=\"xla-cpu\" runs on it";
    else if (backends::hardware_present(dev))
      line += "a " + dev + " device is present; device_map=\"" + dev + "\" starts the plugin";
    else
      line += "unused: no " + dev + " device on this machine";
    out.push_back(line);
  }
  return out;
}

}  // namespace accelerator

}  // namespace tformers
