#include "backends/pjrt/topology_backend.h"

#include "backends/pjrt/lower.h"
#include "tformers/error.h"

namespace tformers::backends {

namespace {

// A tensor's type, with no storage: nothing of a weight is read, nothing is allocated.
class TypeOnlyBuffer : public Buffer {
 public:
  explicit TypeOnlyBuffer(graph::TensorType type) : type_(std::move(type)) {}
  const graph::TensorType& type() const override { return type_; }

 private:
  graph::TensorType type_;
};

class TopologyExecutable : public Executable {
 public:
  TopologyExecutable(const graph::Graph& graph, std::string backend)
      : Executable(graph), backend_(std::move(backend)) {}
  uint64_t arena_bytes() const override { return 0; }
  uint64_t trim() override { return 0; }

 protected:
  void execute(std::span<Buffer* const>, std::span<Buffer* const>, std::span<const Tensor* const>,
               std::span<Tensor* const>) override {
    throw UnsupportedError("device_map=\"" + backend_ +
                           "\" compiles for a TPU topology and runs nothing: run the model on a "
                           "TPU host with device_map=\"tpu\"");
  }

 private:
  std::string backend_;
};

std::string input_types(const graph::Graph& g) {
  std::string out;
  for (int id : g.leaves(graph::Op::kInput))
    out += (out.empty() ? "" : ", ") + g.node(id).name + " " + g.node(id).type.str();
  return out;
}

}  // namespace

TopologyBackend::TopologyBackend(const pjrt::Plugin& plugin, const std::string& topology)
    : topology_(plugin, topology) {}

bool TopologyBackend::supports(const graph::Node& node) const { return pjrt::can_lower(node); }

std::unique_ptr<Executable> TopologyBackend::compile(const graph::Graph& graph) {
  compiled_.push_back(
      {graph.hash(), input_types(graph), topology_.compile(pjrt::lower(graph).mlir)});
  return std::make_unique<TopologyExecutable>(graph, name());
}

std::shared_ptr<Buffer> TopologyBackend::upload(const Tensor& host) {
  return std::make_shared<TypeOnlyBuffer>(graph::TensorType{host.dtype(), host.shape()});
}

std::shared_ptr<Buffer> TopologyBackend::allocate(const graph::TensorType& type) {
  return std::make_shared<TypeOnlyBuffer>(type);
}

Tensor TopologyBackend::download(const Buffer&) {
  throw UnsupportedError("device_map=\"" + name() +
                         "\" compiles for a TPU topology and holds no data to download");
}

}  // namespace tformers::backends
