// Records graph nodes with shape and dtype checks. Models call these while building the forward
// pass for one StepShape; a failed check is a bug in the model code (InternalError), since
// checkpoint shapes are validated when weights load. Compute ops produce the graph's activation
// dtype; reshape, take_last, slice_last and the collectives keep their input's.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace tformers::graph {

using Value = int;  // a node id

struct RopeOptions {
  int64_t rotary_dim = 0;    // features rotated per head, even; 0: the whole head_dim
  bool interleaved = false;  // pairs (2i, 2i+1) (GLM) instead of (i, i + rotary_dim/2)
};
struct RMSNormOptions {
  bool unit_offset = false;  // y = x_normed * (1 + w) (Gemma), in f32
};
struct AttentionOptions {
  // Query at cache slot p sees key slots p - sliding_window < j <= p; 0: all j <= p.
  int64_t sliding_window = 0;
  // Scores (after the scale) become tanh(s / softcap) * softcap before the softmax; 0: none.
  float softcap = 0.0f;
  // A (Hq) weight in the activation dtype: query head h's learned logit joins its softmax and
  // weighs no value (AttentionAttrs::sinks; gpt-oss); -1: none.
  Value sinks = -1;
};

class GraphBuilder {
 public:
  // activation: the dtype of computed values (f32, bf16 or f16); kv: the layout of the KV cache
  // states the cache and attention ops take (see graph.h).
  explicit GraphBuilder(DType activation = DType::f32, KvLayout kv = KvLayout::kHeadMajor)
      : graph_(activation, kv) {}
  DType activation() const { return graph_.activation_dtype(); }
  KvLayout kv_layout() const { return graph_.kv_layout(); }

  Value parameter(const std::string& name, TensorType type);
  Value state(const std::string& name, TensorType type);
  Value input(const std::string& name, TensorType type);

  Value embedding(Value table, Value ids, const std::string& name = "");
  // A vocabulary-sharded table: rows [rank * rows, (rank + 1) * rows) of a `vocab`-row table for
  // the rank's index in process group `group` (rows past vocab are padding); ids outside the
  // slice give zero rows, to be summed over ranks by an all_reduce.
  Value embedding_shard(Value table, Value ids, int64_t vocab, int group,
                        const std::string& name = "");
  Value linear(Value x, Value w, Value bias = -1, const std::string& name = "");
  // A quantized linear with the operands Backend::prepare_linear made, as `q` says (see
  // Op::kLinearQuant); zero is given exactly when q.has_zero, bias (f32 (N)) when there is one.
  Value linear_quant(Value x, Value w, Value scale, Value zero, Value bias,
                     const LinearQuantAttrs& q, const std::string& name = "");
  Value rms_norm(Value x, Value w, float eps, const std::string& name = "");
  Value rms_norm(Value x, Value w, float eps, RMSNormOptions o, const std::string& name);
  // inv_freq has rotary_dim / 2 entries (head_dim / 2 without options).
  Value rope(Value x, Value pos, std::vector<float> inv_freq, const std::string& name = "");
  Value rope(Value x, Value pos, std::vector<float> inv_freq, RopeOptions o,
             const std::string& name);
  Value silu_mul(Value gate, Value up, const std::string& name = "");
  // gelu_pytorch_tanh(gate) * up.
  Value gelu_tanh_mul(Value gate, Value up, const std::string& name = "");
  Value scale(Value x, float factor, const std::string& name = "");  // x * factor
  Value softcap(Value x, float cap, const std::string& name = "");   // tanh(x / cap) * cap
  Value add(Value a, Value b, const std::string& name = "");
  Value reshape(Value x, Shape shape);
  Value cache_write(Value cache, Value update, Value start, const std::string& name = "");
  Value attention(Value q, Value k_cache, Value v_cache, Value start, Value key_mask, float scale,
                  const std::string& name = "");
  Value attention(Value q, Value k_cache, Value v_cache, Value start, Value key_mask, float scale,
                  AttentionOptions o, const std::string& name);
  // Paged KV cache (graph.h): table (B,MB) and pos (B,T) are int32 inputs; with rows (B,T), an
  // int32 input too, the table has a row per sequence.
  Value paged_cache_write(Value pool, Value update, Value table, Value pos,
                          const std::string& name = "", Value rows = -1);
  Value paged_attention(Value q, Value k_pool, Value v_pool, Value table, Value pos, float scale,
                        AttentionOptions o, const std::string& name, Value rows = -1);
  Value take_last(Value x, int64_t n);
  // x in float dtype `to`; x itself when it has that dtype already.
  Value convert(Value x, DType to, const std::string& name = "");
  // A hub kernel producing `out` from `inputs`; the caller (models/layers.cc) has matched the
  // inputs to the kernel's schema.
  Value custom_call(std::shared_ptr<const CustomCall> call, std::vector<Value> inputs,
                    TensorType out, std::vector<float> floats, const std::string& name);
  // Collectives over process group `group` (see graph.h); bias may be -1.
  Value all_reduce(Value x, Value bias, int group, const std::string& name = "");
  // x (..., n) of each of the group's `ranks` ranks -> (..., ranks * n), in rank order.
  Value all_gather(Value x, int ranks, int group, const std::string& name = "");
  Value slice_last(Value x, int64_t begin, int64_t end, const std::string& name = "");
  // The rank's piece of `width` values of the last dim, at rank * width for its index in
  // `group`, zeros past x's end.
  Value shard_last(Value x, int64_t width, int group, const std::string& name = "");

  // ---- Primitives (graph.h) ----
  // A value of `type` filled with `value`.
  Value constant(double value, TensorType type, const std::string& name = "");
  Value unary(UnaryFn fn, Value x, const std::string& name = "");
  // Both operands float (of any float dtypes: the result is an activation) or both int32 (an
  // int32 result); their shapes broadcast.
  Value binary(BinaryFn fn, Value a, Value b, const std::string& name = "");
  Value select(Value pred, Value a, Value b, const std::string& name = "");
  // fn over `axis`, kept as a dim of 1.
  Value reduce(ReduceFn fn, Value x, int64_t axis, const std::string& name = "");
  Value softmax(Value x, const std::string& name = "");  // over the last dim
  Value top_k(Value x, int64_t k, const std::string& name = "");
  Value take_along(Value x, Value idx, const std::string& name = "");
  Value scatter_add(Value base, Value idx, Value src, const std::string& name = "");
  Value concat(const std::vector<Value>& parts, int64_t axis, const std::string& name = "");
  Value transpose(Value x, std::vector<int64_t> perm, const std::string& name = "");
  Value broadcast(Value x, Shape shape, const std::string& name = "");
  // int32 or float `type` counting along `axis`.
  Value iota(TensorType type, int64_t axis, const std::string& name = "");
  Value cumsum(Value x, int64_t axis, const std::string& name = "");
  Value matmul(Value a, Value b, const std::string& name = "");
  // x (..., K) through the experts idx (..., k) of w (E, N, K): (..., k, N); or x (..., k, K), a
  // row for each slot, each through its own expert.
  // With group >= 0, w is this rank's share of experts split over the group (LinearIdAttrs).
  // bias (E, N), float, when >= 0: each expert's row added to its outputs.
  Value linear_id(Value x, Value w, Value idx, const std::string& name = "", int group = -1,
                  Value bias = -1);
  // linear_id through E quantized experts: w, scale and zero are E kLinearQuant operands stacked
  // on a leading dim (zero -1 when there is none).
  Value linear_id_quant(Value x, Value w, Value idx, Value scale, Value zero,
                        const LinearQuantAttrs& q, const std::string& name = "", int group = -1,
                        Value bias = -1);
  // Linear attention over a recurrent state (graph.h): start () and key_mask (B,S) are the static
  // cache's; the state, f32, is written in place.
  Value causal_conv1d(Value x, Value w, Value state, Value start, Value key_mask,
                      const std::string& name = "");
  Value gated_delta_rule(Value q, Value k, Value v, Value g, Value beta, Value state, Value start,
                         Value key_mask, const std::string& name = "");
  // The paged forms: `state` is a pool of states, slots (B,2) and pos (B,T) int32 inputs.
  Value paged_causal_conv1d(Value x, Value w, Value pool, Value slots, Value pos,
                            const std::string& name = "");
  Value paged_gated_delta_rule(Value q, Value k, Value v, Value g, Value beta, Value pool,
                               Value slots, Value pos, const std::string& name = "");
  // A node of another graph, its operands already renumbered into this one (graph/ops.h's
  // decompose()).
  Value copy(Node node) { return graph_.add(std::move(node)); }

  const TensorType& type(Value v) const { return graph_.node(v).type; }
  Op op(Value v) const { return graph_.node(v).op; }
  void output(Value v) { graph_.mark_output(v); }
  Graph finish() { return std::move(graph_); }

 private:
  std::vector<int> paged_operands(Value table, Value pos, Value rows, int64_t B, int64_t T,
                                  const std::string& name) const;
  // The experts' bias operand (E, N), checked, when bias >= 0.
  void add_experts_bias(std::vector<int>& inputs, Value bias, int64_t E, int64_t N,
                        const std::string& name) const;
  // The state (f32 of shape `want`), start and key mask (B, S) of a linear-attention op, checked.
  void check_recurrent_operands(Value state, const Shape& want, Value start, Value key_mask,
                                int64_t B, const std::string& name) const;
  // The same for the paged forms: a pool of states of shape `each`, slots (B,2) and pos (B,T).
  void check_paged_recurrent_operands(Value pool, const Shape& each, Value slots, Value pos,
                                      int64_t B, int64_t T, const std::string& name) const;
  // The operands of a causal convolution or a delta rule, checked, and the shape of one row's
  // state.
  Shape conv_state_shape(Value x, Value w, const std::string& name) const;
  Shape delta_state_shape(Value q, Value k, Value v, Value g, Value beta,
                          const std::string& name) const;
  AttentionAttrs attention_attrs(float scale, const AttentionOptions& o, int64_t Hq,
                                 std::vector<int>& inputs, const std::string& name) const;
  Value add_node(Op op, std::vector<int> inputs, TensorType type, std::string name,
                 Attrs attrs = {});
  // The dtype of an elementwise result from float operands (an activation) or int32 ones.
  DType elementwise_dtype(std::initializer_list<Value> operands, const std::string& name) const;
  Graph graph_;
};

}  // namespace tformers::graph
