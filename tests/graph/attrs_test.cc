// Typed op attributes: a node carries its op's attribute struct, a wrong pairing or a wrong read
// is an InternalError naming the node, and every field reaches the graph hash.
#include <gtest/gtest.h>

#include <string>

#include "graph/builder.h"
#include "tformers/error.h"

namespace tformers::graph {
namespace {

// The message of the InternalError `f` throws ("" when it throws none).
template <class F>
std::string internal_error(F f) {
  try {
    f();
  } catch (const InternalError& e) {
    return e.what();
  }
  return "";
}

TEST(OpAttrs, ReadingAnotherKindNamesTheNodeAndBothKinds) {
  GraphBuilder b;
  const Value x = b.input("x", {DType::f32, {2, 4}});
  const Value n = b.rms_norm(x, b.parameter("w", {DType::f32, {4}}), 1e-6f, "model.norm");
  const Graph g = b.finish();
  EXPECT_EQ(g.node(n).attrs_as<RMSNormAttrs>().eps, 1e-6f);
  const std::string e = internal_error([&] { g.node(n).attrs_as<RopeAttrs>(); });
  EXPECT_NE(e.find("rms_norm node 'model.norm' has RMSNormAttrs, not RopeAttrs"), std::string::npos)
      << e;
  const std::string leaf = internal_error([&] { g.node(x).attrs_as<ScaleAttrs>(); });
  EXPECT_NE(leaf.find("input node 'x' has no attributes, not ScaleAttrs"), std::string::npos)
      << leaf;
}

TEST(OpAttrs, GraphRefusesAttributesOfAnotherOp) {
  Graph g;
  const int x = g.add({Op::kInput, {}, {DType::f32, {2, 4}}, "x", {}});
  const std::string e = internal_error([&] {
    g.add({Op::kScale, {x}, {DType::f32, {2, 4}}, "s", SoftcapAttrs{2}});
  });
  EXPECT_NE(e.find("scale node 's' has SoftcapAttrs, not the op's kind"), std::string::npos) << e;
  EXPECT_NE(internal_error([&] {
              g.add({Op::kAdd, {x, x}, {DType::f32, {2, 4}}, "a", ScaleAttrs{}});
            }),
            "");
  EXPECT_NE(internal_error([&] {
              g.add({Op::kRMSNorm, {x, x}, {DType::f32, {2, 4}}, "n", {}});
            }),
            "");
  EXPECT_NE(internal_error([&] {
              g.add({Op::kCustomCall, {x}, {DType::f32, {2, 4}}, "c", CustomCallAttrs{}});
            }).find("custom call 'c' names no kernel"),
            std::string::npos);
  EXPECT_EQ(g.nodes().size(), 1u);  // nothing refused was added
}

// A vocabulary-sharded embedding of `vocab` rows over process group `group`.
Graph shard(int group, int64_t vocab) {
  GraphBuilder b;
  const Value t = b.parameter("t", {DType::f32, {4, 8}});
  b.output(b.embedding_shard(t, b.input("ids", {DType::i32, {1, 3}}), vocab, group));
  return b.finish();
}

// Integer, float, bool and vector fields each change the hash; equal attributes hash equal.
TEST(OpAttrs, EveryFieldIsPartOfTheHash) {
  EXPECT_EQ(shard(1, 12).hash(), shard(1, 12).hash());
  EXPECT_NE(shard(1, 12).hash(), shard(2, 12).hash());
  EXPECT_NE(shard(1, 12).hash(), shard(1, 16).hash());

  auto rope = [](std::vector<float> inv_freq, RopeOptions o) {
    GraphBuilder b;
    const Value x = b.input("x", {DType::f32, {1, 2, 1, 8}});
    b.output(b.rope(x, b.input("pos", {DType::i32, {1, 2}}), std::move(inv_freq), o, "rope"));
    return b.finish().hash();
  };
  const uint64_t base = rope({1.0f, 0.5f}, {.rotary_dim = 4});
  EXPECT_EQ(base, rope({1.0f, 0.5f}, {.rotary_dim = 4}));
  EXPECT_NE(base, rope({1.0f, 0.25f}, {.rotary_dim = 4}));
  EXPECT_NE(base, rope({1.0f, 0.5f}, {.rotary_dim = 4, .interleaved = true}));
  EXPECT_NE(base, rope({1.0f, 0.5f, 0.25f, 0.125f}, {}));

  auto norm = [](float eps, bool unit_offset) {
    GraphBuilder b;
    const Value x = b.input("x", {DType::f32, {2, 4}});
    b.output(b.rms_norm(x, b.parameter("w", {DType::f32, {4}}), eps, {unit_offset}, "n"));
    return b.finish().hash();
  };
  EXPECT_NE(norm(1e-6f, false), norm(1e-5f, false));
  EXPECT_NE(norm(1e-6f, false), norm(1e-6f, true));
}

}  // namespace
}  // namespace tformers::graph
