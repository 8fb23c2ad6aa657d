// Layer implementations that replace built-in ops in the graphs a model builds. The model layer
// defines this seam and asks it while building; kernels_hub/ (hub kernel packages) implements
// it, so models/ never depends on where a replacement comes from.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace tformers {
class CausalLM;
}  // namespace tformers

namespace tformers::models {

// A step with several new tokens per sequence is prefill, a step with one is decode. The values
// are the kernel ABI's TF_KERNEL_MODE_* bits.
enum class Mode : uint32_t { kPrefill = 1, kDecode = 2 };

class LayerOverrides {
 public:
  virtual ~LayerOverrides() = default;
  // The custom call to emit for `layer` ("RMSNorm", "SiLUAndMul", "RotaryEmbedding",
  // "Attention") in this mode with these input types, or null for the built-in op. May throw
  // when a replacement was required but cannot take these inputs.
  virtual std::shared_ptr<const graph::CustomCall> find(
      const std::string& layer, Mode mode, const std::vector<graph::TensorType>& inputs,
      const std::string& node_name) const = 0;
};

// Makes `model` build its graphs with `overrides` (null: built-in ops only). Compiled steps are
// dropped, so the next forward pass compiles graphs that call the new implementations.
void set_layer_overrides(CausalLM& model, std::shared_ptr<const LayerOverrides> overrides);
// Whether the model was loaded verbose (kernelize reports its choices then).
bool is_verbose(const CausalLM& model);

}  // namespace tformers::models
