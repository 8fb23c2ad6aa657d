// LoadOptions::load_mode: "copy" puts weights used as stored into their own huge-page-aligned
// memory, "mmap" leaves them in the checkpoint's mapping; both compute the same logits.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "golden_util.h"
#include "models/causal_lm_impl.h"
#include "tformers/model.h"

namespace tformers {
namespace {

using testing::model_dir;
using testing::prefill_logits;

// Whether a weight's bytes are outside every mapping of a .safetensors file (/proc/self/maps).
bool own_memory(const CausalLM& lm, const std::string& name) {
  const auto p = reinterpret_cast<uintptr_t>(lm.impl().weights.at(name)->host_data());
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(".safetensors") == std::string::npos) continue;
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && p >= lo && p < hi) return false;
  }
  return true;
}

TEST(LoadMode, CopyAndMmapGiveTheSameLogits) {
  // tiny-qwen3-sharded stores float32: loaded as float32, every weight is used as stored.
  const std::string dir = model_dir("tiny-qwen3-sharded");
  CausalLM copy = AutoModelForCausalLM::from_pretrained(dir, {.dtype = float32});
  CausalLM mapped =
      AutoModelForCausalLM::from_pretrained(dir, {.dtype = float32, .load_mode = "mmap"});
  for (const std::string w : {"model.layers.0.mlp.up_proj.weight", "model.norm.weight"}) {
    EXPECT_TRUE(own_memory(copy, w)) << w;
    EXPECT_FALSE(own_memory(mapped, w)) << w;
  }
  const std::vector<int32_t> ids = {1, 17, 300, 45, 9};
  Tensor a = prefill_logits(copy, ids), b = prefill_logits(mapped, ids);
  ASSERT_EQ(a.numel(), b.numel());
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << i;
}

TEST(LoadMode, UnknownModeIsAnError) {
  try {
    AutoModelForCausalLM::from_pretrained(model_dir("tiny-qwen3"), {.load_mode = "none"});
    FAIL() << "loaded with load_mode \"none\"";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("load_mode 'none'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tformers
