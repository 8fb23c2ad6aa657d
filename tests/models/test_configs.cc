// Real config.json files (tests/data/configs/) read by their architectures: accepted, and the
// weights they declare have the real model's head layout.
#include <gtest/gtest.h>

#include <cmath>

#include <cmath>
#include <filesystem>
#include <map>

#include "io/json.h"
#include "models/architecture.h"
#include "tformers/error.h"

namespace tformers {
namespace {

struct Layout {
  int64_t layers, hidden, q_out, kv_out, min_positions;
};

// From each model's card: heads x head_dim for q, KV heads x head_dim for k and v.
const std::map<std::string, Layout> kExpected = {
    {"Qwen2.5-0.5B", {24, 896, 14 * 64, 2 * 64, 32768}},
    {"Mistral-Small-24B-Instruct-2501", {40, 5120, 32 * 128, 8 * 128, 32768}},
    {"GLM-4-9B-0414", {40, 4096, 32 * 128, 2 * 128, 32768}},
    {"glm-4-9b-hf", {40, 4096, 32 * 128, 2 * 128, 8192}},
    {"gemma-3-1b-it", {26, 1152, 4 * 256, 1 * 256, 32768}},
};

std::shared_ptr<Shape> shape_of(const std::vector<models::WeightSpec>& w, const std::string& n) {
  for (const auto& s : w)
    if (s.name == n) return std::make_shared<Shape>(s.shape);
  return nullptr;
}

TEST(RealConfigs, EachIsAcceptedWithItsHeadLayout) {
  const std::filesystem::path dir = std::filesystem::path(TFORMERS_TEST_DATA) / "configs";
  size_t seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    const std::string name = entry.path().stem().string();
    SCOPED_TRACE(name);
    ASSERT_TRUE(kExpected.count(name)) << "no expected layout for " << name;
    const Layout& want = kExpected.at(name);
    io::Json j = io::load_json_file(entry.path().string());
    const auto* arch = models::find_architecture(j["architectures"][0].get<std::string>());
    ASSERT_NE(arch, nullptr);
    auto config = arch->config(j, entry.path().string());
    EXPECT_EQ(config->num_hidden_layers, want.layers);
    EXPECT_GE(config->max_position_embeddings, want.min_positions);
    EXPECT_GE(config->max_position_embeddings, 8192);
    auto weights = arch->weights(*config);
    auto q = shape_of(weights, "model.layers.0.self_attn.q_proj.weight");
    auto k = shape_of(weights, "model.layers.0.self_attn.k_proj.weight");
    ASSERT_TRUE(q && k);
    EXPECT_EQ(*q, (Shape{want.q_out, want.hidden}));
    EXPECT_EQ(*k, (Shape{want.kv_out, want.hidden}));
    auto states = arch->states(*config, nullptr);
    ASSERT_EQ(int64_t(states.size()), want.layers);
    EXPECT_EQ(states[0].kv_heads * states[0].head_dim, want.kv_out);
    ++seen;
  }
  EXPECT_EQ(seen, kExpected.size());
}

// A bad value in a family's own fields is a FormatError naming the file and the field.
TEST(RealConfigs, BadFamilyFieldsNameFileAndField) {
  const std::filesystem::path dir = std::filesystem::path(TFORMERS_TEST_DATA) / "configs";
  struct Case {
    const char* file;
    const char* field;
    io::Json value;
  };
  const Case cases[] = {
      {"Mistral-Small-24B-Instruct-2501", "sliding_window", -1},
      {"gemma-3-1b-it", "sliding_window_pattern", 0},
      {"gemma-3-1b-it", "query_pre_attn_scalar", -256},
      {"gemma-3-1b-it", "attn_logit_softcapping", -50.0},
      {"gemma-3-1b-it", "layer_types", io::Json::array({"sliding_attention"})},
      {"gemma-3-1b-it", "sliding_window", 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.file) + " " + c.field);
    const std::string path = (dir / (std::string(c.file) + ".json")).string();
    io::Json j = io::load_json_file(path);
    j[c.field] = c.value;
    const auto* arch = models::find_architecture(j["architectures"][0].get<std::string>());
    ASSERT_NE(arch, nullptr);
    try {
      arch->config(j, path);
      ADD_FAILURE() << "accepted";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.field), std::string::npos) << e.what();
    }
  }
}

// Gemma 3 multiplies the embedding by sqrt(hidden_size) cast to the table's dtype, as
// Transformers does: sqrt(1152) = 33.94 is 34 in bfloat16 (the tiny model's sqrt(64) = 8 is exact
// in both, so its goldens cannot show this).
TEST(RealConfigs, Gemma3EmbeddingScaleIsInTheTableDtype) {
  const std::string path = std::string(TFORMERS_TEST_DATA) + "/configs/gemma-3-1b-it.json";
  io::Json j = io::load_json_file(path);
  j["num_hidden_layers"] = 1;
  const auto* arch = models::find_architecture("Gemma3ForCausalLM");
  ASSERT_NE(arch, nullptr);
  auto config = arch->config(j, path);
  for (auto [dtype, want] :
       {std::pair{DType::bf16, 34.0f}, {DType::f32, float(std::sqrt(1152.0))}}) {
    std::map<std::string, graph::TensorType> types;
    for (const auto& w : arch->weights(*config)) types[w.name] = {dtype, w.shape};
    graph::GraphBuilder b;
    models::Params params(b, types);
    arch->build(b, params, *config, {.batch = 1, .new_tokens = 1, .cache_len = 8}, dtype);
    graph::Graph g = b.finish();
    int scales = 0;
    for (const auto& n : g.nodes()) {
      if (n.name != "model.embed_tokens.scale") continue;
      ++scales;
      EXPECT_EQ(n.attrs_as<graph::ScaleAttrs>().factor, want) << dtype_name(dtype);
    }
    EXPECT_EQ(scales, 1);
  }
}

}  // namespace
}  // namespace tformers
