#include "backends/pjrt/plugin_discovery.h"

#include <dlfcn.h>
#include <glob.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "io/shared_library.h"
#include "tformers/error.h"

namespace tformers::backends::pjrt {

namespace {

struct PluginSource {
  const char* device;
  const char* extra_env;          // a variable the plugin's own tooling uses, or null
  const char* package_file;       // the library inside site-packages
  std::vector<const char*> libs;  // system-wide install paths
  const char* package;            // what installs it
};

const std::vector<PluginSource>& sources() {
  static const std::vector<PluginSource> s = {
      {"tpu",
       "TPU_LIBRARY_PATH",
       "libtpu/libtpu.so",
       {"/usr/lib/libtpu.so", "/usr/local/lib/libtpu.so"},
       "pip install libtpu"},
      {"cuda",
       nullptr,
       "jax_plugins/xla_cuda*/xla_cuda_plugin.so",
       {"/usr/local/lib/pjrt_c_api_gpu_plugin.so"},
       "pip install jax-cuda13-plugin"},
      {"xla-cpu",
       nullptr,
       "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so",
       {},
       "pip install xla-cpu-pjrt==0.0.1, which scripts/setup.sh --tests puts in .venv/"},
  };
  return s;
}

const PluginSource& source_for(const std::string& device) {
  for (const PluginSource& s : sources())
    if (device == s.device) return s;
  throw InvalidArgumentError("\"" + device +
                             "\" is not a PJRT device: use \"tpu\", \"cuda\" or \"xla-cpu\"");
}

// The running interpreter's site-packages folders, as the Python package sets them.
struct PythonDirs {
  std::mutex mu;
  std::vector<std::string> dirs;
};
PythonDirs& python_dirs() {
  static PythonDirs d;
  return d;
}

// The site-packages folder this library was installed into (the Python package puts it, and the
// command it runs, in site-packages/tformers/), or "" for a build folder.
std::string own_site_packages() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&own_site_packages), &info) == 0 || !info.dli_fname)
    return "";
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(info.dli_fname, ec);
  for (; !ec && p.has_parent_path() && p != p.parent_path(); p = p.parent_path())
    if (p.filename() == "site-packages" || p.filename() == "dist-packages") return p.string();
  return "";
}

std::vector<std::string> candidates(const PluginSource& src, std::vector<std::string>& looked) {
  std::vector<std::string> out;
  auto env = [&](const std::string& name) {
    looked.push_back("$" + name);
    if (const char* v = std::getenv(name.c_str()); v && *v) out.push_back(v);
  };
  auto pattern = [&](const std::string& p) {
    looked.push_back(p);
    glob_t g{};
    if (::glob(p.c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) out.push_back(g.gl_pathv[i]);
    globfree(&g);
  };
  env(plugin_env_var(src.device));
  if (src.extra_env) env(src.extra_env);
  // Python environments: the running interpreter's (set by the Python package), the one this
  // library is installed in (the console script's), the activated one, the project's .venv/ when
  // run from its checkout, then the system's. A virtual environment run by its own bin/python
  // is not activated, so VIRTUAL_ENV alone misses it.
  std::vector<std::string> interpreter;
  {
    std::lock_guard<std::mutex> lock(python_dirs().mu);
    interpreter = python_dirs().dirs;
  }
  for (const std::string& dir : interpreter) pattern(dir + "/" + src.package_file);
  static const std::string own = own_site_packages();
  if (!own.empty() && std::find(interpreter.begin(), interpreter.end(), own) == interpreter.end())
    pattern(own + "/" + src.package_file);
  if (const char* venv = std::getenv("VIRTUAL_ENV"); venv && *venv)
    pattern(std::string(venv) + "/lib/python3*/site-packages/" + src.package_file);
  pattern(std::string(".venv/lib/python3*/site-packages/") + src.package_file);
  pattern(std::string("/usr/local/lib/python3*/dist-packages/") + src.package_file);
  pattern(std::string("/usr/lib/python3*/dist-packages/") + src.package_file);
  for (const char* lib : src.libs) pattern(lib);
  return out;
}

}  // namespace

const std::vector<std::string>& plugin_devices() {
  static const std::vector<std::string> d = [] {
    std::vector<std::string> out;
    for (const PluginSource& s : sources()) out.push_back(s.device);
    return out;
  }();
  return d;
}

std::string plugin_env_var(const std::string& device) {
  std::string name = "TFORMERS_PJRT_PLUGIN_";
  for (char c : device) name += c == '-' ? '_' : char(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

void set_python_site_packages(std::vector<std::string> dirs) {
  std::lock_guard<std::mutex> lock(python_dirs().mu);
  python_dirs().dirs = std::move(dirs);
}

PluginProbe probe_plugin(const std::string& device) {
  const PluginSource& src = source_for(device);
  PluginProbe probe;
  probe.device = device;
  probe.package = src.package;
  // A variable set to a path is what the user asked for: a typo there must not fall back to
  // another plugin found elsewhere without a word.
  const std::string var = plugin_env_var(device);
  if (const char* v = std::getenv(var.c_str()); v && *v && !std::filesystem::exists(v)) {
    probe.looked.push_back("$" + var);
    probe.path = v;
    probe.problem = var + " names no existing file; set it to the plugin library, or unset it";
    return probe;
  }
  for (const std::string& path : candidates(src, probe.looked)) {
    if (!std::filesystem::exists(path)) continue;
    probe.path = path;
    try {
      io::check_shared_library(path);  // a truncated copy would end the process in dlopen
    } catch (const Error& e) {
      probe.problem = e.what();
      return probe;
    }
    // Never dlclose'd: unloading a PJRT plugin is unsafe, and the client loads it again anyway.
    void* handle = ::dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
    if (!handle)
      probe.problem = std::string("dlopen failed: ") + ::dlerror();
    else if (!::dlsym(handle, "GetPjrtApi"))
      probe.problem = "the library does not export GetPjrtApi (not a PJRT plugin)";
    return probe;
  }
  return probe;
}

void configure_libtpu_without_tpu() {
  ::setenv("TPU_SKIP_MDS_QUERY", "1", /*overwrite=*/0);
  ::setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1", 0);
  ::setenv("TPU_WORKER_HOSTNAMES", "localhost", 0);
  ::setenv("TPU_ACCELERATOR_TYPE", "v5litepod-1", 0);
}

}  // namespace tformers::backends::pjrt
