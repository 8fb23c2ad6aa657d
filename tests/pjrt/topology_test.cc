// Deviceless compilation for TPU topologies with libtpu (the `plugins` group of pyproject.toml
// in .venv/): StableHLO compiled for a TPU that is not there, and the memory the compiler plans,
// checked against sizes worked out here from the program's shapes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "backends/pjrt/pjrt_api.h"
#include "backends/pjrt/plugin_discovery.h"
#include "tformers/error.h"

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
    skip_tpu_metadata_query();
    plugin_ = &Plugin::load(probe.path);
  }
  void SetUp() override {
    if (!plugin_) GTEST_SKIP() << skip_reason_;
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

TEST_F(TpuTopology, AnUnknownTopologyIsAnErrorQuotingLibtpu) {
  try {
    Topology(*plugin_, "v5litepod-1");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("PJRT_TopologyDescription_Create"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("v5litepod-1"), std::string::npos) << e.what();
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

}  // namespace
}  // namespace tformers::backends::pjrt
