// The native CPU backend: always present. An executable is the graph's nodes in order, each a
// kernel call, over an arena whose layout is planned once from tensor lifetimes. Each concurrent
// run gets an arena of its own, allocated by its first use and reused after, so steady-state
// runs allocate nothing.
#pragma once

#include <memory>

#include "backends/backend.h"

namespace tformers::backends {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace tformers::backends
