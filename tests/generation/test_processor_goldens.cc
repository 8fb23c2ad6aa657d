// The processor chain against Transformers' own processors (make_generation_goldens.py records
// the LogitsProcessorList that generate() builds, stage by stage): for every case and step, the
// recorded raw scores go through the chain a resolved config builds, and the scores after each
// stage must match the recorded ones (same filtered set, finite values within 1e-5 relative).
// No model is needed.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "generation/logits_process.h"
#include "generation/sampling.h"
#include "io/json.h"
#include "tformers/generation.h"

namespace tformers::generation {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kRelTol = 1e-5;

std::vector<float> row(const io::Json& j) {
  std::vector<float> out;
  out.reserve(j.size());
  for (const auto& v : j) out.push_back(v.is_null() ? -kInf : v.get<float>());
  return out;
}

// Writes the case's generation_config to a file so that from_file reads it as Transformers
// would read a generation_config.json.
GenerationConfig config_of(const io::Json& cfg) {
  auto path = std::filesystem::temp_directory_path() /
              ("tformers_golden_gc_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << cfg.dump();
  GenerationConfig c = GenerationConfig::from_file(path.string());
  std::filesystem::remove(path);
  return c;
}

// Worst mismatch of a stage: filtered sets must be equal; finite values compare with the
// README's metric, max|a - b| / max|b|.
void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i] == -kInf, want[i] == -kInf)
        << where << ": token " << i << " got " << got[i] << " want " << want[i];
    if (want[i] == -kInf) continue;
    max_ref = std::max(max_ref, std::abs(double(want[i])));
    max_err = std::max(max_err, std::abs(double(got[i]) - double(want[i])));
  }
  EXPECT_LE(max_err, kRelTol * max_ref) << where;
}

struct Stage {
  std::string name;
  std::vector<float> scores;
};

// The stages the engine should report for one recorded step. Transformers holds eos back with
// MinLengthLogitsProcessor (min_length counts the prompt) and MinNewTokensLengthLogitsProcessor,
// and generate() sets min_length = prompt + min_new_tokens, so a min_new_tokens config gives both.
// resolve() turns either setting into one count of new tokens, and the engine applies it as one
// stage, `min_new_tokens`: a run of those recorded stages is that one stage, whose scores are the
// run's last (the two only set the same eos ids to -inf, so their composition is either).
std::vector<Stage> engine_stages(const io::Json& recorded) {
  std::vector<Stage> out;
  bool in_eos_run = false;
  for (const auto& st : recorded) {
    const std::string name = st["name"];
    const bool eos_stage = name == "min_length" || name == "min_new_tokens";
    if (eos_stage && in_eos_run) {
      out.back().scores = row(st["scores"]);
    } else {
      out.push_back({eos_stage ? "min_new_tokens" : name, row(st["scores"])});
    }
    in_eos_run = eos_stage;
  }
  return out;
}

class ProcessorGoldens : public ::testing::TestWithParam<std::string> {};

TEST_P(ProcessorGoldens, EveryStageOfEveryStep) {
  const io::Json golden = io::load_json_file(std::string(TFORMERS_TEST_DATA) +
                                             "/goldens/generation." + GetParam() + ".float32.json");
  const int64_t vocab = 512, positions = 512;
  int checked_stages = 0;
  ASSERT_GE(golden["cases"].size(), 19u);
  for (const auto& c : golden["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const GenerationConfig gc = config_of(c["generation_config"]);
    const auto prompt = c["input_ids"].get<std::vector<int32_t>>();
    const auto output = c["output_ids"].get<std::vector<int32_t>>();
    const ResolvedGenerationConfig r = resolve(gc, int64_t(prompt.size()), vocab, positions);
    const LogitsProcessorList list(r, vocab);

    std::vector<std::string> want_names;
    for (const Stage& st : engine_stages(c["steps"][0]["stages"])) want_names.push_back(st.name);
    EXPECT_EQ(list.names(), want_names);

    std::vector<int32_t> ids = prompt;
    ASSERT_EQ(c["steps"].size(), output.size());
    for (size_t step = 0; step < output.size(); ++step) {
      const auto& st = c["steps"][step];
      std::vector<float> scores = row(st["scores"]);
      std::vector<std::vector<float>> stages;
      list.process(ids, int64_t(prompt.size()), scores,
                   [&](std::string_view, std::span<const float> s) {
                     stages.emplace_back(s.begin(), s.end());
                   });
      const std::vector<Stage> want = engine_stages(st["stages"]);
      ASSERT_EQ(stages.size(), want.size());
      for (size_t k = 0; k < stages.size(); ++k) {
        expect_close(stages[k], want[k].scores,
                     name + " step " + std::to_string(step) + " stage " + want[k].name);
        ++checked_stages;
      }
      // The reference takes the first argmax of the processed scores (also for sampling cases,
      // to fix the path).
      EXPECT_EQ(Sampler::greedy(scores), st["token"].get<int32_t>()) << "step " << step;
      EXPECT_EQ(output[step], st["token"].get<int32_t>());
      ids.push_back(output[step]);
    }
    // Stopping: finished_by_eos exactly when the last token is one of the eos ids.
    const bool last_is_eos =
        !output.empty() && std::find(r.eos_token_id.begin(), r.eos_token_id.end(),
                                     int64_t(output.back())) != r.eos_token_id.end();
    EXPECT_EQ(c["finished_by_eos"].get<bool>(), last_is_eos);
    if (!last_is_eos) {
      EXPECT_EQ(int64_t(output.size()), r.max_new_tokens);
    }
  }
  EXPECT_GT(checked_stages, 50);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, ProcessorGoldens,
                         ::testing::Values("tiny-llama", "tiny-qwen3"), [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace tformers::generation
