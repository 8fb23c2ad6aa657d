#include "backends/backend.h"

#include "tformers/error.h"

namespace tformers::backends {

PreparedWeight Backend::prepare_linear(const Tensor& w, const std::string& quantize) {
  if (!quantize.empty())
    throw UnsupportedError("the " + name() + " backend cannot quantize weights to '" + quantize +
                           "'; load without quantize");
  return {upload(w), nullptr, nullptr};
}

PreparedWeight Backend::prepare_linear_int4(const Tensor&, const Tensor&, const Tensor&) {
  throw UnsupportedError("the " + name() + " backend has no 4-bit weights");
}

}  // namespace tformers::backends
