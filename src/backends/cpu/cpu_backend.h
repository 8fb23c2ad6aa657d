// The native CPU backend: always present. An executable is the graph's nodes in order, each a
// kernel call, over an arena whose layout is planned once from tensor lifetimes. Each concurrent
// run gets an arena of its own, allocated by its first use and reused after, so steady-state
// runs allocate nothing.
#pragma once

#include <memory>

#include "backends/backend.h"

namespace tformers::backends {

std::unique_ptr<Backend> make_cpu_backend();

// Backend::prepare_linear for "int8" on the CPU (prepare.cc).
PreparedWeight prepare_int8(Backend& backend, const Tensor& w);
// ... and "int4".
PreparedWeight prepare_int4(Backend& backend, const Tensor& w);
// Backend::prepare_linear_int4 on the CPU.
PreparedWeight pack_int4(Backend& backend, const Tensor& codes, const Tensor& scale,
                         const Tensor& zero);

}  // namespace tformers::backends
