#include "backends/pjrt/plugin_discovery.h"

#include <dlfcn.h>
#include <glob.h>

#include <cstdlib>
#include <filesystem>

namespace tformers::backends::pjrt {

namespace {

std::vector<std::string> candidates(const std::string& device, std::vector<std::string>& looked) {
  std::vector<std::string> out;
  auto env = [&](const char* name) {
    looked.push_back(std::string("$") + name);
    if (const char* v = std::getenv(name); v && *v) out.push_back(v);
  };
  auto pattern = [&](const std::string& p) {
    looked.push_back(p);
    glob_t g{};
    if (::glob(p.c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) out.push_back(g.gl_pathv[i]);
    globfree(&g);
  };
  if (device == "tpu") {
    env("TFORMERS_PJRT_TPU");
    env("TPU_LIBRARY_PATH");  // the variable libtpu's own tooling uses
    pattern("/usr/lib/libtpu.so");
    pattern("/usr/local/lib/libtpu.so");
    pattern("/usr/local/lib/python3*/dist-packages/libtpu/libtpu.so");
    pattern("/usr/lib/python3*/dist-packages/libtpu/libtpu.so");
  } else {
    env("TFORMERS_PJRT_CUDA");
    pattern("/usr/local/lib/pjrt_c_api_gpu_plugin.so");
    pattern("/usr/local/lib/python3*/dist-packages/jax_plugins/xla_cuda*/xla_cuda_plugin.so");
  }
  return out;
}

}  // namespace

PluginProbe probe_plugin(const std::string& device) {
  PluginProbe probe;
  probe.device = device;
  for (const std::string& path : candidates(device, probe.looked)) {
    if (!std::filesystem::exists(path)) continue;
    probe.path = path;
    void* handle = ::dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
    if (!handle) {
      probe.problem = std::string("dlopen failed: ") + ::dlerror();
    } else {
      if (!::dlsym(handle, "GetPjrtApi"))
        probe.problem = "the library does not export GetPjrtApi (not a PJRT plugin)";
      else
        // The plugin is real, but graphs cannot be lowered to StableHLO in this build yet.
        probe.problem = "this build has no StableHLO lowering for PJRT yet";
      ::dlclose(handle);
    }
    return probe;
  }
  return probe;
}

}  // namespace tformers::backends::pjrt
