// Tensor-parallel plans: which style shards each weight, resolved from an architecture's default
// plan and the user's overrides, and the slice of each weight a rank reads. Pure logic, no MPI:
// unit-tested without processes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tformers/tensor.h"

namespace tformers::distributed {

// The Transformers styles an inference forward uses (names as in Transformers; aliases parse).
enum class TpStyle : uint8_t {
  kReplicate,            // "replicate", "local": the whole weight, no communication
  kColwise,              // rows (output features) split; output stays sharded
  kRowwise,              // columns (input features) split; input sharded, output reduced
  kColwiseGatherOutput,  // "colwise_rep": colwise, then the output is all-gathered
  kRowwiseSplitInput,    // "rowwise_rep": rowwise on a replicated input, sliced locally
  kEmbeddingRowwise,     // vocabulary rows split; lookups outside the slice are zero, reduced
  kPackedColwise,        // fused [gate; up] rows: each half split colwise, then re-packed
  kReplicatedWithGradAllreduce,  // replicated (the gradient all-reduce matters only in training)
  kGroupedGemm,  // "ep_dispatch_experts": a mixture's experts split over ranks (dim 0), each
                 // rank's share of a token's experts summed, then reduced
};

const char* style_name(TpStyle s);
// Every accepted style name, aliases included, comma-separated (for error messages).
std::string style_names();
std::optional<TpStyle> parse_style(const std::string& name);

// [begin, end) of rank `rank` when `n` is split over `size` ranks as torch.chunk does: chunks of
// ceil(n / size), the last one shorter, trailing ranks possibly empty.
std::pair<int64_t, int64_t> chunk_range(int64_t n, int rank, int size);
// ceil(n / size): the length every rank's piece of n is padded to.
int64_t padded_chunk(int64_t n, int size);

// The part of one weight a rank holds. Every rank holds the same shape: each range is padded
// with zeros to padded_chunk() along dim, so that every rank builds the same graph (the padded
// features of a colwise output are zeros, which the rowwise layer after it multiplies by its
// zero columns, and an all-gather slices them off).
struct WeightShard {
  TpStyle style = TpStyle::kReplicate;
  int dim = -1;  // split dimension (0 rows, 1 columns), -1 for the whole tensor
  // The rank's data along dim: ranges of the full weight, each at the start of its own piece of
  // `chunk` positions of the local one, in order (packed_colwise has two, everything else one).
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t chunk = 0;
  Shape full_shape, local_shape;
  int64_t local_elements() const { return shape_numel(local_shape); }
};

// How a weight of `shape` is held by `rank` of `size` under `style` (dims follow the style:
// 2-D weights split rows for colwise-like styles and columns for rowwise-like ones; a 1-D bias
// follows its weight: split for colwise-like styles, whole for rowwise ones, since a rowwise
// bias is added once after the reduce).
WeightShard shard_for(TpStyle style, const Shape& shape, int rank, int size);

// A resolved plan: the architecture's default rules with the user's rules laid over them.
class TpPlan {
 public:
  // `modules` are the model's module names ("model.layers.0.self_attn.q_proj", "lm_head");
  // they define which keys are valid. Throws InvalidArgumentError for a user key that matches
  // no module or an unknown style, listing the valid keys or styles.
  TpPlan(const std::map<std::string, std::string>& defaults,
         const std::map<std::string, std::string>& user, const std::vector<std::string>& modules);
  // The style of a module (replicate when no rule matches). User rules win over defaults; within
  // each, a rule without `*` wins over one with.
  TpStyle style_of(const std::string& module) const;
  // The key that decided a module's style, or "" for none.
  std::string rule_of(const std::string& module) const;
  const std::vector<std::pair<std::string, TpStyle>>& rules() const { return rules_; }

  // Does `key` ("layers.*.mlp.up_proj") name `module` ("model.layers.3.mlp.up_proj")? Keys are
  // relative to the base model or the causal LM; `*` matches one whole path component.
  static bool matches(const std::string& key, const std::string& module);
  // "model.layers.3.mlp.up_proj" -> "layers.*.mlp.up_proj": the key form listed in errors.
  static std::string key_form(const std::string& module);

 private:
  // In lookup order: user exact, user wildcard, default exact, default wildcard.
  std::vector<std::pair<std::string, TpStyle>> rules_;
};

}  // namespace tformers::distributed
