// Backends by device name. "cpu" is always available; "tpu" and "cuda" need a PJRT plugin.
#pragma once

#include <string>

#include "backends/backend.h"

namespace tformers::backends {

// The backend for a device_map value: "cpu", "auto" (best available; logged when verbose),
// "tpu" or "cuda" (DeviceError naming what was looked for and where when absent).
Backend& backend_for(const std::string& device_map, bool verbose);

}  // namespace tformers::backends
