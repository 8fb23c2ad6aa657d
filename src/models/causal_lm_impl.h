// The state behind a CausalLM handle: config, bound weights, the static KV cache and the
// compiled steps. Shared by models/ (loading, forward) and generation/ (the decoding loop).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "distributed/tp_model.h"
#include "models/architecture.h"
#include "tformers/model.h"

namespace tformers {

struct CausalLM::Impl {
  // A compiled step with its bindings resolved once, in the graph's leaf order. States are bound
  // to their slots in `cache` or `kv_pool`, not to the buffers in them, so a slot's buffer can
  // be replaced (a new attention mask; a device that hands back donated state as a new buffer)
  // without rebinding.
  struct Step {
    models::StepShape shape;
    std::shared_ptr<backends::Executable> exe;
    std::vector<backends::Buffer*> params;
    std::vector<const std::shared_ptr<backends::Buffer>*> states;
  };

  // config.json as the architecture read it; its PretrainedConfig part is what CausalLM::config
  // returns and the generation loop reads.
  std::unique_ptr<models::ArchConfig> arch_config;
  const models::Architecture* arch = nullptr;
  backends::Backend* backend = nullptr;
  std::string device;  // the backend's name
  std::string path;
  DType dtype = DType::f32;
  DType cache_dtype = DType::f32;  // the KV caches', as the backend keeps them for dtype
  // The linear weights' quantization ("", "int8", "int4"): asked for at load, or as stored.
  std::string quantize;
  bool verbose = false;
  std::map<std::string, std::shared_ptr<backends::Buffer>> weights;
  std::map<std::string, graph::TensorType> weight_types;
  // The quantized linear weights, by name: how the backend holds each (graph::Op::kLinearQuant).
  std::map<std::string, graph::LinearQuantAttrs> quant_attrs;
  // Tensor parallelism: this rank's layout, or null for a whole model.
  std::shared_ptr<distributed::TpModel> tp;

  // Static KV cache, laid out as the architecture's states() say:
  // past_key_values.{i}.{key,value}, B by S slots by Hkv by D each in the backend's
  // kv_layout(); recurrent_state.{i}.{conv,delta} for linear-attention layers (LayerState);
  // and attention_mask (B,S) int32, the key
  // mask over cache slots, uploaded once per generation rather than at every step.
  int64_t cache_batch = 0, cache_len = 0;
  std::map<std::string, std::shared_ptr<backends::Buffer>> cache;
  // Counts every step run and every reallocation of the static cache, so a caller that keeps
  // what its last call left in the cache (KeptCache) can tell whether anything ran since.
  uint64_t cache_writes = 0;

  // Allocates the static cache for (batch, cache_len), or keeps it if the shape is the same.
  void reset_cache(int64_t batch, int64_t cache_len);

  // Paged KV pools (ServingEngine): kv_pool.{i}.{key,value}, blocks by block_size by Hkv by D
  // each, in the backend's kv_layout();
  // block tables of pool_table_blocks entries per sequence.
  int64_t pool_blocks = 0, pool_block_size = 0, pool_table_blocks = 0;
  // With linear-attention layers, their recurrent_pool.{i}.{conv,delta}: a state per slot, a
  // slot per sequence a paged step holds (StepShape::state_slots).
  int64_t pool_state_slots = 0;
  std::map<std::string, std::shared_ptr<backends::Buffer>> kv_pool;
  // Allocates the pools (or keeps them if the sizes match); paged steps bind to them.
  void allocate_pool(int64_t blocks, int64_t block_size, int64_t table_blocks, int64_t state_slots);
  // Allocates every layer's state into `into`: an attention layer's keys and values as
  // "<kv>.{i}.key" and ".value", `rows` (sequences, or pool blocks) of `positions` slots; a
  // linear-attention layer's as "<recurrent>.{i}.conv" and ".delta", one per sequence of
  // `sequences`.
  void allocate_states(std::map<std::string, std::shared_ptr<backends::Buffer>>& into,
                       const char* kv, int64_t rows, int64_t positions, const char* recurrent,
                       int64_t sequences);
  // Bytes of keys and values one position takes over all layers, in the cache dtype.
  int64_t kv_bytes_per_position() const;
  // Bytes of the linear-attention layers' recurrent state one sequence holds (0 for a model of
  // attention layers only).
  int64_t recurrent_bytes_per_sequence() const;
  // Whether the KV cache and pools live in host memory (the CPU backend, XLA's CPU plugin), so
  // that plans are checked against memory_limit_bytes() before allocating them.
  bool state_on_host() const { return device == "cpu" || device == "xla-cpu"; }

  // The weight bytes one decode step streams, for rooflines (tformers bench, bench/): every
  // weight buffer once (a tied head that is the embedding counts once), but not an embedding of
  // which a step gathers one row while the head is its own buffer (untied, or a quantized copy);
  // of a mixture's experts, the routed share (WeightSpec::read_share), from the buffer's start.
  // `data` is where the host reads the bytes in place, null for device memory.
  struct WeightSpan {
    const void* data;
    int64_t bytes;
  };
  std::vector<WeightSpan> decode_weight_spans() const;

  // Layer implementations the graphs call instead of built-in ops (models::set_layer_overrides).
  std::shared_ptr<const models::LayerOverrides> overrides;

  // The graph of one step, as step() compiles it (also for tests and debugging).
  graph::Graph build_graph(const models::StepShape& shape) const;

  // The calls that run the model (generate, forward, reset_cache) take turns: they share the
  // static cache and the steps' bound state. `caller` is the thread inside one, so that a call
  // made from within it (a token callback calling the model) is refused rather than waiting on
  // itself forever (models::ExclusiveCall).
  std::mutex call_mutex;
  std::atomic<std::thread::id> caller;

  std::map<models::StepShape, Step> steps;
  CompileStats stats;
  GenerationConfig generation_config;
  std::vector<int64_t> prompt_buckets;

  // The compiled step for a shape: looked up, else built, compiled (or found in the global
  // compile cache) and bound.
  // With `uncached` (disable_compile) the graph is compiled afresh and kept only in `scratch`.
  Step& step(const models::StepShape& shape, bool uncached = false);
  Step scratch;
  // Runs a step with these host inputs (the graph's kInput leaves in order) on its bound state;
  // fills the host outputs.
  void run(Step& step, std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs);
};

namespace models {

// The way into a CausalLM handle's state for the layers below the public API (the model
// runner, kernelize, their tests). Nothing in include/ reaches it.
struct CausalLMAccess {
  static CausalLM::Impl& state(CausalLM& model) { return *model.impl_; }
  static const CausalLM::Impl& state(const CausalLM& model) { return *model.impl_; }
  static CausalLM wrap(std::shared_ptr<CausalLM::Impl> impl) { return CausalLM(std::move(impl)); }
};

// Holds a model for one call that runs it, for its scope (CausalLM::Impl::call_mutex).
// InvalidArgumentError when the thread is already inside a call on the same model.
class ExclusiveCall {
 public:
  explicit ExclusiveCall(CausalLM::Impl& model);
  ~ExclusiveCall();
  ExclusiveCall(const ExclusiveCall&) = delete;
  ExclusiveCall& operator=(const ExclusiveCall&) = delete;

 private:
  CausalLM::Impl& model_;
  std::lock_guard<std::mutex> lock_;
};

inline CausalLM::Impl& state_of(CausalLM& model) { return CausalLMAccess::state(model); }
inline const CausalLM::Impl& state_of(const CausalLM& model) {
  return CausalLMAccess::state(model);
}

}  // namespace models

}  // namespace tformers
