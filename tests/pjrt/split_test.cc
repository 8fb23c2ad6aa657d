// A tensor-parallel graph cut at its collectives (backends/pjrt/split.h): which segment holds
// what, what crosses between them and when it is freed; the pieces run on XLA's CPU plugin with
// the collectives on the host give the CPU backend's numbers; and a state read across a
// collective in another shape is refused. The two-rank runs of whole models are in
// tests/distributed (TpMpiXlaCpu.*).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/pjrt/plugin_discovery.h"
#include "backends/pjrt/split.h"
#include "backends/registry.h"
#include "common/missing_dependency.h"
#include "common/random_floats.h"
#include "distributed/process_group.h"
#include "graph/builder.h"
#include "test_device.h"
#include "tformers/error.h"

namespace tformers::backends::pjrt {
namespace {

using tformers::testing::random_floats;

using graph::GraphBuilder;
using graph::Value;

struct Built {
  graph::Graph graph;
  Value h, r, y, z, g, out;
};

// x -> h = x W1 -> r = all_reduce(h) -> y = r W2 -> z = y + h -> g = all_gather(z) -> out = g W3;
// y and out are returned. h crosses the first collective without passing through it.
Built two_collectives(int group) {
  GraphBuilder b;
  const Value x = b.input("x", {DType::f32, {1, 3, 8}});
  const Value w1 = b.parameter("w1", {DType::f32, {8, 8}});
  const Value w2 = b.parameter("w2", {DType::f32, {8, 8}});
  const Value w3 = b.parameter("w3", {DType::f32, {4, 8}});
  Built t;
  t.h = b.linear(x, w1, -1, "h");
  t.r = b.all_reduce(t.h, -1, group, "r");
  t.y = b.linear(t.r, w2, -1, "y");
  t.z = b.add(t.y, t.h, "z");
  t.g = b.all_gather(t.z, 1, group, "g");
  t.out = b.linear(t.g, w3, -1, "out");
  b.output(t.y);
  b.output(t.out);
  t.graph = b.finish();
  return t;
}

TEST(SplitAtCollectives, SegmentsCarryWhatCrossesAndFreeItAfterItsLastReader) {
  const Built t = two_collectives(0);
  const Split s = split_at_collectives(t.graph);
  ASSERT_EQ(s.steps.size(), 5u);
  const auto* s0 = std::get_if<Segment>(&s.steps[0]);
  const auto* c1 = std::get_if<HostCollective>(&s.steps[1]);
  const auto* s2 = std::get_if<Segment>(&s.steps[2]);
  const auto* c3 = std::get_if<HostCollective>(&s.steps[3]);
  const auto* s4 = std::get_if<Segment>(&s.steps[4]);
  ASSERT_TRUE(s0 && c1 && s2 && c3 && s4);
  EXPECT_EQ(c1->node, t.r);
  EXPECT_EQ(c3->node, t.g);
  // Parameters by their position among the graph's parameters; x is input 0.
  EXPECT_EQ(s0->params, (std::vector<size_t>{0}));
  EXPECT_EQ(s0->inputs, (std::vector<size_t>{0}));
  EXPECT_EQ(s0->carried, std::vector<int>{});
  EXPECT_EQ(s0->produced, (std::vector<int>{t.h}));
  EXPECT_EQ(s2->params, (std::vector<size_t>{1}));
  EXPECT_EQ(s2->inputs, std::vector<size_t>{});
  EXPECT_EQ(s2->carried, (std::vector<int>{t.r, t.h}));
  EXPECT_EQ(s2->produced, (std::vector<int>{t.y, t.z}));  // y is returned, z gathered
  EXPECT_EQ(s4->params, (std::vector<size_t>{2}));
  EXPECT_EQ(s4->carried, (std::vector<int>{t.g}));
  EXPECT_EQ(s4->produced, (std::vector<int>{t.out}));
  // A segment's graph: its leaves, then its nodes; the carried values are inputs after the
  // graph's own.
  EXPECT_EQ(s2->graph.leaves(graph::Op::kParameter).size(), 1u);
  EXPECT_EQ(s2->graph.leaves(graph::Op::kInput).size(), 2u);
  EXPECT_EQ(s2->graph.outputs().size(), 2u);
  // h and r die after segment 2 reads them, z after the gather, g after the last segment; y and
  // out are returned and live to the end.
  ASSERT_EQ(s.dead_after.size(), 5u);
  EXPECT_EQ(s.dead_after[2], (std::vector<int>{t.h, t.r}));
  EXPECT_EQ(s.dead_after[3], (std::vector<int>{t.z}));
  EXPECT_EQ(s.dead_after[4], (std::vector<int>{t.g}));
  EXPECT_TRUE(s.dead_after[0].empty() && s.dead_after[1].empty());
}

TEST(SplitAtCollectives, AGraphWithoutCollectivesIsOneSegmentOfItself) {
  GraphBuilder b;
  const Value x = b.input("x", {DType::f32, {2, 4}});
  const Value w = b.parameter("w", {DType::f32, {4, 4}});
  b.output(b.linear(x, w));
  const graph::Graph g = b.finish();
  const Split s = split_at_collectives(g);
  ASSERT_EQ(s.steps.size(), 1u);
  const Segment& seg = std::get<Segment>(s.steps[0]);
  EXPECT_EQ(seg.graph.hash(), g.hash());
  EXPECT_EQ(seg.produced, g.outputs());
}

// A cache seen through a reshape on one side of a collective and read on the other would need
// the state in two shapes: refused, naming the value and the state.
TEST(SplitAtCollectives, AStateReadAcrossACollectiveInAnotherShapeIsRefused) {
  GraphBuilder b;
  const Value cache = b.state("layers.0.k_cache", {DType::f32, {2, 8}});
  const Value flat = b.reshape(cache, {16});
  const Value x = b.input("x", {DType::f32, {16}});
  const Value sum = b.all_reduce(x, -1, 0, "sum");
  b.output(b.add(flat, sum, "mix"));
  try {
    split_at_collectives(b.finish());
    FAIL() << "split";
  } catch (const UnsupportedError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("layers.0.k_cache"), std::string::npos) << what;
    EXPECT_NE(what.find("across a collective"), std::string::npos) << what;
  }
}

// A linear-attention op's state written in one segment and read in the next: the first
// segment's module returns the state's new value, and the second binds the state as written.
// x -> conv (writes the state) -> all_reduce -> conv over the same state; the second conv's
// output is returned.
graph::Graph state_written_across_a_collective(int group) {
  GraphBuilder b;
  const Value state = b.state("layers.0.conv_state", {DType::f32, {2, 2, 4}});
  const Value x = b.input("x", {DType::f32, {2, 3, 4}});
  const Value start = b.input("start", {DType::i32, {}});
  const Value mask = b.input("mask", {DType::i32, {2, 8}});
  const Value w = b.parameter("w", {DType::f32, {4, 3}});
  const Value first = b.causal_conv1d(x, w, state, start, mask, "first");
  const Value sum = b.all_reduce(first, -1, group, "sum");
  b.output(b.causal_conv1d(sum, w, state, start, mask, "second"));
  return b.finish();
}

TEST(SplitAtCollectives, AStateWrittenInPlaceIsBoundByEachSegmentThatWritesIt) {
  const graph::Graph g = state_written_across_a_collective(0);
  const Split s = split_at_collectives(g);
  ASSERT_EQ(s.steps.size(), 3u);
  const auto* s0 = std::get_if<Segment>(&s.steps[0]);
  const auto* s2 = std::get_if<Segment>(&s.steps[2]);
  ASSERT_TRUE(s0 && s2);
  EXPECT_EQ(s0->states, (std::vector<size_t>{0}));
  EXPECT_EQ(s2->states, (std::vector<size_t>{0}));
  // The first conv's value goes to the collective; the state is not carried but bound.
  EXPECT_EQ(s0->produced.size(), 1u);
  EXPECT_EQ(s2->carried.size(), 1u);
}

// An in-place write into a value that no state holds cannot cross segments: refused, naming the
// op and the value.
TEST(SplitAtCollectives, AnInPlaceWriteOutsideAStateIsRefused) {
  GraphBuilder b;
  const Value buffer = b.input("scratch_state", {DType::f32, {1, 2, 4}});
  const Value x = b.input("x", {DType::f32, {1, 3, 4}});
  const Value start = b.input("start", {DType::i32, {}});
  const Value mask = b.input("mask", {DType::i32, {1, 8}});
  const Value w = b.parameter("w", {DType::f32, {4, 3}});
  const Value y = b.causal_conv1d(x, w, buffer, start, mask, "conv");
  b.output(b.all_reduce(y, -1, 0, "sum"));
  try {
    split_at_collectives(b.finish());
    FAIL() << "split";
  } catch (const UnsupportedError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'conv'"), std::string::npos) << what;
    EXPECT_NE(what.find("scratch_state"), std::string::npos) << what;
    EXPECT_NE(what.find("not a state"), std::string::npos) << what;
  }
}

// The graph's outputs from `backend`, its collectives over this process's one-rank group.
std::vector<Tensor> run_on(Backend& backend, const graph::Graph& g,
                           const std::vector<Tensor>& weights, const Tensor& x) {
  auto exe = backend.compile(g);
  std::vector<std::shared_ptr<Buffer>> held;
  std::vector<Buffer*> params;
  for (const Tensor& w : weights) params.push_back(held.emplace_back(backend.upload(w)).get());
  std::vector<Tensor> outs;
  for (int o : g.outputs()) outs.push_back(Tensor::zeros(g.node(o).type.shape, DType::f32));
  std::vector<Tensor*> out_ptrs;
  for (Tensor& t : outs) out_ptrs.push_back(&t);
  const std::vector<const Tensor*> in = {&x};
  exe->run(params, {}, in, out_ptrs);
  return outs;
}

TEST(SplitAtCollectives, PiecesOnXlaCpuGiveTheCpuBackendsNumbers) {
  const std::string missing = tformers::testing::missing_pjrt_plugin();
  if (!missing.empty()) TF_SKIP_MISSING_DEPENDENCY(missing);
  const Built t = two_collectives(distributed::tp_group(1)->id());
  const std::vector<Tensor> weights = {
      Tensor::from_vector<float>({8, 8}, DType::f32, random_floats(64, 1)),
      Tensor::from_vector<float>({8, 8}, DType::f32, random_floats(64, 2)),
      Tensor::from_vector<float>({4, 8}, DType::f32, random_floats(32, 3))};
  const Tensor x = Tensor::from_vector<float>({1, 3, 8}, DType::f32, random_floats(24, 4));
  Backend& xla = backend_for(tformers::testing::pjrt_test_device(), false);
  const TransferStats before = xla.transfer_stats();
  const std::vector<Tensor> got = run_on(xla, t.graph, weights, x);
  const TransferStats moved = xla.transfer_stats();
  auto cpu = make_cpu_backend();
  const std::vector<Tensor> want = run_on(*cpu, t.graph, weights, x);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k)
    for (int64_t i = 0; i < got[k].numel(); ++i)
      EXPECT_NEAR(got[k].data<float>()[i], want[k].data<float>()[i],
                  1e-5 * (1 + std::fabs(want[k].data<float>()[i])))
          << "output " << k << " at " << i;
  // Three executions; across each collective its input comes down and its result goes up, and
  // the two outputs come down.
  EXPECT_EQ(moved.executions - before.executions, 3u);
  const uint64_t act = 3 * 8 * sizeof(float);
  EXPECT_EQ(moved.device_to_host_bytes - before.device_to_host_bytes, act + act + act + 3 * 4 * 4);
  EXPECT_EQ(moved.host_to_device_bytes - before.host_to_device_bytes,
            (64 + 64 + 32) * 4 + act /* x */ + act + act);
}

// The written state on XLA's CPU plugin through the segments: the second conv's output and the
// state after both writes are the CPU backend's.
TEST(SplitAtCollectives, AStateWrittenInPlaceCarriesAcrossSegmentsOnXlaCpu) {
  const std::string missing = tformers::testing::missing_pjrt_plugin();
  if (!missing.empty()) TF_SKIP_MISSING_DEPENDENCY(missing);
  const graph::Graph g = state_written_across_a_collective(distributed::tp_group(1)->id());
  const Tensor w = Tensor::from_vector<float>({4, 3}, DType::f32, random_floats(12, 5));
  const Tensor state = Tensor::from_vector<float>({2, 2, 4}, DType::f32, random_floats(16, 6));
  const Tensor x = Tensor::from_vector<float>({2, 3, 4}, DType::f32, random_floats(24, 7));
  const Tensor start = Tensor::from_vector<int32_t>({}, DType::i32, {4});
  std::vector<int32_t> m(16, 1);
  m[4] = 0;  // row 0's first new token is padding
  const Tensor mask = Tensor::from_vector<int32_t>({2, 8}, DType::i32, m);
  auto run = [&](Backend& backend, Tensor& out) {
    auto exe = backend.compile(g);
    const std::shared_ptr<Buffer> wb = backend.upload(w), sb = backend.upload(state);
    const std::vector<Buffer*> params = {wb.get()}, states = {sb.get()};
    const std::vector<const Tensor*> in = {&x, &start, &mask};
    out = Tensor::zeros({2, 3, 4}, DType::f32);
    const std::vector<Tensor*> outs = {&out};
    exe->run(params, states, in, outs);
    return backend.download(*sb);
  };
  Tensor got, want;
  const Tensor got_state = run(backend_for(tformers::testing::pjrt_test_device(), false), got);
  auto cpu = make_cpu_backend();
  const Tensor want_state = run(*cpu, want);
  using Pair = std::tuple<const Tensor*, const Tensor*, const char*>;
  for (const auto& [a, b, what] :
       {Pair{&got, &want, "output"}, Pair{&got_state, &want_state, "state"}})
    for (int64_t i = 0; i < b->numel(); ++i)
      EXPECT_NEAR(a->data<float>()[i], b->data<float>()[i],
                  1e-5 * (1 + std::fabs(b->data<float>()[i])))
          << what << " at " << i;
}

}  // namespace
}  // namespace tformers::backends::pjrt
