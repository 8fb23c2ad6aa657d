// The tensor-parallel state of one loaded model: its process group, its resolved plan, the slice
// of every weight this rank holds, and the loader that reads exactly those slices from the mmap'd
// checkpoint.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "distributed/tp_plan.h"
#include "io/safetensors.h"
#include "tformers/distributed.h"

namespace tformers::distributed {

struct WeightDecl {
  std::string name;  // checkpoint name, "model.layers.0.self_attn.q_proj.weight"
  Shape shape;
};

class TpModel {
 public:
  // Resolves the plan (`defaults` are the architecture's rules) over `weights` for this rank of
  // the tensor-parallel group that `config` describes.
  TpModel(const DistributedConfig& config, const std::map<std::string, std::string>& defaults,
          const std::vector<WeightDecl>& weights);
  // The same for an explicit group (tests, benchmarks).
  TpModel(std::shared_ptr<ProcessGroup> group, const std::map<std::string, std::string>& defaults,
          const std::map<std::string, std::string>& user, const std::vector<WeightDecl>& weights);

  int rank() const { return group_->rank(); }
  int size() const { return group_->size(); }
  int group_id() const { return group_->id(); }
  ProcessGroup& group() { return *group_; }
  const TpPlan& plan() const { return plan_; }
  // The slice of a declared weight (TF_CHECK if undeclared).
  const WeightShard& shard(const std::string& weight) const;
  bool has(const std::string& weight) const { return shards_.count(weight) != 0; }
  // The rule that decided a weight's style, for messages ("layers.*.self_attn.k_proj").
  std::string rule_for(const std::string& weight) const;

  // Reads this rank's slice of checkpoint tensor `source` as weight `weight` would be held
  // (source differs from weight for a tied alias), converted to `dtype`. Rows along dim 0 are a
  // view of the mapping; a column slice is copied row by row, touching only those bytes.
  Tensor load(const io::Checkpoint& ckpt, const std::string& weight, const std::string& source,
              DType dtype);
  // Bytes of checkpoint data this rank read, and the bytes of the whole tensors it read from.
  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t bytes_full() const { return bytes_full_; }

  // Set by the architecture's validation: KV heads each rank holds in its cache.
  int64_t local_kv_heads = 0;

 private:
  // The slice of every weight, refusing splits that leave a rank without one.
  void init(const std::vector<WeightDecl>& weights);
  std::shared_ptr<ProcessGroup> group_;
  TpPlan plan_;
  std::map<std::string, WeightShard> shards_;
  uint64_t bytes_read_ = 0, bytes_full_ = 0;
};

// "model.layers.0.mlp.up_proj.weight" -> "model.layers.0.mlp.up_proj".
std::string module_of(const std::string& weight);

// A rank's rows of a weight split along dim 0 (s.dim == 0), as `s` lays them out: each range at
// the start of its piece of s.chunk rows, the rest zeros. copy(b, e, dst) writes rows [b, e) of
// the whole weight, in `dtype`, to dst.
Tensor shard_rows(const WeightShard& s, DType dtype,
                  const std::function<void(int64_t, int64_t, void*)>& copy);
// The same rows of `whole`, a host tensor whose dim 0 is the weight's (its other dims may differ:
// a weight's MXFP4 codes, say), in whole's dtype, its other dims kept.
Tensor shard_rows(const WeightShard& s, const Tensor& whole);

}  // namespace tformers::distributed
