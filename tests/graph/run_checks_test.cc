// Executable::run checks bindings and step inputs against the graph above the backends: on a
// backend that runs nothing, every bad value is refused with the message the CPU backend's
// users see, and the backend's execute() is never reached.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "graph/builder.h"
#include "graph/fake_backend.h"
#include "tformers/error.h"

namespace tformers {
namespace {

using graph::GraphBuilder;
using graph::Value;
using testing::FakeBackend;
using testing::FakeExecutable;

// A vocabulary of V, a static cache of S slots, and a pool of NB blocks of BS slots reached
// through tables of MB blocks; T new tokens, one KV head of D.
constexpr int64_t V = 5, S = 4, NB = 2, BS = 2, MB = 2, T = 3, D = 4;

// Embeds ids (given flat and reshaped, so the check follows reshapes to the input), writes the
// static cache at start and the paged pool at pos through table.
graph::Graph step_graph() {
  GraphBuilder b;
  const Value table = b.parameter("embed", {DType::f32, {V, D}});
  const Value ids = b.reshape(b.input("ids", {DType::i32, {T}}), {1, T});
  const Value start = b.input("start", {DType::i32, {}});
  const Value block_table = b.input("table", {DType::i32, {1, MB}});
  const Value pos = b.input("pos", {DType::i32, {1, T}});
  const Value cache = b.state("cache", {DType::f32, {1, 1, S, D}});
  const Value pool = b.state("pool", {DType::f32, {NB, 1, BS, D}});
  const Value h = b.embedding(table, ids, "embed");
  const Value kv = b.reshape(h, {1, T, 1, D});
  b.cache_write(cache, kv, start, "cache");
  b.paged_cache_write(pool, kv, block_table, pos, "pool");
  b.output(h);
  return b.finish();
}

class RunChecks : public ::testing::Test {
 protected:
  // Runs one step with these values; returns the InvalidArgumentError's message, or "" when the
  // run passes.
  std::string run(std::vector<int32_t> ids, int32_t start, std::vector<int32_t> table,
                  std::vector<int32_t> pos, Shape ids_shape = {T}) {
    const Tensor t_ids = Tensor::from_vector<int32_t>(ids_shape, DType::i32, ids);
    const Tensor t_start = Tensor::from_vector<int32_t>({}, DType::i32, {start});
    const Tensor t_table = Tensor::from_vector<int32_t>({1, MB}, DType::i32, table);
    const Tensor t_pos = Tensor::from_vector<int32_t>({1, T}, DType::i32, pos);
    Tensor out = Tensor::zeros({1, T, D}, DType::f32);
    backends::Buffer* params[] = {embed_.get()};
    backends::Buffer* states[] = {cache_.get(), pool_.get()};
    const Tensor* inputs[] = {&t_ids, &t_start, &t_table, &t_pos};
    Tensor* outputs[] = {&out};
    try {
      exe_->run(params, states, inputs, outputs);
    } catch (const InvalidArgumentError& e) {
      return e.what();
    }
    return "";
  }
  int executes() const { return static_cast<const FakeExecutable&>(*exe_).executes; }

  FakeBackend backend_;
  std::unique_ptr<backends::Executable> exe_ = backend_.compile(step_graph());
  std::shared_ptr<backends::Buffer> embed_ = backend_.allocate({DType::f32, {V, D}});
  std::shared_ptr<backends::Buffer> cache_ = backend_.allocate({DType::f32, {1, 1, S, D}});
  std::shared_ptr<backends::Buffer> pool_ = backend_.allocate({DType::f32, {NB, 1, BS, D}});
};

TEST_F(RunChecks, AValidStepReachesTheBackend) {
  EXPECT_EQ(run({0, 4, 2}, 1, {1, 0}, {1, 2, 3}), "");
  EXPECT_EQ(executes(), 1);
  // Padding positions (negative) reach no block, so an unused table entry may be anything.
  EXPECT_EQ(run({0, 4, 2}, 0, {1, -9}, {0, 1, -1}), "");
  EXPECT_EQ(executes(), 2);
}

TEST_F(RunChecks, BadValuesAreRefusedBeforeTheBackendRuns) {
  EXPECT_EQ(run({0, 5, 2}, 0, {0, 1}, {0, 1, 2}),
            "token id 5 at index 1 is out of range: the vocabulary has 5 entries (ids 0..4)");
  EXPECT_EQ(run({-1, 0, 2}, 0, {0, 1}, {0, 1, 2}),
            "token id -1 at index 0 is out of range: the vocabulary has 5 entries (ids 0..4)");
  EXPECT_EQ(run({0, 1, 2}, 2, {0, 1}, {0, 1, 2}),
            "cache position 2 with 3 new tokens does not fit the static cache of 4 positions: "
            "allocate a larger cache (max_cache_len)");
  EXPECT_EQ(run({0, 1, 2}, -1, {0, 1}, {0, 1, 2}),
            "cache position -1 with 3 new tokens does not fit the static cache of 4 positions: "
            "allocate a larger cache (max_cache_len)");
  EXPECT_EQ(run({0, 1, 2}, 0, {0, 1}, {0, 4, 2}),
            "pool: position 4 of sequence 0 is past its block table of 2 blocks of 2 positions");
  EXPECT_EQ(run({0, 1, 2}, 0, {0, 2}, {0, 1, 2}),
            "pool: block table row 0 entry 1 is 2, outside the pool of 2 blocks");
  EXPECT_EQ(run({0, 1, 2}, 0, {-1, 0}, {0, 0, 1}),
            "pool: block table row 0 entry 0 is -1, outside the pool of 2 blocks");
  EXPECT_EQ(run({0, 1}, 0, {0, 1}, {0, 1, 2}, {1, 2}),
            "input 'ids' must be int32[3], got int32[1, 2]");
  EXPECT_EQ(executes(), 0);
}

TEST_F(RunChecks, BindingsOfOtherTypesAreInternalErrors) {
  const Tensor ids = Tensor::from_vector<int32_t>({T}, DType::i32, {0, 1, 2});
  const Tensor start = Tensor::from_vector<int32_t>({}, DType::i32, {0});
  const Tensor table = Tensor::from_vector<int32_t>({1, MB}, DType::i32, {0, 1});
  const Tensor pos = Tensor::from_vector<int32_t>({1, T}, DType::i32, {0, 1, 2});
  const Tensor* inputs[] = {&ids, &start, &table, &pos};
  Tensor out = Tensor::zeros({1, T, D}, DType::f32), wrong_out = Tensor::zeros({T, D}, DType::f32);
  Tensor* outputs[] = {&out};
  auto bf16_embed = backend_.allocate({DType::bf16, {V, D}});
  backends::Buffer* wrong_param[] = {bf16_embed.get()};
  backends::Buffer* params[] = {embed_.get()};
  backends::Buffer* states[] = {cache_.get(), pool_.get()};
  backends::Buffer* swapped[] = {pool_.get(), cache_.get()};
  Tensor* wrong_outputs[] = {&wrong_out};
  EXPECT_THROW(exe_->run(wrong_param, states, inputs, outputs), InternalError);
  EXPECT_THROW(exe_->run(params, swapped, inputs, outputs), InternalError);
  EXPECT_THROW(exe_->run(params, states, inputs, wrong_outputs), InternalError);
  EXPECT_THROW(exe_->run(params, {}, inputs, outputs), InternalError);
  EXPECT_EQ(executes(), 0);
  exe_->run(params, states, inputs, outputs);
  EXPECT_EQ(executes(), 1);
}

// A packed paged write (the rows operand): each token's sequence picks its row of a table of
// two; a token whose sequence has no row, or a sequence whose positions pass its own table row,
// is refused before the backend runs.
TEST(RunChecksPacked, EachTokensSequenceAndItsBlocksAreChecked) {
  GraphBuilder b;
  const Value table = b.input("table", {DType::i32, {2, MB}});
  const Value pos = b.input("pos", {DType::i32, {1, T}});
  const Value rows = b.input("rows", {DType::i32, {1, T}});
  const Value kv = b.input("kv", {DType::f32, {1, T, 1, D}});
  b.paged_cache_write(b.state("pool", {DType::f32, {NB, 1, BS, D}}), kv, table, pos, "pool", rows);
  b.output(kv);
  FakeBackend backend;
  std::unique_ptr<backends::Executable> exe = backend.compile(b.finish());
  std::shared_ptr<backends::Buffer> pool = backend.allocate({DType::f32, {NB, 1, BS, D}});
  auto run = [&](std::vector<int32_t> t, std::vector<int32_t> p, std::vector<int32_t> r) {
    const Tensor tt = Tensor::from_vector<int32_t>({2, MB}, DType::i32, t);
    const Tensor pt = Tensor::from_vector<int32_t>({1, T}, DType::i32, p);
    const Tensor rt = Tensor::from_vector<int32_t>({1, T}, DType::i32, r);
    const Tensor kt = Tensor::zeros({1, T, 1, D}, DType::f32);
    Tensor out = Tensor::zeros({1, T, 1, D}, DType::f32);
    backends::Buffer* states[] = {pool.get()};
    const Tensor* inputs[] = {&tt, &pt, &rt, &kt};
    Tensor* outputs[] = {&out};
    try {
      exe->run({}, states, inputs, outputs);
    } catch (const InvalidArgumentError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Sequence 1 at positions 0 and 1 (its block 0), sequence 0 at position 2 (its block 1); a
  // padding token's sequence is not read. Sequence 1's second entry is unused.
  EXPECT_EQ(run({0, 1, 1, -5}, {0, 1, 2}, {1, 1, 0}), "");
  EXPECT_EQ(run({0, 1, 1, -5}, {0, -1, 2}, {1, 9, 0}), "");
  EXPECT_EQ(run({0, 1, 1, -5}, {0, 1, 2}, {1, 2, 0}),
            "pool: token 1 of row 0 names sequence 2, outside the block table's 2 rows");
  EXPECT_EQ(run({0, 1, 1, -5}, {0, 1, 2}, {1, 1, 1}),
            "pool: block table row 1 entry 1 is -5, outside the pool of 2 blocks");
  EXPECT_EQ(run({0, 1, 1, 0}, {0, 1, 4}, {1, 1, 0}),
            "pool: position 4 of sequence 0 is past its block table of 2 blocks of 2 positions");
  EXPECT_EQ(static_cast<const FakeExecutable&>(*exe).executes, 2);
}

// Ids that no input carries cannot be checked before a run: refused when compiling.
TEST(RunChecksPlan, ComputedIdsAreRefusedAtCompile) {
  GraphBuilder b;
  const Value table = b.parameter("table", {DType::f32, {V, D}});
  b.output(b.embedding(table, b.parameter("ids", {DType::i32, {1, T}}), "embed"));
  FakeBackend backend;
  try {
    backend.compile(b.finish());
    FAIL() << "compiled an embedding of parameter ids";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "embedding node 'embed': its ids come from a parameter node; they must be a "
                  "graph input"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tformers
