// Lowering of a graph (graph/graph.h) to a StableHLO module in MLIR text, the form every PJRT
// plugin compiles. The module's @main takes, in order, the graph's leaves(kParameter),
// leaves(kState) and leaves(kInput), and returns the graph's outputs followed by the new value
// of each state (written by a cache write, or in place by an op beside its own value:
// graph::side_written_operand). Each state argument is donated to its result (tf.aliasing_output),
// so a KV cache stays on the device and is updated without a copy: the executable that runs the
// module swaps the state's buffer for the returned one.
#pragma once

#include <cstddef>
#include <string>

#include "backends/backend.h"
#include "graph/graph.h"

namespace tformers::backends::pjrt {

struct LoweredModule {
  std::string mlir;
  size_t num_outputs = 0;  // results [0, num_outputs) are the graph's outputs, then the states
  size_t num_states = 0;
};

// Whether the lowering's rule table (lowering.h) has a rule that takes this node.
bool can_lower(const graph::Node& node);

// What the PJRT backends give (backend.h): token-major caches, so that a cache write copies whole
// rows without a transpose; computing in the graph's float dtype; one sequence per paged row;
// results that XLA may sum in another order at another batch size.
Capabilities capabilities();

// The graph as a StableHLO module. Compute runs in the graph's activation dtype, accumulating in
// float32 where the CPU backend does (dots, norms, softmax). UnsupportedError naming the node
// and its op for a node can_lower() rejects; a composite without a rule is lowered through its
// decomposition (graph/ops.h).
LoweredModule lower(const graph::Graph& graph);

}  // namespace tformers::backends::pjrt
