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
#include <vector>

#include "tformers/dtype.h"
#include "tformers/tensor.h"

namespace tformers::graph {

enum class Op : uint8_t {
  kParameter,   // leaf: a weight, bound by name
  kState,       // leaf: device state updated in place (KV cache), bound by name
  kInput,       // leaf: a per-call tensor copied from the host
  kEmbedding,   // (table (V,D), ids (...)) -> (..., D) act; ints = {row_offset, vocab} when the
                // table holds rows [row_offset, row_offset + V) of a vocab-row table (zero
                // rows for ids outside)
  kLinear,      // (x (..., K), w (N, K) [, bias (N)]) -> (..., N) act
  kRMSNorm,     // (x (..., D), w (D)) -> (..., D) act; floats = {eps}, ints = {unit_offset}:
                // 1 scales by (1 + w) (Gemma)
  kRope,        // (x (B,T,H,D), pos (B,T)) -> (B,T,H,D); floats = inv_freq (rotary_dim/2),
                // ints = {rotary_dim, interleaved}: the first rotary_dim features rotate, the
                // rest pass; pairs (i, i + rotary_dim/2), or (2i, 2i+1) when interleaved (GLM)
  kSiluMul,     // (gate, up) -> silu(gate) * up
  kAdd,         // (a, b) -> a + b
  kReshape,     // (x) -> same bytes, shape of the node
  kCacheWrite,  // (cache (B,Hkv,S,D), new (B,T,Hkv,D), start ()) -> cache, written in place
  kAttention,   // (q (B,T,Hq,D), k_cache, v_cache, start () [, key_mask (B,S)]) -> (B,T,Hq,D);
                // floats = {scale, softcap}, ints = {sliding_window}; 0 for none (see
                // GraphBuilder::attention)
  kTakeLast,    // (x (B,T,D)) -> (B,n,D): the last n = ints[0] positions (any dtype)
  kCustomCall,  // a hub kernel (Node::custom): inputs and floats as its layer's schema says
  // Tensor parallelism. ints[0] is the process group id (distributed/process_group.h). The
  // collectives and kSlice take any dtype; the output has the input's.
  kAllReduce,   // (x (..., N) [, bias (N)]) -> sum over ranks [+ bias, added once after the sum]
  kAllGather,   // (x (..., n_r)) -> (..., sum n): ranks' pieces concatenated along the last dim;
                // ints = {group, n_0, n_1, ...}
  kSlice,       // (x (..., K)) -> (..., end - begin): ints = {begin, end} along the last dim
  kLinearInt8,  // (x (..., K), w int8 (N, K), scale f32 (N, ceil(K / kInt8Block)) [, bias f32
                // (N)]) -> (..., N) act: weight-only int8 with one scale per block of
                // kInt8Block k values, w[n,k] ~ scale[n, k / kInt8Block] * q[n,k]

  // Gemma's activations and scalings.
  kGeluTanhMul,  // (gate, up) -> gelu_tanh(gate) * up (PyTorch's tanh approximation)
  kScale,        // (x) -> x * factor; floats = {factor}
  kSoftcap,      // (x) -> tanh(x / cap) * cap; floats = {cap}

  // Paged KV cache (continuous batching): a layer's keys or values for every sequence live in
  // one pool of blocks (num_blocks, Hkv, block_size, D); sequence b's position p is at offset
  // p % block_size of block table[b, p / block_size]. pos (B,T) int32 holds each new token's
  // position, negative for padding.
  kPagedCacheWrite,  // (pool, new (B,T,Hkv,D), table (B,MB), pos (B,T)) -> pool, in place
  kPagedAttention,   // (q (B,T,Hq,D), k_pool, v_pool, table (B,MB), pos (B,T)) -> (B,T,Hq,D):
                     // query (b,t) sees its sequence's positions <= pos[b,t]; attributes as
                     // kAttention; a padding query gives zeros

  kLinearInt4,  // (x (..., K), w u8 (N / 8, nb, 128), scale f16 (N / 8, nb, 8) [, zero u8
                // (N / 8, nb, 8)] [, bias f32 (N)]) -> (..., N) act, nb = ceil(K / kInt4Block):
                // weight-only 4-bit codes in tiles of 8 rows by kInt4Block k values (the layout
                // of backends/cpu/kernels.h), w[n,k] = scale[n, b] * (code[n,k] - zero[n, b])
                // with zero 8 when absent; ints = {has_zero}
};

const char* op_name(Op op);

// k values per int8 scale in kLinearInt8 (as llama.cpp's Q8_0 block).
constexpr int64_t kInt8Block = 32;
// k values per int4 scale in kLinearInt4 (as llama.cpp's Q4_0 block), and rows per tile.
constexpr int64_t kInt4Block = 32;
constexpr int64_t kInt4Rows = 8;

struct TensorType {
  DType dtype = DType::f32;
  Shape shape;
  bool operator==(const TensorType&) const = default;
  std::string str() const;  // "bfloat16[2, 3]"
};

// The implementation of a kCustomCall node: a hub kernel loaded by kernels_hub/. The target
// names it completely (repo, version, revision, variant, layer, library digest) and is part of
// the graph hash, so graphs that call different kernels never share an executable.
struct CustomCall {
  std::string target;
  std::string backend;                // the backend that can run it ("cpu")
  const void* fn = nullptr;           // the backend's entry point (a TfKernelFn on the CPU)
  std::shared_ptr<const void> owner;  // keeps the kernel library loaded
};

struct Node {
  Op op;
  std::vector<int> inputs;
  TensorType type;
  std::string name;  // binding name for leaves; a debug name for the rest
  std::vector<int64_t> ints;
  std::vector<float> floats;
  std::shared_ptr<const CustomCall> custom;  // kCustomCall only
};

class Graph {
 public:
  // `activation` is the dtype compute ops produce (f32, bf16 or f16).
  explicit Graph(DType activation = DType::f32);

  DType activation_dtype() const { return activation_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(int id) const { return nodes_.at(id); }
  const std::vector<int>& outputs() const { return outputs_; }
  // Leaves by kind, in creation order (the order bindings are given in).
  std::vector<int> leaves(Op kind) const;

  int add(Node node);  // checks that inputs exist; returns the node id
  void mark_output(int id);

  // A 64-bit hash of the activation dtype, structure, shapes, dtypes, names and attributes; two
  // graphs with the same hash compile to the same executable.
  uint64_t hash() const;
  // "activation: bfloat16", then one line per node:
  // "%12 = linear(%10, %3) -> float32[1, 7, 64]  # layers.0.mlp.up_proj", with options that are
  // not the op's default in braces: "rope(%4, %2) {interleaved} -> ...".
  std::string to_string() const;

 private:
  DType activation_;
  std::vector<Node> nodes_;
  std::vector<int> outputs_;
};

}  // namespace tformers::graph
