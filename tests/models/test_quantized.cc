// int8 and int4 weight-only quantization (LoadOptions::quantize) against the bf16 model and the
// independent PyTorch reference, int4 against the float32 model of its dequantized weights, and
// the goldens on every CPU target this machine supports.
//
// Metric for int8 (issue 5: "logits within 2 % relative cross-entropy of bf16"): on every
// position t of every golden prompt, the target is the reference's greedy next token
// y_t = argmax of the float32 reference logits at t, and CE_x(t) = -log softmax(logits_x[t])[y_t]
// for x in {bf16, int8 (or int4)}, both computed by tformers from the same checkpoint. The relative
// cross-entropy difference is
//   sum_t |CE_int8(t) - CE_bf16(t)| / sum_t CE_bf16(t)
// (absolute differences, so errors of opposite sign cannot cancel) and must be <= 0.02.
// Measured when written: 0.0147 (tiny-qwen3), 0.0173 (tiny-llama), 0.0141 (tiny-llama-sharded);
// one scale per row instead of per 32-block gave 0.022 on tiny-qwen3 and failed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/cpu/kernels.h"
#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "golden_util.h"
#include "io/safetensors.h"
#include "models/causal_lm_impl.h"
#include "tformers/error.h"
#include "tformers/model.h"

namespace tformers {
namespace {

using testing::load_goldens;
using testing::model_dir;
using testing::prefill_logits;
using testing::row_error;

// -log softmax(row)[target], in double.
double cross_entropy(const float* row, int64_t V, int64_t target) {
  double mx = row[0];
  for (int64_t i = 1; i < V; ++i) mx = std::max(mx, double(row[i]));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(row[i]) - mx);
  return std::log(sum) + mx - double(row[target]);
}

// The quantized model's relative cross-entropy difference from bf16 (see the top of the file),
// checking on the way that each row stays within `row_tolerance` of the float32 reference and
// that quantization changed something.
double relative_ce_difference(const std::string& name, const std::string& scheme,
                              double row_tolerance) {
  CausalLM bf16 = AutoModelForCausalLM::from_pretrained(model_dir(name),
                                                        {.dtype = bfloat16, .device_map = "cpu"});
  CausalLM q = AutoModelForCausalLM::from_pretrained(
      model_dir(name), {.dtype = bfloat16, .device_map = "cpu", .quantize = scheme});
  const int64_t V = bf16.config().vocab_size;
  double diff = 0, base = 0, worst_row = 0;
  bool any_different = false;
  for (const auto& c : load_goldens(name, "float32")) {
    Tensor lb = prefill_logits(bf16, c.input_ids), lq = prefill_logits(q, c.input_ids);
    EXPECT_EQ(lq.numel(), int64_t(c.logits.size()) * V);
    for (size_t t = 0; t < c.logits.size(); ++t) {
      const auto& ref = c.logits[t];
      const int64_t target = std::max_element(ref.begin(), ref.end()) - ref.begin();
      const float *rb = lb.data<float>() + t * V, *rq = lq.data<float>() + t * V;
      const double cb = cross_entropy(rb, V, target), cq = cross_entropy(rq, V, target);
      diff += std::abs(cq - cb);
      base += cb;
      for (int64_t i = 0; i < V; ++i) any_different |= rb[i] != rq[i];
      worst_row = std::max(worst_row, row_error(rq, ref));
      EXPECT_LT(row_error(rq, ref), row_tolerance) << name << " " << scheme << " position " << t;
    }
  }
  EXPECT_TRUE(any_different) << "the " << scheme
                             << " model computed exactly the bf16 logits: not quantized?";
  EXPECT_GT(base, 0);
  ::testing::Test::RecordProperty("relative_ce_difference_" + scheme, std::to_string(diff / base));
  std::printf("%s %s: relative cross-entropy difference %.4f, worst row error %.4f\n", name.c_str(),
              scheme.c_str(), diff / base, worst_row);
  return diff / base;
}

class Quantized : public ::testing::TestWithParam<std::string> {};

// int4's allowance per logits row against the float32 reference (see below).
constexpr double kInt4Row = 0.8;

TEST_P(Quantized, Int8CrossEntropyWithinTwoPercentOfBf16) {
  // Per row against the float32 reference, with the bf16-vs-PyTorch-bf16 allowance of
  // test_golden.cc: int8 rounding (half a step of max|row| / 127 per weight, about 2^-9
  // relative to the largest weight) is of the same order as bf16's 2^-9.
  EXPECT_LE(relative_ce_difference(GetParam(), "int8", 5e-2), 0.02) << GetParam();
}

// int4 (issue 19: logits of a tiny model within a stated tolerance of float32). Its step is 2^-3
// of a block's largest |weight| (Q4_0's scale m / -8), int8's 2^-7 (max / 127): 16 times larger.
// For errors this small the logits' error and the cross-entropy difference grow in proportion,
// so both of int8's bounds are scaled by 16: rows within 0.8 of the float32 reference, and a
// relative cross-entropy difference from bf16 of at most 0.32. Measured when written (int8 in
// brackets): 0.291, 0.215, 0.256 (0.0147, 0.0173, 0.0141), worst rows 0.41, 0.35, 0.43 (0.032,
// 0.027, 0.025). These random tiny models lose more than a trained one: the shipped model's
// held-out perplexity moves by 0.9 % (test_default_model.cc).
TEST_P(Quantized, Int4CrossEntropyWithin32PercentOfBf16) {
  EXPECT_LE(relative_ce_difference(GetParam(), "int4", kInt4Row), 0.32) << GetParam();
}

TEST_P(Quantized, Int8GreedyMatchesReferenceUntilNearTie) {
  const std::string name = GetParam();
  CausalLM lm = AutoModelForCausalLM::from_pretrained(
      model_dir(name), {.dtype = bfloat16, .device_map = "cpu", .quantize = "int8"});
  for (const auto& c : load_goldens(name, "bfloat16")) {
    auto out = lm.generate({c.input_ids}, {.max_new_tokens = int64_t(c.greedy.size())});
    for (size_t k = 0; k < c.greedy.size(); ++k) {
      if (c.greedy_margins[k] < 0.25f) break;  // a near-tie: rounding may flip it
      EXPECT_EQ(out[0][c.input_ids.size() + k], c.greedy[k]) << name << " step " << k;
      if (out[0][c.input_ids.size() + k] != c.greedy[k]) break;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, Quantized,
                         ::testing::Values("tiny-qwen3", "tiny-llama", "tiny-llama-sharded"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// The mixtures of experts, their experts quantized too (Backend::prepare_experts). Where two
// experts' router scores nearly tie, quantization can pick the other and move the whole row:
// hf-qwen3-moe, whose router has such near-ties (its bf16 golden in test_golden.cc), measured a
// worst row of 0.165 against float32 in int8 and a cross-entropy difference of 0.34 in int4
// (2026-12-07), so it is not held to these dense-model bounds; the other two are (measured:
// int8 0.0107 and 0.0151, int4 0.215 and 0.223).
INSTANTIATE_TEST_SUITE_P(HfMoeModels, Quantized, ::testing::Values("hf-mixtral", "hf-glm4-moe"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// The experts are what quantize shrinks in a mixture: they hold int8 codes (int4 tiles) with
// their scales, stacked by expert, not the float tensors; the router stays as stored.
TEST(QuantizedLoad, ExpertsAreQuantizedStackedByExpert) {
  const std::string experts = "model.layers.1.mlp.experts.gate_up_proj";
  for (const char* scheme : {"int8", "int4"}) {
    CausalLM lm = AutoModelForCausalLM::from_pretrained(
        model_dir("hf-glm4-moe"), {.dtype = float32, .device_map = "cpu", .quantize = scheme});
    const CausalLM::Impl& m = models::state_of(lm);
    const graph::TensorType w = m.weight_types.at(experts);
    EXPECT_EQ(w.dtype, std::string(scheme) == "int8" ? DType::i8 : DType::u8) << scheme;
    EXPECT_EQ(w.shape[0], 8) << scheme << ": " << w.str();
    EXPECT_EQ(m.weight_types.at(experts + "_scale").shape[0], 8) << scheme;
    EXPECT_TRUE(m.quant_attrs.count(experts)) << scheme;
    EXPECT_EQ(m.weight_types.at("model.layers.1.mlp.gate.weight").dtype, DType::f32) << scheme;
  }
}

TEST(QuantizedLoad, UnknownSchemeIsRejected) {
  try {
    AutoModelForCausalLM::from_pretrained(model_dir("tiny-qwen3"),
                                          {.device_map = "cpu", .quantize = "int3"});
    FAIL() << "int3 accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("\"int8\" or \"int4\""), std::string::npos) << e.what();
  }
}

// The int4 model is the float32 model of its dequantized weights: tiny-qwen3 with every linear
// weight replaced by scale * (code - 8) of its int4 quantization (quantize_int4, read back code by
// code; the tied head written out as its own tensor) and loaded as float32 gives the logits of
// tiny-qwen3 loaded with quantize = "int4", in prefill (the GEMM, exact f32 weights: at most f32
// summation order, the float32 goldens' 1e-4; the same numbers when written) and in decode (the
// GEMV, which also rounds x to int8 per 32-block: up to 2^-8 of the block's largest |x| per
// value, twice bf16's 2^-9, so twice the 2e-2 that bf16 gets against float32 in test_golden.cc;
// 0.010-0.016 when written). On AVX-512 BF16 the prefill GEMM rounds x to bf16 (vdpbf16ps, as for
// bf16 weights): there prefill gets bf16's 2e-2.
TEST(Int4Load, EqualsFloat32ModelOfDequantizedWeights) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tformers-int4-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const io::Checkpoint ckpt = io::Checkpoint::open(model_dir("tiny-qwen3"));
  std::vector<std::pair<std::string, Tensor>> tensors;
  auto dequantized = [&](const Tensor& w) {
    const Tensor f = w.to(DType::f32);
    const int64_t N = f.dim(0), K = f.dim(1), nb = cpu::int4_blocks(K);
    std::vector<uint8_t> codes(size_t(N / cpu::kInt4Rows * nb * cpu::kInt4TileBytes));
    std::vector<uint16_t> scale(size_t(N * nb));
    cpu::quantize_int4(f.raw(), DType::f32, codes.data(), scale.data(), N, K, ThreadPool::global());
    Tensor out = Tensor::zeros({N, K}, DType::f32);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        out.data<float>()[n * K + k] =
            f16_to_f32(scale[size_t((n / 8 * nb + k / 32) * 8 + n % 8)]) *
            float(cpu::int4_code(codes.data(), K, n, k) - 8);
    return out;
  };
  for (const auto& name : ckpt.names()) {
    const Tensor t = ckpt.get(name);
    const bool linear = t.ndim() == 2 && name != "model.embed_tokens.weight";
    tensors.push_back({name, linear ? dequantized(t) : t.to(DType::f32)});
  }
  tensors.push_back({"lm_head.weight", dequantized(ckpt.get("model.embed_tokens.weight"))});
  io::save_safetensors((dir / "model.safetensors").string(), tensors);
  nlohmann::json config =
      nlohmann::json::parse(std::ifstream(model_dir("tiny-qwen3") + "/config.json"));
  config["tie_word_embeddings"] = false;
  std::ofstream(dir / "config.json") << config.dump(2);

  CausalLM f32 =
      AutoModelForCausalLM::from_pretrained(dir.string(), {.dtype = float32, .device_map = "cpu"});
  CausalLM q = AutoModelForCausalLM::from_pretrained(
      model_dir("tiny-qwen3"), {.dtype = float32, .device_map = "cpu", .quantize = "int4"});
  const int64_t V = f32.config().vocab_size;
  // Prefill on every target this CPU has, so that the exact-weights claim (1e-4) is checked on
  // AVX-512 BF16 hosts too, through their other targets; decode below on the active one.
  const cpu::Target active = cpu::active_target();
  for (cpu::Target target : cpu::supported_targets()) {
    cpu::set_active_target(target);
    CausalLM qt = AutoModelForCausalLM::from_pretrained(
        model_dir("tiny-qwen3"), {.dtype = float32, .device_map = "cpu", .quantize = "int4"});
    const double tolerance = target >= cpu::Target::kAVX512BF16 ? 2e-2 : 1e-4;
    for (const auto& c : load_goldens("tiny-qwen3", "float32")) {
      if (c.input_ids.size() < 4) continue;  // a prefill of fewer rows would take the GEMV
      Tensor want = prefill_logits(f32, c.input_ids), got = prefill_logits(qt, c.input_ids);
      for (size_t t = 0; t < c.input_ids.size(); ++t) {
        const std::vector<float> row(want.data<float>() + t * V, want.data<float>() + (t + 1) * V);
        EXPECT_LT(row_error(got.data<float>() + t * V, row), tolerance)
            << cpu::target_name(target) << " prefill position " << t;
      }
    }
  }
  cpu::set_active_target(active);
  int checked = 0;
  for (const auto& c : load_goldens("tiny-qwen3", "float32")) {
    if (c.input_ids.size() < 4) continue;
    ++checked;
    // Decode: the last token on its own after the rest of the prompt.
    const int64_t T = int64_t(c.input_ids.size());
    for (CausalLM* lm : {&f32, &q}) {
      lm->reset_cache(1, T);
      ForwardArgs a;
      a.input_ids = Tensor::from_vector<int32_t>(
          {1, T - 1}, DType::i32, std::vector<int32_t>(c.input_ids.begin(), c.input_ids.end() - 1));
      lm->forward(a);
    }
    ForwardArgs a;
    a.input_ids = Tensor::from_vector<int32_t>({1, 1}, DType::i32, {c.input_ids.back()});
    a.cache_position = T - 1;
    Tensor wd = f32.forward(a), gd = q.forward(a);
    const std::vector<float> row(wd.data<float>(), wd.data<float>() + V);
    EXPECT_LT(row_error(gd.data<float>(), row), 4e-2) << "decode";
  }
  EXPECT_GE(checked, 2);
  fs::remove_all(dir);
}

// LoadOptions::progress reports every checkpoint byte read, in order, ending at its total: the
// checkpoint's tensors, plus the tied embedding once more when the head gets its quantized copy.
TEST(LoadProgress, CountsEveryByteReadOnce) {
  const std::string dir = model_dir("tiny-qwen3");  // tied embeddings
  const io::Checkpoint ckpt = io::Checkpoint::open(dir);
  for (const std::string quantize : {"", "int8", "int4"}) {
    std::vector<std::tuple<std::string, int64_t, int64_t>> calls;
    LoadOptions opt{.dtype = DType::f32, .device_map = "cpu", .quantize = quantize};
    opt.progress = [&](std::string_view stage, int64_t done, int64_t total) {
      calls.emplace_back(std::string(stage), done, total);
    };
    AutoModelForCausalLM::from_pretrained(dir, opt);
    ASSERT_FALSE(calls.empty()) << quantize;
    const int64_t expected =
        int64_t(ckpt.total_bytes()) +
        (quantize.empty() ? 0 : int64_t(ckpt.info("model.embed_tokens.weight").nbytes));
    int64_t prev = 0;
    for (const auto& [stage, done, total] : calls) {
      EXPECT_EQ(stage, quantize.empty() ? "loading weights" : "quantizing to " + quantize);
      EXPECT_EQ(total, expected) << quantize;
      EXPECT_GT(done, prev) << quantize;
      prev = done;
    }
    EXPECT_EQ(std::get<1>(calls.back()), expected) << quantize;
  }
}

// The float32 and bfloat16 goldens of one tiny model on every target the CPU supports (the
// op-consistency tests cover each kernel; this covers their composition), and int8 and int4 on
// each, with the row tolerances of the tests above.
TEST(EveryTarget, GoldensHold) {
  const cpu::Target saved = cpu::active_target();
  for (cpu::Target target : cpu::supported_targets()) {
    cpu::set_active_target(target);
    const std::string where = std::string("target ") + std::string(cpu::target_name(target));
    auto f32 = load_goldens("tiny-qwen3", "float32");
    for (DType dt : {DType::f32, DType::bf16}) {
      CausalLM lm = AutoModelForCausalLM::from_pretrained(model_dir("tiny-qwen3"),
                                                          {.dtype = dt, .device_map = "cpu"});
      for (const auto& c : f32) {
        Tensor logits = prefill_logits(lm, c.input_ids);
        const int64_t V = lm.config().vocab_size;
        for (size_t t = 0; t < c.logits.size(); ++t)
          EXPECT_LT(row_error(logits.data<float>() + t * V, c.logits[t]),
                    dt == DType::f32 ? 1e-4 : 2e-2)
              << where << " " << dtype_name(dt) << " position " << t;
        if (dt == DType::f32) {  // greedy of the exact model is exact
          auto out = lm.generate({c.input_ids}, {.max_new_tokens = int64_t(c.greedy.size())});
          EXPECT_EQ(std::vector<int32_t>(out[0].begin() + c.input_ids.size(), out[0].end()),
                    c.greedy)
              << where;
        }
      }
    }
    for (const auto& [scheme, tolerance] : {std::pair{"int8", 5e-2}, std::pair{"int4", kInt4Row}}) {
      CausalLM q = AutoModelForCausalLM::from_pretrained(
          model_dir("tiny-qwen3"), {.dtype = bfloat16, .device_map = "cpu", .quantize = scheme});
      for (const auto& c : f32) {
        Tensor logits = prefill_logits(q, c.input_ids);
        const int64_t V = q.config().vocab_size;
        for (size_t t = 0; t < c.logits.size(); ++t)
          EXPECT_LT(row_error(logits.data<float>() + t * V, c.logits[t]), tolerance)
              << where << " " << scheme << " position " << t;
      }
    }
  }
  cpu::set_active_target(saved);
}

}  // namespace
}  // namespace tformers
