// The graph's activation dtype: what the builder types compute ops with, what the hash and the
// printout include, and how the CPU backend runs a bfloat16-activation graph (in f32, rounding
// at the outputs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "graph/builder.h"
#include "tformers/error.h"

namespace tformers {
namespace {

using graph::GraphBuilder;
using graph::Op;
using graph::TensorType;
using graph::Value;

constexpr int64_t kVocab = 32, kDim = 16, kHidden = 24, kTokens = 5;

std::vector<float> ramp(int64_t n, float scale, float phase) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * std::sin(0.37f * float(i) + phase);
  return v;
}

// embedding -> rms_norm -> gate/up linears -> silu_mul -> down linear -> residual add ->
// take_last: (1,5) ids -> (1,2,16).
graph::Graph small_graph(DType activation) {
  GraphBuilder b(activation);
  Value table = b.parameter("embed", {DType::f32, {kVocab, kDim}});
  Value norm = b.parameter("norm", {DType::f32, {kDim}});
  Value gate = b.parameter("gate", {DType::f32, {kHidden, kDim}});
  Value up = b.parameter("up", {DType::f32, {kHidden, kDim}});
  Value down = b.parameter("down", {DType::f32, {kDim, kHidden}});
  Value ids = b.input("ids", {DType::i32, {1, kTokens}});
  Value h = b.embedding(table, ids, "embed");
  Value x = b.rms_norm(h, norm, 1e-6f, "norm");
  Value m = b.silu_mul(b.linear(x, gate, -1, "gate"), b.linear(x, up, -1, "up"), "act");
  Value y = b.add(h, b.linear(m, down, -1, "down"), "residual");
  b.output(b.take_last(y, 2));
  return b.finish();
}

std::vector<float> run_small(DType activation) {
  auto backend = backends::make_cpu_backend();
  const graph::Graph g = small_graph(activation);
  auto exe = backend->compile(g);
  std::vector<std::shared_ptr<backends::Buffer>> params;
  std::vector<backends::Buffer*> bound;
  float phase = 0;
  for (int id : g.leaves(Op::kParameter)) {
    const Shape& s = g.node(id).type.shape;
    params.push_back(backend->upload(
        Tensor::from_vector<float>(s, DType::f32, ramp(shape_numel(s), 0.5f, phase += 1))));
    bound.push_back(params.back().get());
  }
  Tensor ids = Tensor::from_vector<int32_t>({1, kTokens}, DType::i32, {3, 17, 0, 31, 8});
  Tensor out = Tensor::zeros({1, 2, kDim}, activation);
  const Tensor* inputs[] = {&ids};
  Tensor* outputs[] = {&out};
  exe->run(bound, {}, inputs, outputs);
  return out.to_f32_vector();
}

TEST(ActivationDtype, BuilderTypesComputeOpsWithIt) {
  const graph::Graph g = small_graph(DType::bf16);
  EXPECT_EQ(g.activation_dtype(), DType::bf16);
  int computed = 0;
  for (const graph::Node& n : g.nodes()) {
    if (n.op == Op::kParameter || n.op == Op::kInput) continue;
    EXPECT_EQ(n.type.dtype, DType::bf16) << graph::op_name(n.op);
    ++computed;
  }
  EXPECT_EQ(computed, 8);
  EXPECT_EQ(g.to_string().rfind("activation: bfloat16\n", 0), 0u) << g.to_string();
  EXPECT_NE(g.hash(), small_graph(DType::f32).hash());
  EXPECT_EQ(g.hash(), small_graph(DType::bf16).hash());
}

TEST(ActivationDtype, Bf16GraphOnCpuMatchesF32WithinBf16Rounding) {
  const std::vector<float> f32 = run_small(DType::f32), bf16 = run_small(DType::bf16);
  ASSERT_EQ(f32.size(), bf16.size());
  double max_abs = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    // The CPU computes both in f32; the bf16 graph rounds its output once, to 8 significant
    // bits: an error of at most half a unit in the last place, 2^-8 of the value.
    EXPECT_NEAR(bf16[i], f32[i], std::ldexp(std::fabs(f32[i]), -8) + 1e-30) << i;
    max_abs = std::max(max_abs, double(std::fabs(f32[i])));
  }
  EXPECT_GT(max_abs, 0.1);  // the graph computed something
}

// An activation-typed input is widened on the way in.
TEST(ActivationDtype, Bf16InputsAreConvertedAtTheBoundary) {
  auto backend = backends::make_cpu_backend();
  auto build = [](DType act) {
    GraphBuilder b(act);
    Value w = b.parameter("w", {DType::f32, {kDim}});
    Value x = b.input("x", {act, {2, kDim}});
    b.output(b.rms_norm(x, w, 1e-6f));
    return b.finish();
  };
  Tensor x32 = Tensor::from_vector<float>({2, kDim}, DType::f32, ramp(2 * kDim, 3.0f, 0.5f));
  Tensor x16 = Tensor::zeros({2, kDim}, DType::bf16);
  for (int64_t i = 0; i < 2 * kDim; ++i) {
    x16.data<uint16_t>()[i] = f32_to_bf16(x32.data<float>()[i]);
    x32.data<float>()[i] = bf16_to_f32(x16.data<uint16_t>()[i]);  // the same values in both
  }
  auto w = backend->upload(Tensor::from_vector<float>({kDim}, DType::f32, ramp(kDim, 1.0f, 2.0f)));
  backends::Buffer* params[] = {w.get()};
  Tensor out32 = Tensor::zeros({2, kDim}, DType::f32),
         out16 = Tensor::zeros({2, kDim}, DType::bf16);
  const Tensor* in32[] = {&x32};
  const Tensor* in16[] = {&x16};
  Tensor* o32[] = {&out32};
  Tensor* o16[] = {&out16};
  backend->compile(build(DType::f32))->run(params, {}, in32, o32);
  backend->compile(build(DType::bf16))->run(params, {}, in16, o16);
  const std::vector<float> a = out32.to_f32_vector(), b = out16.to_f32_vector();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(b[i], a[i], std::ldexp(std::fabs(a[i]), -8) + 1e-30) << i;
  // The wrong host dtype is the caller's error.
  EXPECT_THROW(backend->compile(build(DType::bf16))->run(params, {}, in32, o16),
               InvalidArgumentError);
}

// A bf16 KV cache written and attended to from a bf16-activation graph: cache writes keep the
// cache's dtype while the new keys and the queries arrive as bf16 inputs.
TEST(ActivationDtype, Bf16GraphWithKvCacheMatchesF32) {
  constexpr int64_t kS = 6, kHkv = 2, kHq = 4, kD = 8;
  const graph::TensorType cache{DType::bf16, {1, kHkv, kS, kD}};
  auto build = [&](DType act) {
    GraphBuilder b(act);
    Value k = b.state("k", cache), v = b.state("v", cache);
    Value q = b.input("q", {act, {1, 1, kHq, kD}});
    Value kv = b.input("kv", {act, {1, 1, kHkv, kD}});
    Value start = b.input("start", {DType::i32, {}});
    Value kc = b.cache_write(k, kv, start), vc = b.cache_write(v, kv, start);
    b.output(b.attention(q, kc, vc, start, -1, 0.35f));
    return b.finish();
  };
  // Host tensors of `dtype` holding the same bf16-representable values.
  auto values = [](Shape shape, DType dtype, float phase) {
    std::vector<float> v = ramp(shape_numel(shape), 2.0f, phase);
    Tensor t = Tensor::zeros(shape, dtype);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t h = f32_to_bf16(v[i]);
      if (dtype == DType::bf16)
        t.data<uint16_t>()[i] = h;
      else
        t.data<float>()[i] = bf16_to_f32(h);
    }
    return t;
  };
  auto backend = backends::make_cpu_backend();
  auto decode = [&](DType act) {
    auto exe = backend->compile(build(act));
    auto kb = backend->allocate(cache), vb = backend->allocate(cache);
    backends::Buffer* states[] = {kb.get(), vb.get()};
    std::vector<float> out;
    for (int32_t s = 0; s < kS; ++s) {
      Tensor q = values({1, 1, kHq, kD}, act, 0.3f * float(s));
      Tensor kv = values({1, 1, kHkv, kD}, act, 1.7f * float(s) + 0.5f);
      Tensor start = Tensor::from_vector<int32_t>({}, DType::i32, {s});
      Tensor o = Tensor::zeros({1, 1, kHq, kD}, act);
      const Tensor* inputs[] = {&q, &kv, &start};
      Tensor* outputs[] = {&o};
      exe->run({}, states, inputs, outputs);
      const std::vector<float> ov = o.to_f32_vector();
      out.insert(out.end(), ov.begin(), ov.end());
    }
    return out;
  };
  const std::vector<float> f32 = decode(DType::f32), bf16 = decode(DType::bf16);
  ASSERT_EQ(f32.size(), bf16.size());
  float max_abs = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    EXPECT_NEAR(bf16[i], f32[i], std::ldexp(std::fabs(f32[i]), -8) + 1e-30) << i;
    max_abs = std::max(max_abs, std::fabs(f32[i]));
  }
  EXPECT_GT(max_abs, 0.1f);
}

// A bf16 graph whose output is converted to float32, as models return their logits: the CPU
// computes it in float32, so the output is the float32 graph's exactly, with no rounding.
TEST(ActivationDtype, ConvertToFloat32OutputsTheFloat32GraphsValues) {
  auto build = [](DType act) {
    GraphBuilder b(act);
    Value w = b.parameter("w", {DType::f32, {kHidden, kDim}});
    Value x = b.input("x", {DType::f32, {2, kDim}});
    Value y = b.linear(b.convert(x, act, "in"), w, -1, "proj");
    b.output(b.convert(y, DType::f32, "out"));
    return b.finish();
  };
  const graph::Graph g = build(DType::bf16);
  ASSERT_EQ(g.nodes().size(), 5u);
  EXPECT_EQ(g.node(g.outputs()[0]).op, Op::kConvert);
  EXPECT_EQ(g.node(g.outputs()[0]).type.dtype, DType::f32);
  // Converting to the dtype a value has adds no node.
  EXPECT_EQ(build(DType::f32).nodes().size(), 3u);

  auto backend = backends::make_cpu_backend();
  auto w = backend->upload(
      Tensor::from_vector<float>({kHidden, kDim}, DType::f32, ramp(kHidden * kDim, 0.7f, 0.2f)));
  backends::Buffer* params[] = {w.get()};
  Tensor x = Tensor::from_vector<float>({2, kDim}, DType::f32, ramp(2 * kDim, 1.3f, 0.9f));
  const Tensor* inputs[] = {&x};
  auto run = [&](DType act) {
    Tensor out = Tensor::zeros({2, kHidden}, DType::f32);
    Tensor* outputs[] = {&out};
    backend->compile(build(act))->run(params, {}, inputs, outputs);
    return out.to_f32_vector();
  };
  const std::vector<float> f32 = run(DType::f32), bf16 = run(DType::bf16);
  EXPECT_EQ(bf16, f32);
  EXPECT_GT(*std::max_element(f32.begin(), f32.end()), 0.1f);
}

// The CPU converts only where its float32 twin meets the graph's boundary; a convert inside the
// graph that changes the dtype is refused when the graph compiles, with the node named.
// A convert to or from float32 runs (a weight widened for a primitive, a value rounded to another
// dtype); one between two 16-bit dtypes is refused at compile, naming the node.
TEST(ActivationDtype, CpuConvertsToAndFromFloat32) {
  auto cpu = backends::make_cpu_backend();
  GraphBuilder b;
  const Value x = b.input("x", {DType::f32, {4}});
  b.output(b.convert(x, DType::f16, "narrow"));
  const std::vector<float> v = {1.0f, 1.0f / 3.0f, -65504.0f, 1e-6f};
  const Tensor in = Tensor::from_vector<float>({4}, DType::f32, v);
  Tensor out = Tensor::zeros({4}, DType::f16);
  const Tensor* inputs[] = {&in};
  Tensor* outputs[] = {&out};
  cpu->compile(b.finish())->run({}, {}, inputs, outputs);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(out.data<uint16_t>()[i], f32_to_f16(v[i])) << i;

  GraphBuilder w;
  w.output(w.convert(w.parameter("w", {DType::bf16, {kDim}}), DType::f16, "sideways"));
  try {
    cpu->compile(w.finish());
    ADD_FAILURE() << "no error";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("convert of bfloat16[16] to float16 at sideways"),
              std::string::npos)
        << e.what();
  }
  GraphBuilder ints;
  EXPECT_THROW(ints.convert(ints.input("ids", {DType::i32, {2}}), DType::f32), InternalError);
}

// The IR lets take_last move any dtype; the CPU moves f32 only and says so at compile time.
TEST(ActivationDtype, CpuRejectsMovingNonF32Values) {
  GraphBuilder b;
  b.output(b.take_last(b.parameter("p", {DType::bf16, {1, 4, 8}}), 1));
  EXPECT_THROW(backends::make_cpu_backend()->compile(b.finish()), UnsupportedError);
}

TEST(ActivationDtype, MustBeAFloatType) {
  EXPECT_THROW(GraphBuilder{DType::i32}, InvalidArgumentError);
}

}  // namespace
}  // namespace tformers
