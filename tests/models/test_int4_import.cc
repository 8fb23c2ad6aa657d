// AWQ and GPTQ checkpoints: the tiny packed checkpoints of tools/reference/make_quantized_models.py
// against goldens computed from their dequantized weights, on every CPU target; the conversion of
// the packed tensors by hand (AWQ's nibble order, GPTQ's zero point offset, g_idx); and the
// configurations and tensors that cannot load, with errors naming the field or tensor.
//
// Tolerances: prefill of 4 or more tokens runs the int4 GEMM on exact f32 weights (an f16 scale
// times a small integer), so it is the float32 model up to summation order: the float32 goldens'
// 1e-4; except on AVX-512 BF16, whose GEMM rounds x to bf16 (vdpbf16ps, as for bf16 weights): the
// 2e-2 that bf16 gets against float32 in test_golden.cc. A one-token prompt runs the GEMV, which
// rounds x to int8 per block of 32 (test_quantized.cc explains its 4e-2). Greedy decoding (the GEMV
// again) must follow the goldens until a step whose top-2 margin is under 0.25, where that rounding
// may pick the other token.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/error_of.h"
#include "core/cpu_features.h"
#include "golden_util.h"
#include "io/safetensors.h"
#include "models/int4_import.h"
#include "tformers/error.h"
#include "tformers/model.h"

namespace tformers {
namespace {

namespace fs = std::filesystem;
using models::import_int4;
using models::Int4Import;
using models::read_int4_import;
using testing::error_of;
using testing::load_goldens;
using testing::model_dir;
using testing::prefill_logits;
using testing::row_error;

class Imported : public ::testing::TestWithParam<std::string> {};

TEST_P(Imported, MatchesTheDequantizedGoldensOnEveryTarget) {
  const std::string name = GetParam();
  const cpu::Target saved = cpu::active_target();
  for (cpu::Target target : cpu::supported_targets()) {
    cpu::set_active_target(target);
    const std::string where = name + " on " + std::string(cpu::target_name(target));
    CausalLM lm = AutoModelForCausalLM::from_pretrained(model_dir(name),
                                                        {.dtype = float32, .device_map = "cpu"});
    const int64_t V = lm.config().vocab_size;
    for (const auto& c : load_goldens(name, "float32")) {
      Tensor logits = prefill_logits(lm, c.input_ids);
      const double tolerance = c.input_ids.size() < 4               ? 4e-2
                               : target >= cpu::Target::kAVX512BF16 ? 2e-2
                                                                    : 1e-4;
      for (size_t t = 0; t < c.logits.size(); ++t)
        EXPECT_LT(row_error(logits.data<float>() + t * V, c.logits[t]), tolerance)
            << where << " prompt of " << c.input_ids.size() << " position " << t;
      auto out = lm.generate({c.input_ids}, {.max_new_tokens = int64_t(c.greedy.size())});
      for (size_t k = 0; k < c.greedy.size(); ++k) {
        if (c.greedy_margins[k] < 0.25f) break;
        ASSERT_EQ(out[0][c.input_ids.size() + k], c.greedy[k]) << where << " step " << k;
      }
    }
  }
  cpu::set_active_target(saved);
}

// Their float16 tensors become bfloat16 by default (the CPU backend computes in f32 from f32 or
// bf16 weights), within bf16's 2e-2 of the goldens.
TEST_P(Imported, LoadsInBfloat16ByDefault) {
  const std::string name = GetParam();
  CausalLM lm = AutoModelForCausalLM::from_pretrained(model_dir(name), {.device_map = "cpu"});
  EXPECT_EQ(lm.dtype(), bfloat16);
  const int64_t V = lm.config().vocab_size;
  for (const auto& c : load_goldens(name, "float32")) {
    if (c.input_ids.size() < 4) continue;
    Tensor logits = prefill_logits(lm, c.input_ids);
    for (size_t t = 0; t < c.logits.size(); ++t)
      EXPECT_LT(row_error(logits.data<float>() + t * V, c.logits[t]), 2e-2) << name << " " << t;
  }
}

// Saved by save_pretrained, an imported model is a tformers int4 checkpoint with zero points,
// which loads with the same logits.
TEST_P(Imported, SavesAsTformersInt4WithZeroPoints) {
  const std::string name = GetParam();
  const fs::path dir =
      fs::temp_directory_path() / ("tformers-import-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  CausalLM lm = AutoModelForCausalLM::from_pretrained(model_dir(name),
                                                      {.dtype = float32, .device_map = "cpu"});
  lm.save_pretrained(dir.string());
  const io::Checkpoint saved = io::Checkpoint::open(dir.string());
  EXPECT_TRUE(saved.has("model.layers.0.mlp.down_proj.weight_zero"));
  CausalLM again = AutoModelForCausalLM::from_pretrained(dir.string(), {.device_map = "cpu"});
  for (const auto& c : load_goldens(name, "float32")) {
    Tensor a = prefill_logits(lm, c.input_ids), b = prefill_logits(again, c.input_ids);
    ASSERT_EQ(a.numel(), b.numel());
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << name;
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, Imported,
                         ::testing::Values("tiny-llama-awq", "tiny-qwen3-gptq"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// ---- The conversion, on packed tensors written here from the formats' definitions.

const std::string kConfig = "config.json: quantization_config";

// One linear "w" (N = 8 outputs, K = 96 inputs) with codes (n * 7 + k * 3) % 16, written into a
// checkpoint folder by `pack`, read by import_int4 under `q`.
class Conversion : public ::testing::Test {
 protected:
  static constexpr int64_t N = 8, K = 96;
  void SetUp() override { fs::create_directories(dir_); }
  void TearDown() override { fs::remove_all(dir_); }
  static int code(int64_t n, int64_t k) { return int((n * 7 + k * 3) % 16); }
  // Words of 8 nibbles, nibble i = value(i).
  static int32_t word(const std::function<int(int)>& value) {
    uint32_t w = 0;
    for (int i = 0; i < 8; ++i) w |= uint32_t(value(i)) << (4 * i);
    return int32_t(w);
  }
  models::Int4Codes convert(const Int4Import& q,
                            const std::vector<std::pair<std::string, Tensor>>& tensors) {
    io::save_safetensors((dir_ / "model.safetensors").string(), tensors);
    const io::Checkpoint ckpt = io::Checkpoint::open(dir_.string());
    return import_int4(ckpt, dir_.string(), q, "w", N, K);
  }
  static Tensor f16(Shape shape, const std::function<float(int64_t)>& value) {
    Tensor t = Tensor::zeros(shape, DType::f16);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<uint16_t>()[i] = f32_to_f16(value(i));
    return t;
  }
  static Tensor i32(Shape shape, const std::function<int32_t(int64_t)>& value) {
    Tensor t = Tensor::zeros(shape, DType::i32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = value(i);
    return t;
  }
  void expect_codes(const models::Int4Codes& r) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        ASSERT_EQ(r.codes.data<uint8_t>()[n * K + k], code(n, k)) << n << " " << k;
  }
  const fs::path dir_ = fs::temp_directory_path() / ("tformers-conv-" + std::to_string(::getpid()));
};

// AWQ, groups of 32: qweight (K, N/8) with output 8c + [0,2,4,6,1,3,5,7][i] in nibble i; zero
// point of (group g, output n) = (g + n) % 16, scale (g + 1) / 4 + n.
TEST_F(Conversion, AwqNibbleOrder) {
  const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  const Tensor qweight =
      i32({K, N / 8}, [&](int64_t k) { return word([&](int i) { return code(order[i], k); }); });
  const Tensor qzeros = i32({K / 32, N / 8}, [&](int64_t g) {
    return word([&](int i) { return int((g + order[i]) % 16); });
  });
  const Tensor scales = f16({K / 32, N}, [](int64_t i) { return float(i / N + 1) / 4 + i % N; });
  const auto r = convert({.method = "awq", .group_size = 32},
                         {{"w.qweight", qweight}, {"w.qzeros", qzeros}, {"w.scales", scales}});
  expect_codes(r);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < 3; ++b) {
      EXPECT_EQ(r.zero.data<uint8_t>()[n * 3 + b], (b + n) % 16) << n << " " << b;
      EXPECT_EQ(f16_to_f32(r.scale.data<uint16_t>()[n * 3 + b]), float(b + 1) / 4 + n);
    }
}

// GPTQ: qweight (K/8, N) with input 8r + i in nibble i; stored zero points one less than used;
// g_idx that places whole blocks in groups out of order (honoured), group -1 (one group), and
// checkpoint_format gptq_v2 (no offset).
TEST_F(Conversion, GptqOffsetsAndGroups) {
  const Tensor qweight = i32({K / 8, N}, [&](int64_t i) {
    const int64_t r = i / N, n = i % N;
    return word([&](int j) { return code(n, 8 * r + j); });
  });
  auto tensors = [&](int64_t groups, const std::vector<int32_t>& g_idx) {
    std::vector<std::pair<std::string, Tensor>> t = {
        {"w.qweight", qweight},
        {"w.qzeros",
         i32({groups, N / 8},
             [&](int64_t g) { return word([&](int i) { return int((3 * g + i) % 15); }); })},
        {"w.scales", f16({groups, N}, [](int64_t i) { return 0.5f + float(i); })}};
    if (!g_idx.empty())
      t.emplace_back("w.g_idx", Tensor::from_vector<int32_t>({K}, DType::i32, g_idx));
    return t;
  };
  // Blocks 0, 1, 2 in groups 2, 0, 1 (desc_act put them out of order, each whole).
  std::vector<int32_t> g_idx(K);
  for (int64_t k = 0; k < K; ++k) g_idx[size_t(k)] = int32_t((k / 32 + 2) % 3);
  auto r = convert({.method = "gptq", .group_size = 32, .zero_offset = 1, .desc_act = true},
                   tensors(3, g_idx));
  expect_codes(r);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < 3; ++b) {
      const int64_t g = (b + 2) % 3;
      EXPECT_EQ(r.zero.data<uint8_t>()[n * 3 + b], (3 * g + n) % 15 + 1) << n << " " << b;
      EXPECT_EQ(f16_to_f32(r.scale.data<uint16_t>()[n * 3 + b]), 0.5f + float(g * N + n));
    }
  r = convert({.method = "gptq", .group_size = -1, .zero_offset = 0}, tensors(1, {}));
  expect_codes(r);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < 3; ++b) EXPECT_EQ(r.zero.data<uint8_t>()[n * 3 + b], n % 15);
}

TEST_F(Conversion, GroupsThatSplitABlockAreRejected) {
  std::vector<int32_t> g_idx(K);
  for (int64_t k = 0; k < K; ++k) g_idx[size_t(k)] = int32_t(k % 3);  // act-order interleaving
  const std::string msg = error_of<UnsupportedError>([&] {
    convert({.method = "gptq", .group_size = 32, .zero_offset = 1, .desc_act = true},
            {{"w.qweight", i32({K / 8, N}, [](int64_t) { return 0; })},
             {"w.qzeros", i32({3, N / 8}, [](int64_t) { return 0; })},
             {"w.scales", f16({3, N}, [](int64_t) { return 1.0f; })},
             {"w.g_idx", Tensor::from_vector<int32_t>({K}, DType::i32, g_idx)}});
  });
  EXPECT_CONTAINS(msg, "'w.g_idx'");
  EXPECT_CONTAINS(msg, "inputs 0 and 1 in different groups");
  EXPECT_CONTAINS(msg, "desc_act true");
}

TEST_F(Conversion, PartsOfTheWrongShapeOrMissingAreNamed) {
  std::string msg = error_of<FormatError>([&] {
    convert({.method = "awq", .group_size = 32},
            {{"w.qweight", i32({K, N / 8}, [](int64_t) { return 0; })},
             {"w.qzeros", i32({3, N / 8}, [](int64_t) { return 0; })},
             {"w.scales", f16({2, N}, [](int64_t) { return 1.0f; })}});
  });
  EXPECT_CONTAINS(msg, "tensor 'w.scales'");
  EXPECT_CONTAINS(msg, "needs float16[3, 8]");
  msg = error_of<NotFoundError>([&] {
    convert({.method = "awq", .group_size = 32},
            {{"w.qweight", i32({K, N / 8}, [](int64_t) { return 0; })}});
  });
  EXPECT_CONTAINS(msg, "no tensor 'w.qzeros'");
}

// ---- quantization_config.

// `base` with the fields of `changes` set.
nlohmann::json with(nlohmann::json base, const nlohmann::json& changes) {
  base.update(changes);
  return base;
}

TEST(Int4Config, WhatCannotLoadNamesTheField) {
  auto error = [](nlohmann::json q) {
    return error_of<UnsupportedError>([&] { read_int4_import(q, kConfig); });
  };
  const nlohmann::json awq = {{"quant_method", "awq"},
                              {"bits", 4},
                              {"group_size", 128},
                              {"zero_point", true},
                              {"version", "gemm"}};
  const nlohmann::json gptq = {{"quant_method", "gptq"},
                               {"bits", 4},
                               {"group_size", 128},
                               {"desc_act", false},
                               {"sym", true}};
  EXPECT_CONTAINS(error(with(awq, {{"bits", 8}})), "field 'bits' is 8");
  EXPECT_CONTAINS(error(with(gptq, {{"bits", 3}})), "field 'bits' is 3");
  EXPECT_CONTAINS(error(with(awq, {{"version", "GEMV"}})), "field 'version' is 'gemv'");
  EXPECT_CONTAINS(error(with(awq, {{"zero_point", false}})), "field 'zero_point' is false");
  EXPECT_CONTAINS(error(with(gptq, {{"group_size", 16}})), "field 'group_size' is 16");
  EXPECT_CONTAINS(error(with(gptq, {{"checkpoint_format", "marlin"}})),
                  "field 'checkpoint_format' is 'marlin'");
  EXPECT_CONTAINS(error(with(gptq, {{"is_marlin_format", true}})), "field 'is_marlin_format'");
  // What loads: AWQ's "GEMM" in capitals, GPTQ's classic and v2 formats, one group per row.
  EXPECT_EQ(read_int4_import(with(awq, {{"version", "GEMM"}}), kConfig)->method, "awq");
  EXPECT_EQ(read_int4_import(gptq, kConfig)->zero_offset, 1);
  EXPECT_EQ(read_int4_import(with(gptq, {{"checkpoint_format", "gptq_v2"}}), kConfig)->zero_offset,
            0);
  EXPECT_EQ(read_int4_import(with(gptq, {{"group_size", -1}}), kConfig)->group_size, -1);
  EXPECT_FALSE(read_int4_import({{"quant_method", "tformers"}}, kConfig));
}

// Through from_pretrained, the message names config.json.
TEST(Int4Config, ReachesTheLoaderWithTheFile) {
  const fs::path dir = fs::temp_directory_path() / ("tformers-awq-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& f : fs::directory_iterator(model_dir("tiny-llama-awq")))
    fs::copy(f.path(), dir / f.path().filename());
  auto config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  config["quantization_config"]["version"] = "exllama";
  std::ofstream(dir / "config.json") << config.dump(2);
  const std::string msg = error_of<UnsupportedError>(
      [&] { AutoModelForCausalLM::from_pretrained(dir.string(), {.device_map = "cpu"}); });
  EXPECT_CONTAINS(msg, (dir / "config.json").string() + ": quantization_config: field 'version'");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tformers
