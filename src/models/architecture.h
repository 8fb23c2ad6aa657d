// What one architecture file declares, as data the loader acts on: its config (read and
// validated from config.json), its weights (each with a role and a default tensor-parallel
// style), its state (the KV cache layout per layer) and its graph. The loader decides
// quantization, tensor-parallel checks and cache allocation from roles and states, never from
// weight names. Architectures register themselves by name (config.json "architectures"), so a
// new one is a single file in src/models/ and nothing else changes.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/builder.h"
#include "io/json.h"
#include "models/overrides.h"
#include "tformers/model.h"

namespace tformers::distributed {
class TpModel;
}  // namespace tformers::distributed

namespace tformers::models {

// What a weight is for. The backend prepares linear weights (int8 quantization, layout); the
// rest are used as stored or converted to the model dtype.
enum class WeightRole : uint8_t {
  kEmbedding,   // gathered by token id, never quantized
  kLinear,      // (out, in) multiplied by activations; may be quantized; packed/fused ones too
  kBias,        // (out) of the linear named by WeightSpec::linear; f32 when that one is quantized
  kNorm,        // per-feature scale of a norm, or a value per head (attention sinks)
  kRouter,      // (experts, in): a mixture's router, used as stored in the model dtype (as
                // llama.cpp keeps it): a quantized router would send tokens to other experts
  kExperts,     // (experts, out, in): one linear weight per expert, for linear_id; may be
                // quantized (each expert as a linear weight is)
  kExpertBias,  // (experts, out): each expert's bias, gathered by expert in the model dtype
  kConv,        // (channels, 1, width): a depthwise convolution's kernel, used as stored
};

// How a checkpoint lays out a weight other than as its shape in float (gpt-oss's experts).
struct StoredLayout {
  // The last two dims swapped: (experts, in, out), as gpt-oss's float checkpoints hold experts.
  bool transposed = false;
  // The two halves of dim 1 interleaved (a0 b0 a1 b1 ...): gpt-oss's gate and up rows.
  bool interleaved = false;
  // May be MXFP4 instead: "<name>_blocks" (experts, out, in / 32, 16) uint8, two 4-bit e2m1 codes
  // per byte (the low nibble first), and "<name>_scales" (experts, out, in / 32) uint8, an e8m0
  // exponent per 32 values; not transposed, interleaved as the float form is.
  bool mxfp4 = false;
  bool any() const { return transposed || interleaved || mxfp4; }
};

// One weight the architecture reads, with the checkpoint's own name.
struct WeightSpec {
  std::string name;
  Shape shape;
  WeightRole role = WeightRole::kLinear;
  // The default tensor-parallel style of this weight's module ("colwise", "rowwise",
  // "packed_colwise", ...; see distributed/tp_plan.h), or "" for replicated. Biases follow their
  // weight and leave it empty.
  std::string tp_style;
  bool required = true;
  std::string tied_to;  // when absent from the checkpoint, use this weight instead
  std::string linear;   // kBias: the ".weight" of the linear layer it belongs to
  // When the checkpoint does not hold this weight under its name, the tensors whose rows, in
  // order, make it (Hub checkpoints name each expert's projections: "experts.0.gate_proj.weight",
  // ...), or the one tensor of its older name; the loader copies them into one tensor.
  std::vector<std::string> stacked_from;
  // The share of it one decode token reads: top_k / experts for a mixture's experts, else all.
  double read_share = 1;
  StoredLayout stored;
};

// What one layer keeps between steps, by kind. An attention layer's KV cache:
// past_key_values.{layer}.key and .value, each B sequences by S slots by kv_heads by head_dim in
// the cache dtype, laid out as the backend says (graph::KvLayout); under tensor parallelism
// kv_heads is this rank's share. A linear-attention layer's recurrent state instead (Gated
// DeltaNet), a fixed size per sequence whatever its length: recurrent_state.{layer}.conv
// (B, conv_width - 1, conv_channels), the last inputs of its causal convolution, and
// recurrent_state.{layer}.delta (B, heads, key_dim, value_dim), both float32. A layer that reads
// another layer's KV cache (Gemma 4's KV-shared layers) keeps nothing (kShared).
struct LayerState {
  enum class Kind : uint8_t { kAttention, kRecurrent, kShared };
  Kind kind = Kind::kAttention;
  int64_t kv_heads = 0, head_dim = 0;
  int64_t conv_channels = 0, conv_width = 0, heads = 0, key_dim = 0, value_dim = 0;
  bool recurrent() const { return kind == Kind::kRecurrent; }
  bool attention() const { return kind == Kind::kAttention; }
  // Bytes of one sequence's recurrent state (0 for attention, whose cache grows per position).
  int64_t recurrent_bytes() const {
    return recurrent() ? 4 * ((conv_width - 1) * conv_channels + heads * key_dim * value_dim) : 0;
  }
};

// The static shape signature of one forward pass. Positions and the used cache length are
// runtime inputs, never part of the shape.
struct StepShape {
  int64_t batch = 1;
  int64_t new_tokens = 1;
  int64_t cache_len = 0;       // allocated static cache positions (0 with a paged cache)
  int64_t logits_to_keep = 1;  // 0 = all positions
  // A paged KV cache (continuous batching) instead of the static one: blocks in each layer's
  // pool, positions per block, and blocks in each sequence's table. 0: the static cache.
  int64_t kv_blocks = 0, block_size = 0, table_blocks = 0;
  // A paged step of one row that packs up to this many sequences' tokens (0: one sequence per
  // row): a block table row per sequence, each token's sequence an input, and the logits of
  // each sequence's last token.
  int64_t sequences = 0;
  // A paged step of a model with linear-attention layers: the slots of its recurrent state
  // pools (recurrent_pool.{i}.{conv,delta}, slots by a state's shape) and the input
  // state_slots (B,2) int32, the slot each row reads its state from and the one it writes it to
  // (graph.h's paged linear-attention ops). 0: the model has none.
  int64_t state_slots = 0;
  bool paged() const { return kv_blocks > 0; }
  auto operator<=>(const StepShape&) const = default;
};

// Every architecture's config derives from this: the fields the loader and the generation loop
// read (public as tformers::PretrainedConfig), then the architecture's own.
struct ArchConfig : PretrainedConfig {
  virtual ~ArchConfig() = default;
};

// Parameter nodes by checkpoint name, created on first use so a tied weight is one node.
class Params {
 public:
  // `quant` (null: none): the quantized linear weights by name, with the attributes of the op that
  // reads them (Backend::prepare_linear chose them); their scales and zero points are the weights
  // "<prefix>.weight_scale" and "<prefix>.weight_zero".
  Params(graph::GraphBuilder& b, const std::map<std::string, graph::TensorType>& types,
         const std::map<std::string, graph::LinearQuantAttrs>* quant = nullptr)
      : b_(b), types_(types), quant_(quant) {}
  graph::Value operator()(const std::string& name);
  bool has(const std::string& name) const { return types_.count(name) != 0; }
  // How weight `name` is quantized, or null for a float weight.
  const graph::LinearQuantAttrs* quant(const std::string& name) const {
    if (!quant_) return nullptr;
    auto it = quant_->find(name);
    return it == quant_->end() ? nullptr : &it->second;
  }
  // Tensor parallelism: the model's layout when it is split over ranks, else null.
  void set_tp(const distributed::TpModel* tp) { tp_ = tp; }
  const distributed::TpModel* tp() const { return tp_; }

  // Layer implementations to call instead of built-in ops (null: none); see overrides.h.
  const LayerOverrides* overrides = nullptr;

 private:
  const distributed::TpModel* tp_ = nullptr;
  graph::GraphBuilder& b_;
  const std::map<std::string, graph::TensorType>& types_;
  const std::map<std::string, graph::LinearQuantAttrs>* quant_;
  std::map<std::string, graph::Value> nodes_;
};

class Architecture {
 public:
  virtual ~Architecture() = default;
  // Reads and validates config.json; `where` is its path for messages. The common fields
  // (PretrainedConfig) must be filled.
  virtual std::unique_ptr<ArchConfig> config(const io::Json& json,
                                             const std::string& where) const = 0;
  virtual std::vector<WeightSpec> weights(const ArchConfig& config) const = 0;
  // What each layer keeps between steps (tp: this rank's layout, or null for a whole model).
  virtual std::vector<LayerState> states(const ArchConfig& config,
                                         const distributed::TpModel* tp) const = 0;
  // Checkpoint tensors that are known and deliberately not used (cached RoPE tables, the
  // multi-token-prediction layers some checkpoints append).
  virtual bool ignorable(const ArchConfig& config, const std::string& name) const = 0;
  // Builds the forward pass: inputs input_ids, position_ids (B,T), cache_position (); states
  // attention_mask (B,S) and past_key_values.{i}.{key,value}; output logits
  // (B, keep, V). With a paged shape the inputs are input_ids, position_ids (negative for
  // padding) and block_table (B, table_blocks), and the states kv_pool.{i}.{key,value}
  // (kv_blocks by block_size by Hkv by D). Caches are in b.kv_layout(); cache_dtype is their
  // element type.
  virtual void build(graph::GraphBuilder& b, Params& params, const ArchConfig& config,
                     const StepShape& shape, DType cache_dtype) const = 0;
  // Checks that the resolved tensor-parallel layout can run (head counts, compatible styles);
  // InvalidArgumentError naming the override that fixes an impossible plan. The default says
  // the architecture cannot be split.
  virtual void validate_tp(const ArchConfig& config, const distributed::TpModel& tp) const;
};

// An architecture over its own config type: the type-erased calls downcast once, here.
template <class Config>
class ArchitectureFor : public Architecture {
 public:
  virtual void read(const io::Json& json, const std::string& where, Config& config) const = 0;
  virtual std::vector<WeightSpec> weights(const Config& config) const = 0;
  virtual std::vector<LayerState> states(const Config& config,
                                         const distributed::TpModel* tp) const = 0;
  virtual void build(graph::GraphBuilder& b, Params& params, const Config& config,
                     const StepShape& shape, DType cache_dtype) const = 0;
  virtual void validate_tp(const Config& config, const distributed::TpModel& tp) const {
    Architecture::validate_tp(config, tp);
  }
  virtual bool ignorable(const Config& config, const std::string& name) const { return false; }

  std::unique_ptr<ArchConfig> config(const io::Json& json, const std::string& where) const final {
    auto c = std::make_unique<Config>();
    read(json, where, *c);
    return c;
  }
  std::vector<WeightSpec> weights(const ArchConfig& c) const final { return weights(cast(c)); }
  std::vector<LayerState> states(const ArchConfig& c, const distributed::TpModel* tp) const final {
    return states(cast(c), tp);
  }
  void build(graph::GraphBuilder& b, Params& p, const ArchConfig& c, const StepShape& s,
             DType cache_dtype) const final {
    build(b, p, cast(c), s, cache_dtype);
  }
  void validate_tp(const ArchConfig& c, const distributed::TpModel& tp) const final {
    validate_tp(cast(c), tp);
  }
  bool ignorable(const ArchConfig& c, const std::string& name) const final {
    return ignorable(cast(c), name);
  }

 private:
  static const Config& cast(const ArchConfig& c) { return static_cast<const Config&>(c); }
};

void register_architecture(const std::string& name,
                           std::function<std::unique_ptr<Architecture>()> make);
// Null when unknown.
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
