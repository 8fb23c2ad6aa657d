// RoPE frequencies from config.json (src/models/config.cc read_rope) against the float32
// reference of tools/reference/make_rope_goldens.py: default, partial, linear, llama3 and yarn.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "models/layers.h"

namespace tformers {
namespace {

TEST(Rope, FrequenciesAndAttentionFactorMatchTheReference) {
  const auto path = std::filesystem::path(TFORMERS_TEST_DATA) / "goldens" / "rope.json";
  const auto golden = nlohmann::json::parse(std::ifstream(path));
  ASSERT_GE(golden["cases"].size(), 7u);
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

}  // namespace
}  // namespace tformers
