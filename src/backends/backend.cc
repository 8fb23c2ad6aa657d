#include "backends/backend.h"

#include "tformers/error.h"

namespace tformers::backends {

PreparedWeight Backend::prepare_linear(const Tensor& w, const std::string& quantize) {
  if (!quantize.empty())
    throw UnsupportedError("the " + name() + " backend cannot quantize weights to '" + quantize +
                           "'; load without quantize");
  return {upload(w), nullptr};
}

}  // namespace tformers::backends
