// Checkpoints that cannot load: each gives a tformers::Error naming what and where, never a
// crash (these tests also run under the asan preset).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "golden_util.h"
#include "io/safetensors.h"
#include "tformers/error.h"
#include "tformers/model.h"

namespace tformers {
namespace {

namespace fs = std::filesystem;

// A writable copy of tiny-qwen3 (single file) in a fresh temporary folder.
class BadCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tformers-bad-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const auto& f : fs::directory_iterator(testing::model_dir("tiny-qwen3")))
      fs::copy(f.path(), dir_ / f.path().filename());
  }
  void TearDown() override { fs::remove_all(dir_); }

  nlohmann::json config() { return nlohmann::json::parse(std::ifstream(dir_ / "config.json")); }
  void write_config(const nlohmann::json& j) { std::ofstream(dir_ / "config.json") << j.dump(2); }
  // Rewrites model.safetensors through `edit` of its (name, tensor) list.
  template <typename F>
  void edit_weights(F edit) {
    io::Checkpoint ck = io::Checkpoint::open(dir_.string());
    std::vector<std::pair<std::string, Tensor>> ts;
    for (const auto& n : ck.names()) ts.push_back({n, ck.get(n).to(ck.get(n).dtype())});
    edit(ts);
    // Copies of the data are held by `ts`; the old mapping can be replaced.
    std::vector<std::pair<std::string, Tensor>> owned;
    for (auto& [n, t] : ts) {
      Tensor c = Tensor::zeros(t.shape(), t.dtype());
      std::memcpy(c.raw(), t.raw(), t.nbytes());
      owned.push_back({n, c});
    }
    ts.clear();
    ck = io::Checkpoint();
    io::save_safetensors((dir_ / "model.safetensors").string(), owned);
  }
  // Loads and returns the error message, failing the test if loading succeeds.
  template <typename E>
  std::string load_error() {
    try {
      AutoModelForCausalLM::from_pretrained(dir_.string(), {.device_map = "cpu"});
    } catch (const E& e) {
      return e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "wrong error type: " << e.what();
      return "";
    }
    ADD_FAILURE() << "loading succeeded";
    return "";
  }
  fs::path dir_;
};

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

TEST_F(BadCheckpoint, UnknownArchitecture) {
  auto j = config();
  j["architectures"] = {"MambaForCausalLM"};
  write_config(j);
  std::string m = load_error<UnsupportedError>();
  EXPECT_HAS(m, "MambaForCausalLM");
  EXPECT_HAS(m, "Qwen3ForCausalLM");  // lists what is supported
}

TEST_F(BadCheckpoint, ConfigWithoutRequiredField) {
  auto j = config();
  j.erase("hidden_size");
  write_config(j);
  std::string m = load_error<NotFoundError>();
  EXPECT_HAS(m, "hidden_size");
  EXPECT_HAS(m, "config.json");
}

TEST_F(BadCheckpoint, ConfigFieldOfWrongType) {
  auto j = config();
  j["num_hidden_layers"] = "two";
  write_config(j);
  std::string m = load_error<FormatError>();
  EXPECT_HAS(m, "num_hidden_layers");
}

TEST_F(BadCheckpoint, HeadsNotDivisibleByKvHeads) {
  auto j = config();
  j["num_key_value_heads"] = 3;
  write_config(j);
  EXPECT_HAS(load_error<FormatError>(), "num_key_value_heads");
}

TEST_F(BadCheckpoint, MissingTensor) {
  edit_weights([](auto& ts) {
    std::erase_if(ts, [](auto& p) { return p.first == "model.layers.1.mlp.up_proj.weight"; });
  });
  std::string m = load_error<NotFoundError>();
  EXPECT_HAS(m, "model.layers.1.mlp.up_proj.weight");
  EXPECT_HAS(m, dir_.string());
}

TEST_F(BadCheckpoint, UnexpectedTensor) {
  edit_weights([](auto& ts) {
    ts.push_back({"model.layers.7.mlp.up_proj.weight", Tensor::zeros({4, 4}, DType::f32)});
  });
  EXPECT_HAS(load_error<FormatError>(), "model.layers.7.mlp.up_proj.weight");
}

TEST_F(BadCheckpoint, TensorShapeDisagreesWithConfig) {
  auto j = config();
  j["intermediate_size"] = 96;
  write_config(j);
  std::string m = load_error<FormatError>();
  EXPECT_HAS(m, "mlp");
  EXPECT_HAS(m, "[96, 64]");
}

TEST_F(BadCheckpoint, MissingConfig) {
  fs::remove(dir_ / "config.json");
  EXPECT_HAS(load_error<NotFoundError>(), "config.json");
}

// Hostile config.json values: each is refused before any size is computed from it, with a
// FormatError naming the file and the field (no hang, no overflow, no huge allocation).
TEST_F(BadCheckpoint, OutOfRangeFieldsAreFormatErrorsNamingTheField) {
  const int64_t huge = int64_t(1) << 62;
  const std::vector<std::pair<std::string, nlohmann::json>> cases = {
      {"head_dim", huge},
      {"num_hidden_layers", huge},
      {"max_position_embeddings", huge},
      {"max_position_embeddings", 0},
      {"max_position_embeddings", -5},
      {"num_attention_heads", huge},
      {"hidden_size", huge},
      {"vocab_size", int64_t(1) << 40},
      {"rope_theta", 0.0},
      {"rope_theta", -1.0},
      {"rms_norm_eps", -1e-6},
      {"rms_norm_eps", 0.0},
  };
  const nlohmann::json good = config();
  for (const auto& [field, value] : cases) {
    auto j = good;
    j[field] = value;
    write_config(j);
    std::string m = load_error<FormatError>();
    EXPECT_HAS(m, field);
    EXPECT_HAS(m, "config.json");
  }
}

TEST_F(BadCheckpoint, UnsupportedRopeScaling) {
  auto j = config();
  // Qwen2-VL's multimodal RoPE, which no architecture here reads.
  j["rope_scaling"] = {{"rope_type", "mrope"}, {"factor", 4.0}};
  write_config(j);
  EXPECT_HAS(load_error<UnsupportedError>(), "mrope");
}

TEST(Devices, MissingAcceleratorIsAClearError) {
  for (const char* dev : {"tpu", "cuda"}) {
    try {
      AutoModelForCausalLM::from_pretrained(testing::model_dir("tiny-qwen3"), {.device_map = dev});
      ADD_FAILURE() << dev << " loaded without a runtime";
    } catch (const DeviceError& e) {
      std::string m = e.what();
      EXPECT_HAS(m, dev);
      EXPECT_HAS(m, "looked in");
    }
  }
  EXPECT_THROW(AutoModelForCausalLM::from_pretrained(testing::model_dir("tiny-qwen3"),
                                                     {.device_map = "gpu0"}),
               InvalidArgumentError);
}

}  // namespace
}  // namespace tformers
