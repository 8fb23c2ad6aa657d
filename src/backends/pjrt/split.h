// A graph with collectives, cut at each one into pieces that StableHLO can hold. A PJRT plugin
// runs one process's devices and knows nothing of the process group that joins the ranks of a
// tensor-parallel model (distributed/process_group.h), so a collective runs on the host between
// two executables: the first returns the collective's input, the host sums or gathers it over
// the group, and the second takes the result as an input. Everything else stays on the device:
// weights and states are bound to each segment that reads them, and values that cross a
// collective without passing through it move between segments as device buffers.
#pragma once

#include <cstddef>
#include <variant>
#include <vector>

#include "graph/graph.h"

namespace tformers::backends::pjrt {

// Nodes of the whole graph between two collectives, as a graph of their own. Its leaves are, in
// order: the parameters, states and inputs of the whole graph that its nodes read, then one input
// per value it takes from an earlier step (`carried`). Its outputs are the values later steps or
// the whole graph's outputs need (`produced`), in that order.
struct Segment {
  graph::Graph graph;
  // Positions in the whole graph's leaves(kParameter), leaves(kState), leaves(kInput) of the
  // segment's leaves of each kind, in order.
  std::vector<size_t> params, states, inputs;
  std::vector<int> carried;   // node ids of the whole graph, one per extra input
  std::vector<int> produced;  // node ids of the whole graph, one per output
};

// A collective node of the whole graph, run on the host.
struct HostCollective {
  int node = 0;
};

using Step = std::variant<Segment, HostCollective>;

struct Split {
  std::vector<Step> steps;  // in execution order
  // Per step, the values (node ids) no later step reads and the whole graph does not return:
  // their buffers can be freed once the step has run.
  std::vector<std::vector<int>> dead_after;
};

// The graph in steps. A graph without collectives is one segment equal to the graph.
// UnsupportedError when a value that lives in a state (a cache through its write) is read across
// a collective in another shape than the state's, or when an op writes an operand in place
// (graph::side_written_operand) that does not live in a state.
Split split_at_collectives(const graph::Graph& g);

bool is_collective(graph::Op op);

}  // namespace tformers::backends::pjrt
