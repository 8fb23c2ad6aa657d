// Continuous batching: output tokens/s and time to first token / time per output token
// percentiles of the serving engine at several concurrencies, with closed-loop clients (each
// submits its next request when the last one ends), greedy, fixed prompt and output lengths.
// --sample 1 samples as an OpenAI request with the API's defaults does (temperature 1, top_p 1:
// the whole vocabulary), and --top-logprobs N asks for N log-probabilities per token.
// The engine is measured directly, without HTTP, so the figures are the batching's own.
//
//   bench_serve [--model DIR | --shape qwen3-0.6b] [--concurrency 1,4,16,32] [--requests 2]
//               [--prompt 64] [--tokens 32] [--shared-prefix 0] [--threads N] [--dir /tmp]
//               [--quantize int8] [--sample 0|1] [--top-logprobs N]
//
// --requests is per client. --shared-prefix N starts every prompt with the same N tokens, so
// that every request after the first finds them in the prefix cache; one request is then timed
// alone before the table, cold and again with its prefix cached. Throughput at each concurrency is
// printed against concurrency 1: decode is bandwidth-bound, so a batched step that reads the
// weights once for all rows should produce several times the tokens of a single stream.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench_help.h"
#include "core/thread_pool.h"
#include "model_shapes.h"
#include "tformers/model.h"
#include "tformers/serving.h"

namespace {

using namespace tformers;
using Clock = std::chrono::steady_clock;

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

std::vector<int> split_ints(const std::string& s) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    out.push_back(std::stoi(s.substr(at, comma - at)));
    at = comma + 1;
  }
  return out;
}

struct Run {
  double seconds = 0;
  int64_t tokens = 0;
  std::vector<double> ttft_ms, tpot_ms;
};

// `clients` threads, each submitting `requests` requests one after another.
// How each request picks its tokens.
struct Picking {
  bool sample = false;
  int top_logprobs = 0;
};

Run run_clients(ServingEngine& engine, int clients, int requests, int prompt, int shared,
                int tokens, int64_t vocab, Picking picking) {
  Run run;
  std::mutex mu;
  auto client = [&](int c) {
    for (int r = 0; r < requests; ++r) {
      ServingRequest req;
      for (int i = 0; i < prompt; ++i)
        req.prompt.push_back(
            int32_t(((i < shared ? 0 : c * 7919 + r * 104729 + 1) + i * 31) % vocab));
      req.config.do_sample = picking.sample;
      if (picking.sample) {
        req.config.temperature = 1.0;
        req.config.top_k = 0;
        req.config.top_p = 1.0;
        req.config.seed = uint64_t(c * 1000 + r);
      }
      req.top_logprobs = picking.top_logprobs;
      req.config.max_new_tokens = tokens;
      req.config.eos_token_id = std::vector<int64_t>{};  // every request runs its full length
      std::mutex m;
      std::condition_variable cv;
      bool done = false;
      int64_t n = 0;
      Clock::time_point first, last;
      const Clock::time_point sent = Clock::now();
      engine.submit(std::move(req), [&](const ServingEvent& e) {
        std::lock_guard<std::mutex> lock(m);
        if (e.token >= 0) {
          last = Clock::now();
          if (n++ == 0) first = last;
        }
        if (!e.finish_reason.empty()) {
          done = true;
          cv.notify_one();
        }
      });
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return done; });
      std::lock_guard<std::mutex> g(mu);
      run.tokens += n;
      run.ttft_ms.push_back(std::chrono::duration<double, std::milli>(first - sent).count());
      if (n > 1)
        run.tpot_ms.push_back(std::chrono::duration<double, std::milli>(last - first).count() /
                              double(n - 1));
    }
  };
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) threads.emplace_back(client, c);
  for (auto& t : threads) t.join();
  run.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return run;
}

}  // namespace

const char* const kUsage =
    R"(usage: bench_serve [--model DIR | --shape qwen3-0.6b] [--concurrency 1,4,16,32] [--requests 2]
                   [--prompt 64] [--tokens 32] [--shared-prefix 0] [--threads N] [--dir /tmp]
                   [--quantize int8] [--sample 0|1] [--top-logprobs N]
The serving engine's output tokens/s and TTFT/TPOT percentiles at several concurrencies, with
closed-loop clients, without HTTP. --requests is per client. --shared-prefix N: every prompt
starts with the same N tokens (the prefix cache's case), and one request's TTFT alone is
printed cold and with its prefix cached. --sample 1: sampled with the OpenAI API's defaults
(temperature 1, top_p 1) instead of greedy; --top-logprobs N: N log-probabilities per token.
)";

int main(int argc, char** argv) {
  if (tformers::bench::answered_help(argc, argv, kUsage)) return 0;
  std::string model_dir, shape = "qwen3-0.6b", dir = "/tmp", quantize;
  std::vector<int> concurrency = {1, 4, 16, 32};
  int requests = 2, prompt = 64, tokens = 32, shared = 0, threads = 0;
  Picking picking;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") {
      model_dir = v;
    } else if (k == "--shape") {
      shape = v;
    } else if (k == "--concurrency") {
      concurrency = split_ints(v);
    } else if (k == "--requests") {
      requests = std::stoi(v);
    } else if (k == "--prompt") {
      prompt = std::stoi(v);
    } else if (k == "--tokens") {
      tokens = std::stoi(v);
    } else if (k == "--shared-prefix") {
      shared = std::stoi(v);
    } else if (k == "--threads") {
      threads = std::stoi(v);
    } else if (k == "--dir") {
      dir = v;
    } else if (k == "--quantize") {
      quantize = v;
    } else if (k == "--sample") {
      picking.sample = std::stoi(v) != 0;
    } else if (k == "--top-logprobs") {
      picking.top_logprobs = std::stoi(v);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (shared < 0 || shared > prompt) {
    std::fprintf(stderr, "--shared-prefix %d must be in [0, --prompt %d]\n", shared, prompt);
    return 2;
  }
  if (threads > 0) ThreadPool::set_global_threads(threads);
  if (model_dir.empty()) {
    if (shape != bench::kQwen3.name) {
      std::fprintf(stderr, "--shape: only %s\n", bench::kQwen3.name.c_str());
      return 2;
    }
    model_dir = dir + "/tformers-bench-" + shape;
    bench::make_model(bench::kQwen3, model_dir);
  }
  CausalLM model =
      AutoModelForCausalLM::from_pretrained(model_dir, {.device_map = "cpu", .quantize = quantize});
  const int max_c = *std::max_element(concurrency.begin(), concurrency.end());
  const int64_t len = prompt + tokens;
  ServingEngine engine(model, {.max_num_seqs = max_c, .max_model_len = len});
  const double warm = engine.warm_up();
  engine.start();
  std::printf(
      "model %s%s, %d threads, prompt %d, %d new tokens, %d requests per client; "
      "warm-up %.1f s\n\n",
      model_dir.c_str(), quantize.empty() ? "" : (" " + quantize).c_str(),
      ThreadPool::global().num_threads(), prompt, tokens, requests, warm);
  const int64_t vocab = model.config().vocab_size;
  if (shared > 0) {
    const double cold =
        run_clients(engine, 1, 1, prompt, shared, tokens, vocab, picking).ttft_ms[0];
    const double cached =
        run_clients(engine, 1, 1, prompt, shared, tokens, vocab, picking).ttft_ms[0];
    std::printf(
        "shared prefix of %d tokens, one request alone: TTFT %.0f ms cold, %.0f ms cached "
        "(%.3fx)\n\n",
        shared, cold, cached, cached / cold);
  }
  std::printf(
      "| concurrency | output tok/s | vs concurrency %d | TTFT p50 / p90 / p99 ms | TPOT p50 / "
      "p90 / p99 ms |\n|---|---|---|---|---|\n",
      concurrency.front());
  double base = 0;
  for (int c : concurrency) {
    const Run r = run_clients(engine, c, requests, prompt, shared, tokens, vocab, picking);
    const double tps = double(r.tokens) / r.seconds;
    if (base == 0) base = tps;
    std::printf("| %d | %.1f | %.2fx | %.0f / %.0f / %.0f | %.1f / %.1f / %.1f |\n", c, tps,
                tps / base, pct(r.ttft_ms, 0.5), pct(r.ttft_ms, 0.9), pct(r.ttft_ms, 0.99),
                pct(r.tpot_ms, 0.5), pct(r.tpot_ms, 0.9), pct(r.tpot_ms, 0.99));
    std::fflush(stdout);
  }
  const ServingStats s = engine.stats();
  std::printf("\ncompiles after warm-up: %llu; padding %.1f %% of computed positions\n",
              (unsigned long long)s.compiles_since_ready,
              100.0 * double(s.padded_tokens) / double(std::max<uint64_t>(1, s.computed_tokens)));
  std::printf(
      "prefix cache: %.1f %% of %llu prompt tokens looked up were cached; %llu preemptions\n",
      100.0 * double(s.prefix_cache_hits) / double(std::max<uint64_t>(1, s.prefix_cache_queries)),
      (unsigned long long)s.prefix_cache_queries, (unsigned long long)s.preemptions);
  return 0;
}
