// The shipped default model (models/kjv-fortunes-tiny): tformers recomputes its held-out loss
// and must match the training script's figure (tools/train/heldout_loss.py, PyTorch reference)
// within 1 %, with the same tokenization.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tformers/model.h"
#include "tformers/tokenizer.h"

namespace tformers {
namespace {

TEST(DefaultModel, HeldOutLossMatchesTrainingFigure) {
  const std::string dir = std::string(TFORMERS_SOURCE_DIR) + "/models/kjv-fortunes-tiny";
  nlohmann::json expect = nlohmann::json::parse(std::ifstream(dir + "/heldout.json"));
  std::stringstream text;
  text << std::ifstream(dir + "/heldout.txt").rdbuf();

  Tokenizer tok = AutoTokenizer::from_pretrained(dir);
  std::vector<int32_t> ids = tok.encode(text.str(), /*add_special_tokens=*/false);
  ASSERT_EQ(int64_t(ids.size()), expect["tokens"].get<int64_t>());
  auto first = expect["first_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + first.size()), first);

  // The protocol of heldout_loss.py: non-overlapping windows from position 0, every token but
  // each window's first predicted, the last window kept when it has at least 2 tokens.
  CausalLM lm = AutoModelForCausalLM::from_pretrained(dir, {.dtype = float32, .device_map = "cpu"});
  const int64_t window = expect["window"].get<int64_t>(), V = lm.config().vocab_size;
  double nll = 0;
  int64_t predicted = 0;
  for (size_t start = 0; start < ids.size(); start += size_t(window)) {
    const int64_t T = std::min<int64_t>(window, int64_t(ids.size() - start));
    if (T < 2) break;
    lm.reset_cache(1, window);
    ForwardArgs a;
    a.input_ids = Tensor::from_vector<int32_t>(
        {1, T}, DType::i32, std::vector<int32_t>(ids.begin() + start, ids.begin() + start + T));
    a.logits_to_keep = 0;
    Tensor logits = lm.forward(a);
    for (int64_t t = 0; t + 1 < T; ++t) {
      const float* row = logits.data<float>() + t * V;
      double mx = row[0], sum = 0;
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
      nll += std::log(sum) + mx - row[ids[start + t + 1]];
      ++predicted;
    }
  }
  EXPECT_EQ(predicted, expect["predicted_tokens"].get<int64_t>());
  const double loss = nll / double(predicted), want = expect["loss"].get<double>();
  std::printf("held-out loss: tformers %.6f, training script %.6f\n", loss, want);
  EXPECT_NEAR(loss, want, 0.01 * want) << "tformers " << loss << " vs training script " << want;
}

}  // namespace
}  // namespace tformers
