// The generation loop: left-padded batches, prompt buckets and compile counts, the host/device
// split (bytes crossing per step), seeds, eos handling and streaming.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "backends/compile_cache.h"
#include "golden_util.h"
#include "tformers/error.h"
#include "tformers/model.h"
#include "tformers/tokenizer.h"

namespace tformers {
namespace {

using testing::model_dir;

CausalLM load(const char* name = "tiny-qwen3") {
  return AutoModelForCausalLM::from_pretrained(model_dir(name), {.dtype = float32});
}

TEST(Generate, PaddedBatchGivesEachRowWhatItGivesAlone) {
  for (const char* name : {"tiny-qwen3", "tiny-llama"}) {
    CausalLM lm = load(name);
    const std::vector<std::vector<int32_t>> prompts = {
        {5, 77, 300}, {1, 17, 300, 45, 9, 401, 23, 150, 8}, {499}};
    GenerationConfig gc{.max_new_tokens = 12, .pad_token_id = 0};
    gc.eos_token_id = std::vector<int64_t>{};  // run every row to the end
    auto batch = lm.generate(prompts, gc);
    ASSERT_EQ(batch.size(), prompts.size());
    for (size_t r = 0; r < prompts.size(); ++r) {
      auto alone = lm.generate({prompts[r]}, gc);
      EXPECT_EQ(batch[r], alone[0]) << name << " row " << r;
    }
  }
}

TEST(Generate, GreedyMatchesReferenceThroughBucketPadding) {
  // The golden greedy continuations come from an unpadded full recompute; tformers pads each
  // prompt up to a 16-token bucket and masks the padding.
  CausalLM lm = load("tiny-llama");
  for (const auto& c : testing::load_goldens("tiny-llama", "float32")) {
    GenerationConfig gc{.max_new_tokens = int64_t(c.greedy.size())};
    gc.eos_token_id = std::vector<int64_t>{};
    auto out = lm.generate({c.input_ids}, gc);
    EXPECT_EQ(std::vector<int32_t>(out[0].begin() + c.input_ids.size(), out[0].end()), c.greedy);
  }
}

TEST(Generate, FinishedRowsAreFilledWithPad) {
  CausalLM lm = load();
  GenerationConfig free_cfg{.max_new_tokens = 8};
  free_cfg.eos_token_id = std::vector<int64_t>{};
  auto free_run = lm.generate({{5, 77, 300}}, free_cfg);
  std::vector<int32_t> gen(free_run[0].begin() + 3, free_run[0].end());
  // Make the first generated token not seen before (after the first step) an eos: the row stops
  // there and the rest of it is padding.
  size_t k = 1;
  while (k < gen.size() && std::find(gen.begin(), gen.begin() + k, gen[k]) != gen.begin() + k) ++k;
  ASSERT_LT(k, gen.size()) << "the tiny model repeats one token; pick another prompt";
  GenerationConfig gc{.max_new_tokens = 8, .pad_token_id = 7};
  gc.eos_token_id = std::vector<int64_t>{gen[k], 511};
  auto out = lm.generate({{5, 77, 300}, {1, 2, 3, 4, 5, 6}}, gc);
  EXPECT_EQ(std::vector<int32_t>(out[0].begin() + 3, out[0].begin() + 3 + k + 1),
            std::vector<int32_t>(gen.begin(), gen.begin() + k + 1));
  for (size_t i = 3 + k + 1; i < out[0].size(); ++i) EXPECT_EQ(out[0][i], 7) << i;
  EXPECT_EQ(out[0].size() - 3, out[1].size() - 6);
}

TEST(Generate, PromptBucketsBoundCompiles) {
  backends::CompileCache::global().clear();
  CausalLM lm = load();
  std::mt19937 rng(3);
  GenerationConfig gc{.max_new_tokens = 2, .max_cache_len = 320};
  gc.eos_token_id = std::vector<int64_t>{};
  std::set<int64_t> buckets;
  for (int i = 0; i < 200; ++i) {
    int64_t len = 1 + int64_t(rng() % 300);
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (auto& t : p) t = int32_t(rng() % 512);
    lm.generate({p}, gc);
    int64_t b = 16;
    while (b < len) b *= 2;
    buckets.insert(b + 2 <= 320 ? b : 320 - 2);  // a bucket past the cache: the largest that fits
  }
  // One prefill graph per bucket used, one decode graph, nothing per step.
  EXPECT_EQ(lm.compile_stats().compiles, buckets.size() + 1);
}

// The cache length is a bucket too: three calls with different max_new_tokens under one bucket
// (a 16-position prompt bucket plus 5, 9 or 14 tokens: a 32-slot cache) compile one prefill and
// one decode step between them, and each gives the tokens of a cache of its exact length.
TEST(Generate, MaxNewTokensUnderOneCacheBucketCompileOnce) {
  backends::CompileCache::global().clear();
  CausalLM lm = load();
  const std::vector<int32_t> prompt = {5, 77, 300};
  std::vector<std::vector<int32_t>> got;
  for (int64_t n : {5, 9, 14}) {
    GenerationConfig gc{.max_new_tokens = n};
    gc.eos_token_id = std::vector<int64_t>{};
    got.push_back(lm.generate({prompt}, gc)[0]);
  }
  EXPECT_EQ(lm.compile_stats().compiles, 2u);
  size_t i = 0;
  for (int64_t n : {5, 9, 14}) {
    GenerationConfig gc{.max_new_tokens = n, .max_cache_len = 16 + n};
    gc.eos_token_id = std::vector<int64_t>{};
    EXPECT_EQ(lm.generate({prompt}, gc)[0], got[i++]) << "max_new_tokens " << n;
  }
}

TEST(Generate, DisableCompileGivesTheSameTokensWithoutCaching) {
  CausalLM lm = load();
  GenerationConfig gc{.max_new_tokens = 6};
  auto cached = lm.generate({{5, 77, 300}}, gc);
  CompileStats before = lm.compile_stats();
  gc.disable_compile = true;
  EXPECT_EQ(lm.generate({{5, 77, 300}}, gc), cached);
  EXPECT_EQ(lm.compile_stats().compiles, before.compiles);
  EXPECT_EQ(lm.compile_stats().hits, before.hits);
}

TEST(Generate, OnlyWhatForwardConsumesCrossesPerStep) {
  CausalLM lm = load();
  const int64_t V = lm.config().vocab_size, S = 64, B = 2;
  GenerationConfig gc{.max_new_tokens = 10, .pad_token_id = 0, .max_cache_len = S};
  gc.eos_token_id = std::vector<int64_t>{};
  lm.generate({{1, 2, 3}, {4, 5}}, gc);  // compile first
  uint64_t in0 = lm.host_to_device_bytes(), out0 = lm.device_to_host_bytes();
  gc.max_new_tokens = 11;
  lm.generate({{1, 2, 3}, {4, 5}}, gc);
  uint64_t in1 = lm.host_to_device_bytes(), out1 = lm.device_to_host_bytes();
  gc.max_new_tokens = 12;
  lm.generate({{1, 2, 3}, {4, 5}}, gc);
  uint64_t in2 = lm.host_to_device_bytes(), out2 = lm.device_to_host_bytes();
  // One more decode step costs exactly: ids and positions (B x int32 each) and the cache slot
  // (one int32) in; the last position's logits (B x V f32) out. The KV cache and the key mask
  // never cross at a step.
  EXPECT_EQ((in2 - in1) - (in1 - in0), uint64_t(4 * (B + B + 1)));
  EXPECT_EQ((out2 - out1) - (out1 - out0), uint64_t(4 * B * V));
}

TEST(Generate, SeedsMakeSamplingReproducible) {
  CausalLM lm = load();
  GenerationConfig gc{.max_new_tokens = 16, .do_sample = true, .temperature = 1.5, .top_k = 0};
  gc.eos_token_id = std::vector<int64_t>{};
  gc.seed = 1234;
  auto a = lm.generate({{5, 77, 300}}, gc);
  auto b = lm.generate({{5, 77, 300}}, gc);
  EXPECT_EQ(a, b);
  gc.seed = 99;
  EXPECT_NE(lm.generate({{5, 77, 300}}, gc), a);
}

TEST(Generate, NumReturnSequencesRepeatsEachPrompt) {
  CausalLM lm = load();
  GenerationConfig gc{.max_new_tokens = 8,
                      .do_sample = true,
                      .num_return_sequences = 3,
                      .temperature = 2.0,
                      .top_k = 0};
  gc.seed = 5;
  auto out = lm.generate({{5, 77}, {9}}, gc);
  ASSERT_EQ(out.size(), 6u);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(std::vector<int32_t>(out[r].begin(), out[r].begin() + 2),
              (std::vector<int32_t>{5, 77}));
  EXPECT_EQ(out[3][0], 9);
}

TEST(Generate, StreamingSeesEveryTokenAndCanStop) {
  CausalLM lm = load();
  std::vector<int32_t> seen;
  GenerationConfig gc{.max_new_tokens = 10};
  gc.eos_token_id = std::vector<int64_t>{};
  auto out = lm.generate({{5, 77, 300}}, gc, [&](int64_t row, int32_t id) {
    EXPECT_EQ(row, 0);
    seen.push_back(id);
    return seen.size() < 4;
  });
  EXPECT_EQ(seen.size(), 4u);
  EXPECT_EQ(std::vector<int32_t>(out[0].begin() + 3, out[0].end()), seen);
}

TEST(Generate, BadRequestsAreClearErrors) {
  CausalLM lm = load();
  EXPECT_THROW(lm.generate({{}}, {.max_new_tokens = 3}), InvalidArgumentError);
  EXPECT_THROW(lm.generate({}, {.max_new_tokens = 3}), InvalidArgumentError);
  EXPECT_THROW(lm.generate({{1, 2}}, {.max_new_tokens = 0}), InvalidArgumentError);
  EXPECT_THROW(lm.generate({{1, 2}}, {.max_new_tokens = 600}), InvalidArgumentError);  // > 512
  EXPECT_THROW(lm.generate({{1, 2}}, {.max_new_tokens = 5, .max_cache_len = 4}),
               InvalidArgumentError);
  EXPECT_THROW(lm.generate({{1, 9999}}, {.max_new_tokens = 3}), InvalidArgumentError);
  EXPECT_THROW(lm.generate({{1}}, {.max_new_tokens = 3, .do_sample = true, .top_p = 1.5}),
               InvalidArgumentError);
  EXPECT_THROW(lm.generate({{1}}, {.max_new_tokens = 3, .do_sample = true, .temperature = 0.0}),
               InvalidArgumentError);
  // A padded batch needs a pad id; with neither pad nor eos there is none to use.
  lm.generation_config() = {};
  GenerationConfig none{.max_new_tokens = 2};
  none.eos_token_id = std::vector<int64_t>{};
  EXPECT_THROW(lm.generate({{1, 2}, {3}}, none), InvalidArgumentError);
}

}  // namespace
}  // namespace tformers

namespace tformers {
namespace {

TEST(Generate, StopStringSpanningTokensStopsTheRow) {
  CausalLM lm = load();
  Tokenizer tok = AutoTokenizer::from_pretrained(testing::model_dir("tiny-qwen3"));
  GenerationConfig gc{.max_new_tokens = 16};
  gc.eos_token_id = std::vector<int64_t>{};
  auto free_run = lm.generate({{84, 380, 257}}, gc);
  std::vector<int32_t> gen(free_run[0].begin() + 3, free_run[0].end());
  // A stop string made of the last byte of token k-1's text and the first byte of token k's:
  // it spans two tokens, so generation must stop right after token k. Pick the first k whose
  // stop string does not occur earlier in the text.
  size_t k = 1;
  std::string stop;
  for (; k < gen.size(); ++k) {
    std::string a = tok.decode(std::vector<int32_t>{gen[k - 1]});
    std::string b = tok.decode(std::vector<int32_t>{gen[k]});
    std::string text = tok.decode(std::vector<int32_t>(gen.begin(), gen.begin() + k + 1));
    if (a.empty() || b.empty()) continue;
    stop = a.substr(a.size() - 1) + b.substr(0, 1);
    if (text.find(stop) == text.size() - b.size() - 1) break;  // first occurrence spans k-1, k
  }
  ASSERT_LT(k, gen.size()) << "no stop string spans two tokens in this continuation";
  gc.stop_strings = std::vector<std::string>{stop};
  gc.pad_token_id = 0;
  EXPECT_THROW(lm.generate({{84, 380, 257}}, gc), InvalidArgumentError);  // needs the tokenizer
  auto out = lm.generate({{84, 380, 257}}, gc, {}, &tok);
  EXPECT_EQ(std::vector<int32_t>(out[0].begin() + 3, out[0].end()),
            std::vector<int32_t>(gen.begin(), gen.begin() + k + 1))
      << "stop string '" << stop << "' should end generation at token " << k;
}

}  // namespace
}  // namespace tformers
