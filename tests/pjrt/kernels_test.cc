// Hub kernels and a model on XLA's CPU plugin: a CPU build of a kernel package is never called
// from an XLA graph. A layer mapped for "cpu" only, or mapped for "xla-cpu" to a package with no
// build for it, keeps the layer's own lowering and the report says why; with the fallback off it
// is an error. The logits are the built-in graph's exactly.
#include <gtest/gtest.h>

#include "../kernels_hub/hub_test_util.h"
#include "backends/pjrt/plugin_discovery.h"
#include "common/missing_dependency.h"
#include "models/causal_lm_impl.h"
#include "tformers/error.h"
#include "tformers/kernels.h"
#include "tformers/model.h"

namespace tformers {
namespace {

const std::string kRepo = "tformers-community/fused-norms";

CausalLM load() {
  return AutoModelForCausalLM::from_pretrained(
      std::string(TFORMERS_TEST_DATA) + "/models/tiny-qwen3",
      {.dtype = DType::f32, .device_map = "xla-cpu"});
}

std::vector<float> prefill(CausalLM& lm) {
  const std::vector<int32_t> prompt = {5, 77, 301, 12, 9, 440, 3};
  lm.reset_cache(1, 16);
  ForwardArgs a;
  a.input_ids = Tensor::from_vector<int32_t>({1, int64_t(prompt.size())}, DType::i32, prompt);
  a.logits_to_keep = 0;
  Tensor logits = lm.forward(a);
  return std::vector<float>(logits.data<float>(), logits.data<float>() + logits.numel());
}

size_t custom_calls(CausalLM& lm) {
  graph::Graph g = models::state_of(lm).build_graph({1, 7, 16, 0});
  size_t n = 0;
  for (const auto& node : g.nodes()) n += node.op == graph::Op::kCustomCall;
  return n;
}

class XlaCpuKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    const backends::pjrt::PluginProbe probe = backends::pjrt::probe_plugin("xla-cpu");
    if (probe.path.empty())
      TF_SKIP_MISSING_DEPENDENCY("XLA's CPU PJRT plugin is not installed (" + probe.package + ")");
    testing::install_package(cache_.path(), kRepo, 1, "rev1", testing::fused_norms(1));
    opt_.kernel_options = testing::cache_options(cache_);
    testing::pin(opt_.kernel_options, kRepo, 1);
  }
  testing::TempDir cache_;
  KernelizeOptions opt_;
};

TEST_F(XlaCpuKernels, ALayerMappedForTheCpuOnlyKeepsItsLowering) {
  CausalLM builtin = load();
  const std::vector<float> want = prefill(builtin);
  CausalLM lm = load();
  const auto report = kernelize(lm, {{"RMSNorm", {{"cpu", {kRepo, 1, ""}}}}}, opt_);
  ASSERT_EQ(report.size(), 1u);
  EXPECT_TRUE(report[0].kernel.empty());
  EXPECT_NE(report[0].note.find("no kernel is mapped for device xla-cpu (mapped: cpu)"),
            std::string::npos)
      << report[0].note;
  EXPECT_EQ(custom_calls(lm), 0u);
  EXPECT_EQ(prefill(lm), want);
}

TEST_F(XlaCpuKernels, APackageWithNoBuildForTheDeviceIsSkippedWithTheReason) {
  CausalLM builtin = load();
  const std::vector<float> want = prefill(builtin);
  CausalLM lm = load();
  const KernelMapping mapping = {
      {"RMSNorm", {{"cpu", {kRepo, 1, ""}}, {"xla-cpu", {kRepo, 1, ""}}}}};
  const auto report = kernelize(lm, mapping, opt_);
  ASSERT_EQ(report.size(), 1u);
  EXPECT_TRUE(report[0].kernel.empty());
  EXPECT_NE(report[0].note.find("has no variant for this"), std::string::npos) << report[0].note;
  EXPECT_NE(report[0].note.find("backend 'cpu' is not available here (available: xla-cpu)"),
            std::string::npos)
      << report[0].note;
  EXPECT_NE(report[0].note.find("=> built-in op"), std::string::npos) << report[0].note;
  EXPECT_EQ(custom_calls(lm), 0u);
  EXPECT_EQ(prefill(lm), want);

  opt_.use_fallback = false;
  CausalLM strict = load();
  EXPECT_THROW(kernelize(strict, mapping, opt_), UnsupportedError);
}

}  // namespace
}  // namespace tformers
