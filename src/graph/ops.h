// The op registry: every op of the IR declared once, with its name, the kind of attributes it
// carries, how many operands it takes and, for a composite, its decomposition into primitives.
// Backends hold rule tables keyed by op (backends/cpu/rules.h, backends/pjrt/lowering.h): a
// backend runs an op when its table has a rule for it, and runs a composite it has no rule for
// through the decomposition (decompose() below), as JAX lowers a primitive by the rule its
// platform registered and StableHLO's composite carries its own decomposition.
//
// Adding an op: its entry in graph.h's Op (and attributes), its OpDef in ops.cc, its builder
// method (shape and dtype checks), its reference kernel in the CPU's rule table, the rules of the
// backends that accelerate it, and a case in the op test (tests/pjrt/lower_test.cc), which runs
// every registered op on the CPU and through the StableHLO lowering and compares them
// (OpRegistry.EveryOpHasACase fails until the case is there).
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "graph/builder.h"

namespace tformers::graph {

// A composite's value from primitives: the nodes it adds to b, from the node's operands as they
// are in b, and the value of the node's type it returns.
using Decomposition = Value (*)(GraphBuilder& b, const Node& n, const std::vector<Value>& in);

struct OpDef {
  Op op;
  const char* name;
  size_t attrs;                       // the position in Attrs of the op's attribute kind
  int min_inputs;                     // operands
  int max_inputs;                     // (-1: any number)
  Decomposition decompose = nullptr;  // null: the op has no primitive form
};

const OpDef& op_def(Op op);

// Whether a backend has a rule for a node.
using HasRule = std::function<bool(const Node&)>;

// g with each composite node that has no rule replaced by its decomposition (itself decomposed
// where its primitives have no rule either), the other nodes as they are: a node with neither is
// left for the backend to refuse. Leaves keep their order, so bindings are unchanged.
Graph decompose(const Graph& g, const HasRule& has_rule);

}  // namespace tformers::graph
