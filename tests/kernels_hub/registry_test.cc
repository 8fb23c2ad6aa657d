// Custom calls name their kernel and the backend resolves it: loading a package registers its
// kernels, a compiled executable keeps the library it resolved, and a name that no loaded
// package provides fails at compile, naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "backends/kernel_registry.h"
#include "graph/builder.h"
#include "hub_test_util.h"
#include "kernels_hub/package.h"
#include "tformers/error.h"
#include "tformers/kernels.h"

namespace tformers {
namespace {

const std::string kRepo = "tformers-community/fused-norms";
constexpr int64_t M = 3, D = 19;
constexpr float kEps = 1e-6f;

// x (M,D) and w (D) through a custom call to `call`, as models::layers emits RMSNorm.
graph::Graph rms_norm_graph(std::shared_ptr<const graph::CustomCall> call) {
  graph::GraphBuilder b;
  const graph::Value x = b.input("x", {DType::f32, {M, D}});
  const graph::Value w = b.input("w", {DType::f32, {D}});
  b.output(b.custom_call(std::move(call), {x, w}, {DType::f32, {M, D}}, {kEps}, "norm"));
  return b.finish();
}

std::shared_ptr<graph::CustomCall> named(const std::string& target) {
  auto call = std::make_shared<graph::CustomCall>();
  call->target = target;
  call->backend = "cpu";
  return call;
}

class Registry : public ::testing::Test {
 protected:
  void SetUp() override {
    // A revision of its own gives targets that no other test's loads share.
    testing::install_package(cache_.path(), kRepo, 1, "registry-test", testing::fused_norms(1));
    opt_ = testing::cache_options(cache_);
    testing::pin(opt_, kRepo, 1);
  }
  testing::TempDir cache_;
  KernelOptions opt_;
};

TEST_F(Registry, LoadingRegistersEveryKernelWhileTheLibraryIsLoaded) {
  std::string target;
  {
    Kernel k = get_kernel(kRepo, 1, opt_);
    for (const std::string& layer : k.layers()) {
      backends::KernelEntry e =
          backends::find_kernel("cpu", kernels_hub::KernelAccess::impl(k)->target(layer));
      EXPECT_EQ(e.fn, reinterpret_cast<const void*>(
                          kernels_hub::KernelAccess::impl(k)->entries.at(layer).fn))
          << layer;
      EXPECT_EQ(e.owner, kernels_hub::KernelAccess::impl(k)) << layer;
    }
    target = kernels_hub::KernelAccess::impl(k)->target("RMSNorm");
    EXPECT_EQ(backends::find_kernel("tpu", target).fn, nullptr);  // registered for its backend
  }
  EXPECT_EQ(backends::find_kernel("cpu", target).fn, nullptr);  // the library is gone
}

// The graph holds only the name; the executable keeps the library it resolved loaded, and runs
// it after every other holder has let go.
TEST_F(Registry, ExecutableResolvesTheNameAndKeepsTheLibrary) {
  std::optional<Kernel> k = get_kernel(kRepo, 1, opt_);
  auto backend = backends::make_cpu_backend();
  auto exe = backend->compile(
      rms_norm_graph(named(kernels_hub::KernelAccess::impl(*k)->target("RMSNorm"))));
  const std::weak_ptr<Kernel::Impl> library = kernels_hub::KernelAccess::impl(*k);
  k.reset();
  EXPECT_FALSE(library.expired());

  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> xs(M * D), ws(D), want(M * D);
  for (auto& v : xs) v = nd(rng);
  for (auto& v : ws) v = nd(rng);
  cpu::ref::rms_norm(xs.data(), ws.data(), DType::f32, want.data(), M, D, kEps);
  Tensor x = Tensor::from_vector<float>({M, D}, DType::f32, xs);
  Tensor w = Tensor::from_vector<float>({D}, DType::f32, ws);
  Tensor y = Tensor::zeros({M, D}, DType::f32);
  const Tensor* inputs[] = {&x, &w};
  Tensor* outputs[] = {&y};
  exe->run({}, {}, inputs, outputs);
  for (int64_t i = 0; i < M * D; ++i)
    EXPECT_NEAR(y.data<float>()[i], want[size_t(i)], 1e-5 * (std::fabs(want[size_t(i)]) + 1)) << i;
  exe.reset();
  EXPECT_TRUE(library.expired());
}

TEST(KernelRegistry, CompilingAnUnknownNameSaysWhichAndWhere) {
  const std::string target = "nobody/absent@v1/rev/cabi1-cpu-x86_64-linux:RMSNorm#0123456789abcdef";
  auto backend = backends::make_cpu_backend();
  try {
    backend->compile(rms_norm_graph(named(target)));
    FAIL() << "compiled a call to a kernel that is not loaded";
  } catch (const NotFoundError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("custom call norm names hub kernel " + target), std::string::npos) << m;
    EXPECT_NE(m.find("load its package"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace tformers
