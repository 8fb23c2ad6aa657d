// The layouts in which checkpoints store weights other than as tformers holds them
// (models/stored_layout.h): MXFP4 decoded by the format's definition (sign, two exponent bits,
// one mantissa bit; an e8m0 power of two per 32 values), gpt-oss's transposed and interleaved
// experts read into tformers' shape and written back byte for byte, and the tensors that cannot
// load refused with errors naming them. The whole path against Transformers' own MXFP4
// dequantization is hf-gpt-oss-mxfp4 in test_golden.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/error_of.h"
#include "golden_util.h"
#include "io/safetensors.h"
#include "models/causal_lm_impl.h"
#include "models/stored_layout.h"
#include "tformers/error.h"
#include "tformers/model.h"

namespace tformers {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

// e2m1 by its definition: bit 3 the sign, bits 2-1 the exponent (bias 1), bit 0 the mantissa;
// exponent 0 is subnormal (0 or 0.5).
double e2m1(unsigned code) {
  const double sign = (code & 8) ? -1 : 1;
  const unsigned e = (code >> 1) & 3, m = code & 1;
  return sign * (e == 0 ? 0.5 * m : (1 + 0.5 * m) * std::ldexp(1.0, int(e) - 1));
}

TEST(Mxfp4, EveryByteAndScaleDecodesByTheDefinition) {
  // 256 byte values over 16 groups of 16 bytes, each group with its own scale.
  std::vector<uint8_t> blocks(256), scales(16);
  for (int i = 0; i < 256; ++i) blocks[size_t(i)] = uint8_t(i);
  for (int g = 0; g < 16; ++g)
    scales[size_t(g)] = uint8_t(std::vector<int>{0, 1, 100, 119, 120, 125, 126, 127, 128, 129, 130,
                                                 140, 150, 200, 253, 254}[size_t(g)]);
  std::vector<float> out(512);
  models::dequantize_mxfp4(blocks.data(), scales.data(), 16, out.data());
  for (int g = 0; g < 16; ++g)
    for (int i = 0; i < 16; ++i) {
      const unsigned byte = blocks[size_t(g * 16 + i)];
      const double scale = std::ldexp(1.0, int(scales[size_t(g)]) - 127);
      EXPECT_EQ(out[size_t(g * 32 + 2 * i)], float(e2m1(byte & 0xF) * scale)) << g << " " << i;
      EXPECT_EQ(out[size_t(g * 32 + 2 * i + 1)], float(e2m1(byte >> 4) * scale)) << g << " " << i;
    }
}

class StoredLayoutFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tformers_stored_layout_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  io::Checkpoint write(const std::vector<std::pair<std::string, Tensor>>& tensors) {
    const std::string path = (dir_ / "model.safetensors").string();
    io::save_safetensors(path, tensors, {});
    return io::Checkpoint::open(dir_.string());
  }
  fs::path dir_;
};

// Experts (E=2, N=4, K=3): the checkpoint holds (E, K, N) with rows of gate and up interleaved
// along N: stored[e][k][n] = weight[e][row(n)][k] where rows 0, 1 are gate and 2, 3 up.
TEST_F(StoredLayoutFile, TransposedInterleavedExpertsReadAndWriteBack) {
  const int64_t E = 2, N = 4, K = 3;
  std::vector<float> stored(size_t(E * K * N));
  for (size_t i = 0; i < stored.size(); ++i) stored[i] = float(i);
  const Tensor t = Tensor::from_vector({E, K, N}, DType::f32, stored);
  io::Checkpoint ckpt = write({{"w", t}});
  models::WeightSpec s{"w", {E, N, K}, models::WeightRole::kExperts};
  s.stored = {.transposed = true, .interleaved = true};
  ASSERT_TRUE(models::stored_differently(ckpt, s));
  const Tensor w = models::read_stored(ckpt, s, DType::f32);
  ASSERT_EQ(w.shape(), (Shape{E, N, K}));
  // Our row n is the checkpoint's interleaved column: gate rows 0, 1 <- 0, 2; up 2, 3 <- 1, 3.
  const int64_t from[4] = {0, 2, 1, 3};
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        EXPECT_EQ(w.data<float>()[(e * N + n) * K + k], stored[size_t((e * K + k) * N + from[n])]);
  const Tensor back = models::to_stored(w, s.stored);
  ASSERT_EQ(back.shape(), t.shape());
  EXPECT_EQ(std::vector<float>(back.data<float>(), back.data<float>() + back.numel()), stored);
  // In bf16 the same permutation of the converted values.
  const Tensor b16 = models::read_stored(ckpt, s, DType::bf16);
  EXPECT_EQ(b16.dtype(), DType::bf16);
  EXPECT_EQ(b16.item_f32(1 * K + 0), stored[2]);  // expert 0, row 1, k 0
}

TEST_F(StoredLayoutFile, Mxfp4ExpertsDequantizeWithTheirScales) {
  // E=1, N=2, K=64: two groups per row; row 0 all code 0x2 (1.0), row 1 code 0xF (-6.0).
  std::vector<uint8_t> blocks(size_t(2 * 2 * 16)), scales = {127, 128, 126, 130};
  std::fill(blocks.begin(), blocks.begin() + 32, 0x22);
  std::fill(blocks.begin() + 32, blocks.end(), 0xFF);
  io::Checkpoint ckpt = write({{"w_blocks", Tensor::from_vector({1, 2, 2, 16}, DType::u8, blocks)},
                               {"w_scales", Tensor::from_vector({1, 2, 2}, DType::u8, scales)}});
  models::WeightSpec s{"w", {1, 2, 64}, models::WeightRole::kExperts};
  s.stored = {.transposed = true, .mxfp4 = true};
  ASSERT_TRUE(models::stored_differently(ckpt, s));
  EXPECT_EQ(models::stored_sources(ckpt, s), (std::vector<std::string>{"w_blocks", "w_scales"}));
  const Tensor w = models::read_stored(ckpt, s, DType::f32);
  const float* v = w.data<float>();
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[40], 2.0f);
  EXPECT_EQ(v[64], -3.0f);
  EXPECT_EQ(v[127], -48.0f);
}

TEST_F(StoredLayoutFile, BadTensorsAreRefusedByName) {
  models::WeightSpec s{"w", {1, 2, 64}, models::WeightRole::kExperts};
  s.stored = {.transposed = true, .mxfp4 = true};
  std::vector<uint8_t> blocks(64, 0x11), nan_scales = {127, 255, 127, 127};
  {
    io::Checkpoint ckpt =
        write({{"w_blocks", Tensor::from_vector({1, 2, 2, 16}, DType::u8, blocks)},
               {"w_scales", Tensor::from_vector({1, 2, 2}, DType::u8, nan_scales)}});
    const std::string e = error_of<FormatError>([&] { models::read_stored(ckpt, s, DType::f32); });
    EXPECT_CONTAINS(e, "w_scales");
    EXPECT_CONTAINS(e, "NaN");
  }
  {
    io::Checkpoint ckpt =
        write({{"w_blocks", Tensor::from_vector({1, 2, 4, 8}, DType::u8, blocks)},
               {"w_scales",
                Tensor::from_vector({1, 2, 2}, DType::u8, std::vector<uint8_t>{1, 2, 3, 4})}});
    const std::string e = error_of<FormatError>([&] { models::read_stored(ckpt, s, DType::f32); });
    EXPECT_CONTAINS(e, "w_blocks");
    EXPECT_CONTAINS(e, "[1, 2, 2, 16]");
  }
  {
    io::Checkpoint ckpt =
        write({{"w_blocks", Tensor::from_vector({1, 2, 2, 16}, DType::u8, blocks)}});
    const std::string e =
        error_of<NotFoundError>([&] { models::read_stored(ckpt, s, DType::f32); });
    EXPECT_CONTAINS(e, "w_scales");
  }
  {
    // The float form, not transposed as it should be.
    io::Checkpoint ckpt = write({{"w", Tensor::zeros({1, 2, 64}, DType::f32)}});
    const std::string e = error_of<FormatError>([&] { models::read_stored(ckpt, s, DType::f32); });
    EXPECT_CONTAINS(e, "[1, 64, 2]");
    EXPECT_CONTAINS(e, "transposed");
  }
}

// gpt-oss's MXFP4 experts stay MXFP4 in memory (codes and exponents, half a byte and 1/32 of a
// byte per weight), stacked by expert, also when quantize asks for int8 or int4 (which then
// applies to the float linears: attention).
TEST(Mxfp4Load, ExpertsStayAsStoredAlsoQuantized) {
  const std::string experts = "model.layers.1.mlp.experts.gate_up_proj";
  CausalLM lm = AutoModelForCausalLM::from_pretrained(testing::model_dir("hf-gpt-oss-mxfp4"),
                                                      {.dtype = float32, .device_map = "cpu"});
  const CausalLM::Impl& m = models::state_of(lm);
  EXPECT_EQ(m.weight_types.at(experts), (graph::TensorType{DType::u8, {8, 64, 32}}));
  EXPECT_EQ(m.weight_types.at(experts + "_scale"), (graph::TensorType{DType::u8, {8, 64, 2}}));
  EXPECT_EQ(m.quant_attrs.at(experts).scheme, graph::QuantScheme::kMxfp4);
  CausalLM q = AutoModelForCausalLM::from_pretrained(
      testing::model_dir("hf-gpt-oss-mxfp4"),
      {.dtype = float32, .device_map = "cpu", .quantize = "int8"});
  EXPECT_EQ(models::state_of(q).quant_attrs.at(experts).scheme, graph::QuantScheme::kMxfp4);
  EXPECT_EQ(models::state_of(q).quant_attrs.at("model.layers.1.self_attn.q_proj.weight").scheme,
            graph::QuantScheme::kInt8);
  const std::string e = testing::error_of<UnsupportedError>(
      [&] { q.save_pretrained((fs::temp_directory_path() / "tformers_mxfp4_int8").string()); });
  EXPECT_CONTAINS(e, "without quantize");
}

// save_pretrained writes MXFP4 experts back as the checkpoint held them, byte for byte (the
// interleaved gate and up rows restored), and the float experts of hf-gpt-oss transposed back.
TEST_F(StoredLayoutFile, SavePretrainedWritesTheStoredLayoutsBack) {
  for (const char* name : {"hf-gpt-oss-mxfp4", "hf-gpt-oss"}) {
    const std::string from = testing::model_dir(name);
    CausalLM lm =
        AutoModelForCausalLM::from_pretrained(from, {.dtype = float32, .device_map = "cpu"});
    const std::string to = (dir_ / name).string();
    lm.save_pretrained(to);
    const io::Checkpoint a = io::Checkpoint::open(from), b = io::Checkpoint::open(to);
    EXPECT_EQ(a.names(), b.names()) << name;
    for (const std::string& t : a.names()) {
      const Tensor x = a.get(t), y = b.get(t);
      ASSERT_EQ(x.shape(), y.shape()) << name << " " << t;
      EXPECT_EQ(0, std::memcmp(x.raw(), y.raw(), x.nbytes())) << name << " " << t;
    }
    CausalLM again =
        AutoModelForCausalLM::from_pretrained(to, {.dtype = float32, .device_map = "cpu"});
    const std::vector<int32_t> ids = {1, 17, 300, 45};
    const Tensor l1 = testing::prefill_logits(lm, ids), l2 = testing::prefill_logits(again, ids);
    EXPECT_EQ(0, std::memcmp(l1.raw(), l2.raw(), l1.nbytes())) << name;
  }
}

}  // namespace
}  // namespace tformers
