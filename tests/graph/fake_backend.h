// A backend that runs nothing, for tests of what lies above the backends (the compile cache,
// Executable::run's checks): its executables count their executes and trims, and declare as
// their arena bytes the first dimension of the graph's first input (0 without one).
#pragma once

#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "backends/backend.h"

namespace tformers::testing {

// A buffer that has a type and no bytes.
class FakeBuffer : public backends::Buffer {
 public:
  explicit FakeBuffer(graph::TensorType type) : type_(std::move(type)) {}
  const graph::TensorType& type() const override { return type_; }

 private:
  graph::TensorType type_;
};

class FakeExecutable : public backends::Executable {
 public:
  FakeExecutable(const graph::Graph& g, uint64_t bytes) : Executable(g), bytes_(bytes) {}
  uint64_t arena_bytes() const override { return bytes_; }
  uint64_t trim() override {
    ++trims;
    return 0;
  }
  std::atomic<int> executes{0}, trims{0};

 private:
  void execute(std::span<backends::Buffer* const>, std::span<backends::Buffer* const>,
               std::span<const Tensor* const>, std::span<Tensor* const>) override {
    ++executes;
  }
  uint64_t bytes_;
};

class FakeBackend : public backends::Backend {
 public:
  std::string name() const override { return "fake"; }
  Device device() const override { return Device{"cpu", 0}; }
  bool supports(const graph::Node&) const override { return true; }
  backends::Capabilities capabilities() const override { return {}; }
  std::unique_ptr<backends::Executable> compile(const graph::Graph& g) override {
    ++compiles;
    const std::vector<int> inputs = g.leaves(graph::Op::kInput);
    const graph::TensorType* first = inputs.empty() ? nullptr : &g.node(inputs[0]).type;
    return std::make_unique<FakeExecutable>(
        g, first && !first->shape.empty() ? uint64_t(first->shape[0]) : 0);
  }
  std::shared_ptr<backends::Buffer> upload(const Tensor& host) override {
    return std::make_shared<FakeBuffer>(graph::TensorType{host.dtype(), host.shape()});
  }
  std::shared_ptr<backends::Buffer> allocate(const graph::TensorType& type) override {
    return std::make_shared<FakeBuffer>(type);
  }
  Tensor download(const backends::Buffer&) override { return {}; }
  int compiles = 0;
};

}  // namespace tformers::testing
