// Op consistency of the StableHLO lowering: each op's graph run by the CPU backend and, lowered,
// by XLA's CPU plugin, compared at the op tests' tolerances (tests/ops/ops_test_util.h); a
// deliberately broken lowering that the comparison must catch; and the errors for the ops that
// have no StableHLO form.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/pjrt/lower.h"
#include "backends/pjrt/pjrt_api.h"
#include "backends/pjrt/plugin_discovery.h"
#include "backends/quant.h"
#include "common/missing_dependency.h"
#include "core/cpu_features.h"
#include "distributed/fake_group.h"
#include "graph/builder.h"
#include "graph/ops.h"
#include "models/causal_lm_impl.h"
#include "ops/ops_test_util.h"
#include "test_device.h"
#include "tformers/error.h"
#include "tformers/model.h"

namespace tformers::backends::pjrt {
namespace {

using cpu::expect_close;
using cpu::kUbf16;
using cpu::nmse_tolerance;
using graph::GraphBuilder;
using graph::Op;
using graph::Value;

ElementType element_type(DType t) {
  switch (t) {
    case DType::f32:
      return ElementType::kF32;
    case DType::bf16:
      return ElementType::kBF16;
    case DType::f16:
      return ElementType::kF16;
    case DType::i32:
      return ElementType::kS32;
    case DType::i64:
      return ElementType::kS64;
    case DType::i8:
      return ElementType::kS8;
    case DType::u8:
      return ElementType::kU8;
  }
  throw InternalError("no PJRT element type");
}

Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::zeros(t.shape(), t.dtype());
  std::memcpy(c.raw(), t.raw(), t.nbytes());
  return c;
}

// Random contents: floats uniform in [lo, hi) rounded to the dtype, integers in [lo, hi].
Tensor random(std::mt19937& rng, Shape shape, DType dt, float lo = -1.0f, float hi = 1.0f) {
  const size_t n = size_t(shape_numel(shape));
  if (dt == DType::f32)
    return Tensor::from_vector<float>(shape, dt, cpu::random_f32(rng, n, lo, hi));
  if (dt == DType::bf16)
    return Tensor::from_vector<uint16_t>(shape, dt, cpu::random_tensor(rng, n, dt, lo, hi).h);
  Tensor t = Tensor::zeros(std::move(shape), dt);
  std::uniform_real_distribution<float> u(lo, hi);
  std::uniform_int_distribution<int> k{int(lo), int(hi)};
  for (size_t i = 0; i < n; ++i) {
    if (dt == DType::f16)
      t.data<uint16_t>()[i] = f32_to_f16(u(rng));
    else if (dt == DType::i8)
      t.data<int8_t>()[i] = int8_t(k(rng));
    else if (dt == DType::u8)
      t.data<uint8_t>()[i] = uint8_t(k(rng));
    else
      throw InternalError("random: integer inputs are given explicitly");
  }
  return t;
}

// t (d0, d1, d2, d3) as (d0, d2, d1, d3): a cache between the two KV layouts (graph.h).
Tensor swap_middle(const Tensor& t) {
  const Shape& d = t.shape();
  Tensor out = Tensor::zeros({d[0], d[2], d[1], d[3]}, t.dtype());
  const size_t row = size_t(d[3]) * dtype_size(t.dtype());
  for (int64_t a = 0; a < d[0]; ++a)
    for (int64_t i = 0; i < d[1]; ++i)
      for (int64_t j = 0; j < d[2]; ++j)
        std::memcpy(static_cast<char*>(out.raw()) + ((a * d[2] + j) * d[1] + i) * row,
                    static_cast<const char*>(t.raw()) + ((a * d[1] + i) * d[2] + j) * row, row);
  return out;
}

Tensor ints(Shape shape, std::vector<int32_t> v) {
  return Tensor::from_vector<int32_t>(std::move(shape), DType::i32, v);
}

std::vector<int32_t> int32s(const Tensor& t) {
  return {t.data<int32_t>(), t.data<int32_t>() + t.numel()};
}

// The host values of a graph's leaves, in the order of leaves(kParameter), (kState), (kInput).
struct Leaves {
  std::vector<Tensor> params, states, inputs;
};

// A graph being built, with the host values of its leaves, its KV caches in layout `kv`.
struct Case : Leaves {
  explicit Case(DType act, graph::KvLayout kv = graph::KvLayout::kHeadMajor) : b(act, kv) {}
  // A KV cache state given head-major (B or blocks, Hkv, positions, D), stored in the case's
  // layout.
  Value kv_state(const std::string& name, const Tensor& head_major) {
    return state(
        name, b.kv_layout() == graph::KvLayout::kHeadMajor ? head_major : swap_middle(head_major));
  }
  Value param(const std::string& name, Tensor t) {
    params.push_back(t);
    return b.parameter(name, {t.dtype(), t.shape()});
  }
  Value state(const std::string& name, Tensor t) {
    states.push_back(t);
    return b.state(name, {t.dtype(), t.shape()});
  }
  Value input(const std::string& name, Tensor t) {
    inputs.push_back(t);
    return b.input(name, {t.dtype(), t.shape()});
  }
  GraphBuilder b;
};

struct Results {
  std::vector<Tensor> outputs, states;
};

Results run_cpu(const graph::Graph& g, const Leaves& c) {
  auto backend = make_cpu_backend();
  auto exe = backend->compile(g);
  std::vector<std::shared_ptr<backends::Buffer>> params, states;
  std::vector<backends::Buffer*> p, s;
  for (const Tensor& t : c.params) p.push_back(params.emplace_back(backend->upload(t)).get());
  for (const Tensor& t : c.states)
    s.push_back(states.emplace_back(backend->upload(copy_of(t))).get());
  std::vector<const Tensor*> in;
  for (const Tensor& t : c.inputs) in.push_back(&t);
  Results r;
  for (int o : g.outputs())
    r.outputs.push_back(Tensor::zeros(g.node(o).type.shape, g.node(o).type.dtype));
  std::vector<Tensor*> out;
  for (Tensor& t : r.outputs) out.push_back(&t);
  exe->run(p, s, in, out);
  for (const auto& b : states) r.states.push_back(backend->download(*b));
  return r;
}

Tensor to_tensor(const pjrt::Buffer& b, const graph::TensorType& type) {
  EXPECT_EQ(b.element_type(), element_type(type.dtype));
  EXPECT_EQ(b.dims(), type.shape);
  const std::vector<std::byte> bytes = b.to_host();
  Tensor t = Tensor::zeros(type.shape, type.dtype);
  EXPECT_EQ(bytes.size(), t.nbytes());
  std::memcpy(t.raw(), bytes.data(), std::min(bytes.size(), t.nbytes()));
  return t;
}

Results run_xla(const Client& client, const std::string& mlir, const graph::Graph& g,
                const Leaves& c) {
  LoadedExecutable exe = client.compile(mlir);
  std::vector<pjrt::Buffer> buffers;
  for (const auto* list : {&c.params, &c.states, &c.inputs})
    for (const Tensor& t : *list)
      buffers.push_back(
          client.buffer_from_host(t.raw(), t.nbytes(), element_type(t.dtype()), t.shape()));
  std::vector<const pjrt::Buffer*> args;
  for (const pjrt::Buffer& b : buffers) args.push_back(&b);
  std::vector<pjrt::Buffer> out = exe.execute(args);
  const size_t num_outputs = g.outputs().size();
  EXPECT_EQ(out.size(), num_outputs + c.states.size());
  Results r;
  for (size_t i = 0; i < out.size(); ++i) {
    const int id = i < num_outputs ? g.outputs()[i] : g.leaves(graph::Op::kState)[i - num_outputs];
    (i < num_outputs ? r.outputs : r.states).push_back(to_tensor(out[i], g.node(id).type));
  }
  return r;
}

// One client for the suite (the plugin's start-up is paid once), on XLA's CPU plugin or the device
// of TFORMERS_PJRT_TEST_DEVICE; skips when its plugin is not installed, saying which package.
class Lower : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_reason_ = tformers::testing::missing_pjrt_plugin();
    if (!skip_reason_.empty()) return;
    client_ = new Client(Plugin::load(probe_plugin(tformers::testing::pjrt_test_device()).path));
  }
  static void TearDownTestSuite() {
    delete client_;
    client_ = nullptr;
  }
  void SetUp() override {
    if (!client_) TF_SKIP_MISSING_DEPENDENCY(skip_reason_);
  }

  // Runs the case both ways and compares every output and every state's new value at
  // `nmse_tol` (the measure and bound of tests/ops).
  static void expect_consistent(Case& c, double nmse_tol) {
    expect_consistent(c.b.finish(), c, nmse_tol);
  }
  static void expect_consistent(const graph::Graph& g, const Leaves& c, double nmse_tol) {
    expect_consistent(g, c, g, c, nmse_tol);
  }
  // A graph whose operands the two backends lay out differently (a quantized weight): the CPU
  // runs cpu_g on cpu_c, XLA g on c.
  static void expect_consistent(const graph::Graph& cpu_g, const Leaves& cpu_c,
                                const graph::Graph& g, const Leaves& c, double nmse_tol) {
    const LoweredModule m = lower(g);
    EXPECT_EQ(m.num_outputs, g.outputs().size());
    EXPECT_EQ(m.num_states, c.states.size());
    const Results want = run_cpu(cpu_g, cpu_c);
    const Results got = run_xla(*client_, m.mlir, g, c);
    ASSERT_EQ(got.outputs.size(), want.outputs.size());
    ASSERT_EQ(got.states.size(), want.states.size());
    // A cache in the other KV layout, compared in the CPU's.
    const bool swap = g.kv_layout() != cpu_g.kv_layout();
    for (size_t i = 0; i < want.outputs.size(); ++i) {
      const Op op = g.node(g.outputs()[i]).op;
      const bool cache = op == Op::kCacheWrite || op == Op::kPagedCacheWrite;
      if (want.outputs[i].dtype() == DType::i32) {  // indices: exact
        EXPECT_EQ(int32s(got.outputs[i]), int32s(want.outputs[i])) << "output " << i << " of\n"
                                                                   << g.to_string();
        continue;
      }
      expect_close((swap && cache ? swap_middle(got.outputs[i]) : got.outputs[i]).to_f32_vector(),
                   want.outputs[i].to_f32_vector(), nmse_tol,
                   "output " + std::to_string(i) + " of\n" + g.to_string());
    }
    for (size_t i = 0; i < want.states.size(); ++i) {
      const std::string what = "state " + std::to_string(i) + " of\n" + g.to_string();
      const Tensor got_state =
          swap && got.states[i].ndim() == 4 ? swap_middle(got.states[i]) : got.states[i];
      if (is_float(want.states[i].dtype()))
        expect_close(got_state.to_f32_vector(), want.states[i].to_f32_vector(), nmse_tol, what);
      else  // a key mask, passed through
        EXPECT_EQ(std::memcmp(got_state.raw(), want.states[i].raw(), want.states[i].nbytes()), 0)
            << what;
    }
  }

  // The graph `build` makes on a Case, on the CPU with head-major caches (its only layout), and
  // lowered with caches in each layout (token-major: the same values, transposed).
  template <class Build>
  static void expect_consistent_in_both_layouts(DType act, Build build, double nmse_tol) {
    Case cpu(act);
    build(cpu);
    const graph::Graph cpu_g = cpu.b.finish();
    for (graph::KvLayout kv : {graph::KvLayout::kHeadMajor, graph::KvLayout::kTokenMajor}) {
      SCOPED_TRACE(graph::kv_layout_name(kv));
      Case xla(act, kv);
      build(xla);
      expect_consistent(cpu_g, cpu, xla.b.finish(), xla, nmse_tol);
    }
  }

  static inline Client* client_ = nullptr;
  static inline std::string skip_reason_;
};

// The same tests on float32 and bfloat16 activation graphs.
class LowerOps : public Lower, public ::testing::WithParamInterface<DType> {
 protected:
  DType act() const { return GetParam(); }
  bool bf16() const { return act() == DType::bf16; }
  // The CPU backend keeps every intermediate value in f32 where the lowering rounds it to the
  // activation dtype: each such rounding adds up to bf16's unit roundoff squared to the NMSE.
  double tol(int64_t terms, int roundings = 0, bool cpu_rounds_x = false) const {
    return nmse_tolerance(terms, bf16() || cpu_rounds_x) +
           (bf16() ? roundings * kUbf16 * kUbf16 : 0.0);
  }
};

// The CPU's own rounding of x (shape xs) in its linear kernels (backends/cpu/kernels.h; tests/ops
// allows the same) on AVX-512 BF16: the GEMM (prompt rows, M >= 4) rounds x to bf16 for bf16 and
// quantized weights, the GEMV (decode rows, (..., 1, K), or M < 4) for bf16 weights.
bool cpu_rounds_x_to_bf16(const Shape& xs, bool bf16_weights, bool quantized) {
  const int64_t M = shape_numel(xs) / xs.back();
  const bool decode = xs.size() >= 3 && xs[xs.size() - 2] == 1, gemm = !decode && M >= 4;
  return cpu::active_target() >= cpu::Target::kAVX512BF16 &&
         (gemm ? bf16_weights || quantized : bf16_weights);
}
// The int8 and int4 GEMVs (M < 4) round x to int8 per block on the SIMD targets; tests/ops
// allows them 2^-14 more.
double gemv_int8(int64_t M) { return M < 4 ? 0x1p-14 : 0.0; }

TEST_P(LowerOps, Elementwise) {
  std::mt19937 rng(1);
  Case c(act());
  const Value x = c.input("x", random(rng, {2, 3, 40}, act(), -3.0f, 3.0f));
  const Value y = c.input("y", random(rng, {2, 3, 40}, act(), -3.0f, 3.0f));
  c.b.output(c.b.add(x, y));
  c.b.output(c.b.scale(x, 1.7f));
  c.b.output(c.b.softcap(x, 0.8f));
  c.b.output(c.b.silu_mul(x, y));
  c.b.output(c.b.gelu_tanh_mul(x, y));
  expect_consistent(c, tol(8));
}

TEST_P(LowerOps, ReshapeTakeLastAndSliceMoveValuesExactly) {
  std::mt19937 rng(2);
  Case c(act());
  const Value x = c.input("x", random(rng, {2, 5, 12}, act()));
  c.b.output(c.b.reshape(x, {10, 12}));
  c.b.output(c.b.take_last(x, 1));
  c.b.output(c.b.take_last(x, 3));
  c.b.output(c.b.slice_last(x, 3, 9));
  // Rank 2 of 3's piece of 5: columns 10 and 11, then 3 of padding.
  c.b.output(c.b.shard_last(x, 5, distributed::fake_group_id(2, 3)));
  expect_consistent(c, 0.0);
}

TEST_P(LowerOps, EmbeddingWholeTableAndShard) {
  std::mt19937 rng(3);
  Case c(act());
  const Value table = c.param("table", random(rng, {11, 6}, act()));
  const Value shard = c.param("shard", random(rng, {4, 6}, act()));
  const Value ids = c.input("ids", ints({2, 3}, {0, 10, 4, 8, 3, 9}));
  c.b.output(c.b.embedding(table, ids));
  // Rank 1 of 3 holds rows [4, 8) of 11: ids 0, 10, 8, 3 and 9 fall outside and give zero rows.
  c.b.output(c.b.embedding_shard(shard, ids, 11, distributed::fake_group_id(1, 3)));
  expect_consistent(c, 0.0);
}

TEST_P(LowerOps, LinearWithAndWithoutBias) {
  constexpr int64_t K = 37, N = 9;  // odd K
  for (const Shape& xs : {Shape{1, 1, K}, Shape{2, 3, K}}) {
    for (DType wt : {DType::f32, DType::bf16}) {
      for (bool bias : {false, true}) {
        SCOPED_TRACE(shape_str(xs) + " " + std::string(dtype_name(wt)) + (bias ? " bias" : ""));
        std::mt19937 rng(4);
        Case c(act());
        const Value x = c.input("x", random(rng, xs, act()));
        const Value w = c.param("w", random(rng, {N, K}, wt));
        const Value b = bias ? c.param("b", random(rng, {N}, wt)) : -1;
        c.b.output(c.b.linear(x, w, b));
        expect_consistent(c, tol(K, 0, cpu_rounds_x_to_bf16(xs, wt == DType::bf16, false)));
      }
    }
  }
}

TEST_P(LowerOps, RMSNorm) {
  for (bool unit_offset : {false, true}) {
    SCOPED_TRACE(unit_offset ? "unit offset" : "plain");
    std::mt19937 rng(5);
    Case c(act());
    const Value x = c.input("x", random(rng, {2, 3, 24}, act(), -2.0f, 2.0f));
    const Value w = c.param("w", random(rng, {24}, act(), 0.5f, 1.5f));
    c.b.output(c.b.rms_norm(x, w, 1e-5f, {.unit_offset = unit_offset}, "norm"));
    expect_consistent(c, tol(24));
  }
}

TEST_P(LowerOps, RopeWholePartialAndInterleaved) {
  struct Variant {
    int64_t rotary_dim;
    bool interleaved;
  };
  for (Variant v : {Variant{0, false}, Variant{4, false}, Variant{8, true}, Variant{4, true}}) {
    for (int64_t T : {1, 3}) {
      SCOPED_TRACE("rotary_dim " + std::to_string(v.rotary_dim) +
                   (v.interleaved ? " interleaved" : "") + " T " + std::to_string(T));
      std::mt19937 rng(6);
      Case c(act());
      const Value x = c.input("x", random(rng, {2, T, 3, 8}, act()));
      std::vector<int32_t> pos;
      for (int64_t i = 0; i < 2 * T; ++i) pos.push_back(int32_t(7 * i + 3));
      const Value p = c.input("pos", ints({2, T}, pos));
      const int64_t rd = v.rotary_dim ? v.rotary_dim : 8;
      std::vector<float> inv_freq;
      for (int64_t i = 0; i < rd / 2; ++i)
        inv_freq.push_back(std::pow(100.0f, -2.0f * float(i) / float(rd)));
      c.b.output(c.b.rope(x, p, inv_freq,
                          {.rotary_dim = v.rotary_dim, .interleaved = v.interleaved}, "rope"));
      expect_consistent(c, tol(4));
    }
  }
}

// T tokens written at slot 5 of a cache that holds a history, in either cache dtype (a bf16
// cache under f32 activations rounds the new values; one in f32 under bf16 widens them). The
// written cache is also an output: one value is a result and a donated state's new value.
TEST_P(LowerOps, CacheWriteAtAStart) {
  for (DType cache_dtype : {DType::f32, DType::bf16}) {
    for (int64_t T : {1, 3}) {
      SCOPED_TRACE(std::string(dtype_name(cache_dtype)) + " cache, T " + std::to_string(T));
      expect_consistent_in_both_layouts(
          act(),
          [&](Case& c) {
            std::mt19937 rng(7);
            const Value cache = c.kv_state("cache", random(rng, {2, 2, 8, 4}, cache_dtype));
            const Value update = c.input("new", random(rng, {2, T, 2, 4}, act()));
            const Value start = c.input("start", ints({}, {5}));
            c.b.output(c.b.cache_write(cache, update, start, "write"));
          },
          0.0);
    }
  }
}

// Attention sinks (gpt-oss): none, one per query head about the size of the scores, or far above
// them (each softmax then gives its keys almost nothing, and the output is nearly zero).
enum class Sinks { kNone, kRandom, kDominant };

struct AttentionCase {
  std::string what;
  int64_t T, start, Hq, Hkv;
  bool mask = false;
  graph::AttentionOptions o = {};
  Sinks sinks = Sinks::kNone;
};

constexpr graph::AttentionOptions kWindowAndCap{.sliding_window = 4, .softcap = 1.5f};

const AttentionCase kAttentionCases[] = {
    {"decode", 1, 5, 4, 2},
    {"prefill at 0", 4, 0, 4, 4},
    {"chunk at 3 with GQA", 4, 3, 6, 2},
    {"key mask with zeros", 3, 4, 4, 2, true},
    {"sliding window", 4, 5, 4, 2, false, {.sliding_window = 3}},
    {"softcap", 2, 6, 4, 1, false, {.softcap = 0.8f}},
    {"window, softcap and mask", 3, 6, 4, 2, true, {.sliding_window = 4, .softcap = 1.5f}},
    {"sinks, decode", 1, 5, 4, 2, false, {}, Sinks::kRandom},
    {"sinks, chunk at 3 with GQA", 4, 3, 6, 2, false, {}, Sinks::kRandom},
    // The mask hides every key of row 1's first query: zeros, sinks or not.
    {"sinks, window, softcap and mask", 3, 6, 4, 2, true, kWindowAndCap, Sinks::kRandom},
    {"dominant sinks", 3, 4, 4, 2, true, {}, Sinks::kDominant},
};

// A (Hq) parameter of sinks in the activation dtype, or -1 for none.
Value sinks_param(Case& c, std::mt19937& rng, Sinks sinks, int64_t Hq, DType act) {
  if (sinks == Sinks::kNone) return -1;
  const bool dominant = sinks == Sinks::kDominant;
  return c.param("sinks",
                 random(rng, {Hq}, act, dominant ? 20.0f : -1.0f, dominant ? 24.0f : 3.0f));
}

// Writes T new keys and values at `start` into caches that already hold a history, then
// attends: the step a decoder layer takes.
TEST_P(LowerOps, CacheWriteThenAttention) {
  constexpr int64_t B = 2, S = 12, D = 8;
  for (const AttentionCase& a : kAttentionCases) {
    SCOPED_TRACE(a.what);
    auto build = [&](Case& c) {
      std::mt19937 rng(8);
      const Value kc = c.kv_state("k", random(rng, {B, a.Hkv, S, D}, act()));
      const Value vc = c.kv_state("v", random(rng, {B, a.Hkv, S, D}, act()));
      const Value q = c.input("q", random(rng, {B, a.T, a.Hq, D}, act(), -2.0f, 2.0f));
      const Value k = c.input("k_new", random(rng, {B, a.T, a.Hkv, D}, act(), -2.0f, 2.0f));
      const Value v = c.input("v_new", random(rng, {B, a.T, a.Hkv, D}, act()));
      const Value start = c.input("start", ints({}, {int32_t(a.start)}));
      Value mask = -1;
      if (a.mask) {
        // Row 0 masks every other slot; row 1 masks every slot its first query sees, which
        // must then give zeros.
        std::vector<int32_t> m(size_t(B * S), 1);
        for (int64_t j = 0; j < S; j += 2) m[size_t(j)] = 0;
        for (int64_t j = 0; j <= a.start; ++j) m[size_t(S + j)] = 0;
        mask = c.input("mask", ints({B, S}, m));
      }
      const Value kw = c.b.cache_write(kc, k, start), vw = c.b.cache_write(vc, v, start);
      graph::AttentionOptions o = a.o;
      o.sinks = sinks_param(c, rng, a.sinks, a.Hq, act());
      c.b.output(c.b.attention(q, kw, vw, start, mask, 0.35f, o, "attn"));
    };
    expect_consistent_in_both_layouts(act(), build, tol(D + a.start + a.T + 8, 2));
  }
}

// A ragged paged step: row 0 decodes at position 9 (its third block) behind two padding
// slots, row 1 prefills positions 2..4 across a block boundary, row 2 is all padding. The
// pools hold other sequences' values in the blocks nobody's table names. Plain, with a window and
// a soft cap, and either with attention sinks (the padding queries' zeros included).
TEST_P(LowerOps, PagedWriteThenAttention) {
  constexpr int64_t NB = 7, Hkv = 2, BS = 4, D = 8, B = 3, T = 3, MB = 3, Hq = 4;
  const graph::AttentionOptions plain{}, capped{.sliding_window = 3, .softcap = 0.9f};
  for (const std::pair<graph::AttentionOptions, Sinks>& variant :
       {std::pair{plain, Sinks::kNone}, std::pair{capped, Sinks::kNone},
        std::pair{plain, Sinks::kRandom}, std::pair{capped, Sinks::kRandom}}) {
    SCOPED_TRACE(std::string(variant.first.sliding_window ? "window and softcap" : "plain") +
                 (variant.second == Sinks::kNone ? "" : ", sinks"));
    auto build = [&](Case& c) {
      std::mt19937 rng(9);
      const Value kp = c.kv_state("k_pool", random(rng, {NB, Hkv, BS, D}, act()));
      const Value vp = c.kv_state("v_pool", random(rng, {NB, Hkv, BS, D}, act()));
      const Value q = c.input("q", random(rng, {B, T, Hq, D}, act(), -2.0f, 2.0f));
      const Value k = c.input("k_new", random(rng, {B, T, Hkv, D}, act(), -2.0f, 2.0f));
      const Value v = c.input("v_new", random(rng, {B, T, Hkv, D}, act()));
      const Value table = c.input("table", ints({B, MB}, {5, 1, 3, 0, 2, 4, 6, 6, 6}));
      const Value pos = c.input("pos", ints({B, T}, {-1, -1, 9, 2, 3, 4, -1, -1, -1}));
      const Value kw = c.b.paged_cache_write(kp, k, table, pos, "k_write");
      const Value vw = c.b.paged_cache_write(vp, v, table, pos, "v_write");
      graph::AttentionOptions o = variant.first;
      o.sinks = sinks_param(c, rng, variant.second, Hq, act());
      c.b.output(c.b.paged_attention(q, kw, vw, table, pos, 0.35f, o, "attn"));
    };
    expect_consistent_in_both_layouts(act(), build, tol(D + MB * BS + 8, 2));
  }
}

TEST_P(LowerOps, LinearInt8OddKWithAndWithoutBias) {
  constexpr int64_t K = 45, N = 10, nb = 2;
  for (int64_t M : {1, 5}) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE("M " + std::to_string(M) + (bias ? " bias" : ""));
      std::mt19937 rng(10);
      Case c(act());
      const Value x = c.input("x", random(rng, {M, K}, act()));
      const Value w = c.param("w", random(rng, {N, K}, DType::i8, -127, 127));
      const Value s = c.param("scale", random(rng, {N, nb}, DType::f32, 0.001f, 0.02f));
      const Value b = bias ? c.param("b", random(rng, {N}, DType::f32)) : -1;
      c.b.output(c.b.linear_quant(x, w, s, -1, b, {graph::QuantScheme::kInt8}));
      expect_consistent(
          c, tol(2 * K + 2, 1, cpu_rounds_x_to_bf16({M, K}, false, true)) + gemv_int8(M));
    }
  }
}

// One int4 weight, random tiles, run as tiles on the CPU and as the rows PjrtBackend makes of
// them (backends::to_rows) through the lowering.
TEST_P(LowerOps, LinearInt4OddKWithAndWithoutZeroAndBias) {
  constexpr int64_t K = 45, N = 16, nb = 2, G = N / graph::kInt4Rows;
  for (int64_t M : {1, 5}) {
    for (bool zero : {false, true}) {
      for (bool bias : {false, true}) {
        SCOPED_TRACE("M " + std::to_string(M) + (zero ? " zero" : "") + (bias ? " bias" : ""));
        std::mt19937 rng(11);
        backends::QuantizedLinear tiles{graph::QuantScheme::kInt4,
                                        graph::QuantLayout::kTiles,
                                        N,
                                        K,
                                        random(rng, {G, nb, 128}, DType::u8, 0, 255),
                                        random(rng, {G, nb, 8}, DType::f16, 0.001f, 0.02f)};
        if (zero) tiles.zero = random(rng, {G, nb, 8}, DType::u8, 0, 15);
        const Tensor x = random(rng, {M, K}, act());
        const Tensor bt = random(rng, {N}, DType::f32);
        Case cpu(act()), xla(act());
        for (auto [c, q] : {std::pair{&cpu, tiles}, std::pair{&xla, backends::to_rows(tiles)}}) {
          const Value xv = c->input("x", x);
          const Value w = c->param("w", q.weight), s = c->param("scale", q.scale);
          const Value z = zero ? c->param("zero", *q.zero) : -1;
          const Value b = bias ? c->param("b", bt) : -1;
          c->b.output(c->b.linear_quant(xv, w, s, z, b, q.attrs()));
        }
        const graph::Graph cpu_g = cpu.b.finish();
        expect_consistent(
            cpu_g, cpu, xla.b.finish(), xla,
            tol(2 * K + 2, 1, cpu_rounds_x_to_bf16({M, K}, false, true)) + gemv_int8(M));
      }
    }
  }
}

// ---- The primitives (graph.h), each on both backends ----

TEST_P(LowerOps, UnaryFunctions) {
  std::mt19937 rng(20);
  Case c(act());
  const Value x = c.input("x", random(rng, {3, 17}, act(), -3.0f, 3.0f));
  const Value pos = c.input("pos", random(rng, {3, 17}, act(), 0.1f, 4.0f));  // log, sqrt
  for (graph::UnaryFn fn :
       {graph::UnaryFn::kExp, graph::UnaryFn::kNeg, graph::UnaryFn::kTanh, graph::UnaryFn::kSigmoid,
        graph::UnaryFn::kSilu, graph::UnaryFn::kGeluTanh, graph::UnaryFn::kSoftplus})
    c.b.output(c.b.unary(fn, x, graph::unary_name(fn)));
  for (graph::UnaryFn fn : {graph::UnaryFn::kLog, graph::UnaryFn::kSqrt, graph::UnaryFn::kRsqrt})
    c.b.output(c.b.unary(fn, pos, graph::unary_name(fn)));
  expect_consistent(c, tol(4));
}

// Every binary function, on equal shapes, a row broadcast, a column broadcast and a scalar
// constant; int32 operands too.
TEST_P(LowerOps, BinaryFunctionsBroadcastAndConstants) {
  std::mt19937 rng(21);
  Case c(act());
  const Value a = c.input("a", random(rng, {2, 3, 8}, act(), -2.0f, 2.0f));
  const Value row = c.input("row", random(rng, {8}, act(), 0.5f, 2.0f));
  const Value col = c.param("col", random(rng, {2, 3, 1}, DType::f32, 0.5f, 2.0f));
  const Value k = c.b.constant(1.25, {act(), {}});
  for (graph::BinaryFn fn : {graph::BinaryFn::kAdd, graph::BinaryFn::kSub, graph::BinaryFn::kMul,
                             graph::BinaryFn::kDiv, graph::BinaryFn::kMax, graph::BinaryFn::kMin}) {
    c.b.output(c.b.binary(fn, a, row));
    c.b.output(c.b.binary(fn, col, a));
    c.b.output(c.b.binary(fn, a, k));
  }
  const Value i = c.input("i", ints({2, 4}, {5, -3, 7, 0, 2, 9, -8, 4}));
  const Value j = c.input("j", ints({4}, {3, 2, -5, 1}));
  for (graph::BinaryFn fn : {graph::BinaryFn::kAdd, graph::BinaryFn::kSub, graph::BinaryFn::kMul,
                             graph::BinaryFn::kDiv, graph::BinaryFn::kMax, graph::BinaryFn::kMin})
    c.b.output(c.b.binary(fn, i, j));
  c.b.output(c.b.constant(-7, {DType::i32, {3}}));
  expect_consistent(c, tol(2));
}

TEST_P(LowerOps, SelectReduceAndSoftmax) {
  std::mt19937 rng(22);
  Case c(act());
  const Value x = c.input("x", random(rng, {2, 5, 9}, act(), -4.0f, 4.0f));
  const Value y = c.input("y", random(rng, {9}, act()));
  const Value p =
      c.input("p", ints({2, 1, 9}, {1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1}));
  c.b.output(c.b.select(p, x, y));
  for (int64_t axis : {0, 1, 2}) {
    c.b.output(c.b.reduce(graph::ReduceFn::kSum, x, axis));
    c.b.output(c.b.reduce(graph::ReduceFn::kMax, x, axis));
  }
  c.b.output(c.b.softmax(x));
  expect_consistent(c, tol(9));
}

// Indices are exact: top-k with ties (the lower index first), gathers and scatters along the last
// dim (out-of-row indices clamped by a gather and dropped by a scatter, as XLA does).
TEST_P(LowerOps, TopKTakeAlongAndScatterAdd) {
  Case c(act());
  const std::vector<float> v = {0.5f, -1.0f, 2.0f,  0.5f, 3.0f, 2.0f, -0.25f, 1.0f,
                                1.0f, 1.0f,  -2.0f, 1.0f, 0.0f, 4.0f, 4.0f,   -1.0f};
  Tensor xs = Tensor::from_vector<float>({2, 8}, DType::f32, v);
  const Value x = c.input("x", act() == DType::f32 ? xs : xs.to(act()));
  const Value top = c.b.top_k(x, 3);
  c.b.output(top);
  c.b.output(c.b.take_along(x, top));
  const Value idx = c.input("idx", ints({2, 3}, {7, 0, 7, 9, -1, 2}));
  c.b.output(c.b.take_along(x, idx));
  const Value src = c.input(
      "src", Tensor::from_vector<float>({2, 3}, DType::f32, {1.0f, 2.0f, 4.0f, 8.0f, 16.0f, 32.0f})
                 .to(act()));
  c.b.output(c.b.scatter_add(x, idx, src));
  expect_consistent(c, 0.0);
}

TEST_P(LowerOps, ConcatTransposeBroadcastIotaCumsum) {
  std::mt19937 rng(23);
  Case c(act());
  const Value a = c.input("a", random(rng, {2, 3, 4}, act()));
  const Value b = c.input("b", random(rng, {2, 1, 4}, act()));
  c.b.output(c.b.concat({a, b, a}, 1));
  c.b.output(c.b.transpose(a, {2, 0, 1}));
  c.b.output(c.b.broadcast(b, {5, 2, 3, 4}));
  c.b.output(c.b.iota({DType::i32, {3, 4}}, 1));
  c.b.output(c.b.iota({act(), {3, 4}}, 0));
  c.b.output(c.b.cumsum(c.input("i", ints({2, 3}, {1, 2, 3, 4, 5, 6})), 1));
  expect_consistent(c, 0.0);
  Case s(act());
  s.b.output(s.b.cumsum(s.input("x", random(rng, {3, 7, 2}, act())), 1));
  expect_consistent(s, tol(7));
}

TEST_P(LowerOps, MatMulAndExpertLinear) {
  std::mt19937 rng(24);
  Case c(act());
  c.b.output(c.b.matmul(c.input("a", random(rng, {2, 3, 16}, act())),
                        c.input("b", random(rng, {2, 16, 5}, act()))));
  // 4 tokens, each through 2 of 3 experts of 6 outputs by 16 inputs.
  const Value x = c.input("x", random(rng, {1, 4, 16}, act()));
  const Value w = c.param("experts", random(rng, {3, 6, 16}, act()));
  const Value idx = c.input("idx", ints({1, 4, 2}, {0, 2, 1, 0, 2, 2, 1, 1}));
  c.b.output(c.b.linear_id(x, w, idx));
  // Each slot's own input (an expert's hidden units into its down projection).
  const Value h = c.input("h", random(rng, {1, 4, 2, 6}, act()));
  c.b.output(c.b.linear_id(h, c.param("down", random(rng, {3, 16, 6}, act())), idx));
  expect_consistent(c, tol(16, 0, cpu_rounds_x_to_bf16({1, 1, 16}, bf16(), false)));
}

// Quantized experts as the loader prepares them (Backend::prepare_experts): the CPU reads each
// routed expert's int8 rows or int4 tiles at its offset in the stacked operands; XLA dequantizes
// the rows of every expert and multiplies.
TEST_P(LowerOps, QuantizedExpertLinear) {
  constexpr int64_t E = 3, N = 16, K = 45, M = 4;
  for (const char* scheme : {"int8", "int4"}) {
    SCOPED_TRACE(scheme);
    std::mt19937 rng(26);
    const backends::QuantizedLinear q =
        backends::quantize_on_host(random(rng, {E * N, K}, DType::f32), scheme);
    const Tensor x = random(rng, {1, M, K}, act());
    const Tensor idx = ints({1, M, 2}, {0, 2, 1, 0, 2, 2, 1, 1});
    Case cpu(act()), xla(act());
    for (auto [c, laid] : {std::pair{&cpu, q}, std::pair{&xla, backends::to_rows(q)}}) {
      auto stacked = [&](const Tensor& t) {
        Shape shape = t.shape();
        shape[0] /= E;
        shape.insert(shape.begin(), E);
        return t.reshape(shape);
      };
      const Value w = c->param("experts", stacked(laid.weight));
      const Value s = c->param("scale", stacked(laid.scale));
      c->b.output(
          c->b.linear_id_quant(c->input("x", x), w, c->input("idx", idx), s, -1, laid.attrs()));
    }
    const graph::Graph cpu_g = cpu.b.finish();
    expect_consistent(
        cpu_g, cpu, xla.b.finish(), xla,
        tol(2 * K + 2, 1, cpu_rounds_x_to_bf16({1, 1, K}, false, true)) + gemv_int8(1));
  }
}

// Each composite through its decomposition into primitives, on both backends, against the CPU's
// fused rule: the decompositions compute what the fused ops compute.
TEST_P(LowerOps, CompositesThroughTheirDecompositions) {
  std::mt19937 rng(25);
  Case c(act());
  const Value x = c.input("x", random(rng, {2, 3, 24}, act(), -3.0f, 3.0f));
  const Value y = c.input("y", random(rng, {2, 3, 24}, act(), -3.0f, 3.0f));
  const Value w = c.param("w", random(rng, {24}, act()));
  c.b.output(c.b.add(x, y));
  c.b.output(c.b.scale(x, 1.7f));
  c.b.output(c.b.softcap(x, 0.8f));
  c.b.output(c.b.silu_mul(x, y));
  c.b.output(c.b.gelu_tanh_mul(x, y));
  c.b.output(c.b.rms_norm(x, w, 1e-5f));
  c.b.output(c.b.rms_norm(x, w, 1e-6f, {.unit_offset = true}, "gemma"));
  c.b.output(c.b.softmax(x));
  const graph::Graph fused = c.b.finish();
  const graph::Graph primitive =
      graph::decompose(fused, [](const graph::Node& n) { return !graph::op_def(n.op).decompose; });
  for (const graph::Node& n : primitive.nodes())
    EXPECT_FALSE(graph::op_def(n.op).decompose) << graph::op_name(n.op) << " left";
  expect_consistent(fused, c, primitive, c, tol(24, 4));
  const Results cpu_fused = run_cpu(fused, c), cpu_primitive = run_cpu(primitive, c);
  for (size_t i = 0; i < cpu_fused.outputs.size(); ++i)
    expect_close(cpu_primitive.outputs[i].to_f32_vector(), cpu_fused.outputs[i].to_f32_vector(),
                 tol(24, 4), "CPU output " + std::to_string(i));
}

// The per-token inputs of a step of the linear-attention ops: x (B,T,C) for the convolution and
// q, k (B,T,Hk,Dk), v (B,T,H,Dv), g (a log decay) and beta (B,T,H) for the delta rule.
struct RecurrentInputs {
  Value x, q, k, v, g, beta;
};
RecurrentInputs recurrent_inputs(Case& c, std::mt19937& rng, DType act, int64_t B, int64_t T,
                                 int64_t C, int64_t Hk, int64_t H, int64_t Dk, int64_t Dv) {
  return {c.input("x", random(rng, {B, T, C}, act, -2.0f, 2.0f)),
          c.input("q", random(rng, {B, T, Hk, Dk}, act)),
          c.input("k", random(rng, {B, T, Hk, Dk}, act, -0.6f, 0.6f)),
          c.input("v", random(rng, {B, T, H, Dv}, act, -2.0f, 2.0f)),
          c.input("g", random(rng, {B, T, H}, act, -1.0f, -0.05f)),
          c.input("beta", random(rng, {B, T, H}, act, 0.1f, 0.9f))};
}

// Gated DeltaNet's ops over their recurrent states (Hk = 2 key heads read by H = 4 value heads):
// an 8-token prefill at start 0, whose states hold old nonzero values that must count as zeros,
// then a 3-token continuation at 8 and a decode step at 11 from the states each call left. Row 0
// is left-padded by two slots of the key mask; row 1 has padding in the middle of its prefill
// (slots 3 and 4) and at the start of its continuation (slot 8), as a kept cache continued
// has: a padding token is skipped, so the convolution's window holds the last real inputs
// across it. Each call's outputs and both states match the CPU's; the states stay f32 under
// bf16 activations.
TEST_P(LowerOps, CausalConv1dAndGatedDeltaRule) {
  constexpr int64_t B = 2, S = 12, Hk = 2, H = 4, Dk = 3, Dv = 5, C = 7, K = 4;
  const Tensor mask = ints({B, S}, {0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,    //
                                    1, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1});  //
  std::mt19937 rng(27);
  const Tensor w = random(rng, {C, K}, act());
  std::vector<Tensor> states = {random(rng, {B, K - 1, C}, DType::f32),
                                random(rng, {B, H, Dk, Dv}, DType::f32)};
  for (const auto& [T, start] : {std::pair<int64_t, int32_t>{8, 0}, {3, 8}, {1, 11}}) {
    SCOPED_TRACE("T " + std::to_string(T) + " at " + std::to_string(start));
    Case c(act());
    const Value conv_state = c.state("conv_state", states[0]);
    const Value recurrent_state = c.state("recurrent_state", states[1]);
    const RecurrentInputs in = recurrent_inputs(c, rng, act(), B, T, C, Hk, H, Dk, Dv);
    const Value at = c.input("start", ints({}, {start}));
    const Value key_mask = c.input("mask", mask);
    c.b.output(c.b.causal_conv1d(in.x, c.param("w", w), conv_state, at, key_mask, "conv"));
    c.b.output(c.b.gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, recurrent_state, at, key_mask,
                                    "delta_rule"));
    const graph::Graph graph = c.b.finish();
    // Each y sums a handful of products per step over up to 12 steps of the recurrence; the
    // states are f32 on both sides, and y is rounded once to the activation dtype.
    expect_consistent(graph, c, tol(12 * Dk * Dv));
    const Results cpu = run_cpu(graph, c);
    for (const Tensor& s : cpu.states) EXPECT_EQ(s.dtype(), DType::f32);
    states = cpu.states;
  }
}

// The paged forms over pools of N = 5 state slots that hold other sequences' states: a ragged
// step where row 0 (slot 3) continues a sequence at position 4 with a padding token among its
// own, row 1 is a padding row (no slot) and row 2 (slot 0, whose old state must count as zeros)
// starts a sequence at 0 behind a padding token; then a decode step of the two sequences in the
// other row order, beside a padding row, from the pools the first step left, the second reading
// its state at slot 3 and writing it to slot 4 (a state kept as a prefix cache entry). y and the
// whole pools (the slots nobody writes unchanged) match the CPU's.
TEST_P(LowerOps, PagedCausalConv1dAndGatedDeltaRule) {
  constexpr int64_t N = 5, B = 3, Hk = 2, H = 4, Dk = 3, Dv = 5, C = 7, K = 4;
  std::mt19937 rng(29);
  const Tensor w = random(rng, {C, K}, act());
  std::vector<Tensor> pools = {random(rng, {N, K - 1, C}, DType::f32),
                               random(rng, {N, H, Dk, Dv}, DType::f32)};
  struct Step {
    int64_t T;
    std::vector<int32_t> slots, pos;  // slots: each row's read and write slot
    std::vector<int64_t> untouched;
  };
  const Step steps[] = {
      {4, {3, 3, -1, -1, 0, 0}, {4, 5, -1, 6, -1, -1, -1, -1, -1, 0, 1, 2}, {1, 2, 4}},
      {1, {0, 0, -1, -1, 3, 4}, {3, -1, 7}, {1, 2, 3}}};
  for (const Step& st : steps) {
    const int64_t T = st.T;
    SCOPED_TRACE("T " + std::to_string(T));
    Case c(act());
    const Value conv_pool = c.state("conv_pool", pools[0]);
    const Value delta_pool = c.state("delta_pool", pools[1]);
    const RecurrentInputs in = recurrent_inputs(c, rng, act(), B, T, C, Hk, H, Dk, Dv);
    const Value slots = c.input("slots", ints({B, 2}, st.slots));
    const Value pos = c.input("pos", ints({B, T}, st.pos));
    c.b.output(c.b.paged_causal_conv1d(in.x, c.param("w", w), conv_pool, slots, pos, "conv"));
    c.b.output(c.b.paged_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, delta_pool, slots, pos,
                                          "delta_rule"));
    const graph::Graph graph = c.b.finish();
    expect_consistent(graph, c, tol(12 * Dk * Dv));
    const Results cpu = run_cpu(graph, c);
    // The slots no row writes are as they were.
    for (size_t i = 0; i < pools.size(); ++i) {
      const int64_t each = pools[i].numel() / N;
      for (int64_t slot : st.untouched)
        EXPECT_EQ(std::memcmp(cpu.states[i].data<float>() + slot * each,
                              pools[i].data<float>() + slot * each, size_t(each) * 4),
                  0)
            << "pool " << i << " slot " << slot;
    }
    pools = cpu.states;
  }
}

// The CPU backend writes a linear-attention op's state in place, so whatever reads the state after
// the op sees the write: here a second convolution over the same state (reading the first's new
// rows) and the state itself as an output. The lowering reads it as the write left it.
TEST_P(LowerOps, AStateWrittenInPlaceIsReadAsWritten) {
  constexpr int64_t B = 2, S = 6, T = 2, C = 5, K = 3;
  std::mt19937 rng(28);
  Case c(act());
  const Value state = c.state("conv_state", random(rng, {B, K - 1, C}, DType::f32));
  const Value x = c.input("x", random(rng, {B, T, C}, act()));
  const Value w = c.param("w", random(rng, {C, K}, act()));
  const Value at = c.input("start", ints({}, {2}));
  const Value key_mask = c.input("mask", ints({B, S}, std::vector<int32_t>(size_t(B * S), 1)));
  const Value first = c.b.causal_conv1d(x, w, state, at, key_mask, "first");
  c.b.output(first);
  c.b.output(c.b.causal_conv1d(first, w, state, at, key_mask, "second"));
  c.b.output(c.b.reshape(state, {B, (K - 1) * C}));
  expect_consistent(c, tol(2 * K, 1));  // the first output, rounded, is the second's x
}

INSTANTIATE_TEST_SUITE_P(Activations, LowerOps, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The comparison is not blind: the same graph with one constant of its module changed (the
// scale factor 1.5, 0x3FC00000 in f32, made 1.5 + 2^-10) runs and differs from the CPU.
TEST_F(Lower, ComparisonCatchesAWrongConstant) {
  std::mt19937 rng(12);
  Case c(DType::f32);
  c.b.output(c.b.scale(c.input("x", random(rng, {4, 16}, DType::f32)), 1.5f));
  const graph::Graph g = c.b.finish();
  LoweredModule m = lower(g);
  const size_t at = m.mlir.find("0x3FC00000");
  ASSERT_NE(at, std::string::npos) << m.mlir;
  m.mlir.replace(at, 10, "0x3FC02000");
  const std::vector<float> want = run_cpu(g, c).outputs[0].to_f32_vector();
  const std::vector<float> got = run_xla(*client_, m.mlir, g, c).outputs[0].to_f32_vector();
  const cpu::ErrorStats s = cpu::compare(got, want);
  EXPECT_GT(s.nmse, nmse_tolerance(8)) << "a scale of 1.5 + 2^-10 passed for 1.5";
}

// And a broken primitive rule is caught too: top-k's comparator made to sort ascending gives other
// indices than the CPU's reference.
TEST_F(Lower, ComparisonCatchesABrokenTopK) {
  std::mt19937 rng(14);
  Case c(DType::f32);
  c.b.output(c.b.top_k(c.input("x", random(rng, {4, 16}, DType::f32)), 3));
  const graph::Graph g = c.b.finish();
  LoweredModule m = lower(g);
  const size_t at = m.mlir.find("compare GT, %a, %b");
  ASSERT_NE(at, std::string::npos) << m.mlir;
  const std::vector<int32_t> want = int32s(run_cpu(g, c).outputs[0]);
  EXPECT_EQ(int32s(run_xla(*client_, m.mlir, g, c).outputs[0]), want);
  m.mlir.replace(at, 10, "compare LT");
  EXPECT_NE(int32s(run_xla(*client_, m.mlir, g, c).outputs[0]), want);
}

// The leaves of a model's step: its weights as loaded, a cache holding a random history of
// `start` positions (row 1 left-padded by two slots in the key mask), ids and positions.
Leaves model_leaves(CausalLM::Impl& lm, const graph::Graph& g, const models::StepShape& s,
                    int32_t start) {
  std::mt19937 rng(13);
  Leaves l;
  for (int id : g.leaves(graph::Op::kParameter))
    l.params.push_back(lm.backend->download(*lm.weights.at(g.node(id).name)));
  for (int id : g.leaves(graph::Op::kState)) {
    const graph::Node& n = g.node(id);
    if (n.name != "attention_mask") {
      l.states.push_back(random(rng, n.type.shape, n.type.dtype));
      continue;
    }
    std::vector<int32_t> mask(size_t(shape_numel(n.type.shape)), 1);
    if (s.batch > 1) mask[size_t(s.cache_len)] = mask[size_t(s.cache_len) + 1] = 0;
    l.states.push_back(ints(n.type.shape, mask));
  }
  const int64_t B = s.batch, T = s.new_tokens;
  int64_t vocab = 0;
  for (const graph::Node& n : g.nodes())
    if (n.op == graph::Op::kEmbedding) vocab = n.attrs_as<graph::EmbeddingAttrs>().vocab;
  std::vector<int32_t> ids, pos;
  for (int64_t i = 0; i < B * T; ++i) {
    ids.push_back(int32_t((i * 131 + 17) % vocab));
    pos.push_back(int32_t(start + i % T));
  }
  // Paged: row 0 starts with a padding slot, and the tables are disjoint runs of blocks.
  if (s.paged()) pos[0] = -1;
  std::vector<int32_t> table;
  for (int64_t i = 0; i < B * s.table_blocks; ++i) table.push_back(int32_t(i % s.kv_blocks));
  for (int id : g.leaves(graph::Op::kInput)) {
    const graph::Node& n = g.node(id);
    if (n.name == "input_ids")
      l.inputs.push_back(ints({B, T}, ids));
    else if (n.name == "position_ids")
      l.inputs.push_back(ints({B, T}, pos));
    else if (n.name == "cache_position")
      l.inputs.push_back(ints({}, {start}));
    else if (n.name == "block_table")
      l.inputs.push_back(ints(n.type.shape, table));
    else
      ADD_FAILURE() << "no value for input " << n.name;
  }
  return l;
}

// Whole steps of the tiny checkpoints (Qwen3's q/k norms, Gemma 3's scalings, soft-caps,
// unit-offset norms and sliding window, GLM's partial interleaved rope, Mistral's window), each
// as a static-cache prefill chunk, a batched decode and a ragged paged step: the logits and every
// cache written match the CPU backend's. A bf16 model's graphs compute in bf16 on XLA and in f32
// on the CPU (its float32 twin), which runs one target below AVX-512 BF16 so that its own
// rounding of prefill activations (backends/cpu/kernels.h) does not add to the comparison.
TEST_F(Lower, TinyModelStepsMatchTheCpuBackend) {
  const models::StepShape shapes[] = {
      {.batch = 1, .new_tokens = 5, .cache_len = 16, .logits_to_keep = 0},
      {.batch = 2, .new_tokens = 1, .cache_len = 16, .logits_to_keep = 1},
      {.batch = 2,
       .new_tokens = 3,
       .logits_to_keep = 0,
       .kv_blocks = 6,
       .block_size = 4,
       .table_blocks = 3},
  };
  const cpu::Target target = cpu::active_target();
  for (DType dtype : {DType::f32, DType::bf16}) {
    if (dtype == DType::bf16 && target >= cpu::Target::kAVX512BF16)
      cpu::set_active_target(cpu::Target::kAVX512);
    for (const char* name : {"tiny-qwen3", "tiny-gemma3", "tiny-glm", "tiny-mistral"}) {
      CausalLM model =
          AutoModelForCausalLM::from_pretrained(std::string(TFORMERS_TEST_DATA) + "/models/" + name,
                                                {.dtype = dtype, .device_map = "cpu"});
      CausalLM::Impl& lm = models::state_of(model);
      for (const models::StepShape& s : shapes) {
        SCOPED_TRACE(std::string(name) + " " + std::string(dtype_name(dtype)) +
                     (s.paged() ? " paged" : "") + " B=" + std::to_string(s.batch) +
                     " T=" + std::to_string(s.new_tokens));
        const graph::Graph g = lm.build_graph(s);
        // Rounding in every op of the chain: about 1000 terms summed over two layers' dots
        // (hidden 64, MLP 128, 16 positions) and the head's; seen: NMSE up to 7e-13 in f32. In
        // bf16, XLA rounds each op's result to bf16: about 30 ops on the longest chain through
        // two layers, each within a relative 2^-8; seen: NMSE up to 1.2e-4.
        expect_consistent(
            g, model_leaves(lm, g, s, s.paged() ? 5 : 7),
            nmse_tolerance(1024) + (dtype == DType::bf16 ? 32 * kUbf16 * kUbf16 : 0.0));
      }
    }
  }
  cpu::set_active_target(target);
}

// @main's signature: parameters, states, inputs in binding order; outputs, then each state's
// new value, each state donated to its own result.
TEST(LowerModule, ArgumentsResultsAndDonation) {
  GraphBuilder b(DType::bf16);
  const Value w = b.parameter("w", {DType::bf16, {6, 4}});
  const Value k = b.state("k", {DType::bf16, {1, 2, 8, 4}});
  const Value v = b.state("v", {DType::bf16, {1, 2, 8, 4}});
  const Value x = b.input("x", {DType::bf16, {1, 3, 4}});
  const Value start = b.input("start", {DType::i32, {}});
  const Value kn = b.input("k_new", {DType::bf16, {1, 3, 2, 4}});
  b.cache_write(k, kn, start);
  b.output(b.linear(x, w));
  b.output(b.take_last(b.linear(x, w), 1));
  (void)v;
  const LoweredModule m = lower(b.finish());
  EXPECT_EQ(m.num_outputs, 2u);
  EXPECT_EQ(m.num_states, 2u);
  const std::string sig =
      "@main(%arg0: tensor<6x4xbf16>, %arg1: tensor<1x2x8x4xbf16> {tf.aliasing_output = 2 : i32}, "
      "%arg2: tensor<1x2x8x4xbf16> {tf.aliasing_output = 3 : i32}, %arg3: tensor<1x3x4xbf16>, "
      "%arg4: tensor<i32>, %arg5: tensor<1x3x2x4xbf16>) -> (tensor<1x3x6xbf16>, "
      "tensor<1x1x6xbf16>, "
      "tensor<1x2x8x4xbf16>, tensor<1x2x8x4xbf16>)";
  EXPECT_NE(m.mlir.find(sig), std::string::npos) << m.mlir;
}

// A graph with nothing to return (its only node an input) still makes a module XLA compiles.
TEST_F(Lower, GraphWithoutResultsCompiles) {
  GraphBuilder b;
  b.input("x", {DType::f32, {2}});
  const LoweredModule m = lower(b.finish());
  EXPECT_EQ(m.num_outputs + m.num_states, 0u);
  EXPECT_EQ(client_->compile(m.mlir).num_outputs(), 0u);
}

// The paged attention's sinks come after its optional rows: with sinks alone it lowers (a row per
// sequence), with rows it does not, sinks or not (the lowering gathers a sequence per row).
TEST(LowerModule, PagedAttentionLowersWithSinksButNotWithRows) {
  constexpr int64_t B = 2, T = 3, Hq = 4, Hkv = 2, D = 8;
  GraphBuilder b;
  const Value q = b.input("q", {DType::f32, {B, T, Hq, D}});
  const Value pool = b.state("pool", {DType::f32, {5, Hkv, 4, D}});
  const Value table = b.input("table", {DType::i32, {B, 2}});
  const Value pos = b.input("pos", {DType::i32, {B, T}});
  const Value rows = b.input("rows", {DType::i32, {B, T}});
  const Value sinks = b.parameter("sinks", {DType::f32, {Hq}});
  const graph::AttentionOptions with_sinks{.sinks = sinks};
  const Value plain = b.paged_attention(q, pool, pool, table, pos, 0.35f, {}, "plain");
  const Value sunk = b.paged_attention(q, pool, pool, table, pos, 0.35f, with_sinks, "sinks");
  const Value packed = b.paged_attention(q, pool, pool, table, pos, 0.35f, {}, "packed", rows);
  const Value both = b.paged_attention(q, pool, pool, table, pos, 0.35f, with_sinks, "both", rows);
  const graph::Graph g = b.finish();
  EXPECT_TRUE(can_lower(g.node(plain)));
  EXPECT_TRUE(can_lower(g.node(sunk)));
  EXPECT_FALSE(can_lower(g.node(packed)));
  EXPECT_FALSE(can_lower(g.node(both)));
}

TEST(LowerModule, CustomCallsAndCollectivesNeedTheCpuBackend) {
  const auto kernel =
      std::make_shared<graph::CustomCall>(graph::CustomCall{"org/kernel@1:rms", "cpu", nullptr});
  struct Refused {
    std::string label;  // as the error names node %2
    std::function<Value(GraphBuilder&, Value)> build;
  };
  const Refused refused[] = {
      {"%2 custom_call  # layers.0.norm",
       [&](GraphBuilder& b, Value x) {
         return b.custom_call(kernel, {x}, b.type(x), {1e-6f}, "layers.0.norm");
       }},
      {"%2 all_reduce  # layers.0.down_proj",
       [](GraphBuilder& b, Value x) { return b.all_reduce(x, -1, 0, "layers.0.down_proj"); }},
      {"%2 all_gather  # lm_head",
       [](GraphBuilder& b, Value x) { return b.all_gather(x, 2, 0, "lm_head"); }},
  };
  for (const Refused& r : refused) {
    GraphBuilder b;
    const Value x = b.input("x", {DType::f32, {2, 8}});
    const Value y = b.add(x, x);
    const Value z = r.build(b, y);
    b.output(b.scale(z, 2.0f));
    const graph::Graph g = b.finish();
    EXPECT_TRUE(can_lower(g.node(y)));
    EXPECT_FALSE(can_lower(g.node(z))) << r.label;
    try {
      lower(g);
      ADD_FAILURE() << r.label << " lowered";
    } catch (const UnsupportedError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(r.label), std::string::npos) << what;
      EXPECT_NE(what.find("needs the CPU backend"), std::string::npos) << what;
    }
  }
}

// Every registered op has a case that runs it on both backends: a test of this file (all of the
// ops the lowering has a rule for), or the suite that covers one the lowering leaves to the CPU
// (hub kernels, and the collectives that the PJRT backend runs on the host between segments).
// Registering an op fails this test until its case is named here and exists.
TEST(OpRegistry, EveryOpHasACase) {
  const std::map<Op, std::string> cases = {
      {Op::kEmbedding, "LowerOps.EmbeddingWholeTableAndShard"},
      {Op::kLinear, "LowerOps.LinearWithAndWithoutBias"},
      {Op::kRMSNorm, "LowerOps.RMSNorm"},
      {Op::kRope, "LowerOps.RopeWholePartialAndInterleaved"},
      {Op::kSiluMul, "LowerOps.Elementwise"},
      {Op::kAdd, "LowerOps.Elementwise"},
      {Op::kReshape, "LowerOps.ReshapeTakeLastAndSliceMoveValuesExactly"},
      {Op::kCacheWrite, "LowerOps.CacheWriteAtAStart"},
      {Op::kAttention, "LowerOps.CacheWriteThenAttention"},
      {Op::kTakeLast, "LowerOps.ReshapeTakeLastAndSliceMoveValuesExactly"},
      {Op::kCustomCall, "LowerModule.CustomCallsAndCollectivesNeedTheCpuBackend"},
      {Op::kAllReduce, "LowerModule.CustomCallsAndCollectivesNeedTheCpuBackend"},
      {Op::kAllGather, "LowerModule.CustomCallsAndCollectivesNeedTheCpuBackend"},
      {Op::kSlice, "LowerOps.ReshapeTakeLastAndSliceMoveValuesExactly"},
      {Op::kLinearQuant, "LowerOps.LinearInt8OddKWithAndWithoutBias"},
      {Op::kGeluTanhMul, "LowerOps.Elementwise"},
      {Op::kScale, "LowerOps.Elementwise"},
      {Op::kSoftcap, "LowerOps.Elementwise"},
      {Op::kPagedCacheWrite, "LowerOps.PagedWriteThenAttention"},
      {Op::kPagedAttention, "LowerOps.PagedWriteThenAttention"},
      {Op::kConvert, "Lower.TinyModelStepsMatchTheCpuBackend"},
      {Op::kConstant, "LowerOps.BinaryFunctionsBroadcastAndConstants"},
      {Op::kUnary, "LowerOps.UnaryFunctions"},
      {Op::kBinary, "LowerOps.BinaryFunctionsBroadcastAndConstants"},
      {Op::kSelect, "LowerOps.SelectReduceAndSoftmax"},
      {Op::kReduce, "LowerOps.SelectReduceAndSoftmax"},
      {Op::kSoftmax, "LowerOps.SelectReduceAndSoftmax"},
      {Op::kTopK, "LowerOps.TopKTakeAlongAndScatterAdd"},
      {Op::kTakeAlong, "LowerOps.TopKTakeAlongAndScatterAdd"},
      {Op::kScatterAdd, "LowerOps.TopKTakeAlongAndScatterAdd"},
      {Op::kConcat, "LowerOps.ConcatTransposeBroadcastIotaCumsum"},
      {Op::kTranspose, "LowerOps.ConcatTransposeBroadcastIotaCumsum"},
      {Op::kBroadcast, "LowerOps.ConcatTransposeBroadcastIotaCumsum"},
      {Op::kIota, "LowerOps.ConcatTransposeBroadcastIotaCumsum"},
      {Op::kCumsum, "LowerOps.ConcatTransposeBroadcastIotaCumsum"},
      {Op::kMatMul, "LowerOps.MatMulAndExpertLinear"},
      {Op::kLinearId, "LowerOps.MatMulAndExpertLinear"},
      {Op::kLinearIdQuant, "LowerOps.QuantizedExpertLinear"},
      {Op::kCausalConv1d, "LowerOps.CausalConv1dAndGatedDeltaRule"},
      {Op::kGatedDeltaRule, "LowerOps.CausalConv1dAndGatedDeltaRule"},
      {Op::kPagedCausalConv1d, "LowerOps.PagedCausalConv1dAndGatedDeltaRule"},
      {Op::kPagedGatedDeltaRule, "LowerOps.PagedCausalConv1dAndGatedDeltaRule"},
  };
  // The tests of this binary by "Suite.Name", parameterised ones without their instance prefix
  // and parameter suffix.
  std::set<std::string> tests;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
    std::string name = suite.name();
    name = name.substr(name.find('/') + 1);  // "Activations/LowerOps" -> "LowerOps"
    for (int j = 0; j < suite.total_test_count(); ++j) {
      const std::string test = suite.GetTestInfo(j)->name();
      tests.insert(name + "." + test.substr(0, test.find('/')));
    }
  }
  for (size_t i = 0; i < graph::kOpCount; ++i) {
    const Op op = Op(i);
    if (graph::is_leaf(op)) continue;
    const auto it = cases.find(op);
    if (it == cases.end()) {
      ADD_FAILURE() << graph::op_name(op) << " has no case: write one in lower_test.cc";
      continue;
    }
    EXPECT_TRUE(tests.count(it->second))
        << graph::op_name(op) << "'s case " << it->second << " is not a test of this binary";
  }
}

}  // namespace
}  // namespace tformers::backends::pjrt
