// Quantized checkpoints tformers writes (CausalLM::save_pretrained, `tformers quantize`): a model
// quantized at load, saved and loaded again computes exactly what it computed before, in both
// load modes, without quantizing again; and stored quantized checkpoints that are wrong fail with
// errors naming the file, the tensor or the field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/error_of.h"
#include "golden_util.h"
#include "io/safetensors.h"
#include "tformers/distributed.h"
#include "tformers/error.h"
#include "tformers/model.h"

namespace tformers {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::load_goldens;
using testing::model_dir;
using testing::prefill_logits;

// A fresh temporary folder, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(test.begin(), test.end(), '/', '_');  // parameterized: "Name/param"
    path_ = fs::temp_directory_path() / ("tformers-save-" + std::to_string(::getpid()) + "-" +
                                         test + "-" + std::to_string(count_++));
    fs::remove_all(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  fs::path path() const { return path_; }

 private:
  fs::path path_;
  static inline int count_ = 0;
};

// Logits of every golden prompt: all positions of a prefill, then one decode step after it.
std::vector<std::vector<float>> outputs(CausalLM& lm, const std::string& name) {
  std::vector<std::vector<float>> out;
  for (const auto& c : load_goldens(name, "float32")) {
    Tensor p = prefill_logits(lm, c.input_ids);
    out.emplace_back(p.data<float>(), p.data<float>() + p.numel());
    const int64_t T = int64_t(c.input_ids.size());
    lm.reset_cache(1, T + 1);
    ForwardArgs a;
    a.input_ids = Tensor::from_vector<int32_t>({1, T}, DType::i32, c.input_ids);
    lm.forward(a);
    a.input_ids = Tensor::from_vector<int32_t>({1, 1}, DType::i32, {c.input_ids.front()});
    a.cache_position = T;
    Tensor d = lm.forward(a);
    out.emplace_back(d.data<float>(), d.data<float>() + d.numel());
  }
  return out;
}

struct Case {
  std::string model, scheme;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " " << c.scheme; }

class SaveQuantized : public ::testing::TestWithParam<Case> {};

// tiny-qwen3 (tied head: the saved checkpoint holds the head's own quantized copy), tiny-llama
// (untied), tiny-qwen2 (q/k/v biases, kept in f32 beside quantized weights).
TEST_P(SaveQuantized, LoadsAsStoredWithTheSameLogits) {
  const auto& [name, scheme] = GetParam();
  TempDir dir;
  CausalLM q = AutoModelForCausalLM::from_pretrained(
      model_dir(name), {.dtype = bfloat16, .device_map = "cpu", .quantize = scheme});
  q.save_pretrained(dir.str());
  const auto config = nlohmann::json::parse(std::ifstream(dir.path() / "config.json"));
  EXPECT_EQ(config["quantization_config"],
            (nlohmann::json{{"quant_method", "tformers"}, {"scheme", scheme}, {"block_size", 32}}));
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  const auto want = outputs(q, name);
  for (const std::string mode : {"copy", "mmap"}) {
    std::vector<std::string> stages;
    LoadOptions opt{.device_map = "cpu", .load_mode = mode};
    opt.progress = [&](std::string_view stage, int64_t, int64_t) { stages.emplace_back(stage); };
    CausalLM loaded = AutoModelForCausalLM::from_pretrained(dir.str(), opt);
    EXPECT_EQ(loaded.dtype(), bfloat16);
    for (const auto& s : stages) EXPECT_EQ(s, "loading weights") << "quantized again?";
    EXPECT_EQ(outputs(loaded, name), want) << name << " " << scheme << " " << mode;
  }
  // Saved again, it is the same checkpoint.
  TempDir again;
  AutoModelForCausalLM::from_pretrained(dir.str(), {.device_map = "cpu"})
      .save_pretrained(again.str());
  const io::Checkpoint a = io::Checkpoint::open(dir.str()), b = io::Checkpoint::open(again.str());
  ASSERT_EQ(a.names(), b.names());
  for (const auto& n : a.names()) {
    const Tensor ta = a.get(n), tb = b.get(n);
    ASSERT_EQ(ta.nbytes(), tb.nbytes()) << n;
    EXPECT_EQ(std::memcmp(ta.raw(), tb.raw(), ta.nbytes()), 0) << n;
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, SaveQuantized,
                         ::testing::Values(Case{"tiny-qwen3", "int4"}, Case{"tiny-qwen3", "int8"},
                                           Case{"tiny-llama", "int4"}, Case{"tiny-qwen2", "int4"},
                                           Case{"tiny-qwen2", "int8"}),
                         [](const auto& info) {
                           std::string s = info.param.model + "_" + info.param.scheme;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

using Tensors = std::vector<std::pair<std::string, Tensor>>;

// tiny-qwen3 stored quantized to `scheme` in `dir`, then edited by `edit` of its tensors (copies
// of the file's) and config.json.
void write_stored(const TempDir& dir, const std::string& scheme,
                  const std::function<void(Tensors&, nlohmann::json&)>& edit) {
  AutoModelForCausalLM::from_pretrained(model_dir("tiny-qwen3"),
                                        {.device_map = "cpu", .quantize = scheme})
      .save_pretrained(dir.str());
  Tensors tensors;
  {
    const io::Checkpoint ck = io::Checkpoint::open(dir.str());
    for (const auto& n : ck.names()) {
      const Tensor t = ck.get(n);
      Tensor copy = Tensor::zeros(t.shape(), t.dtype());
      std::memcpy(copy.raw(), t.raw(), t.nbytes());
      tensors.emplace_back(n, copy);
    }
  }
  auto config = nlohmann::json::parse(std::ifstream(dir.path() / "config.json"));
  edit(tensors, config);
  io::save_safetensors((dir.path() / "model.safetensors").string(), tensors);
  std::ofstream(dir.path() / "config.json") << config.dump(2);
}

// The message of the E that loading the edited int4 checkpoint with `load` throws.
template <class E>
std::string stored_error(const std::function<void(Tensors&, nlohmann::json&)>& edit,
                         const LoadOptions& load = {.device_map = "cpu"}) {
  TempDir dir;
  write_stored(dir, "int4", edit);
  return error_of<E>([&] { AutoModelForCausalLM::from_pretrained(dir.str(), load); });
}
const std::string kProj = "model.layers.0.self_attn.q_proj";

TEST(StoredQuantized, MissingScaleNamesTheTensor) {
  const std::string msg = stored_error<NotFoundError>([](Tensors& t, nlohmann::json&) {
    std::erase_if(t, [](const auto& p) { return p.first == kProj + ".weight_scale"; });
  });
  EXPECT_CONTAINS(msg, "'" + kProj + ".weight_scale'");
  EXPECT_CONTAINS(msg, "int4 weight '" + kProj + ".weight'");
}

TEST(StoredQuantized, ScaleOfTheWrongTypeNamesBoth) {
  const std::string msg = stored_error<FormatError>([](Tensors& t, nlohmann::json&) {
    for (auto& [n, v] : t)
      if (n == kProj + ".weight_scale") v = v.to(DType::f32);
  });
  EXPECT_CONTAINS(msg, kProj + ".weight_scale");
  EXPECT_CONTAINS(msg, "float32[16, 2, 8]");
  EXPECT_CONTAINS(msg, "needs float16[16, 2, 8]");
}

TEST(StoredQuantized, TilesOfTheWrongShapeNameTheWeight) {
  const std::string msg = stored_error<FormatError>([](Tensors& t, nlohmann::json&) {
    for (auto& [n, v] : t)
      if (n == kProj + ".weight") v = Tensor::zeros({8, 2, 256}, DType::u8);
  });
  EXPECT_CONTAINS(msg, "'" + kProj + ".weight'");
  EXPECT_CONTAINS(msg, "needs uint8[16, 2, 128]");
}

TEST(StoredQuantized, ZeroPointsOfAnInt8WeightAreRejected) {
  TempDir dir;
  write_stored(dir, "int8", [](Tensors& t, nlohmann::json&) {
    t.emplace_back(kProj + ".weight_zero", Tensor::zeros({16, 2, 8}, DType::u8));
  });
  const std::string msg = error_of<FormatError>(
      [&] { AutoModelForCausalLM::from_pretrained(dir.str(), {.device_map = "cpu"}); });
  EXPECT_CONTAINS(msg, kProj + ".weight_zero");
  EXPECT_CONTAINS(msg, "is int8");
}

TEST(StoredQuantized, UnknownMethodAndSchemeNameTheField) {
  std::string msg = stored_error<UnsupportedError>([](Tensors&, nlohmann::json& c) {
    c["quantization_config"]["quant_method"] = "bitsandbytes";
  });
  EXPECT_CONTAINS(msg, "config.json: quantization_config: quant_method 'bitsandbytes'");
  msg = stored_error<FormatError>(
      [](Tensors&, nlohmann::json& c) { c["quantization_config"]["scheme"] = "int3"; });
  EXPECT_CONTAINS(msg, "quantization_config: field 'scheme' is 'int3'");
  msg = stored_error<FormatError>(
      [](Tensors&, nlohmann::json& c) { c["quantization_config"]["block_size"] = 64; });
  EXPECT_CONTAINS(msg, "'block_size'");
}

TEST(StoredQuantized, AnotherSchemeAtLoadIsRejected) {
  const std::string msg = stored_error<InvalidArgumentError>(
      [](Tensors&, nlohmann::json&) {}, {.device_map = "cpu", .quantize = "int8"});
  EXPECT_CONTAINS(msg, "already quantized to int4 (quantization_config)");
}

// Under tensor parallelism a float checkpoint is quantized rank by rank (TpMpi.Quantized*); a
// stored quantized one is refused before any weight is read, naming the way that works.
TEST(StoredQuantized, TensorParallelLoadIsRefusedWithTheWayThatWorks) {
  const std::string msg = stored_error<UnsupportedError>(
      [](Tensors&, nlohmann::json&) {},
      {.device_map = "cpu", .distributed_config = DistributedConfig{.tp_size = 1}});
  EXPECT_CONTAINS(msg, "is stored quantized (int4)");
  EXPECT_CONTAINS(msg, "quantize=\"int8\" or \"int4\" under tp_size > 1");
}

TEST(StoredQuantized, TheSameSchemeAtLoadIsNoOp) {
  TempDir dir;
  AutoModelForCausalLM::from_pretrained(model_dir("tiny-qwen3"),
                                        {.device_map = "cpu", .quantize = "int4"})
      .save_pretrained(dir.str());
  EXPECT_NO_THROW(
      AutoModelForCausalLM::from_pretrained(dir.str(), {.device_map = "cpu", .quantize = "int4"}));
}

}  // namespace
}  // namespace tformers
