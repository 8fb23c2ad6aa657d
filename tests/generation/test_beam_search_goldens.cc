// Beam search against Transformers' generate(num_beams=...) (goldens from
// tools/reference/make_beam_goldens.py): for every case, on the float32 tiny models, the returned
// sequences must be identical and sequences_scores within 1e-4 relative (the logits agree to about
// 1e-6). Batches of prompts of different lengths are included.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/json.h"
#include "tformers/error.h"
#include "tformers/model.h"

namespace tformers {
namespace {

GenerationConfig config_of(const io::Json& cfg) {
  auto path = std::filesystem::temp_directory_path() /
              ("tformers_beam_gc_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << cfg.dump();
  GenerationConfig c = GenerationConfig::from_file(path.string());
  std::filesystem::remove(path);
  return c;
}

class BeamSearchGoldens : public ::testing::TestWithParam<std::string> {};

TEST_P(BeamSearchGoldens, SequencesAndScores) {
  const std::string data = TFORMERS_TEST_DATA;
  io::Json golden =
      io::load_json_file(data + "/goldens/beam_search." + GetParam() + ".float32.json");
  CausalLM lm = AutoModelForCausalLM::from_pretrained(data + "/models/" + GetParam(),
                                                      {.dtype = float32, .device_map = "cpu"});
  ASSERT_GE(golden["cases"].size(), 9u);
  for (const auto& c : golden["cases"]) {
    const std::string name = c["name"].get<std::string>();
    GenerateOutput out = generate(lm, c["input_ids"].get<std::vector<std::vector<int32_t>>>(),
                                  config_of(c["generation_config"]));
    EXPECT_EQ(out.sequences, c["sequences"].get<std::vector<std::vector<int32_t>>>()) << name;
    auto want = c["sequences_scores"].get<std::vector<float>>();
    ASSERT_EQ(out.sequences_scores.size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(out.sequences_scores[i], want[i], 1e-4 * std::abs(want[i])) << name << " " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, BeamSearchGoldens,
                         ::testing::Values("tiny-llama", "tiny-qwen3", "hf-llama", "hf-qwen2",
                                           "hf-qwen3", "hf-mistral", "hf-glm", "hf-glm4",
                                           "hf-gemma3", "hf-qwen3-moe", "hf-mixtral",
                                           "hf-glm4-moe"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// Beam search does not stream, as in Transformers, and says so instead of ignoring on_token.
TEST(BeamSearch, RefusesAStreamingCallbackAndBeamSampling) {
  CausalLM lm =
      AutoModelForCausalLM::from_pretrained(std::string(TFORMERS_TEST_DATA) + "/models/tiny-qwen3",
                                            {.dtype = float32, .device_map = "cpu"});
  GenerationConfig gc{.max_new_tokens = 3, .num_beams = 2};
  EXPECT_THROW(lm.generate({{1, 2, 3}}, gc, [](int64_t, int32_t) { return true; }),
               InvalidArgumentError);
  gc.do_sample = true;
  EXPECT_THROW(lm.generate({{1, 2, 3}}, gc), UnsupportedError);
}

}  // namespace
}  // namespace tformers
