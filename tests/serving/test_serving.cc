// The continuous-batching engine: paged steps against the static cache, batch invariance, the
// shape plan, a full pool, prefix caching, preemption, cancellation, shutdown and bad requests.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "backends/cpu/kernels.h"
#include "collector.h"
#include "common/error_of.h"
#include "tformers/model.h"
#include "tformers/serving.h"
#include "tformers/tokenizer.h"

namespace tformers {
namespace {

using tformers::testing::Collector;

using testing::error_of;

const std::string kShipped = std::string(TFORMERS_SOURCE_DIR) + "/models/kjv-fortunes-tiny";

ServingRequest greedy(std::vector<int32_t> prompt, int64_t n) {
  ServingRequest r;
  r.prompt = std::move(prompt);
  r.config.do_sample = false;
  r.config.max_new_tokens = n;
  r.config.eos_token_id = std::vector<int64_t>{};  // full length, so lengths are known
  r.logprobs = true;
  return r;
}

std::vector<int32_t> prompt_of(int seed, int len, int64_t vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(int32_t((seed * 7919 + i * 104729) % vocab));
  return p;
}

// Each tiny architecture through the engine: every chosen token's log-probability equals the
// one the static cache gives for the same tokens (forward() over the prompt, then one token at
// a time). Gemma 3 covers sliding windows and soft-capping, GLM partial interleaved rotary.
// The engine's linears see as many rows as its steps: a prefill's output layer 1 (the last
// position), a decode step at least 4 (its smallest batch bucket). The CPU linear runs fewer than
// 4 rows as a GEMV and more as a GEMM, whose sums differ (on AVX-512 BF16 the GEMM rounds
// activations to bf16), so the static reference runs the same shapes: the prompt alone for the
// first token, 4 copies of the sequence for the others. Only the caches differ then.
class PagedMatchesStatic : public ::testing::TestWithParam<std::string> {};

TEST_P(PagedMatchesStatic, LogprobsOfEveryToken) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(
      std::string(TFORMERS_TEST_DATA) + "/models/" + GetParam(), {.device_map = "cpu"});
  const int64_t V = model.config().vocab_size;
  const std::vector<int32_t> prompt = prompt_of(3, 21, V);  // crosses block and bucket edges
  const int64_t n = 12;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  {
    ServingEngine engine(model, {.max_num_seqs = 2, .max_model_len = 64, .block_size = 8});
    engine.warm_up();
    engine.start();
    Collector c;
    engine.submit(greedy(prompt, n), c.callback());
    ASSERT_EQ(c.wait(), "length") << c.error();
    tokens = c.tokens();
    logprobs = c.logprobs();
  }
  ASSERT_EQ(int64_t(tokens.size()), n);
  // log p(token) under the first row's logits of forward() over rows of `copies` copies of
  // all[start, end).
  auto logprob = [&](const std::vector<int32_t>& all, int64_t start, int64_t copies,
                     int32_t token) {
    std::vector<int32_t> step;
    for (int64_t c = 0; c < copies; ++c) step.insert(step.end(), all.begin() + start, all.end());
    Tensor ids =
        Tensor::from_vector<int32_t>({copies, int64_t(all.size()) - start}, DType::i32, step);
    Tensor logits = model.forward({.input_ids = ids, .cache_position = start});
    const float* l = logits.data<float>();
    double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(l[v]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(l[v]) - mx);
    return double(l[token]) - mx - std::log(sum);
  };
  model.reset_cache(1, 64);
  const double first = logprob(prompt, 0, 1, tokens[0]);
  EXPECT_NEAR(logprobs[0], first, 1e-3 + 1e-4 * std::abs(first)) << GetParam() << " 0";
  constexpr int64_t kCopies = 4;
  model.reset_cache(kCopies, 64);
  std::vector<int32_t> all = prompt;
  logprob(all, 0, kCopies, tokens[0]);  // the prompt into the 4-row cache
  for (int64_t i = 1; i < n; ++i) {
    all.push_back(tokens[size_t(i - 1)]);
    const double want = logprob(all, int64_t(all.size()) - 1, kCopies, tokens[size_t(i)]);
    EXPECT_NEAR(logprobs[size_t(i)], want, 1e-3 + 1e-4 * std::abs(want)) << GetParam() << " " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Serving, PagedMatchesStatic,
                         ::testing::Values("tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral",
                                           "tiny-gemma3", "tiny-glm", "tiny-glm4", "hf-qwen3-moe",
                                           "hf-mixtral", "hf-glm4-moe", "hf-gpt-oss",
                                           "hf-qwen3-next", "hf-qwen3-5", "hf-gemma4",
                                           "hf-gemma4-moe"));

// A request's greedy tokens alone equal its tokens among others of other lengths, submitted
// together and at staggered times, with the decode batch growing and shrinking around it; and
// after warm-up nothing compiles.
// The mixtures of experts too: a token's experts are chosen and summed by row, whatever shares
// the step.
class BatchInvariant : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvariant, AndNoCompilesAfterWarmUp) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(GetParam(), {.device_map = "cpu"});
  const int64_t V = model.config().vocab_size;
  ServingEngine engine(model, {.max_num_seqs = 8, .max_model_len = 128});
  engine.warm_up();
  const uint64_t compiled = engine.stats().compiles;
  EXPECT_GT(compiled, 0u);
  engine.start();
  const int kRequests = 12;
  std::vector<std::vector<int32_t>> alone(kRequests);
  std::vector<std::vector<float>> alone_logprobs(kRequests);
  for (int r = 0; r < kRequests; ++r) {
    Collector c;
    engine.submit(greedy(prompt_of(r, 3 + 5 * r, V), 10 + 3 * r), c.callback());
    ASSERT_EQ(c.wait(), "length") << c.error();
    alone[size_t(r)] = c.tokens();
    alone_logprobs[size_t(r)] = c.logprobs();
  }
  std::vector<Collector> together(kRequests);
  for (int r = 0; r < kRequests; ++r) {
    engine.submit(greedy(prompt_of(r, 3 + 5 * r, V), 10 + 3 * r), together[size_t(r)].callback());
    if (r % 3 == 2) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < kRequests; ++r) {
    ASSERT_EQ(together[size_t(r)].wait(), "length");
    EXPECT_EQ(together[size_t(r)].tokens(), alone[size_t(r)]) << "request " << r;
    // Not only the same choices: the same bits of every log-probability.
    EXPECT_EQ(together[size_t(r)].logprobs(), alone_logprobs[size_t(r)]) << "request " << r;
  }
  const ServingStats s = engine.stats();
  EXPECT_EQ(s.compiles_since_ready, 0u);
  EXPECT_EQ(s.compiles, compiled);
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_GT(s.padded_tokens, 0u);
  EXPECT_GT(s.computed_tokens, s.padded_tokens);
}

INSTANTIATE_TEST_SUITE_P(
    Serving, BatchInvariant,
    ::testing::Values(kShipped, std::string(TFORMERS_TEST_DATA) + "/models/hf-qwen3-moe",
                      std::string(TFORMERS_TEST_DATA) + "/models/hf-glm4-moe",
                      std::string(TFORMERS_TEST_DATA) + "/models/hf-qwen3-next",
                      std::string(TFORMERS_TEST_DATA) + "/models/hf-qwen3-5-moe",
                      std::string(TFORMERS_TEST_DATA) + "/models/hf-gemma4"),
    [](const ::testing::TestParamInfo<std::string>& info) {
      std::string name = std::filesystem::path(info.param).filename();
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

// The sequences of a decode step choose their tokens on the pool's threads; one whose sampling
// fails there ends alone with the sampler's error, and the step's other sequences go on with the
// tokens and log-probabilities they have alone.
TEST(Serving, ASequenceWhoseSamplingFailsEndsAloneWithItsError) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(
      std::string(TFORMERS_TEST_DATA) + "/models/tiny-qwen3", {.device_map = "cpu"});
  const int64_t V = model.config().vocab_size;
  // Every id but 7 and 8 suppressed, 8 in the prompt, and no 1-gram may repeat: the first token
  // can only be 7, and after it no token is left, which the sampler refuses.
  ServingRequest doomed;
  doomed.prompt = {8, 20, 30};
  doomed.config.do_sample = true;
  doomed.config.no_repeat_ngram_size = 1;
  doomed.config.suppress_tokens = std::vector<int64_t>{};
  for (int64_t id = 0; id < V; ++id)
    if (id != 7 && id != 8) doomed.config.suppress_tokens->push_back(id);
  doomed.config.max_new_tokens = 4;
  ServingEngine engine(model, {.max_num_seqs = 4, .max_model_len = 64});
  engine.start();
  Collector alone;
  engine.submit(greedy(prompt_of(5, 9, V), 12), alone.callback());
  ASSERT_EQ(alone.wait(), "length") << alone.error();
  Collector bad, good;
  engine.submit(doomed, bad.callback());
  engine.submit(greedy(prompt_of(5, 9, V), 12), good.callback());
  EXPECT_EQ(bad.wait(), "error");
  EXPECT_NE(bad.error().find("every token was filtered out"), std::string::npos) << bad.error();
  EXPECT_EQ(bad.tokens(), std::vector<int32_t>{7});
  ASSERT_EQ(good.wait(), "length") << good.error();
  EXPECT_EQ(good.tokens(), alone.tokens());
  EXPECT_EQ(good.logprobs(), alone.logprobs());
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

// A pool with room for one full-length sequence: the others wait their turn (or are preempted
// back into the queue) and still get every token they asked for.
TEST(Serving, FullPoolMakesRequestsWaitNotTruncate) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(kShipped, {.device_map = "cpu"});
  ServingEngine engine(model,
                       {.max_num_seqs = 4, .max_model_len = 64, .block_size = 16, .num_blocks = 4});
  engine.warm_up();
  engine.start();
  std::vector<Collector> c(3);
  for (int r = 0; r < 3; ++r)
    engine.submit(greedy(prompt_of(r, 10, 4096), 50), c[size_t(r)].callback());
  bool saw_waiting = false;
  for (int i = 0; i < 200 && !saw_waiting; ++i) {
    saw_waiting = engine.stats().waiting > 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(saw_waiting);
  for (auto& x : c) {
    ASSERT_EQ(x.wait(), "length");
    EXPECT_EQ(x.tokens().size(), 50u);
  }
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

// What a request gives alone on an engine without prefix caching, as the reference for the
// same request where prefixes are cached or sequences preempted.
struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

Output run_alone(ServingEngine& engine, const ServingRequest& r) {
  Collector c;
  engine.submit(r, c.callback());
  EXPECT_EQ(c.wait(), "length") << c.error();
  return {c.tokens(), c.logprobs()};
}

// A second request sharing a long prefix with a first prefills only its new tokens, and gets the
// same bits as without the cache: a prompt that extends the first, the same prompt again, one
// ending on a block's end (whose last token is computed all the same), and a next turn that
// repeats the first request's prompt and completion. Also for a model with one query head per KV
// head (tiny-llama-sharded), whose short prefills once took another attention path than long
// ones, for sliding windows (tiny-mistral, tiny-gemma3) and partial rotary (tiny-glm). A hybrid
// model (hf-qwen3-5) hits only up to a block end where a prompt's recurrent state was kept: the
// end of each prompt's last whole block.
class PrefixHits : public ::testing::TestWithParam<std::string> {};

TEST_P(PrefixHits, PrefillOnlyTheNewTokens) {
  const std::string path = GetParam();
  const bool hybrid = path.find("qwen3-5") != std::string::npos;
  CausalLM model = AutoModelForCausalLM::from_pretrained(path, {.device_map = "cpu"});
  const int64_t V = model.config().vocab_size;
  const ServingConfig config{.max_num_seqs = 4, .max_model_len = 128, .block_size = 8};
  ServingConfig uncached = config;
  uncached.enable_prefix_caching = false;
  // Its own model: one model has one KV pool, so one engine.
  CausalLM reference_model = AutoModelForCausalLM::from_pretrained(path, {.device_map = "cpu"});
  ServingEngine reference(reference_model, uncached);
  reference.start();
  ServingEngine engine(model, config);
  engine.start();

  const std::vector<int32_t> prefix = prompt_of(5, 40, V);  // 5 blocks
  auto with = [&](std::vector<int32_t> head, const std::vector<int32_t>& tail) {
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  };
  const std::vector<int32_t> first = with(prefix, prompt_of(6, 5, V));
  const Output first_out = run_alone(engine, greedy(first, 12));
  EXPECT_EQ(engine.stats().prefix_cache_hits, 0u);
  EXPECT_EQ(engine.stats().prefill_tokens, 45u);
  EXPECT_EQ(first_out.tokens, run_alone(reference, greedy(first, 12)).tokens);

  std::vector<int32_t> next_turn = with(first, first_out.tokens);  // 57: 56 computed, 7 blocks
  next_turn = with(next_turn, prompt_of(8, 3, V));
  const struct {
    const char* what;
    std::vector<int32_t> prompt;
    uint64_t hit, hybrid_hit;
  } cases[] = {
      {"a longer prompt", with(prefix, prompt_of(7, 9, V)), 40, 40},
      {"the same prompt", first, 40, 40},
      // No prompt's state was kept at 32.
      {"the prefix alone", prefix, 32, 0},
      // The first request's generated positions came from decode steps: only its prompt's
      // whole blocks serve a prompt that repeats them.
      {"the next turn", next_turn, 40, 40},
  };
  for (const auto& c : cases) {
    const uint64_t hit = hybrid ? c.hybrid_hit : c.hit;
    const ServingStats before = engine.stats();
    const Output got = run_alone(engine, greedy(c.prompt, 10));
    const ServingStats after = engine.stats();
    EXPECT_EQ(after.prefix_cache_hits - before.prefix_cache_hits, hit) << c.what;
    EXPECT_EQ(after.prefix_cache_queries - before.prefix_cache_queries, c.prompt.size()) << c.what;
    EXPECT_EQ(after.prefill_tokens - before.prefill_tokens, c.prompt.size() - hit) << c.what;
    const Output want = run_alone(reference, greedy(c.prompt, 10));
    EXPECT_EQ(got.tokens, want.tokens) << c.what;
    EXPECT_EQ(got.logprobs, want.logprobs) << c.what;
  }
  const ServingStats s = engine.stats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_GT(s.kv_blocks_cached, 0);
  EXPECT_EQ(reference.stats().prefix_cache_hits, 0u);
  EXPECT_EQ(reference.stats().kv_blocks_cached, 0);
}

INSTANTIATE_TEST_SUITE_P(Serving, PrefixHits,
                         ::testing::Values(kShipped,
                                           std::string(TFORMERS_TEST_DATA) +
                                               "/models/tiny-llama-sharded",
                                           std::string(TFORMERS_TEST_DATA) + "/models/tiny-mistral",
                                           std::string(TFORMERS_TEST_DATA) + "/models/tiny-gemma3",
                                           std::string(TFORMERS_TEST_DATA) + "/models/tiny-glm",
                                           std::string(TFORMERS_TEST_DATA) + "/models/hf-qwen3-5",
                                           std::string(TFORMERS_TEST_DATA) + "/models/hf-gemma4"));

// A pool with room for one full-length sequence and four sequences growing in it at once,
// arriving at staggered times: the newest are preempted and computed again, with and without
// the prefix cache, and every request's tokens and log-probabilities are those it gets alone.
// Two requests share a prefix; one samples, so its sampler must carry its state across.
// A hybrid model (Qwen3.5: linear attention's recurrent state in a slot per sequence) resumes
// from the state kept at its prompt's last whole block, or starts it again.
class Preempted : public ::testing::TestWithParam<std::string> {};

TEST_P(Preempted, SequencesResumeWithTheSameOutput) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(GetParam(), {.device_map = "cpu"});
  const int64_t V = model.config().vocab_size;
  std::vector<ServingRequest> requests;
  for (int r = 0; r < 6; ++r) requests.push_back(greedy(prompt_of(r, 6 + 3 * r, V), 30 + 2 * r));
  requests[3].prompt.insert(requests[3].prompt.begin(), requests[1].prompt.begin(),
                            requests[1].prompt.end());
  requests[4].config.do_sample = true;
  requests[4].config.seed = 1234;
  requests[4].config.temperature = 1.5;
  std::vector<Output> alone;
  {
    ServingEngine reference(
        model,
        {.max_num_seqs = 4, .max_model_len = 64, .block_size = 8, .enable_prefix_caching = false});
    reference.start();
    for (const auto& r : requests) alone.push_back(run_alone(reference, r));
  }
  for (bool caching : {true, false}) {
    ServingEngine engine(model, {.max_num_seqs = 4,
                                 .max_model_len = 64,
                                 .block_size = 8,
                                 .num_blocks = 8,
                                 .enable_prefix_caching = caching});
    engine.warm_up();
    engine.start();
    std::vector<Collector> c(requests.size());
    for (size_t r = 0; r < requests.size(); ++r) {
      engine.submit(requests[r], c[r].callback());
      if (r % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (size_t r = 0; r < requests.size(); ++r) {
      ASSERT_EQ(c[r].wait(), "length") << c[r].error();
      EXPECT_EQ(c[r].tokens(), alone[r].tokens) << "request " << r << " caching " << caching;
      EXPECT_EQ(c[r].logprobs(), alone[r].logprobs) << "request " << r << " caching " << caching;
    }
    const ServingStats s = engine.stats();
    EXPECT_GT(s.preemptions, 0u) << caching;
    EXPECT_EQ(s.kv_blocks_used, 0) << caching;
    EXPECT_EQ(s.compiles_since_ready, 0u) << caching;
    // Preempted sequences are looked up again when they come back; without the cache their
    // prompts are prefilled again.
    uint64_t prompts = 0;
    for (const auto& r : requests) prompts += r.prompt.size();
    EXPECT_EQ(s.prompt_tokens, prompts);
    EXPECT_GT(s.prefix_cache_queries, prompts);
    if (caching) {
      EXPECT_GT(s.prefix_cache_hits, 0u);
    } else {
      EXPECT_EQ(s.prefix_cache_hits, 0u);
      EXPECT_GT(s.prefill_tokens, prompts);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Serving, Preempted,
                         ::testing::Values(kShipped,
                                           std::string(TFORMERS_TEST_DATA) + "/models/hf-qwen3-5",
                                           std::string(TFORMERS_TEST_DATA) + "/models/hf-gemma4"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = std::filesystem::path(info.param).filename();
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Without max_new_tokens a request may run to max_model_len, but holds only the blocks it has
// filled: in a pool of one full-length sequence, a short request submitted after it runs beside
// it and ends first, where a reservation of its whole length would have made it wait.
TEST(Serving, UnsetMaxTokensReservesNothing) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(kShipped, {.device_map = "cpu"});
  ServingEngine engine(model,
                       {.max_num_seqs = 2, .max_model_len = 64, .block_size = 16, .num_blocks = 4});
  ServingRequest to_the_end = greedy({1, 2, 3}, 0);
  to_the_end.config.max_new_tokens.reset();
  std::mutex mu;
  std::vector<std::string> order;
  Collector longer, shorter;
  auto noting = [&](const std::string& name, ServingCallback inner) {
    return [&, name, inner](const ServingEvent& e) {
      if (!e.finish_reason.empty()) {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(name);
      }
      inner(e);
    };
  };
  engine.submit(to_the_end, noting("long", longer.callback()));
  engine.submit(greedy({4, 5, 6}, 5), noting("short", shorter.callback()));
  engine.start();  // both are queued before the first step
  ASSERT_EQ(longer.wait(), "length");
  ASSERT_EQ(shorter.wait(), "length");
  EXPECT_EQ(longer.tokens().size(), 61u);
  EXPECT_EQ(order, (std::vector<std::string>{"short", "long"}));
  EXPECT_EQ(engine.stats().preemptions, 0u);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

// A prompt longer than max_prefill_tokens is prefilled in chunks of whole blocks, one a step,
// with the running sequences' decode steps between them. With a budget of 32 and blocks of 8, a
// 100-token prompt queued behind a 4-token one is prefilled as 24 (what the short prompt left of
// the first step's budget), 32, 32 and 12 positions, so the short request has its first token
// and three more before the long one's first. Alone and unchunked, the long request gives the
// same tokens and log-probabilities, bit for bit: a prefill's positions do not depend on where
// the prompt is cut at block ends.
TEST(Serving, ALongPromptIsPrefilledInChunksBetweenDecodeSteps) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(kShipped, {.device_map = "cpu"});
  const int64_t V = model.config().vocab_size;
  const std::vector<int32_t> long_prompt = prompt_of(5, 100, V);
  Collector alone;
  {
    ServingEngine engine(
        model,
        {.max_num_seqs = 2, .max_model_len = 128, .block_size = 8, .max_prefill_tokens = 4096});
    engine.start();
    engine.submit(greedy(long_prompt, 6), alone.callback());
    ASSERT_EQ(alone.wait(), "length") << alone.error();
  }
  std::mutex mu;
  std::vector<char> order;  // 's' or 'l' for each token, in the order they were reported
  auto noting = [&](char who, ServingCallback inner) {
    return [&, who, inner](const ServingEvent& e) {
      if (e.token >= 0) {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(who);
      }
      inner(e);
    };
  };
  ServingEngine engine(
      model, {.max_num_seqs = 2, .max_model_len = 128, .block_size = 8, .max_prefill_tokens = 32});
  Collector shorter, longer;
  engine.submit(greedy(prompt_of(6, 4, V), 12), noting('s', shorter.callback()));
  engine.submit(greedy(long_prompt, 6), noting('l', longer.callback()));
  engine.start();
  ASSERT_EQ(shorter.wait(), "length") << shorter.error();
  ASSERT_EQ(longer.wait(), "length") << longer.error();
  const auto first_long = std::find(order.begin(), order.end(), 'l');
  EXPECT_EQ(std::count(order.begin(), first_long, 's'), 4);
  EXPECT_EQ(longer.tokens(), alone.tokens());
  EXPECT_EQ(longer.logprobs(), alone.logprobs());
  const ServingStats st = engine.stats();
  EXPECT_EQ(st.prefill_tokens, 104u);
  // The 4 prompt chunks (the first in one packed step with the short prompt) and the decode
  // steps (11 tokens of the short request, 5 of the long one's, together once both run).
  EXPECT_EQ(st.steps, 4u + 11u);
}

// Prompts that wait together are prefilled in one packed step (a row of their tokens, a block
// table row each), and each request gets the bits it gets alone, whose prefill step has its
// prompt alone in another bucket. One new token each: the requests end at that step.
TEST(Serving, WaitingPromptsShareOnePackedPrefillStep) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(kShipped, {.device_map = "cpu"});
  const int64_t V = model.config().vocab_size;
  const ServingConfig config{.max_num_seqs = 8, .max_model_len = 128, .block_size = 8};
  const int lengths[] = {3, 17, 40, 1, 9, 24};
  std::vector<Collector> alone(std::size(lengths)), packed(std::size(lengths));
  for (size_t i = 0; i < std::size(lengths); ++i) {
    ServingEngine engine(model, config);
    engine.start();
    engine.submit(greedy(prompt_of(int(i) + 20, lengths[i], V), 1), alone[i].callback());
    ASSERT_EQ(alone[i].wait(), "length") << alone[i].error();
  }
  ServingEngine engine(model, config);
  for (size_t i = 0; i < std::size(lengths); ++i)
    engine.submit(greedy(prompt_of(int(i) + 20, lengths[i], V), 1), packed[i].callback());
  engine.start();
  for (size_t i = 0; i < std::size(lengths); ++i) {
    ASSERT_EQ(packed[i].wait(), "length") << packed[i].error();
    EXPECT_EQ(packed[i].tokens(), alone[i].tokens()) << "request " << i;
    EXPECT_EQ(packed[i].logprobs(), alone[i].logprobs()) << "request " << i;
  }
  const ServingStats st = engine.stats();
  EXPECT_EQ(st.prefill_tokens, 94u);
  EXPECT_EQ(st.steps, 1u);  // 94 tokens: the 96-token bucket, with places for 6 sequences
}

// A context shorter than the smallest default prefill bucket (16) gets the one bucket of its own
// length, and its requests the tokens the static cache gives (the shipped model has no near-ties).
TEST(Serving, AContextShorterThanTheFirstPrefillBucketServes) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(kShipped, {.device_map = "cpu"});
  const std::vector<int32_t> prompt = {11, 5, 42, 7, 99};
  const auto want = model.generate({prompt}, {.max_new_tokens = 7, .do_sample = false});
  for (int64_t len : {2, 12, 16}) {
    ServingEngine engine(model, {.max_num_seqs = 2, .max_model_len = len, .block_size = 4});
    engine.start();
    Collector c;
    const int64_t fit = std::min<int64_t>(len, int64_t(prompt.size()) + 7);
    const std::vector<int32_t> p(prompt.begin(), prompt.begin() + std::min<int64_t>(fit - 1, 5));
    engine.submit(greedy(p, fit - int64_t(p.size())), c.callback());
    ASSERT_EQ(c.wait(), "length") << "max_model_len " << len << ": " << c.error();
    ASSERT_EQ(int64_t(c.tokens().size()), fit - int64_t(p.size()));
    if (p.size() == prompt.size()) {
      for (size_t i = 0; i < c.tokens().size(); ++i)
        EXPECT_EQ(c.tokens()[i], want[0][prompt.size() + i]) << "max_model_len " << len;
    }
  }
}

// The default buckets: prefill steps from 16 by powers of two and their midpoints up to the
// longest chunk a step takes (never a bucket that no step can use: each is run at warm-up), and
// decode batches the same way from one row; given buckets are sorted and completed up to what a
// step needs.
TEST(Serving, BucketsStepByHalvesUpToWhatAStepTakes) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(kShipped, {.device_map = "cpu"});
  {
    ServingEngine engine(
        model,
        {.max_num_seqs = 20, .max_model_len = 256, .block_size = 8, .max_prefill_tokens = 100});
    EXPECT_EQ(engine.config().prefill_buckets, (std::vector<int64_t>{16, 24, 32, 48, 64, 96, 100}));
    EXPECT_EQ(engine.config().decode_buckets, (std::vector<int64_t>{1, 2, 3, 4, 6, 8, 12, 16, 20}));
  }
  {  // A context shorter than max_prefill_tokens bounds the chunks: a packed prefill step holds
     // at most max_num_seqs of them (on the CPU; elsewhere a step is one chunk).
    ServingEngine engine(model, {.max_num_seqs = 2, .max_model_len = 40});
    EXPECT_EQ(engine.config().prefill_buckets, (std::vector<int64_t>{16, 24, 32, 48, 64, 80}));
  }
  {
    ServingEngine engine(model, {.max_num_seqs = 9,
                                 .max_model_len = 256,
                                 .prefill_buckets = {64, 16},
                                 .decode_buckets = {8, 2, 8},
                                 .max_prefill_tokens = 128});
    EXPECT_EQ(engine.config().prefill_buckets, (std::vector<int64_t>{16, 64, 128}));
    EXPECT_EQ(engine.config().decode_buckets, (std::vector<int64_t>{2, 8, 9}));
  }
  EXPECT_CONTAINS(error_of<InvalidArgumentError>([&] {
                    ServingEngine engine(model, {.max_num_seqs = 8, .decode_buckets = {8, 16}});
                  }),
                  "decode_buckets must not exceed max_num_seqs (8)");
  EXPECT_CONTAINS(error_of<InvalidArgumentError>([&] {
                    ServingEngine engine(model, {.max_num_seqs = 8, .decode_buckets = {0, 8}});
                  }),
                  "decode_buckets must be at least 1");
  // A pool far beyond the process's memory is refused before it is allocated.
  EXPECT_CONTAINS(error_of<InvalidArgumentError>(
                      [&] { ServingEngine engine(model, {.num_blocks = INT32_MAX - 1}); }),
                  "bytes this process can have");
}

// Requests cancelled while others are preempted around them, in a pool of one sequence's
// blocks: the cancelled ones end with "abort", the rest with every token, and no block is left
// held.
TEST(Serving, CancelUnderPreemptionLeavesNoBlockHeld) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(kShipped, {.device_map = "cpu"});
  const int64_t V = model.config().vocab_size;
  ServingEngine engine(model,
                       {.max_num_seqs = 4, .max_model_len = 64, .block_size = 8, .num_blocks = 8});
  engine.start();
  std::vector<Collector> c(8);
  for (size_t r = 0; r < c.size(); ++r) {
    ServingCallback inner = c[r].callback();
    const bool cancels = r % 3 == 1;  // after its 12th token, from inside the callback
    engine.submit(greedy(prompt_of(int(r), 9, V), 40),
                  [&engine, inner, cancels, n = 0](const ServingEvent& e) mutable {
                    if (cancels && ++n == 12) engine.cancel(e.request);
                    inner(e);
                  });
  }
  for (size_t r = 0; r < c.size(); ++r) {
    if (r % 3 == 1) {
      EXPECT_EQ(c[r].wait(), "abort") << r;
      EXPECT_LT(c[r].tokens().size(), 40u) << r;
    } else {
      EXPECT_EQ(c[r].wait(), "length") << r;
      EXPECT_EQ(c[r].tokens().size(), 40u) << r;
    }
  }
  const ServingStats s = engine.stats();
  EXPECT_GT(s.preemptions, 0u);
  EXPECT_EQ(s.kv_blocks_used, 0);
}

// A model in one process has no rank 0 to follow (tests/distributed/serve_tp_test.cc runs the
// split server).
TEST(Serving, FollowNeedsATensorParallelModel) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(kShipped, {.device_map = "cpu"});
  EXPECT_CONTAINS(error_of<InvalidArgumentError>([&] { ServingEngine::follow(model); }),
                  "the model runs in one process; there is no one to follow");
}

TEST(Serving, CancelFreesTheSequence) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(kShipped, {.device_map = "cpu"});
  ServingEngine engine(model, {.max_num_seqs = 2, .max_model_len = 256});
  engine.warm_up();
  engine.start();
  Collector c;
  std::atomic<uint64_t> id{0};
  std::atomic<int> seen{0};
  ServingCallback inner = c.callback();
  id = engine.submit(greedy({1, 2, 3}, 250), [&](const ServingEvent& e) {
    if (++seen == 5) engine.cancel(e.request);  // from inside the callback, as a server would
    inner(e);
  });
  EXPECT_EQ(c.wait(), "abort");
  EXPECT_LT(c.tokens().size(), 250u);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  engine.cancel(id);  // finished: ignored
  engine.cancel(12345);
}

TEST(Serving, LogprobsAndStopStrings) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(kShipped, {.device_map = "cpu"});
  Tokenizer tok = AutoTokenizer::from_pretrained(kShipped);
  ServingEngine engine(model, {.max_num_seqs = 2, .max_model_len = 128}, &tok);
  engine.start();  // without warm_up: shapes compile on first use
  ServingRequest r = greedy(tok.encode("And the LORD said"), 40);
  r.top_logprobs = 3;
  Collector c;
  engine.submit(r, c.callback());
  ASSERT_EQ(c.wait(), "length");
  const auto tokens = c.tokens();
  const auto lp = c.logprobs();
  const auto top = c.top();
  for (size_t i = 0; i < tokens.size(); ++i) {
    ASSERT_EQ(top[i].size(), 3u);
    EXPECT_EQ(top[i][0].token, tokens[i]);  // greedy picks the most likely
    EXPECT_FLOAT_EQ(top[i][0].logprob, lp[i]);
    EXPECT_LE(lp[i], 0.0f);
    EXPECT_GE(top[i][0].logprob, top[i][1].logprob);
    EXPECT_GE(top[i][1].logprob, top[i][2].logprob);
  }
  // A stop string taken from the middle of that text ends the same request early.
  const std::string text = tok.decode(tokens);
  ASSERT_GT(text.size(), 12u);
  const std::string stop = text.substr(text.size() / 2, 3);
  ServingRequest s = greedy(tok.encode("And the LORD said"), 40);
  s.config.stop_strings = std::vector<std::string>{stop};
  Collector d;
  engine.submit(s, d.callback());
  EXPECT_EQ(d.wait(), "stop");
  EXPECT_LT(d.tokens().size(), tokens.size());
  EXPECT_NE(tok.decode(d.tokens()).find(stop), std::string::npos);
}

TEST(Serving, BadRequestsAndConfigs) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(kShipped, {.device_map = "cpu"});
  ServingEngine engine(model, {.max_num_seqs = 2, .max_model_len = 64});
  auto none = [](const ServingEvent&) {};
  EXPECT_CONTAINS(error_of<InvalidArgumentError>([&] { engine.submit(greedy({}, 4), none); }),
                  "prompt is empty");
  EXPECT_CONTAINS(error_of<InvalidArgumentError>([&] { engine.submit(greedy({5000}, 4), none); }),
                  "outside the vocabulary");
  EXPECT_CONTAINS(error_of<InvalidArgumentError>(
                      [&] { engine.submit(greedy(std::vector<int32_t>(64, 1), 4), none); }),
                  "max_model_len is 64");
  EXPECT_CONTAINS(error_of<InvalidArgumentError>(
                      [&] { engine.submit(greedy(std::vector<int32_t>(40, 1), 30), none); }),
                  "lower max_new_tokens");
  ServingRequest r = greedy({1}, 4);
  r.top_logprobs = 21;
  EXPECT_CONTAINS(error_of<InvalidArgumentError>([&] { engine.submit(r, none); }),
                  "top_logprobs 21");
  ServingRequest penalty = greedy({1}, 4);
  penalty.frequency_penalty = 2.5;
  EXPECT_CONTAINS(error_of<InvalidArgumentError>([&] { engine.submit(penalty, none); }),
                  "frequency_penalty 2.5");
  ServingRequest bias = greedy({1}, 4);
  bias.logit_bias = {{5000, 1.0f}};
  EXPECT_CONTAINS(error_of<InvalidArgumentError>([&] { engine.submit(bias, none); }),
                  "logit_bias: token 5000 is outside the vocabulary");
  bias.logit_bias = {{7, 101.0f}};
  EXPECT_CONTAINS(error_of<InvalidArgumentError>([&] { engine.submit(bias, none); }),
                  "must be in [-100, 100]");
  ServingRequest beams = greedy({1}, 4);
  beams.config.num_beams = 2;
  EXPECT_CONTAINS(error_of<InvalidArgumentError>([&] { engine.submit(beams, none); }), "num_beams");
  EXPECT_CONTAINS(
      error_of<InvalidArgumentError>([&] { ServingEngine e(model, {.max_model_len = 1000}); }),
      "max_position_embeddings");
  EXPECT_CONTAINS(error_of<InvalidArgumentError>([&] {
                    ServingEngine e(model,
                                    {.max_model_len = 64, .block_size = 16, .num_blocks = 3});
                  }),
                  "cannot hold one sequence");
  // A second engine on a model would share its KV pool.
  EXPECT_CONTAINS(
      error_of<InvalidArgumentError>([&] { ServingEngine e(model, {.max_model_len = 64}); }),
      "already has an engine");
}

// shutdown() lets running requests finish within the grace period, aborts what is left, and
// refuses new requests. The long request's callback takes 50 ms a token, so its 250 tokens need
// over 12 s whatever the build, while the short one's 3 fit the 5 s grace even under sanitizers
// on a loaded host (a 100 ms grace did not, once).
TEST(Serving, ShutdownFinishesOrAborts) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(kShipped, {.device_map = "cpu"});
  ServingEngine engine(model, {.max_num_seqs = 2, .max_model_len = 256});
  engine.warm_up();
  engine.start();
  Collector short_one, long_one;
  engine.submit(greedy({1, 2}, 3), short_one.callback());
  engine.submit(greedy({1, 2}, 250), [slow = long_one.callback()](const ServingEvent& e) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    slow(e);
  });
  engine.shutdown(std::chrono::seconds(5));
  EXPECT_EQ(short_one.wait(), "length");
  EXPECT_EQ(long_one.wait(), "abort");
  EXPECT_FALSE(engine.accepting());
  EXPECT_CONTAINS(
      error_of<ResourceError>([&] { engine.submit(greedy({1}, 2), [](const ServingEvent&) {}); }),
      "shutting down");
}

}  // namespace
}  // namespace tformers
