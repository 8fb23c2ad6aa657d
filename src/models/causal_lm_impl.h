// The state behind a CausalLM handle: config, bound weights, the static KV cache and the
// compiled steps. Shared by models/ (loading, forward) and generation/ (the decoding loop).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "distributed/tp_model.h"
#include "models/architecture.h"
#include "tformers/model.h"

namespace tformers {

struct CausalLM::Impl {
  // A compiled step with its bindings resolved once, in the graph's leaf order.
  struct Step {
    std::shared_ptr<backends::Executable> exe;
    std::vector<backends::Buffer*> params, states;
  };

  // config.json as the architecture read it; its PretrainedConfig part is what CausalLM::config
  // returns and the generation loop reads.
  std::unique_ptr<models::ArchConfig> arch_config;
  const models::Architecture* arch = nullptr;
  backends::Backend* backend = nullptr;
  std::string device;  // the backend's name
  std::string path;
  DType dtype = DType::f32;
  // The linear weights' quantization ("", "int8", "int4"): asked for at load, or as stored.
  std::string quantize;
  bool verbose = false;
  std::map<std::string, std::shared_ptr<backends::Buffer>> weights;
  std::map<std::string, graph::TensorType> weight_types;
  // Tensor parallelism: this rank's layout, or null for a whole model.
  std::shared_ptr<distributed::TpModel> tp;

  // Static KV cache, laid out as the architecture's states() say:
  // past_key_values.{i}.{key,value}, (B,Hkv,S,D) each.
  int64_t cache_batch = 0, cache_len = 0;
  std::map<std::string, std::shared_ptr<backends::Buffer>> cache;

  // Paged KV pools (ServingEngine): kv_pool.{i}.{key,value}, (blocks, Hkv, block_size, D) each.
  int64_t pool_blocks = 0, pool_block_size = 0;
  std::map<std::string, std::shared_ptr<backends::Buffer>> kv_pool;
  // Allocates the pools (or keeps them if the sizes match); paged steps bind to them.
  void allocate_pool(int64_t blocks, int64_t block_size);
  // Bytes of keys and values one position takes over all layers, in the cache dtype.
  int64_t kv_bytes_per_position() const;

  // The weight bytes one decode step streams, for rooflines (tformers bench, bench/): every
  // weight buffer once (a tied head that is the embedding counts once), but not an embedding of
  // which a step gathers one row while the head is its own buffer (untied, or a quantized copy).
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

  std::map<models::StepShape, Step> steps;
  CompileStats stats;
  GenerationConfig generation_config;
  std::vector<int64_t> prompt_buckets;

  // The compiled step for a shape: looked up, else built, compiled (or found in the global
  // compile cache) and bound.
  // With `uncached` (disable_compile) the graph is compiled afresh and kept only in `scratch`.
  Step& step(const models::StepShape& shape, bool uncached = false);
  Step scratch;
  // Runs one step on the current cache with host inputs (B,T) ids and positions, the
  // (B,S) mask and the cache slot of the first new token; fills logits (B,keep,V).
  void run(Step& step, const Tensor& ids, const Tensor& positions, const Tensor& mask,
           int64_t cache_position, Tensor& logits);
  // Runs a paged step: ids and positions (B,T) (negative positions are padding), block table
  // (B, table_blocks); fills logits (B,keep,V).
  void run_paged(Step& step, const Tensor& ids, const Tensor& positions, const Tensor& table,
                 Tensor& logits);
};

}  // namespace tformers
