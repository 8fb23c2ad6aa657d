// Finds PJRT C-API plugins (libtpu for "tpu", the XLA CUDA plugin for "cuda") without loading
// any framework: environment variables first, then the usual install locations.
#pragma once

#include <string>
#include <vector>

namespace tformers::backends::pjrt {

struct PluginProbe {
  std::string device;               // "tpu" or "cuda"
  std::string path;                 // the library found, or ""
  std::vector<std::string> looked;  // every place looked, in order
  std::string problem;              // why a found library is unusable, or ""
};

PluginProbe probe_plugin(const std::string& device);

}  // namespace tformers::backends::pjrt
