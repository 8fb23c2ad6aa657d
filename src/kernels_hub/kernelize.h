// The hub kernels a model was kernelized with, as the graph builder (models/layers.cc) sees
// them: for a layer, a mode and the actual input types, the custom call to emit, or nothing
// (use the built-in op).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace tformers::kernels_hub {

// A step with several new tokens per sequence is prefill, a step with one is decode.
enum class Mode : uint32_t { kPrefill = 1, kDecode = 2 };  // TF_KERNEL_MODE_* bits

class LayerKernels {
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
                                                const std::string& node_name) const;

  std::map<std::string, Slot> slots;
  bool use_fallback = true;
};

}  // namespace tformers::kernels_hub
