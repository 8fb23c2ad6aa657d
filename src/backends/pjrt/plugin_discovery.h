// Finds PJRT C-API plugins (libtpu for "tpu", the XLA CUDA plugin for "cuda", XLA's CPU plugin
// for "xla-cpu") without loading any framework: TFORMERS_PJRT_PLUGIN_<NAME> first, then the
// Python environments' installed plugin packages, then the usual library paths.
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

// libtpu asks the cloud metadata server for its TPU's configuration when it starts, retrying
// each key 30 times: minutes on a host that is not a TPU VM. Compiling for a topology needs none
// of it, so before loading libtpu for that, this sets TPU_SKIP_MDS_QUERY=1 where the environment
// does not set it already.
void skip_tpu_metadata_query();

}  // namespace tformers::backends::pjrt
