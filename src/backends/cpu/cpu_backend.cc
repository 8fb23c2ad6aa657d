#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "backends/cpu/kernels.h"
#include "backends/cpu/rules.h"
#include "backends/kernel_registry.h"
#include "core/cpu_features.h"
#include "core/memory.h"
#include "core/stream_read.h"
#include "tformers/error.h"

namespace tformers::backends {

namespace {

using graph::Node;
using graph::Op;

class CpuBuffer : public Buffer {
 public:
  CpuBuffer(graph::TensorType type, Tensor tensor) : type_(std::move(type)), tensor_(tensor) {}
  const graph::TensorType& type() const override { return type_; }
  const void* host_data() const override { return tensor_.raw(); }
  void* data() { return tensor_.raw(); }
  const Tensor& tensor() const { return tensor_; }

 private:
  graph::TensorType type_;
  Tensor tensor_;
};

// Where a node's value lives at run time.
struct Slot {
  enum Kind { kParam, kState, kArena } kind = kArena;
  int64_t index = 0;  // parameter or state index, or arena byte offset
};

constexpr int64_t kAlign = 64;

// Opt-in time per op kind (TFORMERS_PROFILE=1), summed over every run of every CPU executable
// and printed to stderr at exit, so a user can see where a forward pass spends its time
// without a profiler. The lm_head linear is its own row: with a large vocabulary it is the
// single biggest matrix.
class OpProfile {
 public:
  static OpProfile* get() {
    static OpProfile* p = [] {
      const char* e = std::getenv("TFORMERS_PROFILE");
      return e && *e && std::string(e) != "0" ? new OpProfile : nullptr;
    }();
    return p;
  }
  void add(const char* kind, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    Row& r = rows_[kind];
    ++r.calls;
    r.seconds += seconds;
  }
  void add_run() {
    std::lock_guard<std::mutex> lock(mu_);
    ++runs_;
  }

 private:
  struct Row {
    uint64_t calls = 0;
    double seconds = 0;
  };
  OpProfile() {
    std::atexit([] { get()->print(); });
  }
  void print() {
    std::lock_guard<std::mutex> lock(mu_);
    double total = 0;
    for (const auto& [k, r] : rows_) total += r.seconds;
    std::vector<std::pair<std::string, Row>> sorted(rows_.begin(), rows_.end());
    std::sort(sorted.begin(), sorted.end(),
              [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    std::fprintf(stderr, "tformers profile: %llu runs, %.3f s in ops\n", (unsigned long long)runs_,
                 total);
    std::fprintf(stderr, "  %-14s %10s %12s %12s %7s\n", "op", "calls", "total ms", "us/call", "%");
    for (const auto& [k, r] : sorted)
      std::fprintf(stderr, "  %-14s %10llu %12.2f %12.2f %6.1f%%\n", k.c_str(),
                   (unsigned long long)r.calls, r.seconds * 1e3, r.seconds * 1e6 / double(r.calls),
                   total > 0 ? 100.0 * r.seconds / total : 0.0);
  }
  std::mutex mu_;
  std::map<std::string, Row> rows_;
  uint64_t runs_ = 0;
};

// The kernels compute activations in float32. A graph with another activation dtype is compiled
// as its float32 twin: inputs and computed values typed with the activation dtype become f32,
// cache writes keep their cache's dtype, and ops that only move values (reshape, take_last,
// slice, the collectives) follow their input. run() converts activation-typed inputs and outputs
// at the boundary. Results equal the f32 graph's up to the final rounding of the outputs to the
// activation dtype. The graph converts a hub kernel's activations to the float32 its layer
// contract names, and the logits to float32: those converts become float32 to float32, no-ops.
// A primitive's 16-bit float operand (a weight) gets a convert to float32 of its own.
//
// Whether the rule of node n reads operand k as float32 activations (backends/cpu/rules.cc): a
// 16-bit float there (a weight, a value converted to another dtype) is widened first. Attention
// sinks are a weight of Hq values: widened once per run rather than per query row in the kernel.
bool reads_f32(const Node& n, size_t k) {
  switch (n.op) {
    case Op::kUnary:
    case Op::kBinary:
    case Op::kReduce:
    case Op::kSoftmax:
    case Op::kTopK:
    case Op::kCumsum:
    case Op::kMatMul:
      return true;
    case Op::kSelect:
      return k > 0;
    case Op::kScatterAdd:
      return k != 1;
    case Op::kLinearId:  // x, and the experts' bias
      return k == 0 || k == 3;
    case Op::kLinearIdQuant:  // x, and the bias (after scale and any zero points, which are not
                              // floats)
      return k == 0 || k >= 4;
    case Op::kAllReduce:  // its bias
      return k == 1;
    case Op::kCausalConv1d:  // x and the weight
    case Op::kPagedCausalConv1d:
      return k < 2;
    case Op::kGatedDeltaRule:  // q, k, v, g, beta
    case Op::kPagedGatedDeltaRule:
      return k < 5;
    case Op::kAttention:
    case Op::kPagedAttention:
      return int(k) == graph::attention_operands(n).sinks;
    default:
      return false;
  }
}

graph::Graph legalise(const graph::Graph& g) {
  const DType act = g.activation_dtype();
  graph::Graph out(DType::f32, g.kv_layout());
  std::vector<int> to(g.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.node(int(i));
    Node m = n;
    for (size_t k = 0; k < m.inputs.size(); ++k) {
      int& in = m.inputs[k];
      in = to[size_t(in)];
      const graph::TensorType t = out.node(in).type;
      if (reads_f32(n, k) && t.dtype != DType::f32 && is_float(t.dtype)) {
        Node widen;
        widen.op = Op::kConvert;
        widen.inputs = {in};
        widen.type = {DType::f32, t.shape};
        widen.name = n.name + ".widen";
        in = out.add(std::move(widen));
      }
    }
    switch (n.op) {
      case Op::kParameter:
      case Op::kState:
      case Op::kCacheWrite:
      case Op::kPagedCacheWrite:
        break;
      case Op::kReshape:
      case Op::kTakeLast:
      case Op::kSlice:
      case Op::kAllReduce:
      case Op::kAllGather:
      case Op::kTakeAlong:
      case Op::kConcat:
      case Op::kTranspose:
      case Op::kBroadcast:
        m.type.dtype = out.node(m.inputs[0]).type.dtype;
        break;
      case Op::kCustomCall:  // its dtypes are the kernel's
        break;
      default:
        if (m.type.dtype == act) m.type.dtype = DType::f32;
    }
    to[i] = out.add(std::move(m));
  }
  for (int o : g.outputs()) out.mark_output(to[size_t(o)]);
  return out;
}

// What one run needs besides the plan. A run checks one out of its executable for its duration,
// so runs on several threads never share an arena.
struct RunContext {
  std::unique_ptr<char, decltype(&std::free)> arena{nullptr, &std::free};
  std::span<Buffer*const> params, states;  // bound for the run
  std::vector<float> scratch;              // OpCall::scratch, grown once
};

class CpuExecutable : public Executable {
 public:
  CpuExecutable(const graph::Graph& g, TransferCounters* stats);

  uint64_t arena_bytes() const override { return uint64_t(arena_size_); }
  uint64_t trim() override;

  void execute(std::span<Buffer* const> params, std::span<Buffer* const> states,
               std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs) override;

 private:
  void plan();
  std::unique_ptr<RunContext> checkout();
  void release(std::unique_ptr<RunContext> c);
  void run_in(RunContext& c, std::span<const Tensor* const> inputs,
              std::span<Tensor* const> outputs) const;
  void* ptr(const RunContext& c, int id) const;
  void execute_node(RunContext& c, const Node& n, int id) const;

  // The compiled plan, fixed by the constructor and only read after.
  graph::Graph graph_;       // legalised: activations are f32
  TransferCounters* stats_;  // the backend's counters
  std::vector<Slot> slots_;
  std::vector<int> param_ids_, state_ids_, input_ids_;
  int64_t arena_size_ = 0;
  // Per node, the hub kernel a custom call resolved to at compile (empty for other ops); each
  // holds its library loaded for as long as the executable lives.
  std::vector<KernelEntry> kernels_;
  std::vector<cpu_rules::Rule> rules_;  // per node, its op's rule

  std::mutex mu_;
  std::vector<std::unique_ptr<RunContext>> idle_;  // finished runs' contexts, guarded by mu_
};

CpuExecutable::CpuExecutable(const graph::Graph& g, TransferCounters* stats)
    : Executable(g), graph_(legalise(g)), stats_(stats) {
  if (g.kv_layout() != graph::KvLayout::kHeadMajor)
    throw UnsupportedError(std::string("the CPU backend's attention reads head-major KV caches, "
                                       "not ") +
                           graph::kv_layout_name(g.kv_layout()) +
                           " ones; build the graph with the CPU backend's kv_layout()");
  for (const Node& n : graph_.nodes())
    if (n.op == Op::kLinearQuant || n.op == Op::kLinearIdQuant) {
      const graph::LinearQuantAttrs& q = n.op == Op::kLinearQuant
                                             ? n.attrs_as<graph::LinearQuantAttrs>()
                                             : n.attrs_as<graph::LinearIdAttrs>().quant;
      if ((q.scheme == graph::QuantScheme::kInt4) != (q.layout == graph::QuantLayout::kTiles) ||
          (q.scheme == graph::QuantScheme::kMxfp4 && n.op != Op::kLinearIdQuant))
        throw UnsupportedError("node " + n.name +
                               ": the CPU backend multiplies int8 rows, int4 tiles and MXFP4 "
                               "experts, not this layout; prepare the weight with the CPU "
                               "backend's prepare_quantized_linear");
    }
  plan();
}

void CpuExecutable::plan() {
  const auto& nodes = graph_.nodes();
  const int n = int(nodes.size());
  slots_.resize(n);
  param_ids_ = graph_.leaves(Op::kParameter);
  state_ids_ = graph_.leaves(Op::kState);
  input_ids_ = graph_.leaves(Op::kInput);

  // Reshapes, converts to their input's dtype (float32 to float32 once legalised) and cache
  // writes alias their first input; everything else that is not a parameter or state gets its own
  // arena block.
  std::vector<int> root(n);
  for (int i = 0; i < n; ++i) {
    const Node& nd = nodes[i];
    const DType from = nd.inputs.empty() ? nd.type.dtype : graph_.node(nd.inputs[0]).type.dtype;
    if (nd.op == Op::kConvert && from != nd.type.dtype && from != DType::f32 &&
        nd.type.dtype != DType::f32)
      throw UnsupportedError(detail::str_cat(
          "CPU backend: convert of ", graph_.node(nd.inputs[0]).type.str(), " to ",
          dtype_name(nd.type.dtype), " at ", nd.name, " (it converts to and from float32)"));
    const bool in_place = nd.op == Op::kReshape ||
                          (nd.op == Op::kConvert && from == nd.type.dtype) ||
                          nd.op == Op::kCacheWrite || nd.op == Op::kPagedCacheWrite;
    root[i] = in_place ? root[nd.inputs[0]] : i;
  }
  std::vector<int> first(n, -1), last(n, -1);
  for (int i = 0; i < n; ++i) {
    if (first[root[i]] < 0) first[root[i]] = i;
    last[root[i]] = std::max(last[root[i]], i);
    for (int in : nodes[i].inputs) last[root[in]] = std::max(last[root[in]], i);
  }
  // Inputs are copied in before node 0 runs, wherever the graph creates them: they must not
  // share bytes with any value computed before their node.
  for (int id : input_ids_) first[id] = -1;
  for (int o : graph_.outputs()) last[root[o]] = n;

  struct Block {
    int id;
    int64_t size, begin, end, offset = -1;
  };
  std::vector<Block> blocks;
  for (int i = 0; i < n; ++i) {
    Op op = nodes[i].op;
    if (root[i] != i || op == Op::kParameter || op == Op::kState) continue;
    int64_t bytes = shape_numel(nodes[i].type.shape) * int64_t(dtype_size(nodes[i].type.dtype));
    blocks.push_back({i, (bytes + kAlign - 1) / kAlign * kAlign, first[i], last[i]});
  }
  // Largest first, each at the lowest offset that no block alive at the same time overlaps.
  std::vector<Block*> order;
  for (auto& b : blocks) order.push_back(&b);
  std::stable_sort(order.begin(), order.end(),
                   [](const Block* a, const Block* b) { return a->size > b->size; });
  std::vector<Block*> placed;
  for (Block* b : order) {
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (Block* p : placed)
      if (p->begin <= b->end && b->begin <= p->end)
        busy.push_back({p->offset, p->offset + p->size});
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (auto [lo, hi] : busy) {
      if (offset + b->size <= lo) break;
      offset = std::max(offset, hi);
    }
    b->offset = offset;
    arena_size_ = std::max(arena_size_, offset + b->size);
    placed.push_back(b);
  }
  kernels_.resize(n);
  rules_.resize(n);
  for (int i = 0; i < n; ++i) {
    const Node& nd = nodes[i];
    rules_[i] = cpu_rules::rule(nd.op);
    TF_CHECK(rules_[i] && nd.inputs.size() <= cpu_rules::kMaxOperands,
             "CPU backend: ", graph::op_name(nd.op), " node ", nd.name, " with ", nd.inputs.size(),
             " operands has no rule");
    if (nd.op == Op::kCustomCall) {
      const graph::CustomCall& k = *nd.attrs_as<graph::CustomCallAttrs>().kernel;
      TF_CHECK(k.backend == "cpu", "CPU backend cannot run custom call ", nd.name);
      kernels_[i] = find_kernel("cpu", k.target);
      if (!kernels_[i].fn)
        throw NotFoundError(detail::str_cat(
            "CPU backend: custom call ", nd.name, " names hub kernel ", k.target,
            ", which no loaded kernel package provides; load its package (kernelize or "
            "get_kernel) before compiling the graph"));
    }
    // The IR moves any dtype through these; the CPU's implementations move f32 (what every
    // activation is once legalised).
    const bool moves_f32 = nd.op == Op::kAllReduce || nd.op == Op::kAllGather ||
                           nd.op == Op::kSlice || nd.op == Op::kTakeLast;
    if (moves_f32 && nd.type.dtype != DType::f32)
      throw UnsupportedError(detail::str_cat("CPU backend: ", graph::op_name(nd.op), " of ",
                                             nd.type.str(), " values at ", nd.name,
                                             " (it handles float32 only)"));
  }
  for (const Block& b : blocks) slots_[b.id] = {Slot::kArena, b.offset};
  for (size_t k = 0; k < param_ids_.size(); ++k) slots_[param_ids_[k]] = {Slot::kParam, int64_t(k)};
  for (size_t k = 0; k < state_ids_.size(); ++k) slots_[state_ids_[k]] = {Slot::kState, int64_t(k)};
  for (int i = 0; i < n; ++i) slots_[i] = slots_[root[i]];
}

std::unique_ptr<RunContext> CpuExecutable::checkout() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      std::unique_ptr<RunContext> c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
  }
  auto c = std::make_unique<RunContext>();
  c->arena.reset(
      static_cast<char*>(std::aligned_alloc(kAlign, std::max<int64_t>(arena_size_, kAlign))));
  if (!c->arena)
    throw Error(detail::str_cat("CPU backend: cannot allocate ", arena_size_, " bytes"));
  return c;
}

void CpuExecutable::release(std::unique_ptr<RunContext> c) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(std::move(c));
}

uint64_t CpuExecutable::trim() {
  std::vector<std::unique_ptr<RunContext>> freed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    freed.swap(idle_);
  }
  uint64_t bytes = 0;
  for (const auto& c : freed)
    bytes += uint64_t(arena_size_) + c->scratch.capacity() * sizeof(float);
  return bytes;
}

void* CpuExecutable::ptr(const RunContext& c, int id) const {
  const Slot& s = slots_[id];
  switch (s.kind) {
    case Slot::kParam:
      return static_cast<CpuBuffer*>(c.params[s.index])->data();
    case Slot::kState:
      return static_cast<CpuBuffer*>(c.states[s.index])->data();
    case Slot::kArena:
      return c.arena.get() + s.index;
  }
  return nullptr;
}

// The bindings and step inputs have passed Executable::run's checks.
void CpuExecutable::execute(std::span<Buffer* const> params, std::span<Buffer* const> states,
                            std::span<const Tensor* const> inputs,
                            std::span<Tensor* const> outputs) {
  std::unique_ptr<RunContext> c = checkout();
  c->params = params;
  c->states = states;
  try {
    run_in(*c, inputs, outputs);
  } catch (...) {
    release(std::move(c));
    throw;
  }
  release(std::move(c));
}

void CpuExecutable::run_in(RunContext& c, std::span<const Tensor* const> inputs,
                           std::span<Tensor* const> outputs) const {
  for (size_t k = 0; k < inputs.size(); ++k) {
    void* dst = ptr(c, input_ids_[k]);
    if (graph_.node(input_ids_[k]).type.dtype == inputs[k]->dtype())
      std::memcpy(dst, inputs[k]->raw(), inputs[k]->nbytes());
    else
      cpu_rules::widen(inputs[k]->raw(), inputs[k]->dtype(), inputs[k]->numel(),
                       static_cast<float*>(dst));
    stats_->host_to_device(inputs[k]->nbytes());
  }
  const auto& nodes = graph_.nodes();
  if (OpProfile* prof = OpProfile::get()) {
    using Clock = std::chrono::steady_clock;
    for (int i = 0; i < int(nodes.size()); ++i) {
      const Node& nd = nodes[i];
      if (nd.op == Op::kParameter || nd.op == Op::kState || nd.op == Op::kInput ||
          nd.op == Op::kReshape || nd.op == Op::kConvert) {
        execute_node(c, nd, i);
        continue;
      }
      auto t0 = Clock::now();
      execute_node(c, nd, i);
      prof->add(nd.name == "lm_head" ? "lm_head" : graph::op_name(nd.op),
                std::chrono::duration<double>(Clock::now() - t0).count());
    }
    prof->add_run();
  } else {
    for (int i = 0; i < int(nodes.size()); ++i) execute_node(c, nodes[i], i);
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    const void* src = ptr(c, graph_.outputs()[k]);
    if (graph_.node(graph_.outputs()[k]).type.dtype == outputs[k]->dtype())
      std::memcpy(outputs[k]->raw(), src, outputs[k]->nbytes());
    else
      cpu_rules::narrow(static_cast<const float*>(src), outputs[k]->numel(), outputs[k]->dtype(),
                        outputs[k]->raw());
    stats_->device_to_host(outputs[k]->nbytes());
  }
}

void CpuExecutable::execute_node(RunContext& c, const Node& n, int id) const {
  void* in[cpu_rules::kMaxOperands];
  for (size_t k = 0; k < n.inputs.size(); ++k) in[k] = ptr(c, n.inputs[k]);
  rules_[size_t(id)]({graph_, n, in, ptr(c, id), c.scratch, kernels_[size_t(id)].fn});
}

QuantizedLinear to_tiles_if_int4(const QuantizedLinear& q) {
  return q.scheme == graph::QuantScheme::kInt4 ? to_tiles(q) : q;
}

class CpuBackend : public Backend {
 public:
  // Reports a bad TFORMERS_CPU_PREFETCH before any kernel runs (the kernels read the hint while
  // the library loads, where they cannot).
  CpuBackend() { cpu::weight_prefetch(); }
  std::string name() const override { return "cpu"; }
  Device device() const override { return Device{"cpu", 0}; }
  // The attention kernel reads each head's keys and values as one matrix per sequence (or block),
  // from f32 or bf16 caches (an f16 model's keys and values, computed in f32, are kept in f32:
  // bf16 would drop three of f16's mantissa bits); the kernels compute in float32; the paged
  // kernels take each token's sequence; a decode row's sums are ordered by K alone (kernels.h's
  // LinearRows), attention's by its own sequence.
  Capabilities capabilities() const override {
    return {.kv_layout = graph::KvLayout::kHeadMajor,
            .compute_dtypes = {DType::f32},
            .cache_dtypes = {DType::f32, DType::bf16},
            .packs_sequences = true,
            .batch_invariant = true};
  }
  bool supports(const graph::Node& n) const override {
    return cpu_rules::rule(n.op) && (n.op != Op::kCustomCall ||
                                     n.attrs_as<graph::CustomCallAttrs>().kernel->backend == "cpu");
  }
  std::unique_ptr<Executable> compile(const graph::Graph& g) override {
    return std::make_unique<CpuExecutable>(g, &stats_);
  }
  std::shared_ptr<Buffer> upload(const Tensor& host) override {
    return std::make_shared<CpuBuffer>(graph::TensorType{host.dtype(), host.shape()}, host);
  }
  std::shared_ptr<Buffer> allocate(const graph::TensorType& type) override {
    return std::make_shared<CpuBuffer>(type, resident_zeros(type.shape, type.dtype));
  }
  Tensor download(const Buffer& buffer) override {
    const Tensor& t = static_cast<const CpuBuffer&>(buffer).tensor();
    Tensor copy = Tensor::zeros(t.shape(), t.dtype());
    std::memcpy(copy.raw(), t.raw(), t.nbytes());
    stats_.device_to_host(t.nbytes());
    return copy;
  }
  // The kernels read int8 rows and int4 tiles: those are uploaded as given (a stored checkpoint
  // stays in its mapping), int4 rows are tiled.
  QuantizedLinear laid_out(const QuantizedLinear& q) const override { return to_tiles_if_int4(q); }
  // With every thread of the pool the kernels run on.
  double read_bandwidth_gbs(size_t bytes) override {
    return read_bandwidth(ThreadPool::global(), bytes);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace tformers::backends
