// Backends by device name. "cpu" is always available; "tpu", "cuda" and "xla-cpu" (XLA's CPU
// runtime) need a PJRT plugin.
#pragma once

#include <string>

#include "backends/backend.h"

namespace tformers::backends {

// The backend for a device_map value: "cpu", "auto" (a TPU, else a CUDA GPU, else the CPU: an
// accelerator whose device is on the machine and whose plugin starts; logged when verbose),
// "tpu", "cuda" or "xla-cpu" (a PJRT backend, one per name for the process; DeviceError naming
// what was looked for and where when the plugin is absent or does not start), or
// "tpu-topology:NAME" (libtpu compiling for TPU topology NAME, e.g. "v5e:2x2", on a host
// without one, running nothing: pjrt/topology_backend.h).
Backend& backend_for(const std::string& device_map, bool verbose);

}  // namespace tformers::backends
