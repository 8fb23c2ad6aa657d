// A model's dtype is its graphs' activation dtype: a bfloat16 model builds bfloat16 graphs,
// static and paged, whose logits leave the graph in float32, and a float32 model builds the
// same graphs in float32 without a single convert.
#include <gtest/gtest.h>

#include <string>

#include "golden_util.h"
#include "graph/graph.h"
#include "models/causal_lm_impl.h"
#include "tformers/model.h"

namespace tformers {
namespace {

using graph::Op;

CausalLM load(const std::string& name, DType dtype) {
  return AutoModelForCausalLM::from_pretrained(std::string(TFORMERS_TEST_DATA) + "/models/" + name,
                                               {.dtype = dtype, .device_map = "cpu"});
}

const models::StepShape kShapes[] = {
    {.batch = 1, .new_tokens = 7, .cache_len = 16, .logits_to_keep = 0},                // prefill
    {.batch = 2, .new_tokens = 1, .cache_len = 16},                                     // decode
    {.batch = 2, .new_tokens = 1, .kv_blocks = 8, .block_size = 4, .table_blocks = 4},  // paged
};

class ModelActivationDtype : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelActivationDtype, Bfloat16ModelsBuildBfloat16GraphsWithFloat32Logits) {
  CausalLM lm = load(GetParam(), DType::bf16);
  for (const models::StepShape& s : kShapes) {
    const graph::Graph g = models::state_of(lm).build_graph(s);
    EXPECT_EQ(g.activation_dtype(), DType::bf16);
    int computed = 0, f32 = 0, converts = 0;
    for (const graph::Node& n : g.nodes()) {
      if (n.op == Op::kParameter || n.op == Op::kState || n.op == Op::kInput) continue;
      ++computed;
      f32 += n.type.dtype == DType::f32;
      converts += n.op == Op::kConvert;
    }
    ASSERT_EQ(g.outputs().size(), 1u);
    const graph::Node& logits = g.node(g.outputs()[0]);
    EXPECT_EQ(logits.op, Op::kConvert);
    EXPECT_EQ(logits.type.dtype, DType::f32);
    EXPECT_EQ(g.node(logits.inputs[0]).type.dtype, DType::bf16);
    // The logits' convert is the graph's only float32 value and its only convert.
    EXPECT_EQ(f32, 1) << GetParam();
    EXPECT_EQ(converts, 1) << GetParam();
    EXPECT_GT(computed, 20);
  }
}

TEST_P(ModelActivationDtype, Float32ModelsBuildFloat32GraphsWithoutConverts) {
  CausalLM lm = load(GetParam(), DType::f32);
  for (const models::StepShape& s : kShapes) {
    const graph::Graph g = models::state_of(lm).build_graph(s);
    EXPECT_EQ(g.activation_dtype(), DType::f32);
    for (const graph::Node& n : g.nodes()) EXPECT_NE(n.op, Op::kConvert) << GetParam();
    EXPECT_EQ(g.node(g.outputs()[0]).type.dtype, DType::f32);
  }
}

// The CPU's attention reads f32 and bf16 caches: a float16 model keeps its keys and values in
// float32 there, in every graph and in what the memory checks count per position.
TEST(ModelCacheDtype, Float16ModelsKeepFloat32CachesOnTheCpu) {
  CausalLM half = load("tiny-qwen3", DType::f16), full = load("tiny-qwen3", DType::f32);
  const auto& impl = models::state_of(half);
  EXPECT_EQ(impl.cache_dtype, DType::f32);
  EXPECT_EQ(impl.kv_bytes_per_position(), models::state_of(full).kv_bytes_per_position());
  for (const models::StepShape& s : kShapes) {
    const graph::Graph g = impl.build_graph(s);
    EXPECT_EQ(g.activation_dtype(), DType::f16);
    for (const graph::Node& n : g.nodes())
      if (n.op == Op::kState && n.type.dtype != DType::i32) EXPECT_EQ(n.type.dtype, DType::f32);
  }
}

// Three families with different layers: Qwen3 (q/k norms), Gemma 3 (scaled embedding, sliding
// windows, softcaps), GLM (partial interleaved rotary, fused gate/up).
INSTANTIATE_TEST_SUITE_P(TinyModels, ModelActivationDtype,
                         ::testing::Values("tiny-qwen3", "tiny-gemma3", "tiny-glm"),
                         [](const auto& info) { return testing::test_name_of(info.param); });

}  // namespace
}  // namespace tformers
