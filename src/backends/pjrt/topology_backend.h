// A backend that compiles for a device topology and runs nothing: libtpu compiling a model's
// steps for a TPU slice on a host that has no TPU (`tformers compile`), to learn before renting
// one whether each step compiles and how much device memory it needs. Its buffers are types
// without storage, so a model loads without reading its weights (load it with load_mode
// "mmap"), and running a step is an UnsupportedError that says where to run it instead.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/pjrt/lower.h"
#include "backends/pjrt/pjrt_api.h"

namespace tformers::backends {

// One graph the backend compiled.
struct TopologyCompile {
  uint64_t graph_hash = 0;
  // The shape of the step: its graph inputs' types ("ids int32[1, 32], ...").
  std::string inputs;
  pjrt::CompiledProgram program;
};

class TopologyBackend : public Backend {
 public:
  // Creates the topology through `plugin` (libtpu); what Topology's constructor throws for a
  // name the plugin does not know.
  TopologyBackend(const pjrt::Plugin& plugin, const std::string& topology);

  std::string name() const override { return "tpu-topology:" + topology_.name(); }
  Device device() const override { return Device{topology_.platform_name(), 0}; }
  bool supports(const graph::Node& node) const override;
  std::unique_ptr<Executable> compile(const graph::Graph& graph) override;
  // As the PJRT backend that would run its programs.
  Capabilities capabilities() const override { return pjrt::capabilities(); }
  std::shared_ptr<Buffer> upload(const Tensor& host) override;
  // As a TPU's PJRT backend lays quantized weights out (rows), so their programs are the same.
  QuantizedLinear laid_out(const QuantizedLinear& q) const override { return to_rows(q); }
  std::shared_ptr<Buffer> allocate(const graph::TensorType& type) override;
  Tensor download(const Buffer& buffer) override;

  // Every graph compiled so far, in order.
  const std::vector<TopologyCompile>& compiled() const { return compiled_; }
  const pjrt::Topology& topology() const { return topology_; }

 private:
  pjrt::Topology topology_;
  std::vector<TopologyCompile> compiled_;
};

}  // namespace tformers::backends
