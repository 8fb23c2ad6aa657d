// LoadOptions::load_mode: "copy" puts weights used as stored into their own huge-page-aligned
// memory, "mmap" leaves them in the checkpoint's mapping; both compute the same logits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
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
  const auto p = reinterpret_cast<uintptr_t>(models::state_of(lm).weights.at(name)->host_data());
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

// Tables only gathered from stay in the mapping under "copy" too (an untied embedding, Gemma 4's
// per-layer table); a tied head's embedding, read whole every token, is copied.
TEST(LoadMode, CopyLeavesGatheredTablesMapped) {
  CausalLM gemma4 =
      AutoModelForCausalLM::from_pretrained(model_dir("hf-gemma4"), {.dtype = float32});
  for (const std::string w : {"model.embed_tokens.weight", "model.embed_tokens_per_layer.weight"})
    EXPECT_FALSE(own_memory(gemma4, w)) << w;
  EXPECT_TRUE(own_memory(gemma4, "lm_head.weight"));
  EXPECT_TRUE(own_memory(gemma4, "model.per_layer_model_projection.weight"));
  CausalLM tied = AutoModelForCausalLM::from_pretrained(model_dir("tiny-qwen3"));  // as stored
  EXPECT_TRUE(own_memory(tied, "model.embed_tokens.weight"));
}

// A tied head quantized at load leaves its embedding gathered only, in the mapping under "copy"
// as under "mmap": both give the same head, byte for byte, and the same logits.
TEST(LoadMode, TiedHeadQuantizedIsTheSameInBothModes) {
  const std::string dir = model_dir("tiny-qwen3");  // bfloat16, tied embeddings
  for (const std::string quantize : {"int8", "int4"}) {
    CausalLM copy = AutoModelForCausalLM::from_pretrained(dir, {.quantize = quantize});
    CausalLM mapped =
        AutoModelForCausalLM::from_pretrained(dir, {.quantize = quantize, .load_mode = "mmap"});
    EXPECT_FALSE(own_memory(copy, "model.embed_tokens.weight")) << quantize;
    for (const std::string w : {"lm_head.weight", "lm_head.weight_scale"}) {
      const backends::Buffer& a = *models::state_of(copy).weights.at(w);
      const backends::Buffer& b = *models::state_of(mapped).weights.at(w);
      ASSERT_EQ(a.type(), b.type()) << quantize << " " << w;
      const size_t bytes = size_t(shape_numel(a.type().shape)) * dtype_size(a.type().dtype);
      EXPECT_EQ(std::memcmp(a.host_data(), b.host_data(), bytes), 0) << quantize << " " << w;
    }
    const std::vector<int32_t> ids = {1, 17, 300, 45, 9};
    Tensor a = prefill_logits(copy, ids), b = prefill_logits(mapped, ids);
    ASSERT_EQ(a.numel(), b.numel());
    for (int64_t i = 0; i < a.numel(); ++i)
      ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << quantize << " " << i;
  }
}

// A shard cut short while the model loads (here: from the progress callback, after the first
// weight) raised SIGBUS in both modes, with no message. Under "copy", which reads the weights
// with pread, the load now fails with an IoError naming the shard and the byte where it ended;
// under "mmap", where weights are read when used, the first step that reads the lost pages
// does (the SIGBUS guard of io/safetensors.cc).
TEST(LoadMode, AShardThatShrinksDuringTheLoadIsNamed) {
  namespace fs = std::filesystem;
  for (const std::string mode : {"copy", "mmap"}) {
    const fs::path dir =
        fs::temp_directory_path() / ("tformers-shrink-" + mode + "-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::copy(model_dir("tiny-qwen3-sharded"), dir);
    const std::string shard = (dir / "model-00002-of-00002.safetensors").string();
    bool cut = false;
    LoadOptions opt{.dtype = float32, .load_mode = mode};
    opt.progress = [&](std::string_view, int64_t, int64_t) {
      if (!cut) {
        ASSERT_EQ(::truncate(shard.c_str(), 8192), 0);
      }
      cut = true;
    };
    std::string message;
    try {
      CausalLM lm = AutoModelForCausalLM::from_pretrained(dir.string(), opt);
      prefill_logits(lm, {1, 17, 300, 45, 9});
    } catch (const IoError& e) {
      message = e.what();
    }
    EXPECT_TRUE(cut) << mode;
    const std::string says = mode == "copy" ? ": file ended at byte "
                                            : ": the file shrank while tformers was reading it";
    EXPECT_NE(message.find(shard + says), std::string::npos) << mode << ": " << message;
    fs::remove_all(dir);
  }
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
