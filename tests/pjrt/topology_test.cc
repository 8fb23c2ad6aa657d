// Deviceless compilation for TPU topologies with libtpu (the `plugins` group of pyproject.toml
// in .venv/): StableHLO compiled for a TPU that is not there, and the memory the compiler plans,
// checked against sizes worked out here from the program's shapes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "backends/pjrt/pjrt_api.h"
#include "backends/pjrt/plugin_discovery.h"
#include "common/error_of.h"
#include "common/missing_dependency.h"
#include "common/run_command.h"
#include "models/model_runner.h"
#include "tformers/error.h"
#include "tformers/model.h"

namespace tformers::backends::pjrt {
namespace {

class TpuTopology : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    PluginProbe probe = probe_plugin("tpu");
    if (probe.path.empty()) {
      skip_reason_ = "libtpu is not installed (" + probe.package + ")";
      return;
    }
    configure_libtpu_without_tpu();
    plugin_ = &Plugin::load(probe.path);
  }
  void SetUp() override {
    if (!plugin_) TF_SKIP_MISSING_DEPENDENCY(skip_reason_);
  }

  static inline const Plugin* plugin_ = nullptr;
  static inline std::string skip_reason_;
};

// (M,K) x (K,N) in bf16, accumulated and returned in f32, as the lowering emits a linear.
std::string dot_module(int m, int k, int n) {
  const std::string a = "tensor<" + std::to_string(m) + "x" + std::to_string(k) + "xbf16>";
  const std::string b = "tensor<" + std::to_string(k) + "x" + std::to_string(n) + "xbf16>";
  const std::string c = "tensor<" + std::to_string(m) + "x" + std::to_string(n) + "xf32>";
  return "module @dot {\n  func.func public @main(%a: " + a + ", %b: " + b + ") -> " + c +
         " {\n    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (" + a + ", " +
         b + ") -> " + c + "\n    return %0 : " + c + "\n  }\n}\n";
}

// A property of the cost analysis; -1 when absent.
double cost(const CompiledProgram& program, const std::string& name) {
  for (const auto& [key, value] : program.cost)
    if (key == name) return value;
  return -1;
}

TEST_F(TpuTopology, CompilesADotForAV5eChipWithoutOne) {
  Topology topology(*plugin_, "v5e:1x1");
  EXPECT_EQ(topology.platform_name(), "tpu");
  const CompiledProgram program = topology.compile(dot_module(128, 256, 512));
  EXPECT_EQ(program.memory.argument_bytes, 128 * 256 * 2 + 256 * 512 * 2);
  EXPECT_EQ(program.memory.output_bytes, 128 * 512 * 4);
  EXPECT_EQ(program.memory.alias_bytes, 0);
  EXPECT_GT(program.memory.generated_code_bytes, 0);
  EXPECT_GE(program.memory.peak_bytes, program.memory.argument_bytes + program.memory.output_bytes);
  EXPECT_EQ(cost(program, "flops"), 2.0 * 128 * 256 * 512);
}

TEST_F(TpuTopology, ADonatedArgumentIsAliasedToItsResult) {
  // The KV cache's pattern: state in, state out, the input buffer reused.
  const std::string t = "tensor<64x1024xf32>";
  const std::string module = "module @step {\n  func.func public @main(%s: " + t +
                             " {tf.aliasing_output = 0 : i32}, %x: " + t + ") -> " + t +
                             " {\n    %0 = stablehlo.add %s, %x : " + t + "\n    return %0 : " + t +
                             "\n  }\n}\n";
  const CompiledProgram program = Topology(*plugin_, "v5e:1x1").compile(module);
  EXPECT_EQ(program.memory.alias_bytes, 64 * 1024 * 4);
  EXPECT_EQ(program.memory.argument_bytes, 2 * 64 * 1024 * 4);
}

TEST_F(TpuTopology, CompilesForOtherGenerationsAndSlices) {
  // TPU layouts pad the minor dimension to 128 lanes (an (8,64) x (64,32) dot takes 10,240
  // argument bytes, not 5,120), so these shapes are multiples of 128 and the sizes exact.
  for (const char* name : {"v4:2x2x1", "v5e:2x2", "v6e:1x1"}) {
    SCOPED_TRACE(name);
    const CompiledProgram program = Topology(*plugin_, name).compile(dot_module(128, 128, 256));
    EXPECT_EQ(program.memory.argument_bytes, 128 * 128 * 2 + 128 * 256 * 2);
    EXPECT_EQ(cost(program, "flops"), 2.0 * 128 * 128 * 256);
    EXPECT_GT(cost(program, "optimal_seconds"), 0.0);
  }
}

TEST_F(TpuTopology, ASliceLibtpuCannotLayOutIsAnErrorQuotingIt) {
  try {
    Topology(*plugin_, "v5e:3x3");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("PJRT_TopologyDescription_Create"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("v5e:3x3"), std::string::npos) << e.what();
  }
}

TEST_F(TpuTopology, AProgramThatDoesNotParseIsAnErrorQuotingTheCompiler) {
  Topology topology(*plugin_, "v5e:1x1");
  try {
    topology.compile("module { func.func public @main() -> tensor<f32> { return %nope } }");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("PJRT_Compile failed"), std::string::npos) << e.what();
  }
}

// The repository's model (Qwen3: 4 layers, hidden 256, 4 heads and 2 KV heads of 64, MLP 512,
// vocabulary 4096, tied embeddings, 256 positions, float32), whose sizes the tests below work
// out from its config.json.
constexpr const char* kModel = "models/kjv-fortunes-tiny";
constexpr int64_t kLayers = 4, kHidden = 256, kKvWidth = 2 * 64, kInter = 512, kVocab = 4096;
// Multiply-adds per token of the decoder's linears, and of the head.
constexpr int64_t kLayerMacs =
    kLayers * (2 * kHidden * kHidden + 2 * kHidden * kKvWidth + 3 * kHidden * kInter);
constexpr int64_t kHeadMacs = kVocab * kHidden;

TEST_F(TpuTopology, CompilesEveryStepOfAModelWithTheMemoryEachNeeds) {
  const testing::Streams r = testing::run(
      std::string("VIRTUAL_ENV=") + TFORMERS_SOURCE_DIR + "/.venv " + TFORMERS_CLI +
      " compile -m " + kModel + " --device tpu --topology v5e:1x1 --max-cache-len 128 -o json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["topology"], "v5e:1x1");
  EXPECT_EQ(out["cache_len"], 128);
  EXPECT_EQ(out["hbm_bytes_per_chip"], int64_t(16) << 30);  // one v5e chip
  // The prompt buckets up to the cache, then the decode step.
  std::vector<std::pair<std::string, int64_t>> steps;
  for (const auto& s : out["steps"]) steps.emplace_back(s["step"], s["tokens"]);
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"prefill", 16}, {"prefill", 32}, {"prefill", 64}, {"prefill", 128}, {"decode", 1}};
  EXPECT_EQ(steps, expected);
  for (const auto& s : out["steps"]) {
    SCOPED_TRACE(s.dump());
    const int64_t tokens = s["tokens"];
    EXPECT_EQ(s["fits"], true);
    // Donated: every layer's K and V cache, float32 (1, 2 heads, 128 positions, 64), and the
    // key mask, int32 (1, 128); the weights are only read. (A cache of 64 positions would take
    // as much: TPU layouts pad a dimension to 128.)
    const int64_t state = 2 * kLayers * kKvWidth * 128 * 4 + 128 * 4;
    EXPECT_EQ(s["alias_bytes"], state);
    // Arguments: at least the float32 weights (embedding, norms and linears) and the state.
    EXPECT_GE(s["argument_bytes"], 4 * (kHeadMacs + kLayerMacs) + state);
    // The new state and the logits of the last position.
    EXPECT_GE(s["output_bytes"], state + kVocab * 4);
    // The linears' flops, with the head on one position only (logits_to_keep = 1); attention
    // and the rest add less than half as much again at these sizes.
    const double linear_flops = 2.0 * (tokens * kLayerMacs + kHeadMacs);
    EXPECT_GE(s["cost"]["flops"], linear_flops);
    EXPECT_LE(s["cost"]["flops"], 1.5 * linear_flops);
  }
}

TEST_F(TpuTopology, AModelCompiledForATopologyRefusesToRun) {
  LoadOptions opt;
  opt.device_map = "tpu-topology:v5e:1x1";
  opt.load_mode = "mmap";
  CausalLM lm =
      AutoModelForCausalLM::from_pretrained(std::string(TFORMERS_SOURCE_DIR) + "/" + kModel, opt);
  models::ModelRunner runner(lm);
  runner.reset_cache(1, 32);
  models::ModelRunner::Step& step = runner.prepare_static(1, 1);
  Tensor ids = Tensor::from_vector<int32_t>({1, 1}, DType::i32, {5});
  Tensor pos = Tensor::from_vector<int32_t>({1, 1}, DType::i32, {0});
  Tensor logits = Tensor::zeros({1, 1, kVocab}, DType::f32);
  const std::string msg =
      testing::error_of<UnsupportedError>([&] { runner.run_static(step, ids, pos, 0, logits); });
  EXPECT_CONTAINS(msg, "compiles for a TPU topology and runs nothing");
  EXPECT_CONTAINS(msg, "device_map=\"tpu\"");
}

TEST_F(TpuTopology, CompileNamesWhatItCannotDo) {
  const testing::Streams bad_device = testing::run(std::string(TFORMERS_CLI) + " compile -m " +
                                                   kModel + " --device cuda --topology v5e:1x1");
  EXPECT_EQ(bad_device.status, 2);
  EXPECT_CONTAINS(bad_device.err, "only tpu compiles for a topology");
  const testing::Streams bad_topology =
      testing::run(std::string("VIRTUAL_ENV=") + TFORMERS_SOURCE_DIR + "/.venv " + TFORMERS_CLI +
                   " compile -m " + kModel + " --topology v9z:1x1");
  EXPECT_EQ(bad_topology.status, 2);
  EXPECT_CONTAINS(bad_topology.err, "v9z:1x1");
}

// libtpu divides by the dimensions it is given: "v5e:0x0" ended the process with SIGFPE inside
// it. Names are checked first, without libtpu.
TEST(TopologyName, IsCheckedBeforeLibtpuSeesIt) {
  const std::pair<const char*, const char*> bad[] = {
      {"v5e:0x0", "dimension 0 must be from 1 to 4096"},
      {"v5e:2x0", "dimension 0 must be from 1 to 4096"},
      {"v4:2x2x99999", "dimension 99999 must be from 1 to 4096"},
      {"v5e:-1x2", "dimension -1 must be from 1 to 4096"},
      {"v5e:x2", "'' is not a number of chips"},
      {"v5e:2x", "'' is not a number of chips"},
      {"v5e:2x2x2x2", "4 dimensions; a slice has 2 or 3"},
      {"v5e:4", "1 dimensions; a slice has 2 or 3"},
      {"v9z:1x1", "'v9z' is not a TPU generation"},
      {"v5litepod-1", "no ':' between the TPU generation and the chips"},
  };
  for (const auto& [name, says] : bad) {
    // A copy to capture: clang 14 does not capture structured bindings.
    const std::string topology = name;
    const std::string e =
        testing::error_of<InvalidArgumentError>([&] { check_topology_name(topology); });
    EXPECT_CONTAINS(e, std::string("topology \"") + name + "\"");
    EXPECT_CONTAINS(e, says);
  }
  for (const char* good : {"v5e:1x1", "v5e:2x2", "v4:2x2x1", "v6e:1x1", "v5p:2x2x1", "tpu7x:2x2x1"})
    EXPECT_NO_THROW(check_topology_name(good)) << good;
  const testing::Streams r =
      testing::run(std::string(TFORMERS_CLI) + " compile -m " + kModel + " --topology v5e:0x0");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_CONTAINS(r.err, "--topology: topology \"v5e:0x0\": dimension 0 must be from 1 to 4096");
}

}  // namespace
}  // namespace tformers::backends::pjrt
