// The shipped default model (models/kjv-fortunes-tiny): tformers recomputes its held-out loss
// and must match the training script's figure (tools/train/heldout_loss.py, PyTorch reference)
// within 1 %, with the same tokenization; and with 4-bit weights it stays within 5 % of bf16's
// perplexity.
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

const std::string kDir = std::string(TFORMERS_SOURCE_DIR) + "/models/kjv-fortunes-tiny";

nlohmann::json expected_figures() {
  return nlohmann::json::parse(std::ifstream(kDir + "/heldout.json"));
}

// heldout.txt's ids, checked against the training script's count and first ids.
std::vector<int32_t> heldout_ids() {
  std::stringstream text;
  text << std::ifstream(kDir + "/heldout.txt").rdbuf();
  Tokenizer tok = AutoTokenizer::from_pretrained(kDir);
  std::vector<int32_t> ids = tok.encode(text.str(), /*add_special_tokens=*/false);
  const nlohmann::json expect = expected_figures();
  EXPECT_EQ(int64_t(ids.size()), expect["tokens"].get<int64_t>());
  auto first = expect["first_ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + first.size()), first);
  return ids;
}

// The held-out loss (nats per predicted token) of the model loaded with `opt`, by the protocol
// of heldout_loss.py: non-overlapping windows from position 0, every token but each window's
// first predicted, the last window kept when it has at least 2 tokens.
double heldout_loss(const std::vector<int32_t>& ids, const LoadOptions& opt) {
  CausalLM lm = AutoModelForCausalLM::from_pretrained(kDir, opt);
  const int64_t window = expected_figures()["window"].get<int64_t>(), V = lm.config().vocab_size;
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
  EXPECT_EQ(predicted, expected_figures()["predicted_tokens"].get<int64_t>());
  return nll / double(predicted);
}

TEST(DefaultModel, HeldOutLossMatchesTrainingFigure) {
  const double loss = heldout_loss(heldout_ids(), {.dtype = float32, .device_map = "cpu"});
  const double want = expected_figures()["loss"].get<double>();
  std::printf("held-out loss: tformers %.6f, training script %.6f\n", loss, want);
  EXPECT_NEAR(loss, want, 0.01 * want) << "tformers " << loss << " vs training script " << want;
}

// Issue 19's bar for 4-bit weights: held-out perplexity (exp of the loss) within 5 % of bf16's.
// Measured when written: bf16 3.835378, int4 3.844633 nats (perplexity ratio 1.0093).
TEST(DefaultModel, Int4PerplexityWithinFivePercentOfBf16) {
  const std::vector<int32_t> ids = heldout_ids();
  const double bf16 = heldout_loss(ids, {.dtype = bfloat16, .device_map = "cpu"});
  const double int4 =
      heldout_loss(ids, {.dtype = bfloat16, .device_map = "cpu", .quantize = "int4"});
  const double ratio = std::exp(int4 - bf16);
  std::printf("held-out loss: bf16 %.6f, int4 %.6f, perplexity ratio %.4f\n", bf16, int4, ratio);
  EXPECT_LE(ratio, 1.05);
  EXPECT_NE(int4, bf16) << "int4 computed exactly bf16's loss: not quantized?";
}

}  // namespace
}  // namespace tformers
