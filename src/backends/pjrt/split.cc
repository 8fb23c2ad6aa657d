#include "backends/pjrt/split.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "tformers/error.h"

namespace tformers::backends::pjrt {

using graph::Node;
using graph::Op;

bool is_collective(Op op) { return op == Op::kAllReduce || op == Op::kAllGather; }

namespace {

std::vector<size_t> iota(size_t n) {
  std::vector<size_t> v(n);
  std::iota(v.begin(), v.end(), size_t{0});
  return v;
}

// The segment of the whole graph's nodes `members` (in order). crossing(j) says whether value j
// comes from another step, and so is carried in or, when it lives in a state, read through the
// state's leaf; `produced` are the members that leave the segment.
template <class Crossing>
Segment build_segment(const graph::Graph& g, const std::vector<int>& root,
                      const std::vector<int>& pos, const std::vector<int>& members,
                      Crossing crossing, std::vector<int> produced) {
  std::vector<int> params, states, inputs, carried;
  auto note = [](std::vector<int>& v, int id) {
    if (std::find(v.begin(), v.end(), id) == v.end()) v.push_back(id);
  };
  for (int id : members)
    for (int j : g.node(id).inputs) {
      const Op op = g.node(j).op;
      if (op == Op::kParameter) {
        note(params, j);
      } else if (op == Op::kState) {
        note(states, j);
      } else if (op == Op::kInput) {
        note(inputs, j);
      } else if (crossing(j)) {
        const Node& r = g.node(root[size_t(j)]);
        if (r.op != Op::kState) {
          note(carried, j);
        } else if (g.node(j).type == r.type) {
          note(states, root[size_t(j)]);  // the cache as its write left it
        } else {
          throw UnsupportedError(
              detail::str_cat("PJRT backend: '", g.node(j).name, "' reads state '", r.name, "' as ",
                              g.node(j).type.str(),
                              " across a collective; only the state's own shape can be "
                              "carried between the pieces of a tensor-parallel graph"));
        }
      }
    }
  // Leaves in the whole graph's order of each kind (the order bindings come in), then the
  // carried values.
  for (auto* v : {&params, &states, &inputs}) std::sort(v->begin(), v->end());
  Segment s{
      graph::Graph(g.activation_dtype(), g.kv_layout()), {}, {}, {}, carried, std::move(produced)};
  std::map<int, int> local;  // whole-graph id -> segment id
  auto leaf = [&](int j, Op op) {
    const Node& n = g.node(j);
    local[j] = s.graph.add(Node{op, {}, n.type, n.name, {}});
  };
  for (int j : params) leaf(j, Op::kParameter), s.params.push_back(size_t(pos[size_t(j)]));
  for (int j : states) leaf(j, Op::kState), s.states.push_back(size_t(pos[size_t(j)]));
  for (int j : inputs) leaf(j, Op::kInput), s.inputs.push_back(size_t(pos[size_t(j)]));
  for (int j : carried) leaf(j, Op::kInput);
  for (int id : members) {
    Node n = g.node(id);
    for (int& j : n.inputs) {
      auto it = local.find(j);
      j = it != local.end() ? it->second : local.at(root[size_t(j)]);
    }
    local[id] = s.graph.add(std::move(n));
  }
  for (int id : s.produced) s.graph.mark_output(local.at(id));
  return s;
}

}  // namespace

Split split_at_collectives(const graph::Graph& g) {
  const std::vector<Node>& nodes = g.nodes();
  Split out;
  if (std::none_of(nodes.begin(), nodes.end(), [](const Node& n) { return is_collective(n.op); })) {
    Segment s{g,
              iota(g.leaves(Op::kParameter).size()),
              iota(g.leaves(Op::kState).size()),
              iota(g.leaves(Op::kInput).size()),
              {},
              g.outputs()};
    out.steps.emplace_back(std::move(s));
    out.dead_after.emplace_back();
    return out;
  }
  // Each value's root: a reshape or cache write is its first input's bytes (as lower.cc sees it).
  std::vector<int> root(nodes.size()), pos(nodes.size(), -1);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Op op = nodes[i].op;
    const bool in_place = op == Op::kReshape || op == Op::kCacheWrite || op == Op::kPagedCacheWrite;
    root[i] = in_place ? root[size_t(nodes[i].inputs[0])] : int(i);
  }
  // A linear-attention op writes its state operand in place beside its own value
  // (graph::side_written_operand). When that operand lives in a state, the segment that writes
  // binds the state, returns its new value as a cache write's segment does, and the backend
  // swaps it in; a later segment binds the state as written, as the CPU backend's later nodes
  // read its bytes. Written in place anywhere else, the new value would stay in the writing
  // segment while other segments read the value from before the write: refused.
  for (const Node& n : nodes)
    if (const int k = graph::side_written_operand(n.op); k >= 0) {
      const Node& r = nodes[size_t(root[size_t(n.inputs[size_t(k)])])];
      if (r.op != Op::kState)
        throw UnsupportedError(detail::str_cat(
            "PJRT backend: '", n.name, "' (", graph::op_name(n.op), ") writes '", r.name,
            "' in place, which is not a state; in a graph with collectives only a state can be "
            "written in place"));
    }
  for (Op kind : {Op::kParameter, Op::kState, Op::kInput}) {
    const std::vector<int> ids = g.leaves(kind);
    for (size_t k = 0; k < ids.size(); ++k) pos[size_t(ids[k])] = int(k);
  }
  // Steps: runs of compute nodes, cut by each collective.
  std::vector<int> step_of(nodes.size(), -1);
  std::vector<std::vector<int>> members;
  std::vector<bool> collective;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (graph::is_leaf(nodes[i].op)) continue;
    const bool c = is_collective(nodes[i].op);
    if (c || members.empty() || collective.back()) {
      members.emplace_back();
      collective.push_back(c);
    }
    members.back().push_back(int(i));
    step_of[i] = int(members.size()) - 1;
  }
  // The last step that reads each value; the graph's outputs live to the end.
  const int end = int(members.size());
  std::vector<int> last_read(nodes.size(), -1);
  for (size_t s = 0; s < members.size(); ++s)
    for (int id : members[s])
      for (int j : nodes[size_t(id)].inputs) last_read[size_t(j)] = int(s);
  for (int o : g.outputs()) last_read[size_t(o)] = end;

  out.dead_after.resize(members.size());
  for (size_t s = 0; s < members.size(); ++s) {
    if (collective[s]) {
      out.steps.emplace_back(HostCollective{members[s][0]});
    } else {
      // Values a later step or the caller reads leave the segment; a state's stay in the state.
      std::vector<int> produced;
      for (int id : members[s])
        if (last_read[size_t(id)] > int(s) && nodes[size_t(root[size_t(id)])].op != Op::kState)
          produced.push_back(id);
      out.steps.emplace_back(build_segment(
          g, root, pos, members[s], [&](int j) { return step_of[size_t(j)] != int(s); },
          std::move(produced)));
    }
    for (int id : members[s])
      if (last_read[size_t(id)] > int(s) && last_read[size_t(id)] < end)
        out.dead_after[size_t(last_read[size_t(id)])].push_back(id);
  }
  return out;
}

}  // namespace tformers::backends::pjrt
