// The hub kernels a model was kernelized with, as the layer library (models/layers.cc) sees
// them through models::LayerOverrides: for a layer, a mode and the actual input types, the
// custom call to emit, or nothing (use the built-in op).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "models/overrides.h"

namespace tformers::kernels_hub {

using models::Mode;

class LayerKernels : public models::LayerOverrides {
 public:
  struct Slot {
    std::shared_ptr<const graph::CustomCall> call;       // null: this layer stays built-in
    std::vector<std::vector<std::string>> input_dtypes;  // per input, the dtypes it accepts
    uint32_t modes = 0;
    std::string kernel;  // for messages
  };

  // The custom call for `layer`, or null for the built-in op. With fallback off, a kernel that
  // does not take this mode or these dtypes is an UnsupportedError saying which.
  std::shared_ptr<const graph::CustomCall> find(const std::string& layer, Mode mode,
                                                const std::vector<graph::TensorType>& inputs,
                                                const std::string& node_name) const override;

  std::map<std::string, Slot> slots;
  bool use_fallback = true;
};

}  // namespace tformers::kernels_hub
