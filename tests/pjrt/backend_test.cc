// The PJRT backend (backends/pjrt/pjrt_backend.h) on XLA's CPU plugin: buffers and their transfer
// counters, state donated and advanced across runs, the host checks before a run, weights
// prepared for the quantized linears (against a host computation from their operands), and the
// errors of graphs and bindings it cannot run.
#include <glob.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "backends/pjrt/pjrt_api.h"
#include "backends/pjrt/pjrt_backend.h"
#include "backends/pjrt/plugin_discovery.h"
#include "backends/registry.h"
#include "common/missing_dependency.h"
#include "common/random_floats.h"
#include "graph/builder.h"
#include "test_device.h"
#include "tformers/error.h"

namespace tformers::backends {
namespace {

using tformers::testing::random_floats;

using graph::GraphBuilder;
using graph::TensorType;

class PjrtBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string missing = tformers::testing::missing_pjrt_plugin();
    if (!missing.empty()) TF_SKIP_MISSING_DEPENDENCY(missing);
    backend_ = &backend_for(tformers::testing::pjrt_test_device(), false);
  }
  Backend& backend() { return *backend_; }
  Backend* backend_ = nullptr;
};

template <class T>
std::vector<T> values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

// The roofline of `tformers bench --device`. On GPUs and TPUs, a sum over a buffer filled in
// device memory, timed: run here on XLA's CPU plugin directly, since for it the backend reports
// the host's bandwidth instead. A module that does not compile, or a sum that is not positive,
// throws.
TEST_F(PjrtBackendTest, ReadBandwidthIsMeasuredInDeviceMemory) {
  const pjrt::Client client(
      pjrt::Plugin::load(pjrt::probe_plugin(tformers::testing::pjrt_test_device()).path));
  const double device_gbs = device_read_bandwidth_gbs(client, size_t(64) << 20);
  EXPECT_GT(device_gbs, 0.1);
  EXPECT_LT(device_gbs, 100000.0);
  EXPECT_THROW(device_read_bandwidth_gbs(client, 2), InvalidArgumentError);
  const double gbs = backend().read_bandwidth_gbs(size_t(64) << 20);
  EXPECT_GT(gbs, 0.1);
  EXPECT_LT(gbs, 100000.0);
}

TEST_F(PjrtBackendTest, BuffersRoundTripAndEveryByteIsCounted) {
  EXPECT_EQ(backend().name(), tformers::testing::pjrt_test_device());
  const Tensor f = Tensor::from_vector<float>({2, 3}, DType::f32, {1.5f, -2, 3, 0, 1e30f, -1e-30f});
  const Tensor i = Tensor::from_vector<int32_t>({4}, DType::i32, {7, -1, 2147483647, 0});
  const Tensor h = Tensor::from_vector<uint16_t>({3}, DType::bf16, {0x3f80, 0xc000, 0x7f80});
  const TransferStats before = backend().transfer_stats();
  std::shared_ptr<Buffer> bf = backend().upload(f), bi = backend().upload(i),
                          bh = backend().upload(h);
  EXPECT_EQ(bf->type(), (TensorType{DType::f32, {2, 3}}));
  EXPECT_EQ(bf->host_data(), nullptr);  // device memory
  EXPECT_EQ(values<float>(backend().download(*bf)), values<float>(f));
  EXPECT_EQ(values<int32_t>(backend().download(*bi)), values<int32_t>(i));
  EXPECT_EQ(values<uint16_t>(backend().download(*bh)), values<uint16_t>(h));
  std::shared_ptr<Buffer> z = backend().allocate({DType::bf16, {2, 5}});
  EXPECT_EQ(values<uint16_t>(backend().download(*z)), std::vector<uint16_t>(10, 0));
  const TransferStats after = backend().transfer_stats();
  const uint64_t bytes = f.nbytes() + i.nbytes() + h.nbytes();
  // allocate() uploads its zeros: 20 bytes, once.
  EXPECT_EQ(after.host_to_device_bytes - before.host_to_device_bytes, bytes + 20);
  EXPECT_EQ(after.host_to_device_copies - before.host_to_device_copies, 4u);
  EXPECT_EQ(after.device_to_host_bytes - before.device_to_host_bytes, bytes + 20);
  EXPECT_EQ(after.device_to_host_copies - before.device_to_host_copies, 4u);
}

// A cache (B=1, Hkv=1, S=4, D=2) written at `start` with one new token, and twice the new token
// as the output.
graph::Graph cache_graph() {
  GraphBuilder b;
  auto cache = b.state("cache", {DType::f32, {1, 1, 4, 2}});
  auto x = b.input("x", {DType::f32, {1, 1, 1, 2}});
  auto start = b.input("start", {DType::i32, {}});
  b.cache_write(cache, x, start);
  b.output(b.add(x, x));
  return b.finish();
}

TEST_F(PjrtBackendTest, StateIsAdvancedInPlaceAndNeverCrosses) {
  std::unique_ptr<Executable> exe = backend().compile(cache_graph());
  std::shared_ptr<Buffer> cache = backend().allocate({DType::f32, {1, 1, 4, 2}});
  Buffer* const states[] = {cache.get()};
  Tensor out = Tensor::zeros({1, 1, 1, 2}, DType::f32);
  Tensor* const outputs[] = {&out};
  auto step = [&](float a, float b, int32_t at) {
    const Tensor x = Tensor::from_vector<float>({1, 1, 1, 2}, DType::f32, {a, b});
    const Tensor start = Tensor::from_vector<int32_t>({}, DType::i32, {at});
    const Tensor* const inputs[] = {&x, &start};
    exe->run({}, states, inputs, outputs);
  };
  const TransferStats before = backend().transfer_stats();
  step(1, 2, 0);
  EXPECT_EQ(values<float>(out), (std::vector<float>{2, 4}));
  step(3, 4, 2);
  EXPECT_EQ(values<float>(out), (std::vector<float>{6, 8}));
  const TransferStats after = backend().transfer_stats();
  // Per run: x (8 bytes) and start (4) up, the output (8) down; the cache stays on the device.
  EXPECT_EQ(after.host_to_device_bytes - before.host_to_device_bytes, 2u * 12);
  EXPECT_EQ(after.device_to_host_bytes - before.device_to_host_bytes, 2u * 8);
  // The same Buffer object holds the cache after both writes.
  EXPECT_EQ(values<float>(backend().download(*cache)),
            (std::vector<float>{1, 2, 0, 0, 3, 4, 0, 0}));
  // A start past the cache is refused before the plugin runs, and the cache keeps its contents.
  EXPECT_THROW(step(5, 6, 4), InvalidArgumentError);
  EXPECT_EQ(values<float>(backend().download(*cache)),
            (std::vector<float>{1, 2, 0, 0, 3, 4, 0, 0}));
}

TEST_F(PjrtBackendTest, BuffersOfAnotherBackendAreRefused) {
  std::unique_ptr<Executable> exe = backend().compile(cache_graph());
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::shared_ptr<Buffer> cache = cpu->allocate({DType::f32, {1, 1, 4, 2}});
  Buffer* const states[] = {cache.get()};
  const Tensor x = Tensor::zeros({1, 1, 1, 2}, DType::f32), start = Tensor::zeros({}, DType::i32);
  const Tensor* const inputs[] = {&x, &start};
  Tensor out = Tensor::zeros({1, 1, 1, 2}, DType::f32);
  Tensor* const outputs[] = {&out};
  try {
    exe->run({}, states, inputs, outputs);
    FAIL() << "a CPU buffer was run on PJRT";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("state 0 is a buffer of another backend"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(backend().download(*cache), InvalidArgumentError);
}

// y = x W^T for x (rows, K) on `b`, with `prepared` the weight's operands.
std::vector<float> run_linear(Backend& b, const PreparedWeight& w, const std::vector<float>& x,
                              int64_t rows, int64_t K, int64_t N) {
  GraphBuilder g;
  auto in = g.input("x", {DType::f32, {rows, K}});
  auto weight = g.parameter("w", w.weight->type());
  graph::Graph graph = [&] {
    if (!w.quant)
      g.output(g.linear(in, weight));
    else
      g.output(g.linear_quant(in, weight, g.parameter("s", w.scale->type()),
                              w.zero ? g.parameter("z", w.zero->type()) : -1, -1, *w.quant));
    return g.finish();
  }();
  std::unique_ptr<Executable> exe = b.compile(graph);
  std::vector<Buffer*> params = {w.weight.get()};
  if (w.scale) params.push_back(w.scale.get());
  if (w.zero) params.push_back(w.zero.get());
  const Tensor xt = Tensor::from_vector<float>({rows, K}, DType::f32, x);
  const Tensor* const inputs[] = {&xt};
  Tensor y = Tensor::zeros({rows, N}, DType::f32);
  Tensor* const outputs[] = {&y};
  exe->run(params, {}, inputs, outputs);
  return values<float>(y);
}

// The weight (N,K) that prepared operands stand for, by graph.h's formulas for kLinear and
// kLinearQuant in rows (no zero points: int8 0, int4 8), from the operands downloaded.
std::vector<double> dequantized(Backend& b, const PreparedWeight& p, int64_t N, int64_t K) {
  const Tensor w = b.download(*p.weight);
  std::vector<double> out(size_t(N * K));
  if (!p.quant) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = w.data<float>()[i];
    return out;
  }
  EXPECT_EQ(p.quant->layout, graph::QuantLayout::kRows) << "PJRT keeps quantized weights in rows";
  const Tensor s = b.download(*p.scale);
  const int64_t nb = (K + graph::kQuantBlock - 1) / graph::kQuantBlock;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      double& v = out[size_t(n * K + k)];
      const int64_t at = n * nb + k / graph::kQuantBlock;
      if (p.quant->scheme == graph::QuantScheme::kInt8) {
        EXPECT_EQ(w.dtype(), DType::i8);
        v = double(s.data<float>()[at]) * w.data<int8_t>()[n * K + k];
      } else {
        const uint8_t byte = w.data<uint8_t>()[n * ((K + 1) / 2) + k / 2];
        const int code = k % 2 ? byte >> 4 : byte & 15;
        v = double(f16_to_f32(s.data<uint16_t>()[at])) * (code - 8);
      }
    }
  return out;
}

TEST_F(PjrtBackendTest, QuantizedWeightsComputeWhatTheirOperandsSay) {
  const int64_t N = 16, K = 96, rows = 3;
  const std::vector<float> wv = random_floats(N * K, 1), x = random_floats(rows * K, 2);
  const Tensor w = Tensor::from_vector<float>({N, K}, DType::f32, wv);
  // For values within [-1, 1]: int8 rounds to steps of at most 1/127; int4 to steps of at most
  // 1/8, and the block's largest value of the sign with 7 codes clamps by up to a whole step.
  for (const auto& [q, bound] :
       {std::pair<std::string, double>{"", 0}, {"int8", 0.5 / 127}, {"int4", 1.0 / 8}}) {
    const PreparedWeight p = backend().prepare_linear(w, q);
    const std::vector<double> wq = dequantized(backend(), p, N, K);
    for (size_t i = 0; i < wq.size(); ++i)
      ASSERT_LE(std::fabs(wq[i] - wv[i]), bound + 1e-6) << "'" << q << "' weight " << i;
    const std::vector<float> got = run_linear(backend(), p, x, rows, K, N);
    size_t bad = 0, first = 0;
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double want = 0;
        for (int64_t k = 0; k < K; ++k)
          want += double(x[size_t(m * K + k)]) * wq[size_t(n * K + k)];
        const size_t i = size_t(m * N + n);
        if (!(std::fabs(got[i] - want) <= 1e-5 * (1 + std::fabs(want))) && bad++ == 0) first = i;
      }
    EXPECT_EQ(bad, 0u) << "'" << q << "': " << bad << " of " << got.size()
                       << " values differ from the host's, the first at " << first;
  }
  EXPECT_THROW(backend().prepare_linear(w, "int3"), UnsupportedError);
}

TEST_F(PjrtBackendTest, GraphsWithOpsItCannotLowerAreRefusedAtCompile) {
  const auto kernel =
      std::make_shared<graph::CustomCall>(graph::CustomCall{"org/kernel@1:rms", "cpu", nullptr});
  GraphBuilder g;
  auto x = g.input("x", {DType::f32, {2, 4}});
  auto y = g.custom_call(kernel, {x}, g.type(x), {1e-6f}, "layers.0.norm");
  g.output(y);
  graph::Graph graph = g.finish();
  EXPECT_FALSE(backend().supports(graph.node(y)));
  try {
    backend().compile(graph);
    FAIL() << "a CPU kernel compiled";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.norm"), std::string::npos) << e.what();
  }
}

// On a machine without TPUs or GPUs (no device files), "auto" is the CPU, and asking for either
// accelerator is a DeviceError that names the device, whether or not its plugin is installed.
TEST(PjrtRegistry, AcceleratorsWithoutTheirDevicesAreClearErrors) {
  for (const char* files : {"/dev/accel*", "/dev/nvidia[0-9]*", "/dev/vfio/0"}) {
    glob_t g{};
    const bool found = ::glob(files, 0, nullptr, &g) == 0;
    globfree(&g);
    if (found) GTEST_SKIP() << "this machine has accelerator device files (" << files << ")";
  }
  EXPECT_EQ(backend_for("auto", false).name(), "cpu");
  for (const std::string device : {"tpu", "cuda"}) {
    try {
      backend_for(device, false);
      FAIL() << device << " gave a backend";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("device_map=\"" + device + "\""), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("looked in"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tformers::backends
