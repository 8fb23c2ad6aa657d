// Finds PJRT C-API plugins (libtpu for "tpu", the XLA CUDA plugin for "cuda", XLA's CPU plugin
// for "xla-cpu") without loading any framework: TFORMERS_PJRT_PLUGIN_<NAME> first, then the
// Python environments' installed plugin packages (the running interpreter's first), then the
// usual library paths.
#pragma once

#include <string>
#include <vector>

namespace tformers::backends::pjrt {

// The PJRT devices a plugin can be looked for: "tpu", "cuda", "xla-cpu".
const std::vector<std::string>& plugin_devices();

// "TFORMERS_PJRT_PLUGIN_XLA_CPU" for "xla-cpu".
std::string plugin_env_var(const std::string& device);

struct PluginProbe {
  std::string device;               // one of plugin_devices()
  std::string path;                 // the library found, or ""
  std::vector<std::string> looked;  // every place looked, in order
  std::string problem;              // why a found library is unusable, or ""
  std::string package;              // what installs the plugin, for messages
};

PluginProbe probe_plugin(const std::string& device);

// The running Python interpreter's site-packages folders, searched before any other Python
// environment (accelerator::set_python_site_packages).
void set_python_site_packages(std::vector<std::string> dirs);

// libtpu asks the cloud metadata server for the host's TPU configuration when it starts,
// retrying each key 30 times: over 5 minutes on a host that is not a TPU VM. It also takes a
// lock file, /tmp/libtpu_lockfile, so that one process owns the chips. Compiling for a topology
// needs neither, so before loading libtpu for that, this sets TPU_SKIP_MDS_QUERY=1 and
// ALLOW_MULTIPLE_LIBTPU_LOAD=1 (tests and `tformers compile` may load it in several processes at
// once), and, to quiet the warnings about the host's own TPU (there is none),
// TPU_WORKER_HOSTNAMES=localhost and TPU_ACCELERATOR_TYPE=v5litepod-1; each only where the
// environment does not set it. What is compiled for comes from the topology's name, not these.
void configure_libtpu_without_tpu();

}  // namespace tformers::backends::pjrt
