// The CPU backend's rule table: for each op of the registry (graph/ops.h), the function that runs
// a node of it over the executor's memory. The executor looks each node's rule up once, when it
// plans, and a graph whose composite has no rule here is decomposed into primitives first, so
// the table is the one place that says what the CPU runs. Values reach the rules as the executor
// legalised them: activations in float32, indices in int32, weights and caches as stored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "graph/graph.h"

namespace tformers::backends::cpu_rules {

// The most operands a node may have on the CPU (a concat of more is refused when it compiles).
constexpr size_t kMaxOperands = 16;

// One node's run.
struct OpCall {
  const graph::Graph& g;
  const graph::Node& n;
  void* const* in;  // the operands' bytes, one per n.inputs
  void* out;        // the node's bytes
  // Staging for the rules that need it (all_gather's rank-major copy, the rows routed to one
  // expert), grown once per run.
  std::vector<float>& scratch;
  const void* kernel;  // a custom call's entry point (hub kernel), else null

  const graph::TensorType& in_type(size_t k) const { return g.node(n.inputs[k]).type; }
  const float* f32(size_t k) const { return static_cast<const float*>(in[k]); }
  const int32_t* i32(size_t k) const { return static_cast<const int32_t*>(in[k]); }
  float* out_f32() const { return static_cast<float*>(out); }
};

using Rule = void (*)(const OpCall& call);

// The rule that runs `op`, or null where the CPU has none (then a composite runs through its
// decomposition).
Rule rule(graph::Op op);

// Host tensors of a 16-bit float dtype to and from the f32 values the kernels use.
void widen(const void* src, DType dtype, int64_t n, float* dst);
void narrow(const float* src, int64_t n, DType dtype, void* dst);

}  // namespace tformers::backends::cpu_rules
