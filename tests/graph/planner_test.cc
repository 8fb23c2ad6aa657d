// The CPU executor's arena planner and its per-run memory.
#include <gtest/gtest.h>

#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "graph/builder.h"
#include "tformers/error.h"

namespace tformers {
namespace {

using graph::GraphBuilder;
using graph::TensorType;
using graph::Value;

void run(backends::Executable& exe, std::vector<const Tensor*> inputs, Tensor& out) {
  Tensor* outputs[] = {&out};
  exe.run({}, {}, inputs, outputs);
}

// Inputs are copied into the arena before node 0 runs, so an input the graph creates after some
// compute nodes must not share bytes with them. Here the planner used to start `late`'s lifetime
// at its node, after t1's end, and put it on t1's bytes: node 1 then overwrote it (out was 6).
TEST(Planner, InputCreatedAfterComputeNodesIsNotOverwritten) {
  const TensorType t{DType::f32, {16}};
  GraphBuilder b;
  Value a = b.input("a", t);
  Value t1 = b.add(a, a);
  Value t2 = b.add(t1, t1);
  Value late = b.input("late", t);
  b.output(b.add(t2, late));
  auto backend = backends::make_cpu_backend();
  auto exe = backend->compile(b.finish());

  Tensor ta = Tensor::from_vector<float>({16}, DType::f32, std::vector<float>(16, 1.0f));
  Tensor tl = Tensor::from_vector<float>({16}, DType::f32, std::vector<float>(16, 10.0f));
  Tensor out = Tensor::zeros({16}, DType::f32);
  run(*exe, {&ta, &tl}, out);
  for (float v : out.to_f32_vector()) EXPECT_EQ(v, 14.0f);  // 4 * a + late
}

// A reshape of a mid-graph input aliases it and keeps it alive from before node 0 as well.
TEST(Planner, ReshapedLateInputIsNotOverwritten) {
  GraphBuilder b;
  Value a = b.input("a", {DType::f32, {2, 8}});
  Value t1 = b.add(a, a);
  Value t2 = b.add(t1, t1);
  Value late = b.reshape(b.input("late", {DType::f32, {16}}), {2, 8});
  b.output(b.add(t2, late));
  auto backend = backends::make_cpu_backend();
  auto exe = backend->compile(b.finish());

  Tensor ta = Tensor::from_vector<float>({2, 8}, DType::f32, std::vector<float>(16, 1.0f));
  Tensor tl = Tensor::from_vector<float>({16}, DType::f32, std::vector<float>(16, 10.0f));
  Tensor out = Tensor::zeros({2, 8}, DType::f32);
  run(*exe, {&ta, &tl}, out);
  for (float v : out.to_f32_vector()) EXPECT_EQ(v, 14.0f);
}

TEST(Executable, TrimFreesIdleArenasAndRunsAgainAfter) {
  GraphBuilder b;
  Value a = b.input("a", {DType::f32, {64}});
  b.output(b.add(b.add(a, a), a));
  auto backend = backends::make_cpu_backend();
  auto exe = backend->compile(b.finish());
  EXPECT_EQ(exe->trim(), 0u);  // nothing has run: no arena yet

  Tensor ta = Tensor::from_vector<float>({64}, DType::f32, std::vector<float>(64, 2.0f));
  Tensor out = Tensor::zeros({64}, DType::f32);
  run(*exe, {&ta}, out);
  EXPECT_GE(exe->trim(), exe->arena_bytes());
  EXPECT_EQ(exe->trim(), 0u);
  out = Tensor::zeros({64}, DType::f32);
  run(*exe, {&ta}, out);
  for (float v : out.to_f32_vector()) EXPECT_EQ(v, 6.0f);
}

// A run refused by its checks (a token id out of range) never takes an arena.
TEST(Executable, RefusedRunTakesNoArena) {
  GraphBuilder b;
  Value table = b.parameter("table", {DType::f32, {4, 8}});
  b.output(b.embedding(table, b.input("ids", {DType::i32, {1, 2}})));
  auto backend = backends::make_cpu_backend();
  auto exe = backend->compile(b.finish());
  auto t = backend->upload(Tensor::zeros({4, 8}, DType::f32));
  backends::Buffer* params[] = {t.get()};
  Tensor ids = Tensor::from_vector<int32_t>({1, 2}, DType::i32, {1, 4});
  Tensor out = Tensor::zeros({1, 2, 8}, DType::f32);
  const Tensor* inputs[] = {&ids};
  Tensor* outputs[] = {&out};
  EXPECT_THROW(exe->run(params, {}, inputs, outputs), InvalidArgumentError);
  EXPECT_EQ(exe->trim(), 0u);
}

// A run that fails inside the executor (its collective names a process group that does not
// exist) still gives its arena back for the next run.
TEST(Executable, FailedRunReturnsItsArena) {
  GraphBuilder b;
  Value x = b.input("x", {DType::f32, {2, 8}});
  b.output(b.all_gather(b.add(x, x), 1, 1 << 20));
  auto backend = backends::make_cpu_backend();
  auto exe = backend->compile(b.finish());
  Tensor tx = Tensor::zeros({2, 8}, DType::f32);
  Tensor out = Tensor::zeros({2, 8}, DType::f32);
  EXPECT_THROW(run(*exe, {&tx}, out), InternalError);
  EXPECT_GT(exe->arena_bytes(), 0u);
  EXPECT_GE(exe->trim(), exe->arena_bytes());
}

}  // namespace
}  // namespace tformers
