#include "backends/cpu/rules.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <utility>

#include "backends/cpu/kernels.h"
#include "core/thread_pool.h"
#include "distributed/process_group.h"
#include "tformers/error.h"
#include "tformers/kernel_abi.h"

namespace tformers::backends::cpu_rules {

namespace {

using graph::Node;
using graph::Op;

ThreadPool& pool() { return ThreadPool::global(); }

// A linear's input (..., T, K) with T = 1 is one token per sequence, a decode step: its kernel
// then gives each row the same bits whatever the batch (kernels.h's LinearRows). The models keep
// (B, T, hidden) activations through every linear, so T tells a decode step from a prompt's.
cpu::LinearRows linear_rows(const graph::TensorType& x) {
  const size_t r = x.shape.size();
  return r >= 3 && x.shape[r - 2] == 1 ? cpu::LinearRows::kDecode : cpu::LinearRows::kAny;
}

// ---- The fused ops ----

void nothing(const OpCall&) {}  // leaves and aliases: the planner placed them

void embedding(const OpCall& c) {
  const int64_t count = shape_numel(c.in_type(1).shape);
  const int32_t* ids = c.i32(1);
  const auto& a = c.n.attrs_as<graph::EmbeddingAttrs>();
  const int64_t rows = c.in_type(0).shape[0], d = c.n.type.shape.back();
  const int64_t lo = distributed::rank_offset(a.group, rows);
  float* out = c.out_f32();
  if (lo == 0 && rows == a.vocab) {
    cpu::embedding(c.in[0], c.in_type(0).dtype, ids, count, d, out, pool());
    return;
  }
  // A vocabulary shard: rows owned here are looked up, the rest are zero.
  for (int64_t i = 0; i < count; ++i) {
    const int32_t local = int32_t(ids[i] - lo);
    if (local >= 0 && local < rows)
      cpu::embedding(c.in[0], c.in_type(0).dtype, &local, 1, d, out + i * d, pool());
    else
      std::memset(out + i * d, 0, size_t(d) * sizeof(float));
  }
}

void linear(const OpCall& c) {
  const int64_t k = c.in_type(0).shape.back(), m = shape_numel(c.in_type(0).shape) / k;
  const bool has_bias = c.n.inputs.size() > 2;
  TF_CHECK(!has_bias || c.in_type(2).dtype == c.in_type(1).dtype, "bias dtype must match weight");
  cpu::linear(c.f32(0), c.in[1], c.in_type(1).dtype, has_bias ? c.in[2] : nullptr, c.out_f32(), m,
              c.n.type.shape.back(), k, pool(), linear_rows(c.in_type(0)));
}

// The layouts prepare_quantized_linear makes: int8 rows, int4 tiles.
void linear_quant(const OpCall& c) {
  const int64_t k = c.in_type(0).shape.back(), m = shape_numel(c.in_type(0).shape) / k;
  const auto& q = c.n.attrs_as<graph::LinearQuantAttrs>();
  const size_t bias_at = q.has_zero ? 4 : 3;
  const float* bias = c.n.inputs.size() > bias_at ? c.f32(bias_at) : nullptr;
  const int64_t n = c.n.type.shape.back();
  if (q.scheme == graph::QuantScheme::kInt8)
    cpu::linear_int8(c.f32(0), static_cast<const int8_t*>(c.in[1]), c.f32(2), bias, c.out_f32(), m,
                     n, k, pool(), linear_rows(c.in_type(0)));
  else
    cpu::linear_int4(c.f32(0), static_cast<const uint8_t*>(c.in[1]),
                     static_cast<const uint16_t*>(c.in[2]),
                     q.has_zero ? static_cast<const uint8_t*>(c.in[3]) : nullptr, bias, c.out_f32(),
                     m, n, k, pool(), linear_rows(c.in_type(0)));
}

void rms_norm(const OpCall& c) {
  const Shape& s = c.n.type.shape;
  const int64_t d = s.back(), m = shape_numel(s) / d;
  const auto& a = c.n.attrs_as<graph::RMSNormAttrs>();
  cpu::rms_norm(c.f32(0), c.in[1], c.in_type(1).dtype, c.out_f32(), m, d, a.eps, a.unit_offset,
                pool());
}

void rope(const OpCall& c) {
  const Shape& s = c.n.type.shape;
  if (c.out != c.in[0]) std::memcpy(c.out, c.in[0], shape_numel(s) * sizeof(float));
  const auto& a = c.n.attrs_as<graph::RopeAttrs>();
  cpu::rope(c.out_f32(), c.i32(1), a.inv_freq.data(), s[0] * s[1], s[2], s[3], a.rotary_dim,
            a.interleaved, pool());
}

void silu_mul(const OpCall& c) {
  cpu::silu_mul(c.f32(0), c.f32(1), c.out_f32(), shape_numel(c.n.type.shape), pool());
}
void gelu_tanh_mul(const OpCall& c) {
  cpu::gelu_tanh_mul(c.f32(0), c.f32(1), c.out_f32(), shape_numel(c.n.type.shape), pool());
}
void add(const OpCall& c) {
  cpu::add(c.f32(0), c.f32(1), c.out_f32(), shape_numel(c.n.type.shape), pool());
}
void scale(const OpCall& c) {
  cpu::scale(c.f32(0), c.n.attrs_as<graph::ScaleAttrs>().factor, c.out_f32(),
             shape_numel(c.n.type.shape), pool());
}
void softcap(const OpCall& c) {
  cpu::softcap(c.f32(0), c.n.attrs_as<graph::SoftcapAttrs>().cap, c.out_f32(),
               shape_numel(c.n.type.shape), pool());
}

void cache_write(const OpCall& c) {
  const Shape &u = c.in_type(1).shape, &s = c.n.type.shape;  // (B,T,Hkv,D), (B,Hkv,S,D)
  const int32_t start = *c.i32(2);
  cpu::cache_write(c.out, c.n.type.dtype, c.f32(1), u[0], u[1], u[2], s[2], u[3], start, pool());
}

// An attention node's sinks, float32 once legalised (cpu_backend.cc), or null.
const float* attention_sinks(const OpCall& c, const graph::AttentionOperands& o) {
  return o.sinks >= 0 ? c.f32(size_t(o.sinks)) : nullptr;
}

void attention(const OpCall& c) {
  const Shape &k = c.in_type(1).shape, &s = c.n.type.shape;  // (B,Hkv,S,D)
  const int32_t start = *c.i32(3);
  const graph::AttentionOperands o = graph::attention_operands(c.n);
  const int32_t* mask = o.mask_or_rows >= 0 ? c.i32(size_t(o.mask_or_rows)) : nullptr;
  const auto& a = c.n.attrs_as<graph::AttentionAttrs>();
  cpu::attention(c.f32(0), c.in[1], c.in[2], c.in_type(1).dtype, mask, c.out_f32(), s[0], s[1],
                 s[2], k[1], k[2], s[3], start, a.scale, a.sliding_window, a.softcap,
                 attention_sinks(c, o), pool());
}

void paged_cache_write(const OpCall& c) {
  const Shape &u = c.in_type(1).shape, &s = c.n.type.shape;  // (B,T,Hkv,D)
  const int32_t* rows = c.n.inputs.size() > 4 ? c.i32(4) : nullptr;
  cpu::paged_cache_write(c.out, c.n.type.dtype, c.f32(1), c.i32(2), rows, c.i32(3), u[0], u[1],
                         u[2], s[2], c.in_type(2).shape[1], u[3], pool());
}

void paged_attention(const OpCall& c) {
  const Shape &kp = c.in_type(1).shape, &s = c.n.type.shape;  // (NB,Hkv,BS,D)
  const auto& a = c.n.attrs_as<graph::AttentionAttrs>();
  const graph::AttentionOperands o = graph::attention_operands(c.n);
  const int32_t* rows = o.mask_or_rows >= 0 ? c.i32(size_t(o.mask_or_rows)) : nullptr;
  cpu::paged_attention(c.f32(0), c.in[1], c.in[2], c.in_type(1).dtype, c.i32(3), rows, c.i32(4),
                       c.out_f32(), s[0], s[1], s[2], kp[1], kp[2], c.in_type(3).shape[1], s[3],
                       a.scale, a.sliding_window, a.softcap, attention_sinks(c, o), pool());
}

void take_last(const OpCall& c) {
  const Shape& x = c.in_type(0).shape;  // (B,T,D)
  const int64_t keep = c.n.attrs_as<graph::TakeLastAttrs>().n, d = x[2];
  for (int64_t b = 0; b < x[0]; ++b)
    std::memcpy(c.out_f32() + b * keep * d, c.f32(0) + (b * x[1] + x[1] - keep) * d,
                keep * d * sizeof(float));
}

void all_reduce(const OpCall& c) {
  const Shape& s = c.n.type.shape;
  const int64_t numel = shape_numel(s), d = s.back();
  float* out = c.out_f32();
  distributed::group(c.n.attrs_as<graph::AllReduceAttrs>().group)
      .all_reduce_sum(c.f32(0), out, numel);
  if (c.n.inputs.size() < 2) return;
  // The bias of a rowwise layer (float32: the legaliser widens a 16-bit one), added once after
  // the sum (on every rank alike).
  for (int64_t i = 0; i < numel; ++i) out[i] += c.f32(1)[i % d];
}

void all_gather(const OpCall& c) {
  const auto& a = c.n.attrs_as<graph::AllGatherAttrs>();
  distributed::ProcessGroup& g = distributed::group(a.group);
  TF_CHECK(a.ranks == g.size(), "all_gather over ", a.ranks, " ranks in a group of ", g.size());
  const Shape& s = c.n.type.shape;
  g.all_gather_last_dim(c.f32(0), c.out_f32(), shape_numel(s) / s.back(), c.in_type(0).shape.back(),
                        c.scratch);
}

void slice(const OpCall& c) {
  const auto& a = c.n.attrs_as<graph::SliceAttrs>();
  const int64_t k = c.in_type(0).shape.back(), w = c.n.type.shape.back();
  const int64_t rows = shape_numel(c.n.type.shape) / w;
  const int64_t begin = a.begin + distributed::rank_offset(a.group, w);
  const int64_t have = std::clamp<int64_t>(k - begin, 0, w);  // the rest is padding
  float* out = c.out_f32();
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(out + i * w, c.f32(0) + i * k + begin, size_t(have) * sizeof(float));
    std::fill(out + i * w + have, out + (i + 1) * w, 0.0f);
  }
}

// A convert between dtypes (one of the same dtype aliases its input and runs nothing).
void convert(const OpCall& c) {
  const DType from = c.in_type(0).dtype, to = c.n.type.dtype;
  const int64_t n = shape_numel(c.n.type.shape);
  if (from == to) return;
  if (to == DType::f32)
    widen(c.in[0], from, n, c.out_f32());
  else
    narrow(c.f32(0), n, to, c.out);
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
void custom_call(const OpCall& c) {
  TfKernelTensor inputs[kMaxOperands];
  const int count = int(c.n.inputs.size());
  for (int k = 0; k < count; ++k) {
    const graph::TensorType& t = c.in_type(size_t(k));
    inputs[k] = {c.in[k], int32_t(t.dtype), int32_t(t.shape.size()), t.shape.data()};
  }
  const TfKernelTensor output = {c.out, int32_t(c.n.type.dtype), int32_t(c.n.type.shape.size()),
                                 c.n.type.shape.data()};
  char error[512] = {0};
  TfKernelCall call = {};
  call.inputs = inputs;
  call.num_inputs = count;
  call.output = &output;
  const auto& a = c.n.attrs_as<graph::CustomCallAttrs>();
  call.float_attrs = a.floats.data();
  call.num_float_attrs = int32_t(a.floats.size());
  call.parallel_for = &kernel_parallel_for;
  call.host = &pool();
  call.error = error;
  call.error_size = sizeof error;
  if (reinterpret_cast<TfKernelFn>(const_cast<void*>(c.kernel))(&call) != 0) {
    error[sizeof error - 1] = 0;
    throw Error(detail::str_cat("hub kernel ", a.kernel->target, " failed at node ", c.n.name, ": ",
                                error[0] ? error : "(no message)"));
  }
}

// ---- The primitives: plain loops over float32 (or int32) values, the reference kernels ----

constexpr size_t kMaxRank = 8;
using Index = std::array<int64_t, kMaxRank>;

// Element strides of an operand of shape `in` read at each index of `out` (NumPy's broadcast: 0
// along the dims it stretches or lacks).
Index broadcast_strides(const Shape& in, const Shape& out) {
  TF_CHECK(out.size() <= kMaxRank, "CPU backend: ", out.size(), " dims (at most ", kMaxRank, ")");
  Index st{};
  int64_t stride = 1;
  for (size_t i = in.size(); i-- > 0;) {
    const size_t o = i + (out.size() - in.size());
    st[o] = in[i] == 1 ? 0 : stride;
    stride *= in[i];
  }
  return st;
}

// Calls f(i, offsets...) for each element i of `out` in order, with each operand's element offset.
template <size_t N, class F>
void for_each_broadcast(const Shape& out, const std::array<Index, N>& strides, F f) {
  const int64_t total = shape_numel(out);
  Index at{};
  std::array<int64_t, N> off{};
  for (int64_t i = 0; i < total; ++i) {
    f(i, off);
    for (size_t d = out.size(); d-- > 0;) {  // the odometer
      for (size_t k = 0; k < N; ++k) off[k] += strides[k][d];
      if (++at[d] < out[d]) break;
      for (size_t k = 0; k < N; ++k) off[k] -= strides[k][d] * out[d];
      at[d] = 0;
    }
  }
}

// Rows (outer), the axis and the elements after it (inner) of a shape split at `axis`.
struct Split {
  int64_t outer = 1, axis = 1, inner = 1;
};
Split split_at(const Shape& s, int64_t axis) {
  Split p;
  for (int64_t d = 0; d < int64_t(s.size()); ++d)
    (d < axis ? p.outer : d == axis ? p.axis : p.inner) *= s[size_t(d)];
  return p;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

float apply(graph::UnaryFn fn, float x) {
  switch (fn) {
    case graph::UnaryFn::kExp:
      return std::exp(x);
    case graph::UnaryFn::kLog:
      return std::log(x);
    case graph::UnaryFn::kNeg:
      return -x;
    case graph::UnaryFn::kSqrt:
      return std::sqrt(x);
    case graph::UnaryFn::kRsqrt:
      return 1.0f / std::sqrt(x);
    case graph::UnaryFn::kTanh:
      return std::tanh(x);
    case graph::UnaryFn::kSigmoid:
      return sigmoid(x);
    case graph::UnaryFn::kSilu:
      return x * sigmoid(x);
    case graph::UnaryFn::kGeluTanh:  // PyTorch's tanh approximation
      return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case graph::UnaryFn::kSoftplus:  // PyTorch's threshold: linear above 20
      return x > 20.0f ? x : std::log1p(std::exp(x));
  }
  return x;
}

// float32 as IEEE computes it; int32 as XLA does: sums and products wrap, x / 0 is -1 and
// INT32_MIN / -1 is INT32_MIN (StableHLO's divide), where C++ leaves each undefined.
template <class T>
T apply(graph::BinaryFn fn, T a, T b) {
  using graph::BinaryFn;
  if constexpr (std::is_integral_v<T>) {
    const auto ua = uint32_t(a), ub = uint32_t(b);
    if (fn == BinaryFn::kAdd) return T(ua + ub);
    if (fn == BinaryFn::kSub) return T(ua - ub);
    if (fn == BinaryFn::kMul) return T(ua * ub);
    if (fn == BinaryFn::kDiv) return b == 0 ? -1 : a == INT32_MIN && b == -1 ? INT32_MIN : a / b;
  } else {
    if (fn == BinaryFn::kAdd) return a + b;
    if (fn == BinaryFn::kSub) return a - b;
    if (fn == BinaryFn::kMul) return a * b;
    if (fn == BinaryFn::kDiv) return a / b;
  }
  return fn == BinaryFn::kMax ? std::max(a, b) : std::min(a, b);
}

void constant(const OpCall& c) {
  const auto v = c.n.attrs_as<graph::ConstantAttrs>().value;
  const int64_t n = shape_numel(c.n.type.shape);
  if (c.n.type.dtype == DType::i32)
    std::fill_n(static_cast<int32_t*>(c.out), n, int32_t(v));
  else
    std::fill_n(c.out_f32(), n, float(v));
}

void unary(const OpCall& c) {
  const auto fn = c.n.attrs_as<graph::UnaryAttrs>().fn;
  const int64_t n = shape_numel(c.n.type.shape);
  for (int64_t i = 0; i < n; ++i) c.out_f32()[i] = apply(fn, c.f32(0)[i]);
}

template <class T>
void binary_as(const OpCall& c) {
  const auto fn = c.n.attrs_as<graph::BinaryAttrs>().fn;
  const Shape& out = c.n.type.shape;
  const auto* a = static_cast<const T*>(c.in[0]);
  const auto* b = static_cast<const T*>(c.in[1]);
  for_each_broadcast<2>(
      out, {broadcast_strides(c.in_type(0).shape, out), broadcast_strides(c.in_type(1).shape, out)},
      [&](int64_t i, const std::array<int64_t, 2>& o) {
        static_cast<T*>(c.out)[i] = apply(fn, a[o[0]], b[o[1]]);
      });
}
void binary(const OpCall& c) {
  c.n.type.dtype == DType::i32 ? binary_as<int32_t>(c) : binary_as<float>(c);
}

template <class T>
void select_as(const OpCall& c) {
  const Shape& out = c.n.type.shape;
  const auto* a = static_cast<const T*>(c.in[1]);
  const auto* b = static_cast<const T*>(c.in[2]);
  for_each_broadcast<3>(
      out,
      {broadcast_strides(c.in_type(0).shape, out), broadcast_strides(c.in_type(1).shape, out),
       broadcast_strides(c.in_type(2).shape, out)},
      [&](int64_t i, const std::array<int64_t, 3>& o) {
        static_cast<T*>(c.out)[i] = c.i32(0)[o[0]] ? a[o[1]] : b[o[2]];
      });
}
void select(const OpCall& c) {
  c.n.type.dtype == DType::i32 ? select_as<int32_t>(c) : select_as<float>(c);
}

void reduce(const OpCall& c) {
  const auto& a = c.n.attrs_as<graph::ReduceAttrs>();
  const Split p = split_at(c.in_type(0).shape, a.axis);
  for (int64_t o = 0; o < p.outer; ++o)
    for (int64_t i = 0; i < p.inner; ++i) {
      const float* x = c.f32(0) + o * p.axis * p.inner + i;
      float acc = a.fn == graph::ReduceFn::kSum ? 0.0f : -INFINITY;
      for (int64_t j = 0; j < p.axis; ++j)
        acc = a.fn == graph::ReduceFn::kSum ? acc + x[j * p.inner] : std::max(acc, x[j * p.inner]);
      c.out_f32()[o * p.inner + i] = acc;
    }
}

void softmax(const OpCall& c) {
  const int64_t n = c.n.type.shape.back(), rows = shape_numel(c.n.type.shape) / n;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = c.f32(0) + r * n;
    float* y = c.out_f32() + r * n;
    const float m = *std::max_element(x, x + n);
    float sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += y[j] = std::exp(x[j] - m);
    for (int64_t j = 0; j < n; ++j) y[j] /= sum;
  }
}

void top_k(const OpCall& c) {
  const int64_t n = c.in_type(0).shape.back(), k = c.n.type.shape.back();
  const int64_t rows = shape_numel(c.n.type.shape) / k;
  std::vector<int32_t> order(size_t(n), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = c.f32(0) + r * n;
    std::iota(order.begin(), order.end(), 0);
    // Largest first, the lower index first among equals (a NaN counts as the largest).
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      const bool na = std::isnan(x[a]), nb = std::isnan(x[b]);
      if (na != nb) return na;
      return x[a] > x[b] || (!(x[b] > x[a]) && a < b);
    });
    std::copy_n(order.begin(), k, static_cast<int32_t*>(c.out) + r * k);
  }
}

// An index along a dim of n, clamped into it as XLA's gather clamps.
int64_t clamp_index(int32_t i, int64_t n) { return std::clamp<int64_t>(i, 0, n - 1); }

void take_along(const OpCall& c) {
  const int64_t n = c.in_type(0).shape.back(), k = c.n.type.shape.back();
  const int64_t rows = shape_numel(c.n.type.shape) / k, size = int64_t(dtype_size(c.n.type.dtype));
  const auto* x = static_cast<const char*>(c.in[0]);
  auto* out = static_cast<char*>(c.out);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j)
      std::memcpy(out + (r * k + j) * size,
                  x + (r * n + clamp_index(c.i32(1)[r * k + j], n)) * size, size_t(size));
}

template <class T>
void scatter_add_as(const OpCall& c) {
  const int64_t n = c.n.type.shape.back(), k = c.in_type(1).shape.back();
  const int64_t rows = shape_numel(c.n.type.shape) / n;
  auto* out = static_cast<T*>(c.out);
  const auto* src = static_cast<const T*>(c.in[2]);
  if (c.out != c.in[0]) std::memcpy(out, c.in[0], size_t(rows * n) * sizeof(T));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t i = c.i32(1)[r * k + j];
      if (i >= 0 && i < n)  // XLA drops the rest
        out[r * n + i] = apply(graph::BinaryFn::kAdd, out[r * n + i], src[r * k + j]);
    }
}
void scatter_add(const OpCall& c) {
  c.n.type.dtype == DType::i32 ? scatter_add_as<int32_t>(c) : scatter_add_as<float>(c);
}

void concat(const OpCall& c) {
  const int64_t axis = c.n.attrs_as<graph::AxisAttrs>().axis;
  const Split p = split_at(c.n.type.shape, axis);
  const size_t size = dtype_size(c.n.type.dtype);
  auto* out = static_cast<char*>(c.out);
  int64_t at = 0;  // along the axis
  for (size_t k = 0; k < c.n.inputs.size(); ++k) {
    const int64_t len = c.in_type(k).shape[size_t(axis)] * p.inner;
    for (int64_t o = 0; o < p.outer; ++o)
      std::memcpy(out + (o * p.axis * p.inner + at) * size,
                  static_cast<const char*>(c.in[k]) + o * len * size, size_t(len) * size);
    at += len;
  }
}

// Copies elements of `size` bytes from x to each index of `out`, x read at `strides`.
void gather_strided(const void* x, const Index& strides, const Shape& out, size_t size, void* y) {
  for_each_broadcast<1>(out, {strides}, [&](int64_t i, const std::array<int64_t, 1>& o) {
    std::memcpy(static_cast<char*>(y) + i * size, static_cast<const char*>(x) + o[0] * size, size);
  });
}

void transpose(const OpCall& c) {
  const auto& perm = c.n.attrs_as<graph::TransposeAttrs>().perm;
  const Shape& in = c.in_type(0).shape;
  const Index contiguous = broadcast_strides(in, in);
  Index strides{};
  for (size_t d = 0; d < perm.size(); ++d) strides[d] = contiguous[size_t(perm[d])];
  gather_strided(c.in[0], strides, c.n.type.shape, dtype_size(c.n.type.dtype), c.out);
}

void broadcast(const OpCall& c) {
  gather_strided(c.in[0], broadcast_strides(c.in_type(0).shape, c.n.type.shape), c.n.type.shape,
                 dtype_size(c.n.type.dtype), c.out);
}

void iota(const OpCall& c) {
  const Split p = split_at(c.n.type.shape, c.n.attrs_as<graph::AxisAttrs>().axis);
  const int64_t n = shape_numel(c.n.type.shape);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = i / p.inner % p.axis;
    if (c.n.type.dtype == DType::i32)
      static_cast<int32_t*>(c.out)[i] = int32_t(v);
    else
      c.out_f32()[i] = float(v);
  }
}

template <class T>
void cumsum_as(const OpCall& c) {
  const Split p = split_at(c.n.type.shape, c.n.attrs_as<graph::AxisAttrs>().axis);
  const auto* x = static_cast<const T*>(c.in[0]);
  auto* y = static_cast<T*>(c.out);
  for (int64_t o = 0; o < p.outer; ++o)
    for (int64_t i = 0; i < p.inner; ++i) {
      T acc = 0;
      for (int64_t j = 0; j < p.axis; ++j) {
        const int64_t at = (o * p.axis + j) * p.inner + i;
        y[at] = acc = apply(graph::BinaryFn::kAdd, acc, x[at]);
      }
    }
}
void cumsum(const OpCall& c) {
  c.n.type.dtype == DType::i32 ? cumsum_as<int32_t>(c) : cumsum_as<float>(c);
}

void matmul(const OpCall& c) {
  const Shape& a = c.in_type(0).shape;
  const int64_t M = a[a.size() - 2], K = a.back(), N = c.n.type.shape.back();
  const int64_t batch = shape_numel(a) / (M * K);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        float acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += c.f32(0)[(b * M + m) * K + k] * c.f32(1)[(b * K + k) * N + n];
        c.out_f32()[(b * M + m) * N + n] = acc;
      }
}

// The (row, slot) pairs of kLinearId and kLinearIdQuant, and how to run them by expert.
struct ExpertPairs {
  int64_t E, N, K, k, rows;
  bool sharded;   // w holds this rank's share of the experts (LinearIdAttrs::group)
  int64_t first;  // the global index of its first expert
  bool per_slot;  // x holds a row per (row, slot), else one per row
  // A decode step (one token per sequence): the GEMV, whose bits for a row depend only on K.
  bool decode;
  const float* bias;  // (E, N), or null
};

// The experts' bias operand, after the weight operands of kLinearId or kLinearIdQuant.
const float* experts_bias(const OpCall& c) {
  const int at = graph::experts_bias_operand(c.n);
  return at < 0 ? nullptr : c.f32(size_t(at));
}

ExpertPairs expert_pairs(const OpCall& c) {
  const Shape& is = c.in_type(2).shape;
  const int64_t k = is.back();
  const int64_t E = c.in_type(1).shape[0];
  const int group = c.n.attrs_as<graph::LinearIdAttrs>().group;
  return {E,
          c.n.type.shape.back(),
          c.in_type(0).shape.back(),
          k,
          shape_numel(is) / k,
          group >= 0,
          distributed::rank_offset(group, E),
          c.in_type(0).shape.size() == is.size() + 1,
          is.size() >= 2 && is[is.size() - 2] == 1,
          experts_bias(c)};
}

// Runs every (row, slot) pair through its expert, one expert at a time: the pairs routed to
// expert e are gathered into rows of X, multiplied by e's weight in one call of
// mul(e, X, Y, rows, kind), and scattered back, so a step reads each routed expert once however
// many of its tokens chose it. A prompt's group is padded with zero rows to at least 4, so that
// every row takes the GEMM: its bits then do not depend on how many other tokens of the step
// chose its expert (the batch invariance the serving engine relies on). A decode step keeps the
// GEMV at any count. Under expert parallelism the pairs routed to another rank's experts are
// zero rows.
// The pairs sorted by their local expert (E for another rank's), each expert's in step order:
// expert e's pairs are order[start[e], start[e + 1]).
struct ExpertOrder {
  std::vector<int64_t> start, order;
};

ExpertOrder sort_by_expert(const OpCall& c, const ExpertPairs& p) {
  const int64_t pairs = p.rows * p.k;
  std::vector<int64_t> expert(static_cast<size_t>(pairs));
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t e = p.sharded ? int64_t(c.i32(2)[i]) - p.first : clamp_index(c.i32(2)[i], p.E);
    expert[size_t(i)] = e >= 0 && e < p.E ? e : p.E;
  }
  ExpertOrder o{std::vector<int64_t>(size_t(p.E + 2), 0), std::vector<int64_t>(size_t(pairs))};
  for (int64_t e : expert) ++o.start[size_t(e) + 1];
  std::partial_sum(o.start.begin(), o.start.end(), o.start.begin());
  std::vector<int64_t> next(o.start.begin(), o.start.end() - 1);
  for (int64_t i = 0; i < pairs; ++i) o.order[size_t(next[size_t(expert[size_t(i)])]++)] = i;
  return o;
}

template <class Mul>
void through_experts(const OpCall& c, Mul mul) {
  const ExpertPairs p = expert_pairs(c);
  const int64_t pairs = p.rows * p.k;
  const auto [start, order] = sort_by_expert(c, p);
  for (int64_t i = start[size_t(p.E)]; i < pairs; ++i)
    std::fill_n(c.out_f32() + order[size_t(i)] * p.N, p.N, 0.0f);
  int64_t most = 0;
  for (int64_t e = 0; e < p.E; ++e) most = std::max(most, start[size_t(e + 1)] - start[size_t(e)]);
  const int64_t cap = p.decode ? most : std::max<int64_t>(most, 4);
  const size_t need = size_t(cap * (p.K + p.N));
  if (c.scratch.size() < need) c.scratch.resize(need);
  float* X = c.scratch.data();
  float* Y = X + cap * p.K;
  const auto kind = p.decode ? cpu::LinearRows::kDecode : cpu::LinearRows::kAny;
  for (int64_t e = 0; e < p.E; ++e) {
    const int64_t m = start[size_t(e + 1)] - start[size_t(e)];
    if (m == 0) continue;
    const int64_t* at = order.data() + start[size_t(e)];
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(X + i * p.K, c.f32(0) + (p.per_slot ? at[i] : at[i] / p.k) * p.K,
                  size_t(p.K) * sizeof(float));
    const int64_t rows = p.decode ? m : std::max<int64_t>(m, 4);
    std::fill(X + m * p.K, X + rows * p.K, 0.0f);
    mul(e, X, Y, rows, kind);
    for (int64_t i = 0; i < m; ++i) {
      float* y = c.out_f32() + at[i] * p.N;
      std::memcpy(y, Y + i * p.N, size_t(p.N) * sizeof(float));
      if (p.bias)
        for (int64_t j = 0; j < p.N; ++j) y[j] += p.bias[e * p.N + j];
    }
  }
}

void linear_id(const OpCall& c) {
  const Shape& w = c.in_type(1).shape;  // (E, N, K)
  const DType wt = c.in_type(1).dtype;
  const size_t expert_bytes = size_t(w[1] * w[2]) * dtype_size(wt);
  through_experts(c, [&](int64_t e, const float* x, float* y, int64_t m, cpu::LinearRows kind) {
    cpu::linear(x, static_cast<const char*>(c.in[1]) + size_t(e) * expert_bytes, wt, nullptr, y, m,
                w[1], w[2], pool(), kind);
  });
}

// The experts' int8 rows or int4 tiles, each at its offset in the stacked operands.
void linear_id_quant(const OpCall& c) {
  const graph::LinearQuantAttrs& q = c.n.attrs_as<graph::LinearIdAttrs>().quant;
  const ExpertPairs p = expert_pairs(c);
  const int64_t w_each = shape_numel(c.in_type(1).shape) / p.E;  // bytes
  const int64_t s_each = shape_numel(c.in_type(3).shape) / p.E;  // scales, and zero points
  through_experts(c, [&](int64_t e, const float* x, float* y, int64_t m, cpu::LinearRows kind) {
    const auto* w = static_cast<const uint8_t*>(c.in[1]) + e * w_each;
    if (q.scheme == graph::QuantScheme::kInt8) {
      cpu::linear_int8(x, reinterpret_cast<const int8_t*>(w), c.f32(3) + e * s_each, nullptr, y, m,
                       p.N, p.K, pool(), kind);
      return;
    }
    if (q.scheme == graph::QuantScheme::kMxfp4) {
      cpu::linear_mxfp4(x, w, static_cast<const uint8_t*>(c.in[3]) + e * s_each, nullptr, y, m, p.N,
                        p.K, pool(), kind);
      return;
    }
    const uint8_t* zero = q.has_zero ? static_cast<const uint8_t*>(c.in[4]) + e * s_each : nullptr;
    cpu::linear_int4(x, w, static_cast<const uint16_t*>(c.in[3]) + e * s_each, zero, nullptr, y, m,
                     p.N, p.K, pool(), kind);
  });
}

// The rows of a linear-attention node (cpu::RecurrentRows): a static cache's, whose row b holds
// its state at b and whose tokens are real where the key mask says, at the step's start; or the
// paged form's, by slot and position.
cpu::RecurrentRows recurrent_rows(const OpCall& c, int64_t B, int64_t T) {
  const int at = graph::side_written_operand(c.n.op);
  const graph::TensorType& st = c.in_type(size_t(at));
  const int64_t each = shape_numel(st.shape) / st.shape[0];
  auto* state = static_cast<float*>(c.in[size_t(at)]);
  cpu::RecurrentRows r{std::vector<float*>(size_t(B)), std::vector<uint8_t>(size_t(B)),
                       std::vector<uint8_t>(size_t(B * T))};
  const bool paged = c.n.op == Op::kPagedCausalConv1d || c.n.op == Op::kPagedGatedDeltaRule;
  if (!paged) {
    const int32_t start = *c.i32(size_t(at) + 1);
    const int32_t* mask = c.i32(size_t(at) + 2);
    const int64_t S = c.in_type(size_t(at) + 2).shape[1];
    for (int64_t b = 0; b < B; ++b) {
      r.state[size_t(b)] = state + b * each;
      r.fresh[size_t(b)] = start == 0;
      for (int64_t t = 0; t < T; ++t)
        r.real[size_t(b * T + t)] = start + t < S && mask[b * S + start + t] != 0;
    }
    return r;
  }
  const int32_t* slots = c.i32(size_t(at) + 1);  // (B, 2): read, write
  const int32_t* pos = c.i32(size_t(at) + 2);
  const int64_t N = st.shape[0];
  for (int64_t b = 0; b < B; ++b) {
    const int32_t read = slots[2 * b], write = slots[2 * b + 1];
    TF_CHECK(read < N && write < N, c.n.name, ": state slots ", read, " and ", write,
             " of a pool of ", N);
    bool seen = false;  // a real token: the first one says whether the row starts fresh
    for (int64_t t = 0; t < T; ++t) {
      const int32_t p = pos[b * T + t];
      r.real[size_t(b * T + t)] = p >= 0;
      if (p >= 0 && !std::exchange(seen, true)) r.fresh[size_t(b)] = p == 0;
    }
    if (write < 0) continue;  // a padding row: no state
    r.state[size_t(b)] = state + write * each;
    // The kernels update a state in place: one read elsewhere is copied where it goes first.
    if (!r.fresh[size_t(b)] && read >= 0 && read != write)
      std::memcpy(state + write * each, state + read * each, size_t(each) * sizeof(float));
  }
  return r;
}

void causal_conv1d(const OpCall& c) {
  const Shape& x = c.in_type(0).shape;  // (B,T,C)
  cpu::causal_conv1d(c.f32(0), c.f32(1), recurrent_rows(c, x[0], x[1]), c.out_f32(), x[0], x[1],
                     x[2], c.in_type(1).shape[1], pool());
}

void gated_delta_rule(const OpCall& c) {
  const Shape &qk = c.in_type(0).shape, &v = c.in_type(2).shape;
  cpu::gated_delta_rule(c.f32(0), c.f32(1), c.f32(2), c.f32(3), c.f32(4),
                        recurrent_rows(c, v[0], v[1]), c.out_f32(), v[0], v[1], qk[2], v[2], qk[3],
                        v[3], pool());
}

// The table, in Op's order (checked below).
constexpr std::pair<Op, Rule> kRules[] = {
    {Op::kParameter, nothing},
    {Op::kState, nothing},
    {Op::kInput, nothing},
    {Op::kEmbedding, embedding},
    {Op::kLinear, linear},
    {Op::kRMSNorm, rms_norm},
    {Op::kRope, rope},
    {Op::kSiluMul, silu_mul},
    {Op::kAdd, add},
    {Op::kReshape, nothing},
    {Op::kCacheWrite, cache_write},
    {Op::kAttention, attention},
    {Op::kTakeLast, take_last},
    {Op::kCustomCall, custom_call},
    {Op::kAllReduce, all_reduce},
    {Op::kAllGather, all_gather},
    {Op::kSlice, slice},
    {Op::kLinearQuant, linear_quant},
    {Op::kGeluTanhMul, gelu_tanh_mul},
    {Op::kScale, scale},
    {Op::kSoftcap, softcap},
    {Op::kPagedCacheWrite, paged_cache_write},
    {Op::kPagedAttention, paged_attention},
    {Op::kConvert, convert},
    {Op::kConstant, constant},
    {Op::kUnary, unary},
    {Op::kBinary, binary},
    {Op::kSelect, select},
    {Op::kReduce, reduce},
    {Op::kSoftmax, softmax},
    {Op::kTopK, top_k},
    {Op::kTakeAlong, take_along},
    {Op::kScatterAdd, scatter_add},
    {Op::kConcat, concat},
    {Op::kTranspose, transpose},
    {Op::kBroadcast, broadcast},
    {Op::kIota, iota},
    {Op::kCumsum, cumsum},
    {Op::kMatMul, matmul},
    {Op::kLinearId, linear_id},
    {Op::kLinearIdQuant, linear_id_quant},
    {Op::kCausalConv1d, causal_conv1d},
    {Op::kGatedDeltaRule, gated_delta_rule},
    {Op::kPagedCausalConv1d, causal_conv1d},
    {Op::kPagedGatedDeltaRule, gated_delta_rule},
};
static_assert(std::size(kRules) == graph::kOpCount, "the CPU has a rule for every op");
constexpr bool in_order() {
  for (size_t i = 0; i < std::size(kRules); ++i)
    if (size_t(kRules[i].first) != i) return false;
  return true;
}
static_assert(in_order(), "kRules lists the ops in Op's order");

}  // namespace

Rule rule(graph::Op op) {
  return size_t(op) < std::size(kRules) ? kRules[size_t(op)].second : nullptr;
}

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

}  // namespace tformers::backends::cpu_rules
