// The native CPU backend: always present. An executable is the graph's nodes in order, each a
// kernel call, over an arena whose layout is planned once from tensor lifetimes. Each concurrent
// run gets an arena of its own, allocated by its first use and reused after, so steady-state
// runs allocate nothing.
#pragma once

#include <memory>

#include "backends/backend.h"

namespace tformers::backends {

std::unique_ptr<Backend> make_cpu_backend();

// A backend whose quantized linears take the operands as the graph's linear_int8 and
// linear_int4 define them, the layout of the CPU kernels: weights quantized at load by the CPU's
// quantizers and int4 checkpoints re-tiled on the host, then uploaded (prepare.cc). The CPU
// backend and the PJRT backend both are one.
class QuantizedLayoutBackend : public Backend {
 public:
  PreparedWeight prepare_linear(const Tensor& w, const std::string& quantize) override;
  PreparedWeight prepare_linear_int4(const Tensor& codes, const Tensor& scale,
                                     const Tensor& zero) override;
};

}  // namespace tformers::backends
