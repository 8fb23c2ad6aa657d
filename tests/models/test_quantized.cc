// int8 weight-only quantization (LoadOptions::quantize = "int8") against the bf16 model and the
// independent PyTorch reference, and the goldens on every CPU target this machine supports.
//
// Metric for int8 (issue 5: "logits within 2 % relative cross-entropy of bf16"): on every
// position t of every golden prompt, the target is the reference's greedy next token
// y_t = argmax of the float32 reference logits at t, and CE_x(t) = -log softmax(logits_x[t])[y_t]
// for x in {bf16, int8}, both computed by tformers from the same checkpoint. The relative
// cross-entropy difference is
//   sum_t |CE_int8(t) - CE_bf16(t)| / sum_t CE_bf16(t)
// (absolute differences, so errors of opposite sign cannot cancel) and must be <= 0.02.
// Measured when written: 0.0147 (tiny-qwen3), 0.0173 (tiny-llama), 0.0141 (tiny-llama-sharded);
// one scale per row instead of per 32-block gave 0.022 on tiny-qwen3 and failed.
#include <gtest/gtest.h>

#include <cmath>

#include "core/cpu_features.h"
#include "golden_util.h"
#include "io/safetensors.h"
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

class Int8 : public ::testing::TestWithParam<std::string> {};

TEST_P(Int8, CrossEntropyWithinTwoPercentOfBf16) {
  const std::string name = GetParam();
  CausalLM bf16 = AutoModelForCausalLM::from_pretrained(model_dir(name),
                                                        {.dtype = bfloat16, .device_map = "cpu"});
  CausalLM int8 = AutoModelForCausalLM::from_pretrained(
      model_dir(name), {.dtype = bfloat16, .device_map = "cpu", .quantize = "int8"});
  const int64_t V = bf16.config().vocab_size;
  double diff = 0, base = 0;
  bool any_different = false;
  for (const auto& c : load_goldens(name, "float32")) {
    Tensor lb = prefill_logits(bf16, c.input_ids), lq = prefill_logits(int8, c.input_ids);
    ASSERT_EQ(lq.numel(), int64_t(c.logits.size()) * V);
    for (size_t t = 0; t < c.logits.size(); ++t) {
      const auto& ref = c.logits[t];
      const int64_t target = std::max_element(ref.begin(), ref.end()) - ref.begin();
      const float *rb = lb.data<float>() + t * V, *rq = lq.data<float>() + t * V;
      const double cb = cross_entropy(rb, V, target), cq = cross_entropy(rq, V, target);
      diff += std::abs(cq - cb);
      base += cb;
      for (int64_t i = 0; i < V; ++i) any_different |= rb[i] != rq[i];
      // Per row against the float32 reference, with the bf16-vs-PyTorch-bf16 allowance of
      // test_golden.cc: int8 rounding (half a step of max|row| / 127 per weight, about 2^-9
      // relative to the largest weight) is of the same order as bf16's 2^-9.
      EXPECT_LT(row_error(rq, ref), 5e-2) << name << " position " << t;
    }
  }
  EXPECT_TRUE(any_different) << "the int8 model computed exactly the bf16 logits: not quantized?";
  ASSERT_GT(base, 0);
  EXPECT_LE(diff / base, 0.02) << name << ": relative cross-entropy difference";
  RecordProperty("relative_ce_difference", std::to_string(diff / base));
}

TEST_P(Int8, GreedyMatchesReferenceUntilNearTie) {
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

INSTANTIATE_TEST_SUITE_P(TinyModels, Int8,
                         ::testing::Values("tiny-qwen3", "tiny-llama", "tiny-llama-sharded"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

TEST(Int8Load, UnknownSchemeIsRejected) {
  try {
    AutoModelForCausalLM::from_pretrained(model_dir("tiny-qwen3"),
                                          {.device_map = "cpu", .quantize = "int4"});
    FAIL() << "int4 accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("int8"), std::string::npos) << e.what();
  }
}

// LoadOptions::progress reports every checkpoint byte read, in order, ending at its total: the
// checkpoint's tensors, plus the tied embedding once more when the head gets its int8 copy.
TEST(LoadProgress, CountsEveryByteReadOnce) {
  const std::string dir = model_dir("tiny-qwen3");  // tied embeddings
  const io::Checkpoint ckpt = io::Checkpoint::open(dir);
  for (const std::string quantize : {"", "int8"}) {
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
      EXPECT_EQ(stage, quantize.empty() ? "loading weights" : "quantizing to int8");
      EXPECT_EQ(total, expected) << quantize;
      EXPECT_GT(done, prev) << quantize;
      prev = done;
    }
    EXPECT_EQ(std::get<1>(calls.back()), expected) << quantize;
  }
}

// The float32 and bfloat16 goldens of one tiny model on every target the CPU supports (the
// op-consistency tests cover each kernel; this covers their composition), and int8 on each.
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
    CausalLM q = AutoModelForCausalLM::from_pretrained(
        model_dir("tiny-qwen3"), {.dtype = bfloat16, .device_map = "cpu", .quantize = "int8"});
    for (const auto& c : f32) {
      Tensor logits = prefill_logits(q, c.input_ids);
      const int64_t V = q.config().vocab_size;
      for (size_t t = 0; t < c.logits.size(); ++t)
        EXPECT_LT(row_error(logits.data<float>() + t * V, c.logits[t]), 5e-2)
            << where << " int8 position " << t;
    }
  }
  cpu::set_active_target(saved);
}

}  // namespace
}  // namespace tformers
