#include "backends/pjrt/pjrt_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <variant>

#include "backends/cpu/cpu_backend.h"
#include "backends/pjrt/executable_cache.h"
#include "backends/pjrt/lower.h"
#include "backends/pjrt/split.h"
#include "core/stream_read.h"
#include "distributed/process_group.h"
#include "tformers/error.h"

namespace tformers::backends {

namespace {

using graph::Op;

pjrt::ElementType element_type(DType t) {
  switch (t) {
    case DType::f32:
      return pjrt::ElementType::kF32;
    case DType::bf16:
      return pjrt::ElementType::kBF16;
    case DType::f16:
      return pjrt::ElementType::kF16;
    case DType::i32:
      return pjrt::ElementType::kS32;
    case DType::i64:
      return pjrt::ElementType::kS64;
    case DType::i8:
      return pjrt::ElementType::kS8;
    case DType::u8:
      return pjrt::ElementType::kU8;
  }
  TF_CHECK(false, "PJRT backend: no element type for dtype ", int(t));
}

// A tensor in device memory. A state's buffer is replaced after every run (the run consumed the
// old one by donation), while the object the model's state slot holds stays the same.
class PjrtBuffer : public Buffer {
 public:
  PjrtBuffer(graph::TensorType type, pjrt::Buffer buffer)
      : type_(std::move(type)), buffer_(std::move(buffer)) {}
  const graph::TensorType& type() const override { return type_; }
  const pjrt::Buffer& device_buffer() const { return buffer_; }
  void replace(pjrt::Buffer buffer) { buffer_ = std::move(buffer); }

 private:
  graph::TensorType type_;
  pjrt::Buffer buffer_;
};

// The host bytes of `src` into `dst`, which has its type (checked: a lowering that returned
// another type would otherwise be read past its end).
void copy_to_host(const pjrt::Buffer& src, Tensor& dst, const std::string& what) {
  const std::vector<std::byte> bytes = src.to_host();
  TF_CHECK(bytes.size() == dst.nbytes(), "PJRT backend: ", what, " came back as ", bytes.size(),
           " bytes, expected ", dst.nbytes());
  std::memcpy(dst.raw(), bytes.data(), bytes.size());
}

// `what` names the buffer for the message ("parameter 3").
const PjrtBuffer& device_buffer_of(const Buffer& b, const std::string& what) {
  const auto* p = dynamic_cast<const PjrtBuffer*>(&b);
  if (!p)
    throw InvalidArgumentError("PJRT backend: " + what +
                               " is a buffer of another backend; make it with this backend");
  return *p;
}

// `mlir` compiled by the client's plugin, or loaded from the persistent compile cache when an
// earlier process compiled it under the same build identity (`*loaded` says which). An entry the
// plugin does not take back is compiled again and replaced; a plugin that cannot serialize
// simply compiles every time.
pjrt::LoadedExecutable compile_or_load(const pjrt::Client& client, const std::string& mlir,
                                       bool* loaded) {
  *loaded = false;
  const std::string dir = pjrt::ExecutableCache::default_dir();
  if (dir.empty()) return client.compile(mlir);
  const pjrt::ExecutableCache cache(dir);
  const std::string key = client.build_identity() + mlir;
  if (std::optional<std::string> bytes = cache.load(key)) {
    try {
      pjrt::LoadedExecutable exe = client.deserialize(*bytes, mlir);
      *loaded = true;
      return exe;
    } catch (const Error& e) {
      std::fprintf(stderr, "tformers: compile cache entry %s not loaded, compiling again: %s\n",
                   cache.path_of(key).c_str(), e.what());
    }
  }
  pjrt::LoadedExecutable exe = client.compile(mlir);
  try {
    cache.store(key, exe.serialize());
  } catch (const Error& e) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      std::fprintf(stderr, "tformers: %s cannot keep compiled programs: %s\n",
                   client.plugin().path().c_str(), e.what());
  }
  return exe;
}

// A host tensor as a device buffer, counted.
pjrt::Buffer upload_counted(const pjrt::Client& client, const Tensor& t, TransferCounters& stats) {
  pjrt::Buffer b = client.buffer_from_host(t.raw(), t.nbytes(), element_type(t.dtype()), t.shape());
  stats.host_to_device(t.nbytes());
  return b;
}

// A device buffer of type `type` as a host tensor, counted.
Tensor download_counted(const pjrt::Buffer& b, const graph::TensorType& type,
                        TransferCounters& stats, const std::string& what) {
  Tensor t = Tensor::zeros(type.shape, type.dtype);
  copy_to_host(b, t, what);
  stats.device_to_host(t.nbytes());
  return t;
}

// A segment lowered to StableHLO and compiled (or loaded from the compile cache).
struct CompiledSegment {
  pjrt::Segment seg;
  std::shared_ptr<const pjrt::LoadedExecutable> exe;
};

// A graph compiled as the steps of split_at_collectives: one executable for a graph without
// collectives; for a tensor-parallel graph, its segments, with each collective run on the host
// over the process group between them. Segments that lower to the same module (the layers of a
// model, whose weights are arguments) share one executable, so a model compiles a few modules
// whatever its depth.
class PjrtExecutable : public Executable {
 public:
  PjrtExecutable(const graph::Graph& g, const pjrt::Client& client, TransferCounters* stats)
      : Executable(g), graph_(g), client_(client), stats_(stats) {
    pjrt::Split split = pjrt::split_at_collectives(g);
    dead_after_ = std::move(split.dead_after);
    std::map<std::string, std::shared_ptr<const pjrt::LoadedExecutable>> modules;
    loaded_from_disk_ = true;
    for (pjrt::Step& step : split.steps) {
      auto* seg = std::get_if<pjrt::Segment>(&step);
      if (!seg) {
        steps_.emplace_back(std::get<pjrt::HostCollective>(step));
        continue;
      }
      const pjrt::LoweredModule m = pjrt::lower(seg->graph);
      TF_CHECK(m.num_outputs == seg->produced.size() && m.num_states == seg->states.size(),
               "PJRT backend: the lowered module returns ", m.num_outputs, " outputs and ",
               m.num_states, " states for a segment of ", seg->produced.size(), " and ",
               seg->states.size());
      std::shared_ptr<const pjrt::LoadedExecutable>& exe = modules[m.mlir];
      if (!exe) {
        bool loaded = false;
        exe = std::make_shared<const pjrt::LoadedExecutable>(
            compile_or_load(client, m.mlir, &loaded));
        loaded_from_disk_ = loaded_from_disk_ && loaded;
        TF_CHECK(exe->num_outputs() == m.num_outputs + m.num_states, "PJRT backend: @main returns ",
                 exe->num_outputs(), " results, expected ", m.num_outputs + m.num_states);
      }
      carried_.insert(seg->carried.begin(), seg->carried.end());
      steps_.emplace_back(CompiledSegment{std::move(*seg), exe});
    }
    const std::vector<int> params = g.leaves(Op::kParameter);
    for (size_t k = 0; k < params.size(); ++k) param_pos_[params[k]] = k;
    returned_.insert(g.outputs().begin(), g.outputs().end());
  }

  // XLA plans and owns the device memory of intermediate values; none is ours to count or free.
  uint64_t arena_bytes() const override { return 0; }
  uint64_t trim() override { return 0; }

  void execute(std::span<Buffer* const> params, std::span<Buffer* const> states,
               std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs) override {
    std::vector<pjrt::Buffer> uploaded;
    uploaded.reserve(inputs.size());
    for (const Tensor* t : inputs) uploaded.push_back(upload_counted(client_, *t, *stats_));
    auto param = [&](size_t k) -> const pjrt::Buffer& {
      return device_buffer_of(*params[k], "parameter " + std::to_string(k)).device_buffer();
    };
    // Values that cross steps: device buffers, and the host results of collectives that the
    // graph returns.
    std::map<int, pjrt::Buffer> device;
    std::map<int, Tensor> host;
    for (size_t i = 0; i < steps_.size(); ++i) {
      if (const auto* cs = std::get_if<CompiledSegment>(&steps_[i])) {
        run_segment(*cs, param, states, uploaded, device);
      } else {
        run_collective(std::get<pjrt::HostCollective>(steps_[i]).node, param, device, host);
      }
      for (int id : dead_after_[i]) device.erase(id);
    }
    const std::vector<int>& outs = graph_.outputs();
    for (size_t k = 0; k < outputs.size(); ++k) {
      const std::string what = "output " + std::to_string(k);
      if (auto h = host.find(outs[k]); h != host.end()) {
        TF_CHECK(h->second.nbytes() == outputs[k]->nbytes(), "PJRT backend: ", what, " size");
        std::memcpy(outputs[k]->raw(), h->second.raw(), h->second.nbytes());
      } else {
        copy_to_host(device.at(outs[k]), *outputs[k], what);
        stats_->device_to_host(outputs[k]->nbytes());
      }
    }
  }

 private:
  template <class Param>
  void run_segment(const CompiledSegment& cs, const Param& param, std::span<Buffer* const> states,
                   const std::vector<pjrt::Buffer>& uploaded, std::map<int, pjrt::Buffer>& device) {
    const pjrt::Segment& seg = cs.seg;
    std::vector<const pjrt::Buffer*> args;
    args.reserve(seg.params.size() + seg.states.size() + seg.inputs.size() + seg.carried.size());
    for (size_t k : seg.params) args.push_back(&param(k));
    for (size_t k : seg.states)
      args.push_back(&device_buffer_of(*states[k], "state " + std::to_string(k)).device_buffer());
    for (size_t k : seg.inputs) args.push_back(&uploaded[k]);
    for (int id : seg.carried) args.push_back(&device.at(id));
    const auto launched = std::chrono::steady_clock::now();
    std::vector<pjrt::Buffer> results = cs.exe->execute(args);
    stats_->executed(uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - launched)
                                  .count()));
    // The states first: their old buffers were donated, so the new ones must be in place even
    // if a later step fails.
    const size_t n = seg.produced.size();
    for (size_t k = 0; k < seg.states.size(); ++k)
      static_cast<PjrtBuffer*>(states[seg.states[k]])->replace(std::move(results[n + k]));
    for (size_t k = 0; k < n; ++k) device.insert_or_assign(seg.produced[k], std::move(results[k]));
  }

  // An all-reduce or all-gather of a device value through the process group: down to the host,
  // across the ranks in float32 (as the CPU backend computes them), and up again when a later
  // segment reads it.
  template <class Param>
  void run_collective(int id, const Param& param, std::map<int, pjrt::Buffer>& device,
                      std::map<int, Tensor>& host) {
    const graph::Node& n = graph_.node(id);
    auto value = [&](size_t k) -> Tensor {
      const int j = n.inputs[k];
      const graph::Node& src = graph_.node(j);
      const pjrt::Buffer& b = src.op == Op::kParameter ? param(param_pos_.at(j)) : device.at(j);
      return download_counted(b, src.type, *stats_, graph::op_name(n.op) + std::string(" input"))
          .to(DType::f32);
    };
    const Tensor x = value(0);
    Tensor y = Tensor::zeros(n.type.shape, DType::f32);
    const float* in = static_cast<const float*>(x.raw());
    float* out = static_cast<float*>(y.raw());
    if (n.op == Op::kAllReduce) {
      const int64_t numel = shape_numel(n.type.shape), d = n.type.shape.back();
      distributed::group(n.attrs_as<graph::AllReduceAttrs>().group).all_reduce_sum(in, out, numel);
      if (n.inputs.size() > 1) {  // a rowwise layer's bias, added once after the sum
        const Tensor bias = value(1);
        const float* bv = static_cast<const float*>(bias.raw());
        for (int64_t i = 0; i < numel; ++i) out[i] += bv[i % d];
      }
    } else {
      const auto& a = n.attrs_as<graph::AllGatherAttrs>();
      const int64_t width = n.type.shape.back() / a.ranks;
      distributed::group(a.group).all_gather_last_dim(
          in, out, shape_numel(n.type.shape) / n.type.shape.back(), width, gather_scratch_);
    }
    Tensor result = y.to(n.type.dtype);
    if (carried_.count(id)) device.insert_or_assign(id, upload_counted(client_, result, *stats_));
    if (returned_.count(id)) host.insert_or_assign(id, std::move(result));
  }

  const graph::Graph graph_;
  pjrt::Client client_;
  TransferCounters* stats_;  // the backend's counters
  std::vector<std::variant<CompiledSegment, pjrt::HostCollective>> steps_;
  std::vector<std::vector<int>> dead_after_;
  std::map<int, size_t> param_pos_;  // parameter node id -> its place among the graph's params
  std::set<int> carried_;            // values some segment takes from an earlier step
  std::set<int> returned_;           // the graph's outputs
  std::vector<float> gather_scratch_;
};

class PjrtBackend : public Backend {
 public:
  PjrtBackend(std::string name, const pjrt::Plugin& plugin,
              const std::vector<pjrt::ClientOption>& options)
      : name_(std::move(name)), client_(plugin, options) {}

  std::string name() const override { return name_; }
  Device device() const override { return Device{name_, client_.devices().front().id}; }
  // Collectives run on the host between the segments of their graph (split.h).
  bool supports(const graph::Node& node) const override {
    return pjrt::can_lower(node) || pjrt::is_collective(node.op);
  }
  std::unique_ptr<Executable> compile(const graph::Graph& g) override {
    return std::make_unique<PjrtExecutable>(g, client_, &stats_);
  }
  // Cache writes without a transpose (lower.cc); attention contracts over either layout.
  Capabilities capabilities() const override { return pjrt::capabilities(); }

  std::shared_ptr<Buffer> upload(const Tensor& host) override {
    return std::make_shared<PjrtBuffer>(graph::TensorType{host.dtype(), host.shape()},
                                        upload_counted(client_, host, stats_));
  }
  // Zeros from the host: one copy per allocation (a static cache per generation shape), never
  // per step.
  std::shared_ptr<Buffer> allocate(const graph::TensorType& type) override {
    return upload(Tensor::zeros(type.shape, type.dtype));
  }
  Tensor download(const Buffer& buffer) override {
    const PjrtBuffer& b = device_buffer_of(buffer, "the buffer to download");
    return download_counted(b.device_buffer(), b.type(), stats_, "the downloaded buffer");
  }
  // Quantized weights in rows (graph::QuantLayout::kRows): codes and scales as separate tensors
  // that the lowering dequantizes with elementwise ops, where the CPU's tiles would need a
  // six-dimensional transpose in every step.
  QuantizedLinear laid_out(const QuantizedLinear& q) const override { return to_rows(q); }
  // XLA's CPU reduction reads host memory at a fraction of what the host's own streaming loop
  // gets (5.6 against 27 GB/s on one 2-core AMD EPYC, 2026-12-03), so there the roofline is the
  // host's, as on the CPU backend.
  double read_bandwidth_gbs(size_t bytes) override {
    return client_.platform_name() == "cpu" ? read_bandwidth(ThreadPool::global(), bytes)
                                            : device_read_bandwidth_gbs(client_, bytes);
  }

 private:
  std::string name_;
  pjrt::Client client_;
};

}  // namespace

double device_read_bandwidth_gbs(const pjrt::Client& client, size_t bytes) {
  const int64_t n = int64_t(bytes / sizeof(float));
  if (n < 1) throw InvalidArgumentError("device_read_bandwidth_gbs: give at least 4 bytes");
  const std::string t = "tensor<" + std::to_string(n) + "xf32>";
  const pjrt::LoadedExecutable fill =
      client.compile("module @fill {\n  func.func public @main() -> " + t +
                     " {\n    %one = stablehlo.constant dense<1.0> : tensor<f32>\n"
                     "    %b = stablehlo.broadcast_in_dim %one, dims = [] : (tensor<f32>) -> " +
                     t + "\n    return %b : " + t + "\n  }\n}\n");
  const pjrt::LoadedExecutable sum = client.compile(
      "module @sum {\n  func.func public @main(%x: " + t +
      ") -> tensor<f32> {\n    %zero = stablehlo.constant dense<0.0> : tensor<f32>\n"
      "    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = "
      "[0] : (" +
      t + ", tensor<f32>) -> tensor<f32>\n    return %s : tensor<f32>\n  }\n}\n");
  const std::vector<pjrt::Buffer> filled = fill.execute({});
  std::vector<double> seconds;
  for (int run = 0; run < 6; ++run) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<pjrt::Buffer> total = sum.execute({&filled.front()});
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    // A sum of ones that is not positive is a program that did not read its input.
    if (run == 0 && !(total.front().to_host_as<float>().front() > 0))
      throw Error("device_read_bandwidth_gbs: the sum over device memory is not positive");
    if (run > 0) seconds.push_back(took.count());
  }
  std::sort(seconds.begin(), seconds.end());
  return double(n) * sizeof(float) / seconds[seconds.size() / 2] * 1e-9;
}

std::unique_ptr<Backend> make_pjrt_backend(const std::string& device,
                                           const std::string& plugin_path,
                                           const std::vector<pjrt::ClientOption>& options) {
  return std::make_unique<PjrtBackend>(device, pjrt::Plugin::load(plugin_path), options);
}

}  // namespace tformers::backends
