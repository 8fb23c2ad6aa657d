// Packed prefill steps against a forward per prompt: the time to prefill a burst of N prompts of
// L tokens each as N paged steps of one sequence (each left-padded to the bucket of L, as the
// serving engine runs prompts where the backend does not pack) and as one packed step (their
// tokens in one row of the bucket of N x L, ModelRunner's packed steps, as the engine runs them on
// the CPU). The two sides alternate round by round in one process and the ratio of their
// medians is printed; the logits of each prompt's last token are checked to be the same bits on
// both sides first.
//
//   bench_packed_prefill --model DIR [--prompts 16] [--tokens 32] [--rounds 5] [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_help.h"
#include "core/thread_pool.h"
#include "generation/padding.h"
#include "models/model_runner.h"
#include "tformers/model.h"
#include "tformers/serving.h"

namespace {

using namespace tformers;
using Clock = std::chrono::steady_clock;

const char* kUsage =
    "usage: bench_packed_prefill --model DIR [--prompts 16] [--tokens 32] [--rounds 5] "
    "[--threads N]\n"
    "Times a burst of --prompts prompts of --tokens tokens prefilled as a paged step each and as\n"
    "one packed step (the CPU serving engine's), alternated --rounds times in one process; prints\n"
    "each round, the medians and their ratio. Exit status 1 when the two give other logits.\n";

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (bench::answered_help(argc, argv, kUsage)) return 0;
  std::string dir;
  int64_t prompts = 16, tokens = 32, rounds = 5;
  int threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      dir = v;
    else if (k == "--prompts")
      prompts = std::stoll(v);
    else if (k == "--tokens")
      tokens = std::stoll(v);
    else if (k == "--rounds")
      rounds = std::stoll(v);
    else if (k == "--threads")
      threads = std::stoi(v);
    else
      return std::fprintf(stderr, "unknown option %s\n%s", k.c_str(), kUsage), 2;
  }
  if (dir.empty() || prompts < 1 || tokens < 1 || rounds < 1)
    return std::fprintf(stderr, "%s", kUsage), 2;
  if (threads > 0) ThreadPool::set_global_threads(threads);
  CausalLM lm = AutoModelForCausalLM::from_pretrained(dir, {.device_map = "cpu"});
  // The engine's prefill buckets for these prompts (a context each, up to max_prefill_tokens);
  // the engine goes before the bench's own pool is allocated.
  const std::vector<int64_t> buckets =
      ServingEngine(lm, {.max_num_seqs = prompts, .max_model_len = tokens + 1})
          .config()
          .prefill_buckets;
  models::ModelRunner m(lm);
  if (!m.packs_sequences()) return std::fprintf(stderr, "this backend runs no packed steps\n"), 2;
  const int64_t V = m.vocab_size(), block = 16, per = (tokens + block - 1) / block;
  m.allocate_pool(prompts * per, block, per);
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(prompts)),
      tables(static_cast<size_t>(prompts));
  std::vector<models::SequenceChunk> chunks;
  for (int64_t p = 0; p < prompts; ++p) {
    for (int64_t t = 0; t < tokens; ++t)
      ids[size_t(p)].push_back(int32_t((p * 7919 + t * 104729) % V));
    for (int64_t b = 0; b < per; ++b) tables[size_t(p)].push_back(int32_t(p * per + b));
    chunks.push_back({.tokens = ids[size_t(p)], .position = 0, .blocks = tables[size_t(p)]});
  }
  // The engine's packed step: a bucket with a place for each prompt, and as many places as it
  // has for its tokens, up to the engine's max_num_seqs (here the prompts).
  const int64_t per_place = models::ModelRunner::kTokensPerPlace;
  const int64_t T = generation::bucketed(buckets, std::max(prompts * tokens, prompts * per_place));
  const int64_t places = std::clamp<int64_t>(T / per_place, 1, prompts);
  const int64_t each_bucket = generation::bucketed(buckets, tokens);
  if (T > buckets.back())
    return std::fprintf(stderr, "%lld prompts of %lld tokens do not fit one step of %lld\n",
                        (long long)prompts, (long long)tokens, (long long)buckets.back()),
           2;
  models::ModelRunner::Step& one = m.prepare_paged(1, each_bucket);
  models::ModelRunner::Step& packed = m.prepare_paged(1, T, places);
  Tensor one_logits = Tensor::zeros({1, 1, V}, DType::f32);
  Tensor packed_logits = Tensor::zeros({places, 1, V}, DType::f32);
  auto each = [&](std::vector<float>* keep) {
    for (const auto& c : chunks) {
      m.run_paged(one, {&c, 1}, one_logits);
      if (keep) keep->insert(keep->end(), one_logits.data<float>(), one_logits.data<float>() + V);
    }
  };
  auto all = [&] { m.run_paged(packed, chunks, packed_logits); };
  std::vector<float> want;
  each(&want);
  all();
  if (std::memcmp(want.data(), packed_logits.data<float>(), want.size() * sizeof(float)) != 0)
    return std::fprintf(stderr, "the packed step's logits differ from the steps of one prompt\n"),
           1;
  auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  std::printf(
      "%lld prompts of %lld tokens: a step each (bucket %lld) against one packed step "
      "(bucket %lld, %lld places), %d threads\n",
      (long long)prompts, (long long)tokens, (long long)each_bucket, (long long)T,
      (long long)places, ThreadPool::global().num_threads());
  std::vector<double> a, b;
  for (int64_t r = 0; r < rounds; ++r) {
    const auto t0 = Clock::now();
    each(nullptr);
    const auto t1 = Clock::now();
    all();
    const auto t2 = Clock::now();
    a.push_back(ms(t0, t1));
    b.push_back(ms(t1, t2));
    std::printf("round %lld: a step each %.0f ms, packed %.0f ms\n", (long long)r + 1, a.back(),
                b.back());
  }
  std::printf("median: a step each %.0f ms, packed %.0f ms; packed is %.2fx as fast\n", median(a),
              median(b), median(a) / median(b));
  return 0;
}
