// The graph side of the ops the Qwen2, Mistral, GLM and Gemma layers use: the builder's checks
// and attribute layouts, to_string and the hash, and one graph of every new op and option run by
// the CPU backend against the scalar references (so the executor passes each attribute to the
// right kernel argument).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "core/cpu_features.h"
#include "graph/builder.h"
#include "ops/ops_test_util.h"
#include "tformers/error.h"

namespace tformers::cpu {
namespace {

using graph::AttentionOptions;
using graph::GraphBuilder;
using graph::LinearQuantAttrs;
using graph::Op;
using graph::QuantLayout;
using graph::QuantScheme;
using graph::RMSNormOptions;
using graph::RopeOptions;
using graph::TensorType;
using graph::Value;

// Shapes of the graph below: batch 1, T tokens, Hq query and Hkv KV heads of D, cache of S slots.
constexpr int64_t T = 5, Hq = 4, Hkv = 2, D = 8, S = 8, kRotary = 4;
constexpr float kEps = 1e-5f, kScale = 0.35f, kFactor = 2.5f, kCap = 3.0f, kAttnCap = 0.8f;
constexpr int64_t kWindow = 3;

TEST(GraphOps, DefaultsKeepTheirAttributeLayouts) {
  GraphBuilder b;
  const Value x = b.input("x", {DType::f32, {1, T, Hq, D}});
  const Value pos = b.input("pos", {DType::i32, {1, T}});
  const Value w = b.parameter("w", {DType::f32, {D}});
  const Value kc = b.state("k", {DType::f32, {1, Hkv, S, D}});
  const Value vc = b.state("v", {DType::f32, {1, Hkv, S, D}});
  const Value start = b.input("start", {DType::i32, {}});
  const Value n = b.rms_norm(x, w, kEps);
  const Value r = b.rope(x, pos, std::vector<float>(D / 2, 1.0f));
  const Value a = b.attention(x, kc, vc, start, -1, kScale);
  const graph::Graph g = b.finish();
  const auto& norm = g.node(n).attrs_as<graph::RMSNormAttrs>();
  EXPECT_EQ(norm.eps, kEps);
  EXPECT_FALSE(norm.unit_offset);
  const auto& rope = g.node(r).attrs_as<graph::RopeAttrs>();
  EXPECT_EQ(rope.inv_freq.size(), size_t(D / 2));
  EXPECT_EQ(rope.rotary_dim, D);  // the whole head
  EXPECT_FALSE(rope.interleaved);
  const auto& attn = g.node(a).attrs_as<graph::AttentionAttrs>();
  EXPECT_EQ(attn.scale, kScale);
  EXPECT_EQ(attn.softcap, 0.0f);
  EXPECT_EQ(attn.sliding_window, 0);
  // Defaults print no attributes.
  EXPECT_EQ(g.to_string().find('{'), std::string::npos) << g.to_string();
}

// Builds attention with `o` and returns the graph's hash and text.
std::pair<uint64_t, std::string> attention_graph(AttentionOptions o) {
  GraphBuilder b;
  const Value q = b.input("q", {DType::f32, {1, T, Hq, D}});
  const Value kc = b.state("k", {DType::f32, {1, Hkv, S, D}});
  const Value vc = b.state("v", {DType::f32, {1, Hkv, S, D}});
  b.output(b.attention(q, kc, vc, b.input("start", {DType::i32, {}}), -1, kScale, o, "attn"));
  const graph::Graph g = b.finish();
  return {g.hash(), g.to_string()};
}

TEST(GraphOps, OptionsChangeTheHashAndPrint) {
  const auto plain = attention_graph({});
  const auto window = attention_graph({.sliding_window = 512});
  const auto capped = attention_graph({.softcap = 50.0f});
  EXPECT_NE(plain.first, window.first);
  EXPECT_NE(plain.first, capped.first);
  EXPECT_NE(window.first, capped.first);
  EXPECT_NE(window.second.find("attention(%0, %1, %2, %3) {sliding_window=512} -> float32"),
            std::string::npos)
      << window.second;
  EXPECT_NE(capped.second.find("{softcap=50}"), std::string::npos) << capped.second;

  GraphBuilder b;
  const Value x = b.input("x", {DType::f32, {1, T, Hq, D}});
  const Value pos = b.input("pos", {DType::i32, {1, T}});
  b.rope(x, pos, {1.0f, 0.5f}, {.rotary_dim = kRotary, .interleaved = true}, "rope");
  b.rms_norm(x, b.parameter("w", {DType::f32, {D}}), kEps, {.unit_offset = true}, "norm");
  b.scale(x, kFactor);
  b.softcap(x, kCap);
  b.gelu_tanh_mul(x, x);
  const std::string text = b.finish().to_string();
  EXPECT_NE(text.find("rope(%0, %1) {rotary_dim=4, interleaved} -> "), std::string::npos) << text;
  EXPECT_NE(text.find("rms_norm(%0, %3) {unit_offset} -> "), std::string::npos) << text;
  EXPECT_NE(text.find("scale(%0) {factor=2.5} -> "), std::string::npos) << text;
  EXPECT_NE(text.find("softcap(%0) {cap=3} -> "), std::string::npos) << text;
  EXPECT_NE(text.find("gelu_tanh_mul(%0, %0) -> "), std::string::npos) << text;
}

TEST(GraphOps, BuilderRejectsBadOptions) {
  GraphBuilder b;
  const Value x = b.input("x", {DType::f32, {1, T, Hq, D}});
  const Value pos = b.input("pos", {DType::i32, {1, T}});
  const Value kc = b.state("k", {DType::f32, {1, Hkv, S, D}});
  const Value start = b.input("start", {DType::i32, {}});
  const std::vector<float> two(2, 1.0f);
  EXPECT_NO_THROW(b.rope(x, pos, two, {.rotary_dim = 4}, "ok"));
  EXPECT_THROW(b.rope(x, pos, two, {.rotary_dim = 6}, "frequencies"), InternalError);
  EXPECT_THROW(b.rope(x, pos, two, {.rotary_dim = 3}, "odd"), InternalError);
  EXPECT_THROW(b.rope(x, pos, std::vector<float>(D, 1.0f), {.rotary_dim = 2 * D}, "too wide"),
               InternalError);
  EXPECT_THROW(b.rope(x, pos, two, {}, "whole head needs D/2"), InternalError);
  EXPECT_THROW(b.softcap(x, 0.0f), InternalError);
  EXPECT_THROW(b.softcap(x, -1.0f), InternalError);
  EXPECT_THROW(b.scale(x, INFINITY), InternalError);
  EXPECT_THROW(b.gelu_tanh_mul(x, pos), InternalError);
  EXPECT_THROW(b.attention(x, kc, kc, start, -1, kScale, {.sliding_window = -1}, "window"),
               InternalError);
  EXPECT_THROW(b.attention(x, kc, kc, start, -1, kScale, {.softcap = -2.0f}, "cap"), InternalError);
}

// Every new op and option in one graph on the CPU backend, with bf16 weights and caches, against
// the references: rope (partial, interleaved) of q and k, the caches written at start 0,
// attention with a window and a soft cap, then the unit-offset norm, gelu_tanh_mul, scale and
// softcap of its output.
TEST(GraphOps, RunOnTheCpuBackendAsTheReferences) {
  std::mt19937 rng(31);
  GraphBuilder b;
  const Value q_in = b.input("q", {DType::f32, {1, T, Hq, D}});
  const Value k_in = b.input("k", {DType::f32, {1, T, Hkv, D}});
  const Value v_in = b.input("v", {DType::f32, {1, T, Hkv, D}});
  const Value pos = b.input("pos", {DType::i32, {1, T}});
  const Value start = b.input("start", {DType::i32, {}});
  const Value w = b.parameter("w", {DType::bf16, {D}});
  const Value kc = b.state("k_cache", {DType::bf16, {1, Hkv, S, D}});
  const Value vc = b.state("v_cache", {DType::bf16, {1, Hkv, S, D}});
  const std::vector<float> inv_freq = {1.0f, 0.1f};
  const RopeOptions ro{.rotary_dim = kRotary, .interleaved = true};
  const Value q = b.rope(q_in, pos, inv_freq, ro, "q_rope");
  const Value k = b.rope(k_in, pos, inv_freq, ro, "k_rope");
  const Value kw = b.cache_write(kc, k, start), vw = b.cache_write(vc, v_in, start);
  const Value a = b.attention(q, kw, vw, start, -1, kScale,
                              {.sliding_window = kWindow, .softcap = kAttnCap}, "attn");
  const Value n = b.rms_norm(a, w, kEps, {.unit_offset = true}, "norm");
  const Value g = b.gelu_tanh_mul(n, a);
  b.output(b.softcap(b.scale(g, kFactor), kCap));
  const graph::Graph graph = b.finish();

  const std::vector<float> qv = random_f32(rng, size_t(T * Hq * D), -2.0f, 2.0f);
  const std::vector<float> kv = random_f32(rng, size_t(T * Hkv * D), -2.0f, 2.0f);
  const std::vector<float> vv = random_f32(rng, size_t(T * Hkv * D));
  const Tensor wt = random_tensor(rng, size_t(D), DType::bf16, -0.5f, 0.5f);
  const std::vector<int32_t> pv = {3, 4, 5, 6, 7};

  auto backend = backends::make_cpu_backend();
  auto exe = backend->compile(graph);
  const tformers::Tensor w_host = tformers::Tensor::from_vector<uint16_t>({D}, DType::bf16, wt.h);
  auto w_buf = backend->upload(w_host);
  auto kc_buf = backend->allocate({DType::bf16, {1, Hkv, S, D}});
  auto vc_buf = backend->allocate({DType::bf16, {1, Hkv, S, D}});
  const tformers::Tensor ins[] = {
      tformers::Tensor::from_vector<float>({1, T, Hq, D}, DType::f32, qv),
      tformers::Tensor::from_vector<float>({1, T, Hkv, D}, DType::f32, kv),
      tformers::Tensor::from_vector<float>({1, T, Hkv, D}, DType::f32, vv),
      tformers::Tensor::from_vector<int32_t>({1, T}, DType::i32, pv),
      tformers::Tensor::from_vector<int32_t>({}, DType::i32, {0})};
  tformers::Tensor out = tformers::Tensor::zeros({1, T, Hq, D}, DType::f32);
  backends::Buffer* params[] = {w_buf.get()};
  backends::Buffer* states[] = {kc_buf.get(), vc_buf.get()};
  const tformers::Tensor* inputs[] = {&ins[0], &ins[1], &ins[2], &ins[3], &ins[4]};
  tformers::Tensor* outputs[] = {&out};
  exe->run(params, states, inputs, outputs);

  std::vector<float> rq = qv, rk = kv;
  ref::rope(rq.data(), pv.data(), inv_freq.data(), T, Hq, D, kRotary, true);
  ref::rope(rk.data(), pv.data(), inv_freq.data(), T, Hkv, D, kRotary, true);
  std::vector<uint16_t> rkc(size_t(Hkv * S * D)), rvc(rkc.size());
  ref::cache_write(rkc.data(), DType::bf16, rk.data(), 1, T, Hkv, S, D, 0);
  ref::cache_write(rvc.data(), DType::bf16, vv.data(), 1, T, Hkv, S, D, 0);
  std::vector<float> ra(qv.size()), rn(qv.size()), want(qv.size());
  ref::attention(rq.data(), rkc.data(), rvc.data(), DType::bf16, nullptr, ra.data(), 1, T, Hq, Hkv,
                 S, D, 0, kScale, kWindow, kAttnCap);
  ref::rms_norm(ra.data(), wt.h.data(), DType::bf16, rn.data(), T * Hq, D, kEps, true);
  ref::gelu_tanh_mul(rn.data(), ra.data(), want.data(), int64_t(want.size()));
  ref::scale(want.data(), kFactor, want.data(), int64_t(want.size()));
  ref::softcap(want.data(), kCap, want.data(), int64_t(want.size()));
  const std::vector<float> got(out.data<float>(), out.data<float>() + out.numel());
  // Rounding in every op of the chain, the longest being the D-term norm and attention's sums
  // (bf16 rounding of k is the same on both sides: the reference writes its own bf16 cache).
  expect_close(got, want, nmse_tolerance(4 * (D + T) + 32), "graph");
}

// Attention sinks in the graph: the builder's checks, where attention_operands finds the optional
// operands, the flag in the text and the hash, and a node that claims sinks without the operand.
TEST(GraphOps, AttentionSinksCheckPrintAndHash) {
  auto build = [](bool with_sinks) {
    GraphBuilder b;
    const Value q = b.input("q", {DType::f32, {1, T, Hq, D}});
    const Value kc = b.state("k", {DType::f32, {1, Hkv, S, D}});
    const Value vc = b.state("v", {DType::f32, {1, Hkv, S, D}});
    const Value start = b.input("start", {DType::i32, {}});
    const Value mask = b.input("mask", {DType::i32, {1, S}});
    const Value sinks = b.parameter("sinks", {DType::f32, {Hq}});
    b.output(
        b.attention(q, kc, vc, start, mask, kScale, {.sinks = with_sinks ? sinks : -1}, "attn"));
    return b.finish();
  };
  const graph::Graph plain = build(false), g = build(true);
  EXPECT_NE(plain.hash(), g.hash());
  EXPECT_NE(g.to_string().find("attention(%0, %1, %2, %3, %4, %5) {sinks} -> float32"),
            std::string::npos)
      << g.to_string();
  const graph::Node& attn = g.node(g.outputs()[0]);
  EXPECT_EQ(graph::attention_operands(attn).mask_or_rows, 4);
  EXPECT_EQ(graph::attention_operands(attn).sinks, 5);
  EXPECT_EQ(graph::attention_operands(plain.node(plain.outputs()[0])).sinks, -1);
  // The flag without an operand for it.
  graph::Graph bad = g;
  graph::Node short_node = attn;
  short_node.inputs.resize(4);
  EXPECT_THROW(bad.add(short_node), InternalError);

  GraphBuilder b;
  const Value q = b.input("q", {DType::f32, {1, T, Hq, D}});
  const Value kc = b.state("k", {DType::f32, {1, Hkv, S, D}});
  const Value start = b.input("start", {DType::i32, {}});
  const Value table = b.input("table", {DType::i32, {2, 2}});
  const Value table1 = b.input("table1", {DType::i32, {1, 2}});
  const Value pos = b.input("pos", {DType::i32, {1, T}});
  const Value rows = b.input("rows", {DType::i32, {1, T}});
  const Value sinks = b.parameter("sinks", {DType::f32, {Hq}});
  const Value short_sinks = b.parameter("short", {DType::f32, {Hq - 1}});
  const Value bf16_sinks = b.parameter("bf16", {DType::bf16, {Hq}});
  EXPECT_THROW(b.attention(q, kc, kc, start, -1, kScale, {.sinks = short_sinks}, "short"),
               InternalError);
  EXPECT_THROW(b.attention(q, kc, kc, start, -1, kScale, {.sinks = bf16_sinks}, "dtype"),
               InternalError);
  EXPECT_THROW(b.paged_attention(q, kc, kc, table1, pos, kScale, {.sinks = short_sinks}, "paged"),
               InternalError);
  const Value only = b.attention(q, kc, kc, start, -1, kScale, {.sinks = sinks}, "only");
  const Value paged = b.paged_attention(q, kc, kc, table1, pos, kScale, {.sinks = sinks}, "paged");
  const Value packed =
      b.paged_attention(q, kc, kc, table, pos, kScale, {.sinks = sinks}, "packed", rows);
  const graph::Graph pg = b.finish();
  auto operands = [&](Value v) {
    const graph::AttentionOperands o = graph::attention_operands(pg.node(v));
    return std::pair{o.mask_or_rows, o.sinks};
  };
  EXPECT_EQ(operands(only), std::pair(-1, 4));
  EXPECT_EQ(operands(paged), std::pair(-1, 5));
  EXPECT_EQ(operands(packed), std::pair(5, 6));
}

// Both attention ops with bf16 sinks in a bf16 graph, run by the CPU backend (which widens the
// sinks, as it computes in f32) against the references: static with a window, a soft cap and a
// key mask that leaves row 1's first queries no key; paged with a row per sequence and with the
// sequences packed (the rows operand, which the sinks follow).
TEST(GraphOps, AttentionSinksRunOnTheCpuBackendAsTheReferences) {
  constexpr int64_t B = 2, BS = 4, MB = 2, NB = 7;
  std::mt19937 rng(33);
  GraphBuilder b(DType::bf16);
  const Value sinks = b.parameter("sinks", {DType::bf16, {Hq}});
  const Value kc = b.state("k", {DType::bf16, {B, Hkv, S, D}});
  const Value vc = b.state("v", {DType::bf16, {B, Hkv, S, D}});
  const Value kp = b.state("k_pool", {DType::bf16, {NB, Hkv, BS, D}});
  const Value vp = b.state("v_pool", {DType::bf16, {NB, Hkv, BS, D}});
  const Value q = b.input("q", {DType::bf16, {B, T, Hq, D}});
  const Value start = b.input("start", {DType::i32, {}});
  const Value mask = b.input("mask", {DType::i32, {B, S}});
  const Value table = b.input("table", {DType::i32, {B, MB}});
  const Value pos = b.input("pos", {DType::i32, {B, T}});
  const Value table3 = b.input("table3", {DType::i32, {3, MB}});
  const Value rows = b.input("rows", {DType::i32, {B, T}});
  b.output(b.attention(q, kc, vc, start, mask, kScale,
                       {.sliding_window = kWindow, .softcap = kAttnCap, .sinks = sinks}, "attn"));
  b.output(b.paged_attention(q, kp, vp, table, pos, kScale, {.sinks = sinks}, "paged"));
  b.output(b.paged_attention(q, kp, vp, table3, pos, kScale, {.sinks = sinks}, "packed", rows));
  const graph::Graph graph = b.finish();

  const Tensor sv = random_tensor(rng, size_t(Hq), DType::bf16, -1.0f, 3.0f);
  const Tensor qv = random_tensor(rng, size_t(B * T * Hq * D), DType::bf16, -2.0f, 2.0f);
  const Tensor kcv = random_tensor(rng, size_t(B * Hkv * S * D), DType::bf16);
  const Tensor vcv = random_tensor(rng, size_t(B * Hkv * S * D), DType::bf16);
  const Tensor kpv = random_tensor(rng, size_t(NB * Hkv * BS * D), DType::bf16);
  const Tensor vpv = random_tensor(rng, size_t(NB * Hkv * BS * D), DType::bf16);
  std::vector<int32_t> mv(size_t(B * S), 1);
  for (int64_t j = 0; j < 5; ++j) mv[size_t(S + j)] = 0;  // row 1's queries at slots 3, 4: none
  const std::vector<int32_t> tv = {5, 0, 2, 6}, t3v = {5, 0, 2, 6, 1, 3};
  const std::vector<int32_t> pv = {3, 4, 5, 6, 7, -1, -1, 0, 1, 2};
  const std::vector<int32_t> rv = {0, 2, 0, 2, 0, 1, 1, 1, 1, 1};

  auto backend = backends::make_cpu_backend();
  auto bf16 = [](const Shape& s, const Tensor& t) {
    return tformers::Tensor::from_vector<uint16_t>(s, DType::bf16, t.h);
  };
  auto i32 = [](const Shape& s, const std::vector<int32_t>& v) {
    return tformers::Tensor::from_vector<int32_t>(s, DType::i32, v);
  };
  auto sb = backend->upload(bf16({Hq}, sv));
  auto kcb = backend->upload(bf16({B, Hkv, S, D}, kcv)),
       vcb = backend->upload(bf16({B, Hkv, S, D}, vcv));
  auto kpb = backend->upload(bf16({NB, Hkv, BS, D}, kpv));
  auto vpb = backend->upload(bf16({NB, Hkv, BS, D}, vpv));
  const tformers::Tensor ins[] = {
      bf16({B, T, Hq, D}, qv), i32({}, {int32_t(S - T)}), i32({B, S}, mv), i32({B, MB}, tv),
      i32({B, T}, pv),         i32({3, MB}, t3v),         i32({B, T}, rv)};
  std::vector<tformers::Tensor> outs;
  for (int i = 0; i < 3; ++i) outs.push_back(tformers::Tensor::zeros({B, T, Hq, D}, DType::bf16));
  backends::Buffer* params[] = {sb.get()};
  backends::Buffer* states[] = {kcb.get(), vcb.get(), kpb.get(), vpb.get()};
  const tformers::Tensor* inputs[] = {&ins[0], &ins[1], &ins[2], &ins[3],
                                      &ins[4], &ins[5], &ins[6]};
  tformers::Tensor* outputs[] = {&outs[0], &outs[1], &outs[2]};
  backend->compile(graph)->run(params, states, inputs, outputs);

  std::vector<std::vector<float>> want(3, std::vector<float>(qv.f.size()));
  ref::attention(qv.f.data(), kcv.h.data(), vcv.h.data(), DType::bf16, mv.data(), want[0].data(), B,
                 T, Hq, Hkv, S, D, S - T, kScale, kWindow, kAttnCap, sv.f.data());
  ref::paged_attention(qv.f.data(), kpv.h.data(), vpv.h.data(), DType::bf16, tv.data(), nullptr,
                       pv.data(), want[1].data(), B, T, Hq, Hkv, BS, MB, D, kScale, 0, 0.0f,
                       sv.f.data());
  ref::paged_attention(qv.f.data(), kpv.h.data(), vpv.h.data(), DType::bf16, t3v.data(), rv.data(),
                       pv.data(), want[2].data(), B, T, Hq, Hkv, BS, MB, D, kScale, 0, 0.0f,
                       sv.f.data());
  for (size_t i = 0; i < 3; ++i)
    // The outputs rounded to bf16 at the graph's boundary.
    expect_close(outs[i].to_f32_vector(), want[i], nmse_tolerance(D + S + 8, true),
                 graph::op_name(graph.node(graph.outputs()[i]).op));
  for (int64_t t = 0; t < 2; ++t)  // row 1, queries at slots 3 and 4: every key masked
    for (int64_t i = 0; i < Hq * D; ++i)
      EXPECT_EQ(outs[0].to_f32_vector()[size_t(((T + t) * Hq) * D + i)], 0.0f);
}

// linear_quant with int4 tiles: the builder's shape checks, the attributes in the text and the
// hash, and the CPU backend running it (M = 1, the GEMV; M = 5, the GEMM) with and without zero
// points and bias, against the reference with the tolerances of Ops.LinearInt4; the CPU backend
// refuses the int4 rows it has no kernel for.
TEST(GraphOps, LinearQuantInt4ChecksPrintsAndRuns) {
  constexpr int64_t N = 16, K = 80, nb = 3;  // K: two full blocks and a partial one
  const TensorType wt{DType::u8, {N / kInt4Rows, nb, kInt4TileBytes}};
  const TensorType st{DType::f16, {N / kInt4Rows, nb, kInt4Rows}};
  const TensorType zt{DType::u8, st.shape};
  {
    GraphBuilder b;
    const Value x = b.input("x", {DType::f32, {1, K}});
    const Value w = b.parameter("w", wt), s = b.parameter("s", st), z = b.parameter("z", zt);
    const LinearQuantAttrs tiles{QuantScheme::kInt4, QuantLayout::kTiles, false};
    LinearQuantAttrs tiles_zero = tiles;
    tiles_zero.has_zero = true;
    auto quant = [&](Value x, Value w, Value s, Value z = -1, Value bias = -1) {
      return b.linear_quant(x, w, s, z, bias, z >= 0 ? tiles_zero : tiles);
    };
    EXPECT_THROW(quant(b.input("x2", {DType::f32, {1, K + 32}}), w, s), InternalError);
    EXPECT_THROW(quant(x, w, b.parameter("s32", {DType::f32, st.shape})), InternalError);
    EXPECT_THROW(quant(x, b.parameter("w8", {DType::i8, wt.shape}), s), InternalError);
    EXPECT_THROW(quant(x, w, s, b.parameter("zf", {DType::f16, st.shape})), InternalError);
    EXPECT_THROW(quant(x, w, s, z, b.parameter("b", {DType::f32, {N + 1}})), InternalError);
    EXPECT_THROW(b.linear_quant(x, w, s, -1, -1, tiles_zero), InternalError);  // zero missing
    // int8 has no tiles.
    EXPECT_THROW(b.linear_quant(x, w, s, -1, -1, {QuantScheme::kInt8, QuantLayout::kTiles}),
                 InternalError);
    // Rows: int4 codes two a byte, scales per row; the CPU backend does not run them.
    const Value rows = b.linear_quant(x, b.parameter("wr", {DType::u8, {N, K / 2}}),
                                      b.parameter("sr", {DType::f16, {N, nb}}), -1, -1,
                                      {QuantScheme::kInt4, QuantLayout::kRows});
    b.output(rows);
    EXPECT_THROW(backends::make_cpu_backend()->compile(b.finish()), UnsupportedError);
  }
  std::mt19937 rng(41);
  std::uniform_int_distribution<int> byte(0, 255), zp(0, 16);
  std::vector<uint8_t> w(size_t(N / kInt4Rows * nb * kInt4TileBytes)), z(size_t(N * nb));
  for (auto& v : w) v = uint8_t(byte(rng));
  for (auto& v : z) v = uint8_t(zp(rng));
  std::vector<uint16_t> s;
  for (float v : random_f32(rng, size_t(N * nb), -0.02f, 0.02f)) s.push_back(f32_to_f16(v));
  const std::vector<float> bias = random_f32(rng, size_t(N));
  auto backend = backends::make_cpu_backend();
  auto wb = backend->upload(tformers::Tensor::from_vector<uint8_t>(wt.shape, DType::u8, w));
  auto sb = backend->upload(tformers::Tensor::from_vector<uint16_t>(st.shape, DType::f16, s));
  auto zb = backend->upload(tformers::Tensor::from_vector<uint8_t>(zt.shape, DType::u8, z));
  auto bb = backend->upload(tformers::Tensor::from_vector<float>({N}, DType::f32, bias));
  uint64_t hashes[2] = {};
  for (bool with_zero : {false, true})
    for (int64_t M : {1, 5}) {
      GraphBuilder b;
      // Parameters in binding order: w, s, [z,] b.
      const Value x = b.input("x", {DType::f32, {M, K}});
      const Value pw = b.parameter("w", wt), ps = b.parameter("s", st);
      const Value pz = with_zero ? b.parameter("z", zt) : -1;
      const Value pb = b.parameter("b", {DType::f32, {N}});
      const Value y = b.linear_quant(x, pw, ps, pz, pb,
                                     {QuantScheme::kInt4, QuantLayout::kTiles, with_zero}, "proj");
      b.output(y);
      const graph::Graph g = b.finish();
      EXPECT_EQ(g.node(y).type, (TensorType{DType::f32, {M, N}}));
      EXPECT_NE(
          g.to_string().find(with_zero ? "linear_quant(%0, %1, %2, %3, %4) {int4, tiles, zero}"
                                       : "linear_quant(%0, %1, %2, %3) {int4, tiles} -> float32[" +
                                             std::to_string(M) + ", 16]"),
          std::string::npos)
          << g.to_string();
      if (M == 1) hashes[with_zero] = g.hash();
      const std::vector<float> xv = random_f32(rng, size_t(M * K));
      const tformers::Tensor in = tformers::Tensor::from_vector<float>({M, K}, DType::f32, xv);
      tformers::Tensor out = tformers::Tensor::zeros({M, N}, DType::f32);
      std::vector<backends::Buffer*> params = {wb.get(), sb.get()};
      if (with_zero) params.push_back(zb.get());
      params.push_back(bb.get());
      const tformers::Tensor* inputs[] = {&in};
      tformers::Tensor* outputs[] = {&out};
      backend->compile(g)->run(params, {}, inputs, outputs);
      std::vector<float> want(size_t(M * N));
      ref::linear_int4(xv.data(), w.data(), s.data(), with_zero ? z.data() : nullptr, bias.data(),
                       want.data(), M, N, K);
      const std::vector<float> got(out.data<float>(), out.data<float>() + out.numel());
      const bool x_int8 = active_target() != Target::kScalar && M < 4;
      const bool x_bf16 = active_target() >= Target::kAVX512BF16 && M >= 4;  // the BF16 GEMM
      expect_close(got, want, nmse_tolerance(2 * K + 2, x_bf16) + (x_int8 ? 0x1p-14 : 0.0),
                   "graph M=" + std::to_string(M) + (with_zero ? " zero" : ""));
    }
  EXPECT_NE(hashes[0], hashes[1]);
}

}  // namespace
}  // namespace tformers::cpu
