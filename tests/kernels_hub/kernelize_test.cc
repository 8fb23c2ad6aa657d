// kernelize on the tiny Qwen3 checkpoint: hub kernels become custom-call nodes, the logits match
// the built-in ops, and layers fall back (or fail, when asked) where a kernel does not fit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "graph/builder.h"
#include "hub_test_util.h"
#include "models/causal_lm_impl.h"
#include "tformers/error.h"
#include "tformers/kernels.h"
#include "tformers/model.h"

namespace tformers {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

const std::string kRepo = "tformers-community/fused-norms";
const std::vector<int32_t> kPrompt = {5, 77, 301, 12, 9, 440, 3};

std::string model_dir() { return std::string(TFORMERS_TEST_DATA) + "/models/tiny-qwen3"; }

CausalLM load(DType dtype = DType::f32) {
  return AutoModelForCausalLM::from_pretrained(model_dir(), {.dtype = dtype, .device_map = "cpu"});
}

// Logits of a prefill over the prompt (all positions) followed by three decode steps, each row
// (V) in order: the prefill rows, then one row per decode step.
std::vector<std::vector<float>> run(CausalLM& lm) {
  const int64_t T = int64_t(kPrompt.size()), V = lm.config().vocab_size;
  lm.reset_cache(1, T + 8);
  std::vector<std::vector<float>> rows;
  ForwardArgs a;
  a.input_ids = Tensor::from_vector<int32_t>({1, T}, DType::i32, kPrompt);
  a.logits_to_keep = 0;
  Tensor logits = lm.forward(a);
  for (int64_t t = 0; t < T; ++t)
    rows.emplace_back(logits.data<float>() + t * V, logits.data<float>() + (t + 1) * V);
  int32_t next = 17;
  for (int64_t step = 0; step < 3; ++step) {
    ForwardArgs d;
    d.input_ids = Tensor::from_vector<int32_t>({1, 1}, DType::i32, {next});
    d.cache_position = T + step;
    Tensor l = lm.forward(d);
    rows.emplace_back(l.data<float>(), l.data<float>() + V);
    next = int32_t((next * 31 + 7) % V);
  }
  return rows;
}

// max |a - b| / max |b| over the worst row.
double max_row_error(const std::vector<std::vector<float>>& a,
                     const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (size_t r = 0; r < b.size(); ++r) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < b[r].size(); ++i) {
      diff = std::max(diff, double(std::fabs(a[r][i] - b[r][i])));
      scale = std::max(scale, double(std::fabs(b[r][i])));
    }
    worst = std::max(worst, diff / std::max(scale, 1e-30));
  }
  return worst;
}

// The graph the model compiles for a shape, and the targets of its custom calls.
std::vector<std::string> custom_calls(CausalLM& lm, models::StepShape s) {
  graph::Graph g = models::state_of(lm).build_graph(s);
  std::vector<std::string> out;
  for (const auto& n : g.nodes())
    if (n.op == graph::Op::kCustomCall)
      out.push_back(n.name + " " + n.attrs_as<graph::CustomCallAttrs>().kernel->target);
  return out;
}

size_t count_with(const std::vector<std::string>& calls, const std::string& part) {
  return size_t(std::count_if(calls.begin(), calls.end(), [&](const std::string& c) {
    return c.find(part) != std::string::npos;
  }));
}

LayerRepository repo(int version, const std::string& layer = "") { return {kRepo, version, layer}; }

class Kernelize : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::install_package(cache_.path(), kRepo, 1, "rev1", testing::fused_norms(1));
    testing::install_package(cache_.path(), kRepo, 2, "rev2", testing::fused_norms(2));
    opt_.kernel_options = testing::cache_options(cache_);
    testing::pin(opt_.kernel_options, kRepo, 1);
    testing::pin(opt_.kernel_options, kRepo, 2);
  }
  TempDir cache_;
  KernelizeOptions opt_;
};

// tiny-qwen3 has 2 layers: per layer input_layernorm, q_norm, k_norm, post_attention_layernorm
// (4 RMSNorm), plus model.norm: 9 RMSNorm nodes, 2 SiLUAndMul, 4 rotary, 2 attention.
TEST_F(Kernelize, FusedNormsV1MatchesBuiltInLogits) {
  CausalLM builtin = load();
  auto want = run(builtin);

  CausalLM lm = load();
  auto report =
      kernelize(lm, {{"RMSNorm", {{"cpu", repo(1)}}}, {"SiLUAndMul", {{"cpu", repo(1)}}}}, opt_);
  ASSERT_EQ(report.size(), 2u);
  for (const auto& r : report) EXPECT_NE(r.kernel.find(kRepo + "@v1"), std::string::npos);
  auto calls = custom_calls(lm, {1, 7, 15, 0});
  EXPECT_EQ(count_with(calls, ":RMSNorm#"), 9u);
  EXPECT_EQ(count_with(calls, ":SiLUAndMul#"), 2u);
  EXPECT_EQ(calls.size(), 11u);

  auto got = run(lm);
  EXPECT_LT(max_row_error(got, want), 1e-5);
  EXPECT_GT(lm.compile_stats().compiles, 0u);
}

// A bfloat16 model builds bfloat16 graphs, and the layer contract's activations are float32: each
// custom call reads its activations through a convert to float32 and is read through one back to
// bfloat16 (no-ops on the CPU, which computes in float32), while the bf16 weights go in as they
// are. The logits match the built-in ops as the float32 model's do.
TEST_F(Kernelize, Bfloat16ModelCallsKernelsThroughFloat32Converts) {
  CausalLM builtin = load(DType::bf16);
  auto want = run(builtin);
  CausalLM lm = load(DType::bf16);
  kernelize(lm, {{"RMSNorm", {{"cpu", repo(1)}}}, {"SiLUAndMul", {{"cpu", repo(1)}}}}, opt_);
  const graph::Graph g = models::state_of(lm).build_graph({1, 7, 15, 0});
  EXPECT_EQ(g.activation_dtype(), DType::bf16);
  std::vector<int> readers(g.nodes().size(), 0);
  for (const auto& n : g.nodes())
    for (int in : n.inputs) ++readers[size_t(in)];
  size_t calls = 0;
  for (size_t id = 0; id < g.nodes().size(); ++id) {
    const graph::Node& n = g.node(int(id));
    if (n.op != graph::Op::kCustomCall) continue;
    ++calls;
    EXPECT_EQ(n.type.dtype, DType::f32) << n.name;
    const graph::Node& x = g.node(n.inputs[0]);
    EXPECT_EQ(x.op, graph::Op::kConvert) << n.name;
    EXPECT_EQ(x.type.dtype, DType::f32) << n.name;
    if (n.name.ends_with("norm")) {  // the weight goes in as stored
      EXPECT_EQ(g.node(n.inputs[1]).type.dtype, DType::bf16) << n.name;
    }
    EXPECT_EQ(readers[id], 1) << n.name;
  }
  EXPECT_EQ(calls, 11u);
  for (size_t id = 0; id < g.nodes().size(); ++id) {
    const graph::Node& n = g.node(int(id));
    if (n.op == graph::Op::kConvert && n.type.dtype == DType::bf16) {
      EXPECT_EQ(g.node(n.inputs[0]).op, graph::Op::kCustomCall) << n.name;
    }
  }
  EXPECT_LT(max_row_error(run(lm), want), 1e-5);

  // The caches go in as stored too: v2's attention takes float32 caches only, so a bf16 model's
  // decode keeps the built-in attention, or fails to build when fallback is off.
  CausalLM with_attention = load(DType::bf16);
  kernelize(with_attention, {{"Attention", {{"cpu", repo(2)}}}}, opt_);
  EXPECT_TRUE(custom_calls(with_attention, {1, 1, 15, 1}).empty());
  EXPECT_EQ(max_row_error(run(with_attention), want), 0.0);
  opt_.use_fallback = false;
  CausalLM strict = load(DType::bf16);
  kernelize(strict, {{"Attention", {{"cpu", repo(2)}}}}, opt_);
  try {
    custom_calls(strict, {1, 1, 15, 1});
    ADD_FAILURE() << "no error";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("takes input 1 as f32, not bf16"), std::string::npos)
        << e.what();
  }
}

// Version 2 also replaces rotary embeddings and (decode only) attention; v1 and v2 kernels are
// loaded side by side in one model.
TEST_F(Kernelize, TwoVersionsInOneModelMatchBuiltInLogits) {
  CausalLM builtin = load();
  auto want = run(builtin);
  CausalLM lm = load();
  kernelize(lm,
            {{"RMSNorm", {{"cpu", repo(1)}}},
             {"SiLUAndMul", {{"cpu", repo(2)}}},
             {"RotaryEmbedding", {{"cpu", repo(2)}}},
             {"Attention", {{"cpu", repo(2)}}}},
            opt_);
  auto prefill = custom_calls(lm, {1, 7, 15, 0});
  EXPECT_EQ(count_with(prefill, kRepo + "@v1/rev1/"), 9u);
  EXPECT_EQ(count_with(prefill, ":RotaryEmbedding#"), 4u);
  EXPECT_EQ(count_with(prefill, ":Attention#"), 0u);  // decode-only kernel: built-in in prefill
  auto decode = custom_calls(lm, {1, 1, 15, 1});
  EXPECT_EQ(count_with(decode, ":Attention#"), 2u);
  EXPECT_EQ(count_with(decode, kRepo + "@v2/rev2/"), 8u);

  auto got = run(lm);
  EXPECT_LT(max_row_error(got, want), 1e-5);

  // Greedy generation agrees token for token.
  auto a = builtin.generate({kPrompt}, {.max_new_tokens = 6});
  auto b = lm.generate({kPrompt}, {.max_new_tokens = 6});
  EXPECT_EQ(a, b);
}

// A kernel that computes something else changes the logits: the custom call is what runs.
TEST_F(Kernelize, TheHubKernelIsWhatRuns) {
  TempDir pkg;
  testing::make_fixture_package(pkg.path(), "scaled");
  opt_.kernel_options.local_overrides["test/fixture"] = pkg.str();
  testing::pin(opt_.kernel_options, "test/fixture", 1);
  CausalLM builtin = load();
  auto want = run(builtin);
  CausalLM lm = load();
  kernelize(lm, {{"RMSNorm", {{"cpu", {"test/fixture", 1, ""}}}}}, opt_);
  EXPECT_GT(max_row_error(run(lm), want), 1e-2);
  // Kernelizing again with an empty mapping restores the built-in ops.
  kernelize(lm, {}, opt_);
  EXPECT_TRUE(custom_calls(lm, {1, 7, 15, 0}).empty());
  EXPECT_LT(max_row_error(run(lm), want), 1e-6);
}

// The fixture RMSNorm takes f32 weights only: a bfloat16 model falls back to the built-in op,
// or fails when fallback is off.
TEST_F(Kernelize, UnsupportedDtypeFallsBackOrFails) {
  TempDir pkg;
  testing::make_fixture_package(pkg.path(), "good");
  opt_.kernel_options.local_overrides["test/fixture"] = pkg.str();
  testing::pin(opt_.kernel_options, "test/fixture", 1);

  CausalLM builtin = load(DType::bf16);
  auto want = run(builtin);
  CausalLM lm = load(DType::bf16);
  kernelize(lm, {{"RMSNorm", {{"cpu", {"test/fixture", 1, ""}}}}}, opt_);
  EXPECT_TRUE(custom_calls(lm, {1, 7, 15, 0}).empty());
  EXPECT_EQ(max_row_error(run(lm), want), 0.0);

  // The f32 model does use it.
  CausalLM f32 = load();
  kernelize(f32, {{"RMSNorm", {{"cpu", {"test/fixture", 1, ""}}}}}, opt_);
  EXPECT_EQ(custom_calls(f32, {1, 7, 15, 0}).size(), 9u);

  opt_.use_fallback = false;
  CausalLM strict = load(DType::bf16);
  kernelize(strict, {{"RMSNorm", {{"cpu", {"test/fixture", 1, ""}}}}}, opt_);
  strict.reset_cache(1, 8);
  ForwardArgs a;
  a.input_ids = Tensor::from_vector<int32_t>({1, 2}, DType::i32, {1, 2});
  try {
    strict.forward(a);
    ADD_FAILURE() << "no error";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("takes input 1 as f32, not bf16"), std::string::npos)
        << e.what();
  }
}

TEST_F(Kernelize, UnsupportedModeOrDeviceWithFallbackOff) {
  opt_.use_fallback = false;
  CausalLM lm = load();
  kernelize(lm, {{"Attention", {{"cpu", repo(2)}}}}, opt_);
  EXPECT_EQ(custom_calls(lm, {1, 1, 15, 1}).size(), 2u);
  try {
    custom_calls(lm, {1, 7, 15, 0});
    ADD_FAILURE() << "no error";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("does not support prefill (it supports decode)"),
              std::string::npos)
        << e.what();
  }
  // A layer mapped for another device only.
  EXPECT_THROW(kernelize(lm, {{"RMSNorm", {{"cuda", repo(1)}}}}, opt_), UnsupportedError);
  opt_.use_fallback = true;
  auto report = kernelize(lm, {{"RMSNorm", {{"cuda", repo(1)}}}}, opt_);
  ASSERT_EQ(report.size(), 1u);
  EXPECT_TRUE(report[0].kernel.empty());
  EXPECT_NE(report[0].note.find("no kernel is mapped for device cpu"), std::string::npos);
  EXPECT_TRUE(custom_calls(lm, {1, 7, 15, 0}).empty());
}

// No variant fits this machine: built-in with the variant list in the report, or the error.
TEST_F(Kernelize, NoFittingVariantFallsBackWithReasons) {
  TempDir pkg;
  testing::make_fixture_package(pkg.path(), "good", testing::kFixtureManifest,
                                "cabi1-cpu-aarch64-linux");
  opt_.kernel_options.local_overrides["test/fixture"] = pkg.str();
  testing::pin(opt_.kernel_options, "test/fixture", 1);
  CausalLM lm = load();
  auto report = kernelize(lm, {{"RMSNorm", {{"cpu", {"test/fixture", 1, ""}}}}}, opt_);
  ASSERT_EQ(report.size(), 1u);
  EXPECT_NE(report[0].note.find("cabi1-cpu-aarch64-linux: built for aarch64"), std::string::npos)
      << report[0].note;
  opt_.use_fallback = false;
  EXPECT_THROW(kernelize(lm, {{"RMSNorm", {{"cpu", {"test/fixture", 1, ""}}}}}, opt_),
               UnsupportedError);
}

TEST_F(Kernelize, BadMappingsAreClearErrors) {
  CausalLM lm = load();
  EXPECT_THROW(kernelize(lm, {{"LayerNorm", {{"cpu", repo(1)}}}}, opt_), InvalidArgumentError);
  // A layer the package does not have.
  try {
    kernelize(lm, {{"RotaryEmbedding", {{"cpu", repo(1)}}}}, opt_);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("it has: RMSNorm, SiLUAndMul"), std::string::npos);
  }
  // A package layer whose schema does not fit the model layer it is mapped to.
  try {
    kernelize(lm, {{"RMSNorm", {{"cpu", repo(1, "SiLUAndMul")}}}}, opt_);
    ADD_FAILURE() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot replace RMSNorm"), std::string::npos);
  }
  // Nothing was installed by the failed calls.
  EXPECT_TRUE(custom_calls(lm, {1, 7, 15, 0}).empty());
}

TEST_F(Kernelize, FailingKernelIsAnErrorNotACrash) {
  TempDir pkg;
  testing::make_fixture_package(pkg.path(), "failing");
  opt_.kernel_options.local_overrides["test/fixture"] = pkg.str();
  testing::pin(opt_.kernel_options, "test/fixture", 1);
  CausalLM lm = load();
  kernelize(lm, {{"RMSNorm", {{"cpu", {"test/fixture", 1, ""}}}}}, opt_);
  lm.reset_cache(1, 8);
  ForwardArgs a;
  a.input_ids = Tensor::from_vector<int32_t>({1, 2}, DType::i32, {1, 2});
  try {
    lm.forward(a);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fixture kernel refuses on purpose (2 inputs)"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Kernelize, UseHubKernelsZeroTurnsItOff) {
  ::setenv("USE_HUB_KERNELS", "0", 1);
  CausalLM lm = load();
  auto report = kernelize(lm, {{"RMSNorm", {{"cpu", repo(1)}}}}, opt_);
  ::unsetenv("USE_HUB_KERNELS");
  ASSERT_EQ(report.size(), 1u);
  EXPECT_NE(report[0].note.find("USE_HUB_KERNELS=0"), std::string::npos);
  EXPECT_TRUE(custom_calls(lm, {1, 7, 15, 0}).empty());
}

// Graphs with different kernels hash differently, so the compile cache never mixes them.
TEST_F(Kernelize, CustomCallIdentityIsPartOfTheGraphHash) {
  CausalLM lm = load();
  auto hash = [&](CausalLM& m) { return models::state_of(m).build_graph({1, 7, 15, 0}).hash(); };
  uint64_t builtin = hash(lm);
  kernelize(lm, {{"RMSNorm", {{"cpu", repo(1)}}}}, opt_);
  uint64_t v1 = hash(lm);
  kernelize(lm, {{"RMSNorm", {{"cpu", repo(2)}}}}, opt_);
  uint64_t v2 = hash(lm);
  EXPECT_NE(builtin, v1);
  EXPECT_NE(v1, v2);
  kernelize(lm, {{"RMSNorm", {{"cpu", repo(1)}}}}, opt_);
  EXPECT_EQ(hash(lm), v1);
}

}  // namespace
}  // namespace tformers
