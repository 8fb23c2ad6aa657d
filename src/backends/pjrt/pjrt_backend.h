// A Backend over the first device of a PJRT client (XLA's CPU runtime, a TPU, a GPU). Graphs are
// lowered to StableHLO (lower.h) and compiled by the plugin; buffers live in device memory. A
// step uploads its inputs, runs with the parameters and states as arguments, downloads its
// outputs, and takes each state's new value from the buffer the run hands back: the states are
// donated, so the KV cache is updated in device memory and never crosses to the host.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/pjrt/pjrt_api.h"

namespace tformers::backends {

// A backend named `device` ("xla-cpu", "tpu", "cuda") over the plugin at `plugin_path`, with a
// client created with `options`. Throws what Plugin::load and Client throw when the plugin does
// not load or finds no device. The compile cache keys executables by the backend's name, and an
// executable runs only on buffers of its own client: a process that compiles through the cache
// makes one backend per device name (backend_for does).
std::unique_ptr<Backend> make_pjrt_backend(const std::string& device,
                                           const std::string& plugin_path,
                                           const std::vector<pjrt::ClientOption>& options = {});

// The read bandwidth of `client`'s first device memory in GB/s: one program fills `bytes` there,
// a second, timed, sums them, so each run reads its input from memory once (in one program XLA
// would fuse the fill away); the median of 5 runs after a warm-up, each awaited.
double device_read_bandwidth_gbs(const pjrt::Client& client, size_t bytes);

}  // namespace tformers::backends
