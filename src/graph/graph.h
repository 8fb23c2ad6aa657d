// The graph IR: a forward pass for one static shape signature. Nodes are (op, inputs, attributes)
// with a static TensorType {dtype, shape}; values are not part of the graph. Leaves are
// parameters (weights, bound once), state (the KV cache, updated in place) and inputs (per-call
// tensors and runtime scalars such as the cache position). Node ids are positions in nodes(),
// which is also a valid execution order (a node's inputs always come before it).
//
// The activation dtype is a property of the graph: the dtype in which compute ops produce their
// values (embedding, linear, norms, rope, attention, ...). It says what the model asks for, not
// how a backend computes: a backend may legalise it (the CPU backend computes bf16-activation
// graphs in float32 and converts at the graph's inputs and outputs).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "tformers/dtype.h"
#include "tformers/tensor.h"

namespace tformers::graph {

enum class Op : uint8_t {
  kParameter,   // leaf: a weight, bound by name
  kState,       // leaf: device state updated in place (KV cache), bound by name
  kInput,       // leaf: a per-call tensor copied from the host
  kEmbedding,   // (table (V,D), ids (...)) -> (..., D) act; EmbeddingAttrs
  kLinear,      // (x (..., K), w (N, K) [, bias (N)]) -> (..., N) act
  kRMSNorm,     // (x (..., D), w (D)) -> (..., D) act; RMSNormAttrs
  kRope,        // (x (B,T,H,D), pos (B,T)) -> (B,T,H,D); RopeAttrs
  kSiluMul,     // (gate, up) -> silu(gate) * up
  kAdd,         // (a, b) -> a + b
  kReshape,     // (x) -> same bytes, shape of the node
  kCacheWrite,  // (cache (B,Hkv,S,D), new (B,T,Hkv,D), start ()) -> cache, written in place
  kAttention,   // (q (B,T,Hq,D), k_cache, v_cache, start () [, key_mask (B,S)] [, sinks (Hq)])
                // -> (B,T,Hq,D); AttentionAttrs
  kTakeLast,    // (x (B,T,D)) -> (B,n,D): the last TakeLastAttrs::n positions (any dtype)
  kCustomCall,  // a hub kernel; CustomCallAttrs: inputs and floats as its layer's schema says
  // Tensor parallelism over the process group of the attributes (distributed/process_group.h).
  // The collectives and kSlice take any dtype; the output has the input's.
  kAllReduce,    // (x (..., N) [, bias (N)]) -> sum over ranks [+ bias, added once after the sum];
                 // AllReduceAttrs
  kAllGather,    // (x (..., n)) -> (..., ranks * n): the ranks' even pieces concatenated along the
                 // last dim; AllGatherAttrs
  kSlice,        // (x (..., K)) -> (..., end - begin) along the last dim (with a group, the
                 // rank's piece); SliceAttrs
  kLinearQuant,  // (x (..., K), w, scale [, zero] [, bias f32 (N)]) -> (..., N) act: a weight-only
                 // quantized linear; LinearQuantAttrs say the scheme and the operands' layout,
                 // which the backend chose when it prepared the weight (Backend::prepare_linear)

  // Gemma's activations and scalings.
  kGeluTanhMul,  // (gate, up) -> gelu_tanh(gate) * up (PyTorch's tanh approximation)
  kScale,        // (x) -> x * factor; ScaleAttrs
  kSoftcap,      // (x) -> tanh(x / cap) * cap; SoftcapAttrs

  // Paged KV cache (continuous batching): a layer's keys or values for every sequence live in
  // one pool of blocks (num_blocks, Hkv, block_size, D); sequence s's position p is at offset
  // p % block_size of block table[s, p / block_size]. pos (B,T) int32 holds each new token's
  // position, negative for padding. Token (b,t) belongs to sequence b, or with the optional
  // rows (B,T) int32 operand to sequence rows[b,t] (a step that packs several sequences' tokens
  // into a row; the table then has a row per sequence, S of them).
  kPagedCacheWrite,  // (pool, new (B,T,Hkv,D), table (B|S,MB), pos (B,T)[, rows]) -> pool,
                     // in place
  kPagedAttention,   // (q (B,T,Hq,D), k_pool, v_pool, table (B|S,MB), pos (B,T)[, rows]
                     // [, sinks (Hq)]) -> (B,T,Hq,D): query (b,t) sees its sequence's positions
                     // <= pos[b,t]; AttentionAttrs; a padding query gives zeros

  kConvert,  // (x) -> x in the node's float dtype: a hub kernel's float32 boundary in a graph
             // of other activations, and the float32 logits every graph returns

  // Primitives: the ops that composites decompose into and that new layers are written in
  // (mixtures of experts, gated linear attention). Float operands and results are in the graph's
  // activation dtype; indices are int32. Shapes broadcast as NumPy's do (right-aligned; a dim
  // of 1 stretches) where an op says so.
  kConstant,       // () -> the node's type filled with ConstantAttrs::value
  kUnary,          // (x) -> fn(x) elementwise; UnaryAttrs
  kBinary,         // (a, b) -> fn(a, b) elementwise, broadcast; BinaryAttrs
  kSelect,         // (pred i32, a, b) -> pred != 0 ? a : b, broadcast
  kReduce,         // (x) -> fn over AxisAttrs::axis, kept as a dim of 1; ReduceAttrs
  kSoftmax,        // (x) -> softmax over the last dim (composite: exp(x - max) / sum)
  kTopK,           // (x (..., N)) -> (..., k) int32: indices of the k largest along the last dim,
                   // largest first, the lower index first among equals; TopKAttrs
  kTakeAlong,      // (x (..., N), idx (..., k) int32) -> (..., k): x[..., idx[..., j]]
  kScatterAdd,     // (base (..., N), idx (..., k) int32, src (..., k)) -> base with src[..., j]
                   // added at [..., idx[..., j]]
  kConcat,         // (x0, x1, ...) -> joined along AxisAttrs::axis
  kTranspose,      // (x) -> x with its dims permuted; TransposeAttrs
  kBroadcast,      // (x) -> x stretched to the node's shape, broadcast
  kIota,           // () -> int32 or float counting 0, 1, ... along AxisAttrs::axis
  kCumsum,         // (x) -> inclusive running sums along AxisAttrs::axis
  kMatMul,         // (a (..., M, K), b (..., K, N)) -> (..., M, N), equal batch dims
  kLinearId,       // (x (..., K), w (E, N, K), idx (..., k) int32 [, bias (E, N)]) -> (..., k, N):
                   // x times the transpose of expert idx[..., j]'s weight (plus its bias row),
                   // for each j (a mixture of experts); or x (..., k, K), each slot's own row
                   // through its expert; LinearIdAttrs
  kLinearIdQuant,  // (x, w, idx, scale [, zero] [, bias]) -> (..., k, N): kLinearId over quantized
                   // experts; w, scale and zero are the E experts' kLinearQuant operands stacked
                   // on a leading dim of E; LinearIdAttrs

  // Linear attention (Gated DeltaNet: Qwen3.5, Qwen3-Next) over a recurrent state instead of a
  // KV cache. Each op computes its value and also writes its state operand in place (the ops whose
  // value is not the state they update: side_written_operand). The state belongs to the static
  // cache's rows; at start == 0 a row's state counts as zeros (a new sequence). A token whose
  // key_mask slot (start + t) is 0 (padding, before a prompt or between a kept cache and a
  // continuation) is skipped: its output is zeros and the state is as if it were absent.
  kCausalConv1d,  // (x (B,T,C), w (C,K), state f32 (B,K-1,C), start (), key_mask (B,S)) -> (B,T,C):
                  // y[t,c] = sum_j w[c,j] * u[t+j,c] over u = the state's K-1 rows then the
                  // real tokens' x; the state becomes u's last K-1 rows
  kGatedDeltaRule,  // (q (B,T,Hk,Dk), k (B,T,Hk,Dk), v (B,T,H,Dv), g (B,T,H), beta (B,T,H),
                    // state f32 (B,H,Dk,Dv), start (), key_mask (B,S)) -> (B,T,H,Dv): per token
                    // and value head h (reading key head h / (H / Hk)), S = exp(g) S;
                    // S += k (beta (v - S^T k))^T; y = S^T q (q and k as given: normalised and
                    // scaled by the caller)
  // The same over the paged cache of continuous batching: row b reads its state from
  // pool[slots[b,0]] and writes the new one to pool[slots[b,1]] (slots (B,2) int32; the same slot
  // to go on in place, another to keep the state at a prompt's block end as a prefix cache entry,
  // or to start from one; a negative write slot for a padding row, which keeps no state); token
  // (b,t) is real when pos[b,t] >= 0, and a row's state counts as zeros when its first real token
  // is at position 0.
  kPagedCausalConv1d,    // (x, w, pool f32 (N,K-1,C), slots (B,2), pos (B,T)) -> (B,T,C)
  kPagedGatedDeltaRule,  // (q, k, v, g, beta, pool f32 (N,H,Dk,Dv), slots (B,2), pos (B,T))
                         // -> (B,T,H,Dv)
};

// The number of ops: every Op is below it.
constexpr size_t kOpCount = size_t(Op::kPagedGatedDeltaRule) + 1;

const char* op_name(Op op);
// The operand a node of `op` writes in place beside computing its own value (the state of the
// linear-attention ops), or -1: the backends keep that state's latest value from it.
inline int side_written_operand(Op op) {
  if (op == Op::kCausalConv1d || op == Op::kPagedCausalConv1d) return 2;
  if (op == Op::kGatedDeltaRule || op == Op::kPagedGatedDeltaRule) return 5;
  return -1;
}
// Parameters, states and inputs: the leaves a graph binds.
inline bool is_leaf(Op op) { return op == Op::kParameter || op == Op::kState || op == Op::kInput; }

// Weight-only quantization of kLinearQuant: w[n,k] ~ scale[n, b] * (code[n,k] - zero[n, b]) for
// block b = k / kQuantBlock of row n (the last block of a row may be short).
//   kInt8: codes int8, scale f32, no zero point (0).
//   kInt4: codes 4-bit in [0, 15], scale f16, zero points u8 when the format has them (AWQ,
//          GPTQ), else 8 (the symmetric form tformers quantizes to).
// kMxfp4: gpt-oss's experts as stored, an e2m1 code per input and an e8m0 exponent per block.
enum class QuantScheme : uint8_t { kInt8, kInt4, kMxfp4 };
// How the operands of a kLinearQuant lie in memory, per scheme (N outputs, K inputs,
// nb = ceil(K / kQuantBlock)):
//   kRows:  w (N, K) i8 for kInt8, or u8 (N, ceil(K / 2)) for kInt4 and kMxfp4 with the code of
//           input k in byte k / 2, the low nibble for even k; scale and zero (N, nb): f32 for
//           kInt8, f16 for kInt4, u8 exponents (2^(e - 127)) for kMxfp4 (which has no zero).
//   kTiles: kInt4 only: tiles of kInt4Rows rows by kQuantBlock inputs, w u8 (N / 8, nb, 128),
//           scale and zero (N / 8, nb, 8) (the byte order is backends/cpu/kernels.h's and
//           docs/quantization.md's; tformers' int4 checkpoints store this layout, and the CPU
//           kernels read it).
enum class QuantLayout : uint8_t { kRows, kTiles };
// Inputs per scale (as llama.cpp's Q8_0 and Q4_0 blocks), and rows per int4 tile.
constexpr int64_t kQuantBlock = 32;
constexpr int64_t kInt4Rows = 8;

struct TensorType {
  DType dtype = DType::f32;
  Shape shape;
  bool operator==(const TensorType&) const = default;
  std::string str() const;  // "bfloat16[2, 3]"
};

// The types of a quantized weight's operands, N outputs by K inputs, in the scheme and layout
// above; zero points, where there are any, are u8 of the scale's shape. InternalError for int8
// tiles or tiles of N not a multiple of kInt4Rows, which no layout holds.
struct QuantOperandTypes {
  TensorType weight, scale;
};
QuantOperandTypes quant_operand_types(QuantScheme scheme, QuantLayout layout, int64_t N, int64_t K);

// How the keys (or values) of a KV cache lie in memory: a property of the graph, chosen by the
// backend that runs it (Backend::kv_layout), since each backend's attention wants its own.
//   kHeadMajor:  static cache (B, Hkv, S, D), paged pool (blocks, Hkv, block_size, D): a head's
//                positions contiguous, the matrix the CPU's attention kernel reads per head.
//   kTokenMajor: static cache (B, S, Hkv, D), paged pool (blocks, block_size, Hkv, D): a
//                position's heads contiguous, as the new keys (B, T, Hkv, D) come, so a cache
//                write copies whole rows (XLA: a dynamic_update_slice or a scatter with no
//                transpose; the layout of vLLM's TPU paged attention).
enum class KvLayout : uint8_t { kHeadMajor, kTokenMajor };
const char* kv_layout_name(KvLayout layout);  // "head-major", "token-major"
// The dims of a cache's heads and of its positions (slots, or offsets in a block).
inline int kv_heads_dim(KvLayout l) { return l == KvLayout::kHeadMajor ? 1 : 2; }
inline int kv_positions_dim(KvLayout l) { return l == KvLayout::kHeadMajor ? 2 : 1; }
// A cache of `rows` sequences (or pool blocks) by `positions` slots (or block_size) by `heads`
// heads of `dim` values, in the layout.
TensorType kv_cache_type(KvLayout l, DType dtype, int64_t rows, int64_t heads, int64_t positions,
                         int64_t dim);

// The hub kernel a kCustomCall node calls, loaded by kernels_hub/. The graph names it and does
// not point to it: the backend named here resolves the target to its entry point when it
// compiles the graph (backends/kernel_registry.h). The target names the kernel completely
// (repo, version, revision, variant, layer, library digest) and is part of the graph hash, so
// graphs that call different kernels never share an executable.
struct CustomCall {
  std::string target;
  std::string backend;                // the backend that can run it ("cpu")
  std::shared_ptr<const void> owner;  // keeps the kernel library loaded while graphs name it
};

// Each op's attributes, typed: a node holds its op's struct (Graph::add checks which), or
// std::monostate when the op has none. fields() lists every field for the graph hash.
struct EmbeddingAttrs {
  static constexpr const char* kName = "EmbeddingAttrs";
  // A table of V rows: the whole vocabulary ({V, -1}), or with a process group (>= 0) a vocabulary
  // shard under tensor parallelism, rows [rank * V, (rank + 1) * V) of `vocab` for the rank's index
  // in the group (known when the step runs, so every rank builds the same graph); ids outside a
  // shard give zero rows.
  int64_t vocab = 0;
  int group = -1;
  auto fields() const { return std::tie(vocab, group); }
};
struct RMSNormAttrs {
  static constexpr const char* kName = "RMSNormAttrs";
  float eps = 0.0f;
  bool unit_offset = false;  // scale by (1 + w) (Gemma)
  auto fields() const { return std::tie(eps, unit_offset); }
};
struct RopeAttrs {
  static constexpr const char* kName = "RopeAttrs";
  std::vector<float> inv_freq;  // rotary_dim / 2 frequencies
  // The first rotary_dim features of a head rotate, the rest pass; pairs (i, i + rotary_dim/2),
  // or (2i, 2i+1) when interleaved (GLM).
  int64_t rotary_dim = 0;
  bool interleaved = false;
  auto fields() const { return std::tie(inv_freq, rotary_dim, interleaved); }
};
struct AttentionAttrs {  // kAttention and kPagedAttention (see GraphBuilder::attention)
  static constexpr const char* kName = "AttentionAttrs";
  float scale = 0.0f;
  float softcap = 0.0f;        // 0: none
  int64_t sliding_window = 0;  // 0: none
  // The last operand is a learned logit per query head (gpt-oss's sinks, in the activation
  // dtype) that joins each softmax's denominator and weighs no value: with m the max of the
  // row's scores and sinks[h], p_j = exp(s_j - m) / (sum_j exp(s_j - m) + exp(sinks[h] - m)).
  // A flag rather than a count of operands: the key mask (or rows) before it is optional too.
  bool sinks = false;
  auto fields() const { return std::tie(scale, softcap, sliding_window, sinks); }
};
// Where kAttention's and kPagedAttention's optional operands are in Node::inputs, -1 when absent:
// the key mask (kAttention) or rows (kPagedAttention), and the sinks.
struct AttentionOperands {
  int mask_or_rows = -1;
  int sinks = -1;
};
struct TakeLastAttrs {
  static constexpr const char* kName = "TakeLastAttrs";
  int64_t n = 0;
  auto fields() const { return std::tie(n); }
};
struct ScaleAttrs {
  static constexpr const char* kName = "ScaleAttrs";
  float factor = 0.0f;
  auto fields() const { return std::tie(factor); }
};
struct SoftcapAttrs {
  static constexpr const char* kName = "SoftcapAttrs";
  float cap = 0.0f;
  auto fields() const { return std::tie(cap); }
};
struct SliceAttrs {
  static constexpr const char* kName = "SliceAttrs";
  int64_t begin = 0, end = 0;  // along the last dim
  // With a process group (>= 0): the piece of end - begin values at begin + rank * (end - begin)
  // for the rank's index in the group, zeros past the input's end (each rank's even shard of a
  // replicated input).
  int group = -1;
  auto fields() const { return std::tie(begin, end, group); }
};
struct AllReduceAttrs {
  static constexpr const char* kName = "AllReduceAttrs";
  int group = 0;  // process group id
  auto fields() const { return std::tie(group); }
};
struct AllGatherAttrs {
  static constexpr const char* kName = "AllGatherAttrs";
  int group = 0;
  int ranks = 1;  // the group's size: every rank gives an even piece of the last dim
  auto fields() const { return std::tie(group, ranks); }
};
struct LinearQuantAttrs {
  static constexpr const char* kName = "LinearQuantAttrs";
  QuantScheme scheme = QuantScheme::kInt8;
  QuantLayout layout = QuantLayout::kRows;
  bool has_zero = false;  // the zero-point input is there
  auto fields() const { return std::tie(scheme, layout, has_zero); }
  bool operator==(const LinearQuantAttrs&) const = default;
};
struct LinearIdAttrs {
  static constexpr const char* kName = "LinearIdAttrs";
  // With a process group (>= 0), w holds E experts of a mixture split over the group's ranks:
  // experts [rank * E, (rank + 1) * E) for the rank's index in the group (known when the step
  // runs, so every rank builds the same graph); a (row, slot) routed to another rank's expert
  // gives a zero row.
  int group = -1;
  LinearQuantAttrs quant;  // kLinearIdQuant: the scheme and layout of each expert's operands
  auto fields() const { return std::tie(group, quant.scheme, quant.layout, quant.has_zero); }
};
struct CustomCallAttrs {
  static constexpr const char* kName = "CustomCallAttrs";
  std::shared_ptr<const CustomCall> kernel;  // shared by the nodes of one kernelized layer
  std::vector<float> floats;                 // the float attributes of the kernel's schema
  auto fields() const { return std::tie(kernel->target, floats); }
};

// The primitives' attributes.
struct ConstantAttrs {
  static constexpr const char* kName = "ConstantAttrs";
  double value = 0;  // exact for int32 constants too
  auto fields() const { return std::tie(value); }
};
enum class UnaryFn : uint8_t {
  kExp,
  kLog,
  kNeg,
  kSqrt,
  kRsqrt,
  kTanh,
  kSigmoid,
  kSilu,
  kGeluTanh,
  kSoftplus
};
const char* unary_name(UnaryFn fn);  // "exp", ..., "gelu_tanh", "softplus"
struct UnaryAttrs {
  static constexpr const char* kName = "UnaryAttrs";
  UnaryFn fn = UnaryFn::kExp;
  auto fields() const { return std::tie(fn); }
};
enum class BinaryFn : uint8_t { kAdd, kSub, kMul, kDiv, kMax, kMin };
const char* binary_name(BinaryFn fn);  // "add", "sub", "mul", "div", "max", "min"
struct BinaryAttrs {
  static constexpr const char* kName = "BinaryAttrs";
  BinaryFn fn = BinaryFn::kAdd;
  auto fields() const { return std::tie(fn); }
};
struct AxisAttrs {  // kConcat, kIota, kCumsum
  static constexpr const char* kName = "AxisAttrs";
  int64_t axis = 0;
  auto fields() const { return std::tie(axis); }
};
enum class ReduceFn : uint8_t { kSum, kMax };
struct ReduceAttrs {
  static constexpr const char* kName = "ReduceAttrs";
  ReduceFn fn = ReduceFn::kSum;
  int64_t axis = 0;
  auto fields() const { return std::tie(fn, axis); }
};
struct TopKAttrs {
  static constexpr const char* kName = "TopKAttrs";
  int64_t k = 1;
  auto fields() const { return std::tie(k); }
};
struct TransposeAttrs {
  static constexpr const char* kName = "TransposeAttrs";
  std::vector<int64_t> perm;  // output dim i is input dim perm[i]
  auto fields() const { return std::tie(perm); }
};

using Attrs =
    std::variant<std::monostate, EmbeddingAttrs, RMSNormAttrs, RopeAttrs, AttentionAttrs,
                 TakeLastAttrs, ScaleAttrs, SoftcapAttrs, SliceAttrs, AllReduceAttrs,
                 AllGatherAttrs, LinearQuantAttrs, CustomCallAttrs, ConstantAttrs, UnaryAttrs,
                 BinaryAttrs, AxisAttrs, ReduceAttrs, TopKAttrs, TransposeAttrs, LinearIdAttrs>;

struct Node {
  Op op;
  std::vector<int> inputs;
  TensorType type;
  std::string name;  // binding name for leaves; a debug name for the rest
  Attrs attrs;

  // The attributes as A; InternalError naming the node when it holds another kind.
  template <class A>
  const A& attrs_as() const {
    if (const A* a = std::get_if<A>(&attrs)) return *a;
    wrong_attrs(A::kName);
  }

 private:
  [[noreturn]] void wrong_attrs(const char* wanted) const;
};

// n's optional operands (n a kAttention or kPagedAttention node).
AttentionOperands attention_operands(const Node& n);
// The position of the experts' bias operand of a kLinearId or kLinearIdQuant node (after its
// weight operands), or -1 when it has none.
int experts_bias_operand(const Node& n);

class Graph {
 public:
  // `activation` is the dtype compute ops produce (f32, bf16 or f16); `kv` the layout of its KV
  // cache states.
  explicit Graph(DType activation = DType::f32, KvLayout kv = KvLayout::kHeadMajor);

  DType activation_dtype() const { return activation_; }
  KvLayout kv_layout() const { return kv_layout_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(int id) const { return nodes_.at(id); }
  const std::vector<int>& outputs() const { return outputs_; }
  // Leaves by kind, in creation order (the order bindings are given in).
  std::vector<int> leaves(Op kind) const;

  // Checks that the inputs exist and that the attributes are the op's kind; returns the node id.
  int add(Node node);
  void mark_output(int id);

  // A 64-bit hash of the activation dtype, KV layout, structure, shapes, dtypes, names and
  // attributes; two graphs with the same hash compile to the same executable.
  uint64_t hash() const;
  // "activation: bfloat16" (and ", kv cache: token-major" in that layout), then one line per node:
  // "%12 = linear(%10, %3) -> float32[1, 7, 64]  # layers.0.mlp.up_proj", with options that are
  // not the op's default in braces: "rope(%4, %2) {interleaved} -> ...".
  std::string to_string() const;

 private:
  DType activation_;
  KvLayout kv_layout_;
  std::vector<Node> nodes_;
  std::vector<int> outputs_;
};

}  // namespace tformers::graph
