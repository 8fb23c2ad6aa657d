// Loading the Transformers goldens (tools/reference/make_goldens.py) and comparing logits with the
// metric the reference's README documents: per position max|a - b| / max|b| over the
// vocabulary, worst position.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tformers/model.h"

namespace tformers::testing {

// A test name for a model's folder name: its dashes as underscores (gtest's names take no '-').
inline std::string test_name_of(std::string model) {
  std::replace(model.begin(), model.end(), '-', '_');
  return model;
}

inline std::string model_dir(const std::string& name) {
  return std::string(TFORMERS_TEST_DATA) + "/models/" + name;
}

struct GoldenCase {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> greedy;
  std::vector<float> greedy_margins;
  std::vector<std::vector<float>> logits;  // one row per input position
};

inline std::vector<GoldenCase> load_goldens(const std::string& model, const std::string& dtype) {
  std::ifstream in(std::string(TFORMERS_TEST_DATA) + "/goldens/" + model + "." + dtype + ".json");
  EXPECT_TRUE(in.good()) << "missing golden for " << model << " " << dtype;
  nlohmann::json j = nlohmann::json::parse(in);
  std::vector<GoldenCase> cases;
  for (const auto& c : j["cases"]) {
    GoldenCase g;
    g.input_ids = c["input_ids"].get<std::vector<int32_t>>();
    g.greedy = c["greedy"].get<std::vector<int32_t>>();
    g.greedy_margins = c["greedy_margins"].get<std::vector<float>>();
    g.logits = c["logits"].get<std::vector<std::vector<float>>>();
    cases.push_back(std::move(g));
  }
  return cases;
}

// max|a - b| / max|b| over one row.
inline double row_error(const float* a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// All-position logits of a prompt from one prefill.
inline Tensor prefill_logits(CausalLM& lm, const std::vector<int32_t>& ids) {
  const int64_t T = int64_t(ids.size());
  lm.reset_cache(1, T);
  ForwardArgs a;
  a.input_ids = Tensor::from_vector<int32_t>({1, T}, DType::i32, ids);
  a.logits_to_keep = 0;
  return lm.forward(a);
}

// `n` token ids drawn uniformly from [3, vocab), seeded.
inline std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> id(3, int32_t(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& t : ids) t = id(gen);
  return ids;
}

}  // namespace tformers::testing
