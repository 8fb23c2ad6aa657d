#include "backends/pjrt/pjrt_backend.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

#include "backends/cpu/cpu_backend.h"
#include "backends/pjrt/executable_cache.h"
#include "backends/pjrt/lower.h"
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

// The graph lowered to StableHLO, compiled (or loaded from the compile cache).
pjrt::LoadedExecutable compile_graph(const graph::Graph& g, const pjrt::Client& client,
                                     bool* loaded) {
  const pjrt::LoweredModule m = pjrt::lower(g);
  TF_CHECK(m.num_outputs == g.outputs().size() && m.num_states == g.leaves(Op::kState).size(),
           "PJRT backend: the lowered module returns ", m.num_outputs, " outputs and ",
           m.num_states, " states for a graph of ", g.outputs().size(), " and ",
           g.leaves(Op::kState).size());
  pjrt::LoadedExecutable exe = compile_or_load(client, m.mlir, loaded);
  TF_CHECK(exe.num_outputs() == m.num_outputs + m.num_states, "PJRT backend: @main returns ",
           exe.num_outputs(), " results, expected ", m.num_outputs + m.num_states);
  return exe;
}

class PjrtExecutable : public Executable {
 public:
  PjrtExecutable(const graph::Graph& g, const pjrt::Client& client, TransferCounters* stats)
      : Executable(g),
        client_(client),
        stats_(stats),
        exe_(compile_graph(g, client, &loaded_from_disk_)) {}

  // XLA plans and owns the device memory of intermediate values; none is ours to count or free.
  uint64_t arena_bytes() const override { return 0; }
  uint64_t trim() override { return 0; }

  void execute(std::span<Buffer* const> params, std::span<Buffer* const> states,
               std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs) override {
    std::vector<pjrt::Buffer> uploaded;
    uploaded.reserve(inputs.size());
    for (const Tensor* t : inputs) {
      uploaded.push_back(
          client_.buffer_from_host(t->raw(), t->nbytes(), element_type(t->dtype()), t->shape()));
      stats_->host_to_device(t->nbytes());
    }
    std::vector<const pjrt::Buffer*> args;
    args.reserve(params.size() + states.size() + inputs.size());
    for (size_t k = 0; k < params.size(); ++k)
      args.push_back(
          &device_buffer_of(*params[k], "parameter " + std::to_string(k)).device_buffer());
    for (size_t k = 0; k < states.size(); ++k)
      args.push_back(&device_buffer_of(*states[k], "state " + std::to_string(k)).device_buffer());
    for (const pjrt::Buffer& b : uploaded) args.push_back(&b);
    const auto launched = std::chrono::steady_clock::now();
    std::vector<pjrt::Buffer> results = exe_.execute(args);
    stats_->executed(uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - launched)
                                  .count()));
    // The states first: their old buffers were donated, so the new ones must be in place even
    // if reading an output fails.
    for (size_t k = 0; k < states.size(); ++k)
      static_cast<PjrtBuffer*>(states[k])->replace(std::move(results[outputs.size() + k]));
    for (size_t k = 0; k < outputs.size(); ++k) {
      copy_to_host(results[k], *outputs[k], "output " + std::to_string(k));
      stats_->device_to_host(outputs[k]->nbytes());
    }
  }

 private:
  pjrt::Client client_;
  TransferCounters* stats_;  // the backend's counters
  pjrt::LoadedExecutable exe_;
};

class PjrtBackend : public QuantizedLayoutBackend {
 public:
  PjrtBackend(std::string name, const pjrt::Plugin& plugin,
              const std::vector<pjrt::ClientOption>& options)
      : name_(std::move(name)), client_(plugin, options) {}

  std::string name() const override { return name_; }
  Device device() const override { return Device{name_, client_.devices().front().id}; }
  bool supports(const graph::Node& node) const override { return pjrt::can_lower(node); }
  std::unique_ptr<Executable> compile(const graph::Graph& g) override {
    return std::make_unique<PjrtExecutable>(g, client_, &stats_);
  }
  // No row count makes XLA's rows independent of the batch: its CPU dot picks a blocking from
  // the whole shape, so a row alone and the same row among 2 to 32 others differed in the last
  // bits at K = 256, N = 64 (x W^T, f32, xla-cpu-pjrt 0.0.1). Padding would cost work and buy
  // nothing, so decode batches are not padded.
  int64_t batch_invariant_rows() const override { return 1; }

  std::shared_ptr<Buffer> upload(const Tensor& host) override {
    pjrt::Buffer b = client_.buffer_from_host(host.raw(), host.nbytes(), element_type(host.dtype()),
                                              host.shape());
    stats_.host_to_device(host.nbytes());
    return std::make_shared<PjrtBuffer>(graph::TensorType{host.dtype(), host.shape()},
                                        std::move(b));
  }
  // Zeros from the host: one copy per allocation (a static cache per generation shape), never
  // per step.
  std::shared_ptr<Buffer> allocate(const graph::TensorType& type) override {
    return upload(Tensor::zeros(type.shape, type.dtype));
  }
  Tensor download(const Buffer& buffer) override {
    const PjrtBuffer& b = device_buffer_of(buffer, "the buffer to download");
    Tensor out = Tensor::zeros(b.type().shape, b.type().dtype);
    copy_to_host(b.device_buffer(), out, "the downloaded buffer");
    stats_.device_to_host(out.nbytes());
    return out;
  }

 private:
  std::string name_;
  pjrt::Client client_;
};

}  // namespace

std::unique_ptr<Backend> make_pjrt_backend(const std::string& device,
                                           const std::string& plugin_path,
                                           const std::vector<pjrt::ClientOption>& options) {
  return std::make_unique<PjrtBackend>(device, pjrt::Plugin::load(plugin_path), options);
}

}  // namespace tformers::backends
