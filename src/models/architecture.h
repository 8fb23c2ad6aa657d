// What one architecture file declares: its config fields, its weight table and its graph
// builder. Architectures register themselves by name (config.json "architectures"), so a new
// one is a single file in src/models/ and nothing else changes.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/builder.h"
#include "io/json.h"
#include "tformers/model.h"

namespace tformers::kernels_hub {
class LayerKernels;
}
namespace tformers::distributed {
class TpModel;
struct WeightShard;
}  // namespace tformers::distributed

namespace tformers::models {

// One weight the architecture reads, with the checkpoint's own name.
struct WeightSpec {
  std::string name;
  Shape shape;
  bool required = true;
  std::string tied_to;  // when absent from the checkpoint, use this weight instead
};

// The static shape signature of one forward pass. Positions and the used cache length are
// runtime inputs, never part of the shape.
struct StepShape {
  int64_t batch = 1;
  int64_t new_tokens = 1;
  int64_t cache_len = 0;       // allocated static cache positions
  int64_t logits_to_keep = 1;  // 0 = all positions
  auto operator<=>(const StepShape&) const = default;
};

// Parameter nodes by checkpoint name, created on first use so a tied weight is one node.
class Params {
 public:
  Params(graph::GraphBuilder& b, const std::map<std::string, graph::TensorType>& types)
      : b_(b), types_(types) {}
  graph::Value operator()(const std::string& name);
  bool has(const std::string& name) const { return types_.count(name) != 0; }
  // Tensor parallelism: the model's layout when it is split over ranks, else null.
  void set_tp(const distributed::TpModel* tp) { tp_ = tp; }
  const distributed::TpModel* tp() const { return tp_; }

  // Hub kernels the layers should call instead of built-in ops (null: none); see kernelize().
  const kernels_hub::LayerKernels* kernels = nullptr;

 private:
  const distributed::TpModel* tp_ = nullptr;
  graph::GraphBuilder& b_;
  const std::map<std::string, graph::TensorType>& types_;
  std::map<std::string, graph::Value> nodes_;
};

class Architecture {
 public:
  virtual ~Architecture() = default;
  // Reads fields beyond the shared ones (ModelConfig is already filled by the common parser)
  // and checks the combination; `where` is the config.json path for messages.
  virtual void read_config(const io::Json& json, ModelConfig& config,
                           const std::string& where) const {}
  virtual std::vector<WeightSpec> weights(const ModelConfig& config) const = 0;
  // Checkpoint tensors that are known and deliberately not used (e.g. cached RoPE tables).
  virtual bool ignorable(const std::string& name) const { return false; }
  // Builds the forward pass: inputs input_ids, position_ids (B,T), cache_position (),
  // attention_mask (B,S); states past_key_values.{i}.{key,value}; output logits
  // (B, keep, V). cache_dtype is the KV cache element type.
  virtual void build(graph::GraphBuilder& b, Params& params, const ModelConfig& config,
                     const StepShape& shape, DType cache_dtype) const = 0;
  // The default tensor-parallel plan {module pattern: style}, as Transformers declares it
  // (base_model_tp_plan plus the causal LM's _tp_plan); empty: the model cannot be split.
  virtual std::map<std::string, std::string> tp_plan() const { return {}; }
  // Checks that the resolved layout can run (head counts, compatible styles) and records the
  // per-rank KV heads; InvalidArgumentError naming the override that fixes an impossible plan.
  virtual void validate_tp(const ModelConfig& config, distributed::TpModel& tp) const;
};

void register_architecture(const std::string& name,
                           std::function<std::unique_ptr<Architecture>()> make);
// NotFoundError-free lookup: null when unknown.
const Architecture* find_architecture(const std::string& name);
std::vector<std::string> architecture_names();

// Registers an architecture at static-initialization time:
//   TFORMERS_REGISTER_ARCHITECTURE("LlamaForCausalLM", LlamaForCausalLM);
#define TFORMERS_REGISTER_ARCHITECTURE(NAME, CLASS)                                           \
  static const bool tformers_registered_##CLASS = [] {                                        \
    ::tformers::models::register_architecture(                                                \
        NAME, [] { return std::unique_ptr<::tformers::models::Architecture>(new CLASS()); }); \
    return true;                                                                              \
  }()

}  // namespace tformers::models
