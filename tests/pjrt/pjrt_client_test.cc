// The PJRT C-API client against XLA's CPU plugin (xla-cpu-pjrt, from the `test` group of
// pyproject.toml in .venv/): hand-written StableHLO compiled and run by XLA, compared with host
// computations written here; donation; and the errors bad input must give.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backends/pjrt/pjrt_api.h"
#include "backends/pjrt/plugin_discovery.h"
#include "common/missing_dependency.h"
#include "tformers/dtype.h"
#include "tformers/error.h"

namespace tformers::backends::pjrt {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// One client for the whole suite: creating one costs the plugin's start-up.
class PjrtCpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    PluginProbe probe = probe_plugin("xla-cpu");
    if (probe.path.empty()) {
      skip_reason_ = "XLA's CPU PJRT plugin is not installed (" + probe.package + "); looked in " +
                     join(probe.looked);
      return;
    }
    client_ = new Client(Plugin::load(probe.path));
  }
  static void TearDownTestSuite() {
    delete client_;
    client_ = nullptr;
  }
  void SetUp() override {
    if (!client_) TF_SKIP_MISSING_DEPENDENCY(skip_reason_);
  }
  static Client& client() { return *client_; }

  static inline Client* client_ = nullptr;
  static inline std::string skip_reason_;
};

TEST_F(PjrtCpu, PluginReportsItsVersionsAndOneCpuDevice) {
  const Plugin& plugin = client().plugin();
  EXPECT_EQ(plugin.api_major(), 0);
  EXPECT_GE(plugin.api_minor(), capi::kOldestApiMinor);
  EXPECT_GE(plugin.xla_version(), 0);
  // Every StableHLO version the plugin reads lies between the two it reports.
  EXPECT_GE(plugin.stablehlo_minimum_version()[0], 0);
  EXPECT_LE(plugin.stablehlo_minimum_version(), plugin.stablehlo_current_version());
  EXPECT_EQ(client().platform_name(), "cpu");
  ASSERT_FALSE(client().devices().empty());
  EXPECT_FALSE(client().devices()[0].kind.empty());
  // A second load of the same file is the same plugin, not a second initialization.
  EXPECT_EQ(&Plugin::load(plugin.path()), &plugin);
}

TEST_F(PjrtCpu, ClientOptionsReachThePlugin) {
  // cpu_device_count is the CPU plugin's own option (an int64).
  Client two(client().plugin(), {{"cpu_device_count", int64_t(2)}});
  ASSERT_EQ(two.devices().size(), 2u);
  EXPECT_NE(two.devices()[0].id, two.devices()[1].id);
  EXPECT_THROW(Client(client().plugin(), {{"cpu_device_count", std::string("two")}}), Error);
}

TEST_F(PjrtCpu, BuffersRoundTripWithTypeAndDims) {
  const std::vector<int32_t> host = {1, -2, 3, 2147483647, -2147483647 - 1, 0};
  Buffer b = client().buffer_from_host(host, ElementType::kS32, {2, 3});
  EXPECT_EQ(b.element_type(), ElementType::kS32);
  EXPECT_EQ(b.dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_FALSE(b.is_deleted());
  EXPECT_EQ(b.to_host_as<int32_t>(), host);
  EXPECT_THROW(b.to_host_as<int64_t>(), InvalidArgumentError);
}

// rmsnorm(x)·g @ Wᵀ in element type T, accumulated in f32 (PJRT.md's example module, with the
// element type a parameter so the same text serves f32 and bf16).
std::string rmsnorm_matmul_module(const std::string& t) {
  std::string m = R"(
module @rmsnorm_matmul attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%x: tensor<4x64xT>, %g: tensor<64xT>, %w: tensor<128x64xT>) -> tensor<4x128xT> {
    %xf = stablehlo.convert %x : (tensor<4x64xT>) -> tensor<4x64xf32>
    %sq = stablehlo.multiply %xf, %xf : tensor<4x64xf32>
    %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %ss = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4x64xf32>, tensor<f32>) -> tensor<4xf32>
    %inv_n = stablehlo.constant dense<1.562500e-02> : tensor<4xf32>
    %ms = stablehlo.multiply %ss, %inv_n : tensor<4xf32>
    %eps = stablehlo.constant dense<9.99999997E-7> : tensor<4xf32>
    %mse = stablehlo.add %ms, %eps : tensor<4xf32>
    %r = stablehlo.rsqrt %mse : tensor<4xf32>
    %rb = stablehlo.broadcast_in_dim %r, dims = [0] : (tensor<4xf32>) -> tensor<4x64xf32>
    %xn = stablehlo.multiply %xf, %rb : tensor<4x64xf32>
    %gf = stablehlo.convert %g : (tensor<64xT>) -> tensor<64xf32>
    %gb = stablehlo.broadcast_in_dim %gf, dims = [1] : (tensor<64xf32>) -> tensor<4x64xf32>
    %y = stablehlo.multiply %xn, %gb : tensor<4x64xf32>
    %yt = stablehlo.convert %y : (tensor<4x64xf32>) -> tensor<4x64xT>
    %acc = stablehlo.dot_general %yt, %w, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : (tensor<4x64xT>, tensor<128x64xT>) -> tensor<4x128xf32>
    %out = stablehlo.convert %acc : (tensor<4x128xf32>) -> tensor<4x128xT>
    return %out : tensor<4x128xT>
  }
}
)";
  for (size_t at; (at = m.find("xT>")) != std::string::npos;) m.replace(at, 3, "x" + t + ">");
  return m;
}

struct RmsnormCase {
  std::vector<float> x, g, w;  // [4,64], [64], [128,64], already representable in the type
};

RmsnormCase random_case(bool bf16) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-1.f, 1.f), pos(0.5f, 1.5f);
  auto fill = [&](size_t n, auto& dist) {
    std::vector<float> v(n);
    for (float& f : v) f = bf16 ? bf16_to_f32(f32_to_bf16(dist(rng))) : dist(rng);
    return v;
  };
  RmsnormCase c;
  c.x = fill(4 * 64, u);
  c.g = fill(64, pos);
  c.w = fill(128 * 64, u);
  return c;
}

// The module's computation on the host, in double except where the module rounds to bf16.
std::vector<double> rmsnorm_matmul_reference(const RmsnormCase& c, bool bf16) {
  std::vector<double> out(4 * 128);
  for (int i = 0; i < 4; ++i) {
    double ss = 0;
    for (int k = 0; k < 64; ++k) ss += double(c.x[i * 64 + k]) * c.x[i * 64 + k];
    const double r = 1.0 / std::sqrt(ss / 64 + 1e-6);
    std::vector<double> y(64);
    for (int k = 0; k < 64; ++k) {
      y[k] = c.x[i * 64 + k] * r * c.g[k];
      if (bf16) y[k] = bf16_to_f32(f32_to_bf16(float(y[k])));
    }
    for (int n = 0; n < 128; ++n) {
      double acc = 0;
      for (int k = 0; k < 64; ++k) acc += y[k] * c.w[n * 64 + k];
      out[i * 128 + n] = acc;
    }
  }
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rtol) {
  ASSERT_EQ(got.size(), want.size());
  // Outputs near zero (cancellation in the dot) are held to the tolerance of the output's scale.
  double rms = 0;
  for (double w : want) rms += w * w;
  rms = std::sqrt(rms / double(want.size()));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rtol * std::max(std::abs(want[i]), rms)) << "element " << i;
}

TEST_F(PjrtCpu, RmsnormMatmulF32MatchesTheHost) {
  const RmsnormCase c = random_case(false);
  LoadedExecutable exe = client().compile(rmsnorm_matmul_module("f32"));
  ASSERT_EQ(exe.num_outputs(), 1u);
  Buffer x = client().buffer_from_host(c.x, ElementType::kF32, {4, 64});
  Buffer g = client().buffer_from_host(c.g, ElementType::kF32, {64});
  Buffer w = client().buffer_from_host(c.w, ElementType::kF32, {128, 64});
  std::vector<Buffer> out = exe.execute({&x, &g, &w});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dims(), (std::vector<int64_t>{4, 128}));
  expect_close(out[0].to_host_as<float>(), rmsnorm_matmul_reference(c, false), 1e-5);
}

TEST_F(PjrtCpu, RmsnormMatmulBf16MatchesTheHost) {
  const RmsnormCase c = random_case(true);
  auto to_bf16 = [](const std::vector<float>& v) {
    std::vector<uint16_t> out;
    for (float f : v) out.push_back(f32_to_bf16(f));
    return out;
  };
  LoadedExecutable exe = client().compile(rmsnorm_matmul_module("bf16"));
  Buffer x = client().buffer_from_host(to_bf16(c.x), ElementType::kBF16, {4, 64});
  Buffer g = client().buffer_from_host(to_bf16(c.g), ElementType::kBF16, {64});
  Buffer w = client().buffer_from_host(to_bf16(c.w), ElementType::kBF16, {128, 64});
  std::vector<Buffer> out = exe.execute({&x, &g, &w});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].element_type(), ElementType::kBF16);
  std::vector<float> got;
  for (uint16_t h : out[0].to_host_as<uint16_t>()) got.push_back(bf16_to_f32(h));
  expect_close(got, rmsnorm_matmul_reference(c, true), 2e-2);
}

// The static KV-cache write: the cache is donated, and the update lands in the output buffer.
constexpr const char* kCacheWrite = R"(
module @cache_write {
  func.func public @main(%cache: tensor<8x4xf32> {tf.aliasing_output = 0 : i32}, %new: tensor<2x4xf32>, %pos: tensor<i32>) -> tensor<8x4xf32> {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %r = stablehlo.dynamic_update_slice %cache, %new, %pos, %c0 : (tensor<8x4xf32>, tensor<2x4xf32>, tensor<i32>, tensor<i32>) -> tensor<8x4xf32>
    return %r : tensor<8x4xf32>
  }
}
)";

std::vector<float> written(std::vector<float> cache, const std::vector<float>& rows, int pos) {
  std::copy(rows.begin(), rows.end(), cache.begin() + pos * 4);
  return cache;
}

TEST_F(PjrtCpu, DonatedCacheIsDeletedAndTheOutputHoldsTheWrite) {
  LoadedExecutable exe = client().compile(kCacheWrite);
  std::vector<float> host(8 * 4);
  for (size_t i = 0; i < host.size(); ++i) host[i] = float(i);
  const std::vector<float> rows = {-1, -2, -3, -4, -5, -6, -7, -8};
  Buffer cache = client().buffer_from_host(host, ElementType::kF32, {8, 4});
  Buffer rows_b = client().buffer_from_host(rows, ElementType::kF32, {2, 4});
  Buffer pos3 = client().buffer_from_host(std::vector<int32_t>{3}, ElementType::kS32, {});

  std::vector<Buffer> step1 = exe.execute({&cache, &rows_b, &pos3});
  EXPECT_TRUE(cache.is_deleted());
  EXPECT_FALSE(rows_b.is_deleted());
  host = written(host, rows, 3);
  EXPECT_EQ(step1[0].to_host_as<float>(), host);
  // The donated handle is dead: reading or passing it again is an error, not a crash.
  EXPECT_THROW(cache.to_host(), InvalidArgumentError);
  try {
    exe.execute({&cache, &rows_b, &pos3});
    FAIL() << "a donated buffer was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("donated"), std::string::npos) << e.what();
  }

  // The next step writes into the previous step's output. Start indices clamp to
  // [0, 8 - 2]: position 7 writes rows 6 and 7.
  Buffer pos7 = client().buffer_from_host(std::vector<int32_t>{7}, ElementType::kS32, {});
  std::vector<Buffer> step2 = exe.execute({&step1[0], &rows_b, &pos7});
  EXPECT_TRUE(step1[0].is_deleted());
  EXPECT_EQ(step2[0].to_host_as<float>(), written(host, rows, 6));
}

TEST_F(PjrtCpu, MalformedModuleQuotesTheParseError) {
  try {
    client().compile(
        "module { func.func public @main() -> tensor<f32> { return %nope : tensor<f32> } }");
    FAIL() << "a malformed module compiled";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("PJRT_Client_Compile failed"), std::string::npos) << what;
    EXPECT_NE(what.find("use of undeclared SSA value"), std::string::npos)
        << "the plugin's message is missing: " << what;
  }
}

TEST_F(PjrtCpu, WrongArgumentsAreErrors) {
  LoadedExecutable exe = client().compile(kCacheWrite);
  Buffer cache = client().buffer_from_host(std::vector<float>(32), ElementType::kF32, {8, 4});
  Buffer rows = client().buffer_from_host(std::vector<float>(8), ElementType::kF32, {2, 4});
  Buffer wrong = client().buffer_from_host(std::vector<float>(8), ElementType::kF32, {4, 2});
  Buffer pos = client().buffer_from_host(std::vector<int32_t>{0}, ElementType::kS32, {});
  auto expect_error = [&](const std::vector<const Buffer*>& args, const std::string& says) {
    try {
      exe.execute(args);
      ADD_FAILURE() << "wrong arguments ran";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  expect_error({&cache, &rows}, "@main takes 3 arguments, got 2");
  EXPECT_FALSE(cache.is_deleted());
  // Same size, other dimensions: the CPU plugin itself would run it.
  expect_error({&cache, &wrong, &pos},
               "argument 1 is f32[4,2] but @main's parameter 1 is f32[2,4]");
  expect_error({&cache, &rows, &rows}, "argument 2 is f32[2,4] but @main's parameter 2 is s32[]");
  EXPECT_THROW(exe.execute({&cache, nullptr, &pos}), InvalidArgumentError);
  // Host data that does not fill the shape is caught before the plugin sees it.
  EXPECT_THROW(client().buffer_from_host(std::vector<float>(7), ElementType::kF32, {2, 4}),
               InvalidArgumentError);
  EXPECT_THROW(client().buffer_from_host(std::vector<float>(8), ElementType::kF32, {-2, -4}),
               InvalidArgumentError);
  EXPECT_THROW(client().buffer_from_host(std::vector<int32_t>(8), ElementType::kBF16, {8}),
               InvalidArgumentError);
}

TEST_F(PjrtCpu, EnvCommandListsThePluginAndItsVersions) {
  const Plugin& plugin = client().plugin();
  std::string out;
  {
    // The test's environment (VIRTUAL_ENV) is the one the command searches.
    FILE* p = ::popen((std::string(TFORMERS_CLI) + " env 2>&1").c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    ASSERT_EQ(::pclose(p), 0) << out;
  }
  const std::string want = "backend xla-cpu: " + probe_plugin("xla-cpu").path +
                           " found, PJRT C API " + std::to_string(plugin.api_major()) + "." +
                           std::to_string(plugin.api_minor()) + ", XLA " +
                           std::to_string(plugin.xla_version()) + ", StableHLO ";
  EXPECT_NE(out.find(want), std::string::npos) << out;
}

TEST(PjrtPlugin, MissingPathIsNamed) {
  const std::string path = "/nonexistent/dir/libnot_a_plugin.so";
  try {
    Plugin::load(path);
    FAIL() << "a missing plugin loaded";
  } catch (const NotFoundError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(PjrtPlugin, FileThatIsNotALibraryIsNamed) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "tformers_not_a_plugin.so").string();
  std::ofstream(path) << "not an ELF file\n";
  try {
    Plugin::load(path);
    FAIL() << "a text file loaded as a plugin";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(PjrtPlugin, EnvironmentVariableComesFirst) {
  EXPECT_EQ(plugin_env_var("xla-cpu"), "TFORMERS_PJRT_PLUGIN_XLA_CPU");
  const std::string path =
      (std::filesystem::temp_directory_path() / "tformers_env_plugin.so").string();
  std::ofstream(path) << "x";
  ::setenv("TFORMERS_PJRT_PLUGIN_XLA_CPU", path.c_str(), 1);
  PluginProbe probe = probe_plugin("xla-cpu");
  ::unsetenv("TFORMERS_PJRT_PLUGIN_XLA_CPU");
  std::filesystem::remove(path);
  EXPECT_EQ(probe.path, path);
  ASSERT_FALSE(probe.looked.empty());
  EXPECT_EQ(probe.looked[0], "$TFORMERS_PJRT_PLUGIN_XLA_CPU");
  EXPECT_NE(probe.problem.find("too few for an ELF header"), std::string::npos) << probe.problem;
  EXPECT_THROW(probe_plugin("xla-gpu"), InvalidArgumentError);
}

TEST(PjrtPlugin, EnvironmentVariableNamingNoFileIsAnError) {
  // It used to be skipped, and the plugin of .venv/ used in its place without a word.
  const std::string path = "/nonexistent/dir/xla_cpu_pjrt.so";
  ::setenv("TFORMERS_PJRT_PLUGIN_XLA_CPU", path.c_str(), 1);
  PluginProbe probe = probe_plugin("xla-cpu");
  ::unsetenv("TFORMERS_PJRT_PLUGIN_XLA_CPU");
  EXPECT_EQ(probe.path, path);
  EXPECT_NE(probe.problem.find("TFORMERS_PJRT_PLUGIN_XLA_CPU names no existing file"),
            std::string::npos)
      << probe.problem;
}

// The first `bytes` of the real plugin, as a half-finished copy leaves it, in the temporary
// folder.
std::string truncated_plugin(const std::string& real, uint64_t bytes) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("tformers_cut_plugin_" + std::to_string(bytes) + ".so"))
                               .string();
  std::vector<char> head(bytes);
  std::ifstream(real, std::ios::binary).read(head.data(), std::streamsize(bytes));
  std::ofstream(path, std::ios::binary).write(head.data(), std::streamsize(bytes));
  return path;
}

TEST(PjrtPlugin, TruncatedPluginIsAnErrorNamingTheFile) {
  // dlopen maps segments past the end of a cut file, and the first touch ended the process with
  // SIGBUS.
  const std::string real = probe_plugin("xla-cpu").path;
  if (real.empty()) GTEST_SKIP() << "XLA's CPU PJRT plugin is not installed";
  for (uint64_t bytes : {uint64_t(1) << 20, std::filesystem::file_size(real) / 2}) {
    const std::string path = truncated_plugin(real, bytes);
    try {
      Plugin::load(path);
      ADD_FAILURE() << "a plugin cut to " << bytes << " bytes loaded";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    }
    ::setenv("TFORMERS_PJRT_PLUGIN_XLA_CPU", path.c_str(), 1);
    const PluginProbe probe = probe_plugin("xla-cpu");
    ::unsetenv("TFORMERS_PJRT_PLUGIN_XLA_CPU");
    EXPECT_NE(probe.problem.find("truncated"), std::string::npos) << probe.problem;
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace tformers::backends::pjrt
