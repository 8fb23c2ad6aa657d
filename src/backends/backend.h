// The seam between graphs and the machines that run them. A Backend owns a device: it makes
// buffers (weights, state), compiles graphs into Executables and counts every byte that crosses
// between host and device. Nothing above backends/ knows which backend runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backends/quant.h"
#include "graph/graph.h"
#include "tformers/tensor.h"

namespace tformers::backends {

struct TransferStats {
  uint64_t host_to_device_bytes = 0;
  uint64_t device_to_host_bytes = 0;
  uint64_t host_to_device_copies = 0;
  uint64_t device_to_host_copies = 0;
  // PJRT devices: executions, and the nanoseconds from each launch until its outputs were
  // ready (the rest of a step is host overhead). The CPU backend does not count them.
  uint64_t executions = 0;
  uint64_t execute_ns = 0;
};

// A backend's transfer counters. Runs of its executables add to them from any thread, so they
// are atomics (relaxed: they count, they order nothing); read them as a TransferStats snapshot.
class TransferCounters {
 public:
  void host_to_device(uint64_t bytes) {
    host_to_device_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    host_to_device_copies_.fetch_add(1, std::memory_order_relaxed);
  }
  void device_to_host(uint64_t bytes) {
    device_to_host_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    device_to_host_copies_.fetch_add(1, std::memory_order_relaxed);
  }
  void executed(uint64_t ns) {
    executions_.fetch_add(1, std::memory_order_relaxed);
    execute_ns_.fetch_add(ns, std::memory_order_relaxed);
  }
  TransferStats snapshot() const {
    return {host_to_device_bytes_.load(std::memory_order_relaxed),
            device_to_host_bytes_.load(std::memory_order_relaxed),
            host_to_device_copies_.load(std::memory_order_relaxed),
            device_to_host_copies_.load(std::memory_order_relaxed),
            executions_.load(std::memory_order_relaxed),
            execute_ns_.load(std::memory_order_relaxed)};
  }
  void reset() {
    for (auto* c : {&host_to_device_bytes_, &device_to_host_bytes_, &host_to_device_copies_,
                    &device_to_host_copies_, &executions_, &execute_ns_})
      c->store(0, std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t> host_to_device_bytes_{0}, device_to_host_bytes_{0};
  std::atomic<uint64_t> host_to_device_copies_{0}, device_to_host_copies_{0};
  std::atomic<uint64_t> executions_{0}, execute_ns_{0};
};

// Device memory holding one tensor.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual const graph::TensorType& type() const = 0;
  // Where the host can read the bytes in place (CPU memory, a weight mapping), or null for device
  // memory. Benchmarks read exactly the bytes a decode step reads to measure its roofline.
  virtual const void* host_data() const { return nullptr; }
};

// A compiled graph. An executable is shared process-wide (CompileCache) by every model that
// builds the same graph, so it holds only the immutable compiled plan; the memory one run needs
// (intermediate values, scratch) is checked out per run.
//
// run() checks every binding and step input against the graph before the backend sees them, so
// each backend gets the same checks and messages: a backend implements execute() for bindings
// that have passed.
class Executable {
 public:
  virtual ~Executable();
  // Runs the graph. params and states are device buffers in the order of the graph's
  // leaves(kParameter) and leaves(kState); states are updated in place. inputs are host tensors
  // in leaves(kInput) order, copied to the device; outputs are host tensors of the output types,
  // filled from the device. Input types and runtime values are validated first (token ids in
  // range, cache positions within the cache, block-table entries within the pool): a bad one is
  // an InvalidArgumentError and leaves the state untouched.
  // Thread-safe: concurrent runs of one executable each get their own scratch memory, but they
  // must not share state buffers (two runs writing one KV cache race) or output tensors;
  // parameters are only read and may be shared.
  void run(std::span<Buffer* const> params, std::span<Buffer* const> states,
           std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs);
  // Bytes of scratch memory planned for intermediate values, per concurrent run.
  virtual uint64_t arena_bytes() const = 0;
  // Frees the scratch memory of runs that have finished (a later run allocates it again);
  // returns the bytes freed. Runs in progress keep theirs.
  virtual uint64_t trim() = 0;
  // True when the backend loaded the compiled program from its persistent compile cache rather
  // than compiling it (PJRT devices, docs/accelerators.md).
  bool loaded_from_disk() const { return loaded_from_disk_; }

 protected:
  // Plans run()'s checks from the graph as the caller built it (before any legalisation).
  // UnsupportedError when a value that must be checked on the host (token ids, cache
  // positions, block tables, positions of paged ops) does not come from a graph input.
  explicit Executable(const graph::Graph& graph);
  // run() after its checks: the bindings match the graph and the step inputs are in range.
  virtual void execute(std::span<Buffer* const> params, std::span<Buffer* const> states,
                       std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs) = 0;
  bool loaded_from_disk_ = false;

 private:
  struct Checks;  // backend.cc
  std::unique_ptr<const Checks> checks_;
};

// A linear weight as a backend keeps it for multiplication: the weight and, when quantized, its
// block scales, zero points (int4 from a format that has them) and the attributes of the
// graph::Op::kLinearQuant that takes them (which scheme, and the layout the backend chose).
struct PreparedWeight {
  std::shared_ptr<Buffer> weight, scale, zero;
  std::optional<graph::LinearQuantAttrs> quant;  // absent: a float weight for Op::kLinear
};

// What a backend does, in one place: models and the serving engine ask for what they need and
// the backend says what it gives.
struct Capabilities {
  // The layout of the KV caches (static and paged) in the graphs this backend runs: the model
  // builds its graphs and allocates its caches in it (graph.h).
  graph::KvLayout kv_layout = graph::KvLayout::kHeadMajor;
  // The activation dtypes it computes in; a graph of another float dtype is computed in float32
  // and rounded at its boundary (the CPU backend's bfloat16 and float16 graphs).
  std::vector<DType> compute_dtypes;
  // The KV cache dtypes its attention reads; empty: every dtype it is given.
  std::vector<DType> cache_dtypes;
  // A paged step may pack several sequences' tokens into one row (the rows operand of the paged
  // ops, graph.h): the serving engine then fills a step's tokens without padding.
  bool packs_sequences = false;
  // A row's results are the same bits whatever else shares its step (batch size, other rows'
  // tokens): the serving engine's preemption and prefix hits then give a request exactly what it
  // gets alone.
  bool batch_invariant = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu"
  virtual Device device() const = 0;
  // Whether its rule table runs the node (graph/ops.h): a composite it has no rule for runs
  // through its decomposition when its primitives have rules.
  virtual bool supports(const graph::Node& node) const = 0;
  virtual std::unique_ptr<Executable> compile(const graph::Graph& graph) = 0;
  virtual Capabilities capabilities() const = 0;
  graph::KvLayout kv_layout() const { return capabilities().kv_layout; }
  // The dtype of the KV caches of a model whose activations are `activation`: that dtype where
  // the backend's attention reads it (Capabilities::cache_dtypes), else float32.
  DType cache_dtype(DType activation) const;
  // A device buffer with the host tensor's contents. The CPU backend uses the host bytes as
  // they are (an mmap'd weight stays mapped and is never copied).
  virtual std::shared_ptr<Buffer> upload(const Tensor& host) = 0;
  // A zero-filled device buffer (KV cache).
  virtual std::shared_ptr<Buffer> allocate(const graph::TensorType& type) = 0;
  virtual Tensor download(const Buffer& buffer) = 0;
  // A float linear weight (N,K) prepared for `quantize`: "" uploads it as given; "int8" and
  // "int4" quantize it on the host (quantize_on_host) and prepare the result as below. Weight
  // layout and quantization are the backend's business, so models only say which weights are
  // linear.
  PreparedWeight prepare_linear(const Tensor& w, const std::string& quantize);
  // A weight already quantized, in either layout: stored so in a checkpoint, imported (AWQ,
  // GPTQ) or quantized on the host, laid out as the backend computes (laid_out) and uploaded.
  PreparedWeight prepare_quantized_linear(const QuantizedLinear& q);
  // A mixture's experts w (E, N, K) prepared for Op::kLinearId ("" uploads them as given) or
  // Op::kLinearIdQuant ("int8", "int4": each expert quantized as prepare_linear would, the E
  // results stacked on a leading dim; int4 experts whose N is not a multiple of 8 become int8).
  PreparedWeight prepare_experts(const Tensor& w, const std::string& quantize);
  // E experts already quantized, q holding their (E * N, K) rows in order (gpt-oss's MXFP4 as
  // stored), laid out and stacked on a leading dim as prepare_experts does.
  PreparedWeight prepare_quantized_experts(const QuantizedLinear& q, int64_t E);
  // The streaming-read bandwidth of the device's memory in GB/s, measured now over `bytes`: the
  // roofline of a decode step, which reads every weight once (tformers bench). UnsupportedError
  // where the backend runs nothing.
  virtual double read_bandwidth_gbs(size_t bytes);

  TransferStats transfer_stats() const { return stats_.snapshot(); }
  void reset_transfer_stats() { stats_.reset(); }

 protected:
  // q in the layout the backend computes with (a copy, or q itself where it is already in it).
  // UnsupportedError where the backend has no quantized weights, or none of this shape.
  virtual QuantizedLinear laid_out(const QuantizedLinear& q) const;
  TransferCounters stats_;
};

}  // namespace tformers::backends
