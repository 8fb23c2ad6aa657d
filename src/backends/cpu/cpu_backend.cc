#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "backends/cpu/kernels.h"
#include "backends/kernel_registry.h"
#include "core/cpu_features.h"
#include "core/memory.h"
#include "core/stream_read.h"
#include "distributed/process_group.h"
#include "tformers/error.h"
#include "tformers/kernel_abi.h"

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
graph::Graph legalise(const graph::Graph& g) {
  const DType act = g.activation_dtype();
  if (act == DType::f32) return g;
  graph::Graph out(DType::f32, g.kv_layout());
  for (const Node& n : g.nodes()) {
    Node m = n;
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
        m.type.dtype = out.node(n.inputs[0]).type.dtype;
        break;
      case Op::kCustomCall:  // its dtypes are the kernel's
        break;
      default:
        if (m.type.dtype == act) m.type.dtype = DType::f32;
    }
    out.add(std::move(m));
  }
  for (int o : g.outputs()) out.mark_output(o);
  return out;
}

// A linear's input (..., T, K) with T = 1 is one token per sequence, a decode step: its kernel
// then gives each row the same bits whatever the batch (kernels.h's LinearRows). The models keep
// (B, T, hidden) activations through every linear, so T tells a decode step from a prompt's.
cpu::LinearRows linear_rows(const graph::TensorType& x) {
  const size_t r = x.shape.size();
  return r >= 3 && x.shape[r - 2] == 1 ? cpu::LinearRows::kDecode : cpu::LinearRows::kAny;
}

// Host tensors of a 16-bit float dtype to and from the f32 values the kernels use.
void widen(const void* src, DType dtype, int64_t n, float* dst) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i)
    dst[i] = dtype == DType::bf16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
}
void narrow(const float* src, int64_t n, DType dtype, void* dst) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i)
    h[i] = dtype == DType::bf16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
}

// What one run needs besides the plan. A run checks one out of its executable for its duration,
// so runs on several threads never share an arena.
struct RunContext {
  std::unique_ptr<char, decltype(&std::free)> arena{nullptr, &std::free};
  std::span<Buffer*const> params, states;  // bound for the run
  std::vector<float> gather_scratch;       // all_gather's rank-major staging, grown once
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
  void custom_call(const RunContext& c, const Node& n, int id) const;

  // The compiled plan, fixed by the constructor and only read after.
  graph::Graph graph_;       // legalised: activations are f32
  TransferCounters* stats_;  // the backend's counters
  std::vector<Slot> slots_;
  std::vector<int> param_ids_, state_ids_, input_ids_;
  int64_t arena_size_ = 0;
  // Per node, the hub kernel a custom call resolved to at compile (empty for other ops); each
  // holds its library loaded for as long as the executable lives.
  std::vector<KernelEntry> kernels_;

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
    if (n.op == Op::kLinearQuant) {
      const auto& q = n.attrs_as<graph::LinearQuantAttrs>();
      if ((q.scheme == graph::QuantScheme::kInt4) != (q.layout == graph::QuantLayout::kTiles))
        throw UnsupportedError("node " + n.name +
                               ": the CPU backend multiplies int8 rows and int4 tiles, not this "
                               "layout; prepare the weight with the CPU backend's "
                               "prepare_quantized_linear");
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

  // Reshapes, converts (float32 to float32 once legalised) and cache writes alias their first
  // input; everything else that is not a parameter or state gets its own arena block.
  std::vector<int> root(n);
  for (int i = 0; i < n; ++i) {
    const Node& nd = nodes[i];
    if (nd.op == Op::kConvert && nd.type.dtype != graph_.node(nd.inputs[0]).type.dtype)
      throw UnsupportedError(detail::str_cat(
          "CPU backend: convert of ", graph_.node(nd.inputs[0]).type.str(), " to ",
          dtype_name(nd.type.dtype), " at ", nd.name,
          " (it computes activations in float32 and converts only at the graph's boundary)"));
    const bool in_place = nd.op == Op::kReshape || nd.op == Op::kConvert ||
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
  for (int i = 0; i < n; ++i) {
    const Node& nd = nodes[i];
    if (nd.op == Op::kCustomCall) {
      const graph::CustomCall& k = *nd.attrs_as<graph::CustomCallAttrs>().kernel;
      TF_CHECK(k.backend == "cpu" && nd.inputs.size() <= 8, "CPU backend cannot run custom call ",
               nd.name);
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
    bytes += uint64_t(arena_size_) + c->gather_scratch.capacity() * sizeof(float);
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
      widen(inputs[k]->raw(), inputs[k]->dtype(), inputs[k]->numel(), static_cast<float*>(dst));
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
      narrow(static_cast<const float*>(src), outputs[k]->numel(), outputs[k]->dtype(),
             outputs[k]->raw());
    stats_->device_to_host(outputs[k]->nbytes());
  }
}

void CpuExecutable::execute_node(RunContext& c, const Node& n, int id) const {
  ThreadPool& pool = ThreadPool::global();
  auto in_type = [&](int k) -> const graph::TensorType& { return graph_.node(n.inputs[k]).type; };
  auto in = [&](int k) { return ptr(c, n.inputs[k]); };
  auto f32 = [&](int k) { return static_cast<const float*>(ptr(c, n.inputs[k])); };
  float* out = static_cast<float*>(ptr(c, id));
  const Shape& s = n.type.shape;
  switch (n.op) {
    case Op::kParameter:
    case Op::kState:
    case Op::kInput:
    case Op::kReshape:
    case Op::kConvert:
      return;
    case Op::kEmbedding: {
      int64_t count = shape_numel(in_type(1).shape);
      const auto* ids = static_cast<const int32_t*>(in(1));
      const auto& a = n.attrs_as<graph::EmbeddingAttrs>();
      const int64_t rows = in_type(0).shape[0], d = s.back();
      const int64_t lo = distributed::rank_offset(a.group, rows);
      if (lo == 0 && rows == a.vocab) {
        cpu::embedding(in(0), in_type(0).dtype, ids, count, d, out, pool);
        return;
      }
      // A vocabulary shard: rows owned here are looked up, the rest are zero.
      for (int64_t i = 0; i < count; ++i) {
        const int32_t local = int32_t(ids[i] - lo);
        if (local >= 0 && local < rows)
          cpu::embedding(in(0), in_type(0).dtype, &local, 1, d, out + i * d, pool);
        else
          std::memset(out + i * d, 0, size_t(d) * sizeof(float));
      }
      return;
    }
    case Op::kLinear: {
      int64_t k = in_type(0).shape.back(), m = shape_numel(in_type(0).shape) / k;
      const void* bias = n.inputs.size() > 2 ? in(2) : nullptr;
      DType bias_type = n.inputs.size() > 2 ? in_type(2).dtype : in_type(1).dtype;
      TF_CHECK(bias == nullptr || bias_type == in_type(1).dtype, "bias dtype must match weight");
      cpu::linear(f32(0), in(1), in_type(1).dtype, bias, out, m, s.back(), k, pool,
                  linear_rows(in_type(0)));
      return;
    }
    case Op::kLinearQuant: {
      // The layouts prepare_quantized_linear makes: int8 rows, int4 tiles.
      const int64_t k = in_type(0).shape.back(), m = shape_numel(in_type(0).shape) / k;
      const auto& q = n.attrs_as<graph::LinearQuantAttrs>();
      const size_t bias_at = q.has_zero ? 4 : 3;
      const float* bias = n.inputs.size() > bias_at ? f32(bias_at) : nullptr;
      if (q.scheme == graph::QuantScheme::kInt8)
        cpu::linear_int8(f32(0), static_cast<const int8_t*>(in(1)), f32(2), bias, out, m, s.back(),
                         k, pool, linear_rows(in_type(0)));
      else
        cpu::linear_int4(f32(0), static_cast<const uint8_t*>(in(1)),
                         static_cast<const uint16_t*>(in(2)),
                         q.has_zero ? static_cast<const uint8_t*>(in(3)) : nullptr, bias, out, m,
                         s.back(), k, pool, linear_rows(in_type(0)));
      return;
    }
    case Op::kRMSNorm: {
      int64_t d = s.back(), m = shape_numel(s) / d;
      const auto& a = n.attrs_as<graph::RMSNormAttrs>();
      cpu::rms_norm(f32(0), in(1), in_type(1).dtype, out, m, d, a.eps, a.unit_offset, pool);
      return;
    }
    case Op::kRope: {
      if (out != f32(0)) std::memcpy(out, f32(0), shape_numel(s) * sizeof(float));
      const auto& a = n.attrs_as<graph::RopeAttrs>();
      cpu::rope(out, static_cast<const int32_t*>(in(1)), a.inv_freq.data(), s[0] * s[1], s[2], s[3],
                a.rotary_dim, a.interleaved, pool);
      return;
    }
    case Op::kSiluMul:
      cpu::silu_mul(f32(0), f32(1), out, shape_numel(s), pool);
      return;
    case Op::kGeluTanhMul:
      cpu::gelu_tanh_mul(f32(0), f32(1), out, shape_numel(s), pool);
      return;
    case Op::kAdd:
      cpu::add(f32(0), f32(1), out, shape_numel(s), pool);
      return;
    case Op::kScale:
      cpu::scale(f32(0), n.attrs_as<graph::ScaleAttrs>().factor, out, shape_numel(s), pool);
      return;
    case Op::kSoftcap:
      cpu::softcap(f32(0), n.attrs_as<graph::SoftcapAttrs>().cap, out, shape_numel(s), pool);
      return;
    case Op::kCacheWrite: {
      const Shape& u = in_type(1).shape;  // (B,T,Hkv,D)
      int32_t start = *static_cast<const int32_t*>(in(2));
      cpu::cache_write(ptr(c, id), n.type.dtype, f32(1), u[0], u[1], u[2], s[2], u[3], start, pool);
      return;
    }
    case Op::kAttention: {
      const Shape& c = in_type(1).shape;  // (B,Hkv,S,D)
      int32_t start = *static_cast<const int32_t*>(in(3));
      const int32_t* mask = n.inputs.size() > 4 ? static_cast<const int32_t*>(in(4)) : nullptr;
      const auto& a = n.attrs_as<graph::AttentionAttrs>();
      cpu::attention(f32(0), in(1), in(2), in_type(1).dtype, mask, out, s[0], s[1], s[2], c[1],
                     c[2], s[3], start, a.scale, a.sliding_window, a.softcap, pool);
      return;
    }
    case Op::kPagedCacheWrite: {
      const Shape& u = in_type(1).shape;  // (B,T,Hkv,D)
      const auto* rows = n.inputs.size() > 4 ? static_cast<const int32_t*>(in(4)) : nullptr;
      cpu::paged_cache_write(ptr(c, id), n.type.dtype, f32(1), static_cast<const int32_t*>(in(2)),
                             rows, static_cast<const int32_t*>(in(3)), u[0], u[1], u[2], s[2],
                             in_type(2).shape[1], u[3], pool);
      return;
    }
    case Op::kPagedAttention: {
      const Shape& kp = in_type(1).shape;  // (NB,Hkv,BS,D)
      const auto& a = n.attrs_as<graph::AttentionAttrs>();
      const auto* rows = n.inputs.size() > 5 ? static_cast<const int32_t*>(in(5)) : nullptr;
      cpu::paged_attention(f32(0), in(1), in(2), in_type(1).dtype,
                           static_cast<const int32_t*>(in(3)), rows,
                           static_cast<const int32_t*>(in(4)), out, s[0], s[1], s[2], kp[1], kp[2],
                           in_type(3).shape[1], s[3], a.scale, a.sliding_window, a.softcap, pool);
      return;
    }
    case Op::kCustomCall:
      custom_call(c, n, id);
      return;
    case Op::kTakeLast: {
      const Shape& x = in_type(0).shape;  // (B,T,D)
      int64_t keep = n.attrs_as<graph::TakeLastAttrs>().n, d = x[2];
      for (int64_t b = 0; b < x[0]; ++b)
        std::memcpy(out + b * keep * d, f32(0) + (b * x[1] + x[1] - keep) * d,
                    keep * d * sizeof(float));
      return;
    }
    case Op::kAllReduce: {
      const int64_t numel = shape_numel(s), d = s.back();
      distributed::group(n.attrs_as<graph::AllReduceAttrs>().group)
          .all_reduce_sum(f32(0), out, numel);
      if (n.inputs.size() > 1) {
        // The bias of a rowwise layer, added once after the sum (on every rank alike).
        const DType bt = in_type(1).dtype;
        TF_CHECK(bt == DType::f32 || bt == DType::bf16, "all_reduce bias dtype");
        for (int64_t i = 0; i < numel; ++i)
          out[i] += bt == DType::f32 ? f32(1)[i % d]
                                     : bf16_to_f32(static_cast<const uint16_t*>(in(1))[i % d]);
      }
      return;
    }
    case Op::kAllGather: {
      const auto& a = n.attrs_as<graph::AllGatherAttrs>();
      distributed::ProcessGroup& g = distributed::group(a.group);
      TF_CHECK(a.ranks == g.size(), "all_gather over ", a.ranks, " ranks in a group of ", g.size());
      g.all_gather_last_dim(f32(0), out, shape_numel(s) / s.back(), in_type(0).shape.back(),
                            c.gather_scratch);
      return;
    }
    case Op::kSlice: {
      const auto& a = n.attrs_as<graph::SliceAttrs>();
      const int64_t k = in_type(0).shape.back(), w = s.back(), rows = shape_numel(s) / w;
      const int64_t begin = a.begin + distributed::rank_offset(a.group, w);
      const int64_t have = std::clamp<int64_t>(k - begin, 0, w);  // the rest is padding
      for (int64_t i = 0; i < rows; ++i) {
        std::memcpy(out + i * w, f32(0) + i * k + begin, size_t(have) * sizeof(float));
        std::fill(out + i * w + have, out + (i + 1) * w, 0.0f);
      }
      return;
    }
  }
  TF_CHECK(false, "CPU backend: no kernel for op ", graph::op_name(n.op));
}

static_assert(int(DType::f32) == TF_KERNEL_F32 && int(DType::bf16) == TF_KERNEL_BF16 &&
                  int(DType::f16) == TF_KERNEL_F16 && int(DType::i32) == TF_KERNEL_I32 &&
                  int(DType::i64) == TF_KERNEL_I64,
              "kernel_abi.h dtype codes follow tformers::DType");

// The host side of TfKernelCall::parallel_for: the kernel's C body over the global pool.
void kernel_parallel_for(void* host, int64_t n, int64_t grain,
                         void (*body)(void* arg, int64_t begin, int64_t end), void* arg) {
  static_cast<ThreadPool*>(host)->parallel_for(
      n, [&](int64_t begin, int64_t end, int) { body(arg, begin, end); },
      std::max<int64_t>(grain, 1));
}

// A hub kernel through its C entry point. Tensors and attributes point into the graph and the
// arena; nothing is allocated per call.
void CpuExecutable::custom_call(const RunContext& c, const Node& n, int id) const {
  TfKernelTensor inputs[8];
  const int count = int(n.inputs.size());
  for (int k = 0; k < count; ++k) {
    const graph::TensorType& t = graph_.node(n.inputs[k]).type;
    inputs[k] = {ptr(c, n.inputs[k]), int32_t(t.dtype), int32_t(t.shape.size()), t.shape.data()};
  }
  const TfKernelTensor output = {ptr(c, id), int32_t(n.type.dtype), int32_t(n.type.shape.size()),
                                 n.type.shape.data()};
  char error[512] = {0};
  TfKernelCall call = {};
  call.inputs = inputs;
  call.num_inputs = count;
  call.output = &output;
  const auto& a = n.attrs_as<graph::CustomCallAttrs>();
  call.float_attrs = a.floats.data();
  call.num_float_attrs = int32_t(a.floats.size());
  call.parallel_for = &kernel_parallel_for;
  call.host = &ThreadPool::global();
  call.error = error;
  call.error_size = sizeof error;
  if (reinterpret_cast<TfKernelFn>(const_cast<void*>(kernels_[size_t(id)].fn))(&call) != 0) {
    error[sizeof error - 1] = 0;
    throw Error(detail::str_cat("hub kernel ", a.kernel->target, " failed at node ", n.name, ": ",
                                error[0] ? error : "(no message)"));
  }
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
  // The attention kernel reads each head's keys and values as one matrix per sequence (or block).
  graph::KvLayout kv_layout() const override { return graph::KvLayout::kHeadMajor; }
  bool supports(const graph::Node& n) const override {
    return n.op != Op::kCustomCall || n.attrs_as<graph::CustomCallAttrs>().kernel->backend == "cpu";
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
  PreparedWeight prepare_quantized_linear(const QuantizedLinear& q) override {
    return upload_quantized(to_tiles_if_int4(q));
  }
  // With every thread of the pool the kernels run on.
  double read_bandwidth_gbs(size_t bytes) override {
    return read_bandwidth(ThreadPool::global(), bytes);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace tformers::backends
