// RoPE frequencies from config.json (src/models/config.cc read_rope) against the float32
// reference of tools/reference/make_rope_goldens.py: default, partial, linear, llama3, yarn,
// dynamic, longrope and proportional, in the older config layout and in Transformers 5's
// rope_parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "models/layers.h"

namespace tformers {
namespace {

TEST(Rope, FrequenciesAndAttentionFactorMatchTheReference) {
  const auto path = std::filesystem::path(TFORMERS_TEST_DATA) / "goldens" / "rope.json";
  const auto golden = nlohmann::json::parse(std::ifstream(path));
  ASSERT_GE(golden["cases"].size(), 13u);
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const int64_t head_dim = c["head_dim"].get<int64_t>();
    models::RopeConfig r = models::read_rope(c["config"], "config.json", head_dim, 10000.0, false);
    const auto want = c["inv_freq"].get<std::vector<double>>();
    ASSERT_EQ(r.inv_freq.size(), want.size());
    EXPECT_EQ(r.rotary_dim, int64_t(want.size()) * 2);
    // float32 on both sides, computed in different orders: a few ulps.
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(r.inv_freq[i], want[i], 4e-7 * std::fabs(want[i])) << "frequency " << i;
    EXPECT_NEAR(r.attention_factor, c["attention_factor"].get<double>(), 1e-6);
  }
}

// dynamic and longrope change their frequencies for a step that passes a length (Transformers'
// dynamic_rope_update); the goldens hold the frequencies at the last position tformers runs, so
// the config must keep every sequence within it.
TEST(Rope, RuntimeScaledTypesKeepPositionsWhereTheirFrequenciesHold) {
  const auto path = std::filesystem::path(TFORMERS_TEST_DATA) / "goldens" / "rope.json";
  const auto golden = nlohmann::json::parse(std::ifstream(path));
  int checked = 0;
  for (const auto& c : golden["cases"]) {
    if (!c.contains("positions")) continue;
    SCOPED_TRACE(c["name"].get<std::string>());
    nlohmann::json j = c["config"];
    const int64_t head_dim = c["head_dim"].get<int64_t>();
    j.update({{"vocab_size", 32},
              {"hidden_size", 2 * head_dim},
              {"intermediate_size", 16},
              {"num_hidden_layers", 1},
              {"num_attention_heads", 2},
              {"head_dim", head_dim}});
    models::DecoderConfig config;
    models::read_decoder_config(j, "config.json", config);
    EXPECT_EQ(config.max_position_embeddings, c["positions"].get<int64_t>());
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

// Transformers 5 writes the same settings as one rope_parameters object (rope_theta,
// partial_rotary_factor and rope_scaling's fields): every golden case in that layout must give
// exactly the frequencies of the older layout.
TEST(Rope, RopeParametersLayoutReadsAsTheOlderOne) {
  const auto path = std::filesystem::path(TFORMERS_TEST_DATA) / "goldens" / "rope.json";
  const auto golden = nlohmann::json::parse(std::ifstream(path));
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const int64_t head_dim = c["head_dim"].get<int64_t>();
    const nlohmann::json& old_layout = c["config"];
    nlohmann::json params = nlohmann::json::object();
    if (old_layout.contains("rope_scaling") && old_layout["rope_scaling"].is_object())
      params = old_layout["rope_scaling"];
    if (!params.contains("rope_type")) params["rope_type"] = params.value("type", "default");
    nlohmann::json v5 = old_layout;
    v5.erase("rope_scaling");
    for (const char* key : {"rope_theta", "partial_rotary_factor"}) {
      if (!v5.contains(key)) continue;
      params[key] = v5[key];
      v5.erase(key);
    }
    v5["rope_parameters"] = params;
    models::RopeConfig a = models::read_rope(old_layout, "config.json", head_dim, 10000.0, false);
    models::RopeConfig b = models::read_rope(v5, "config.json", head_dim, 10000.0, false);
    EXPECT_EQ(a.inv_freq, b.inv_freq);
    EXPECT_EQ(a.rotary_dim, b.rotary_dim);
    EXPECT_EQ(a.attention_factor, b.attention_factor);
  }
}

TEST(Rope, BadRopeParametersAreRefusedWithTheField) {
  auto message = [](const nlohmann::json& j) {
    try {
      models::read_rope(j, "config.json", 32, 10000.0, false);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{"rope_parameters", 5}}).find("rope_parameters must be an object"),
            std::string::npos);
  // One object per layer type is Gemma 3's layout, read by that architecture only.
  const nlohmann::json per_type = {
      {"rope_parameters", {{"full_attention", {{"rope_type", "default"}}}}}};
  EXPECT_NE(message(per_type).find("per layer type"), std::string::npos);
  EXPECT_NE(message({{"rope_parameters", {{"rope_type", "linear"}}}}).find("factor"),
            std::string::npos);
  EXPECT_NE(message({{"rope_parameters", {{"rope_type", "dynamic"}}}}).find("factor"),
            std::string::npos);
  // 16 pairs at head_dim 32: one factor per pair.
  const nlohmann::json longrope = {{"rope_type", "longrope"},
                                   {"short_factor", std::vector<double>(15, 1.0)},
                                   {"long_factor", std::vector<double>(16, 1.0)}};
  EXPECT_NE(message({{"rope_parameters", longrope}}).find("short_factor must be a list of 16"),
            std::string::npos);
  EXPECT_NE(message({{"rope_parameters", {{"rope_type", "ntk"}}}}).find("dynamic, llama3"),
            std::string::npos);
  // An attention factor scales all of q.k: with half the features rotated it cannot be applied.
  const nlohmann::json partial = {{"rope_type", "longrope"},
                                  {"partial_rotary_factor", 0.5},
                                  {"factor", 4.0},
                                  {"short_factor", std::vector<double>(8, 1.0)},
                                  {"long_factor", std::vector<double>(8, 1.0)}};
  EXPECT_NE(message({{"rope_parameters", partial}}).find("longrope with partial_rotary_factor"),
            std::string::npos);
}

}  // namespace
}  // namespace tformers
