// `tformers bench`, in the spirit of llama-bench: every test at every thread count, a warm-up
// run (compiles the step and touches its memory) and then --repetitions timed runs, reported as
// the mean and sample standard deviation of their tokens/s.
//
// Token generation is judged against the memory roofline: decoding one token reads every weight
// it multiplies once (models::ModelRunner::decode_weight_spans), so it can go no faster than the
// memory streams those bytes. The roofline is the streaming-read bandwidth of the device's memory
// (Backend::read_bandwidth_gbs: on the CPU, anonymous memory read with the same number of
// threads, core/stream_read.h; on a PJRT device, a reduction over a buffer in device memory),
// measured just before the generation tests of that thread count, divided by those bytes. On a
// PJRT device the thread count is the host's, which only feeds the device. Attention's K and V
// reads are left out: after a short prompt they are a small fraction of the weights. A
// linear-attention layer's recurrent state (Qwen3.5, Qwen3-Next) is read and written whole every
// token whatever the length, so its bytes count twice. A model small enough to stay in the caches
// can run above its roofline (ratio > 1).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/cpu_features.h"
#include "core/progress.h"
#include "core/stream_read.h"
#include "core/thread_pool.h"
#include "eval.h"
#include "interrupt.h"
#include "models/model_runner.h"
#include "tformers/error.h"

namespace tformers::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// n token ids; what they are does not change the cost of a step.
Tensor ids_tensor(int64_t n, int64_t vocab) {
  std::vector<int32_t> ids(size_t(n), 0);
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t((i * 7919 + 1) % vocab);
  return Tensor::from_vector<int32_t>({1, n}, DType::i32, ids);
}

// Seconds of one forward pass over a prompt of `tokens` on a fresh cache.
double prompt_seconds(CausalLM& lm, int64_t tokens) {
  lm.reset_cache(1, tokens);
  ForwardArgs a;
  a.input_ids = ids_tensor(tokens, lm.config().vocab_size);
  const auto t = Clock::now();
  lm.forward(a);
  return seconds_since(t);
}

// Seconds of `steps` single-token forward passes after an untimed prompt of kBenchGenPrompt tokens.
double generation_seconds(CausalLM& lm, int64_t steps) {
  lm.reset_cache(1, kBenchGenPrompt + steps);
  ForwardArgs a;
  a.input_ids = ids_tensor(kBenchGenPrompt, lm.config().vocab_size);
  lm.forward(a);
  a.input_ids = ids_tensor(1, lm.config().vocab_size);
  const auto t = Clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    a.cache_position = kBenchGenPrompt + i;
    lm.forward(a);
  }
  return seconds_since(t);
}

struct Row {
  int64_t threads = 0, prompt = 0, gen = 0;
  std::vector<double> samples;  // tokens/s, one per repetition
  double mean = 0, stddev = 0;
  double read_gbs = 0, roofline = 0;  // generation only
  std::string test() const {
    return prompt > 0 ? "pp" + std::to_string(prompt) : "tg" + std::to_string(gen);
  }
};

void summarize(Row& r) {
  for (double s : r.samples) r.mean += s / double(r.samples.size());
  double sq = 0;
  for (double s : r.samples) sq += (s - r.mean) * (s - r.mean);
  r.stddev = r.samples.size() > 1 ? std::sqrt(sq / double(r.samples.size() - 1)) : 0.0;
}

// The model's name for the table: the last part of its folder or Hub id.
std::string model_name(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return std::filesystem::path(path).filename().string();
}

// The tests must fit the model's positions, which are known once config.json is read.
void check_positions(const BenchArgs& a, int64_t positions) {
  for (int64_t p : a.prompt)
    if (p > positions)
      throw InvalidArgumentError("bench: -p/--n-prompt " + std::to_string(p) +
                                 " is more than the model's " + std::to_string(positions) +
                                 " positions (max_position_embeddings); give at most " +
                                 std::to_string(positions));
  for (int64_t n : a.gen)
    if (n > 0 && n > positions - kBenchGenPrompt)  // not kBenchGenPrompt + n: it may overflow
      throw InvalidArgumentError(
          "bench: -n/--n-gen " + std::to_string(n) + " after the " +
          std::to_string(kBenchGenPrompt) + "-token prompt is more than the model's " +
          std::to_string(positions) + " positions (max_position_embeddings); give at most " +
          std::to_string(positions - kBenchGenPrompt));
}

std::string mean_pm(const Row& r) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f ± %.2f", r.mean, r.stddev);
  return buf;
}

}  // namespace

int run_bench(const BenchArgs& a) {
  check_bench_args(a);
  // From the start, so that a Ctrl-C during the load stops before the first run.
  const StopOnCtrlC stop;
  CausalLM lm = load_with_progress(a.model, a.device);
  check_positions(a, lm.config().max_position_embeddings);
  const models::ModelRunner runner(lm);
  int64_t weight_bytes = 0;
  for (const auto& span : runner.decode_weight_spans()) weight_bytes += span.bytes;
  weight_bytes += 2 * runner.recurrent_bytes_per_sequence();
  const std::vector<int64_t> threads =
      a.threads.empty() ? std::vector<int64_t>{ThreadPool::global().num_threads()} : a.threads;
  const std::string name = model_name(a.model.model), dtype(dtype_name(lm.dtype())),
                    quantize = a.model.quantize.empty() ? "-" : a.model.quantize;
  const bool md = a.output == "md";
  if (md) {
    std::printf(
        "| model | dtype | quantize | MB/token | load | threads | test | tok/s | read GB/s | "
        "roofline tok/s | of roofline |\n");
    std::printf("|---|---|---|--:|---|--:|---|--:|--:|--:|--:|\n");
    std::fflush(stdout);
  }
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  auto report = [&](const Row& r) {
    const bool tg = r.gen > 0;
    if (md) {
      // Prompt processing leaves the three roofline cells empty.
      char roof[96] = "| |";
      if (tg)
        std::snprintf(roof, sizeof roof, "%.1f | %.1f | %.2f", r.read_gbs, r.roofline,
                      r.mean / r.roofline);
      std::printf("| %s | %s | %s | %.1f | %s | %lld | %s | %s | %s |\n", name.c_str(),
                  dtype.c_str(), quantize.c_str(), double(weight_bytes) / 1e6,
                  a.model.load_mode.c_str(), (long long)r.threads, r.test().c_str(),
                  mean_pm(r).c_str(), roof);
      std::fflush(stdout);
      return;
    }
    nlohmann::ordered_json j = {{"model", name},
                                {"path", a.model.model},
                                {"architecture", lm.config().architecture},
                                {"dtype", dtype},
                                {"quantize", a.model.quantize},
                                {"load_mode", a.model.load_mode},
                                {"device", lm.device()},
                                {"cpu_target", std::string(cpu::target_name(cpu::active_target()))},
                                {"tformers_version", TFORMERS_VERSION},
                                {"weight_bytes_per_token", weight_bytes},
                                {"threads", r.threads},
                                {"test", r.test()},
                                {"n_prompt", r.prompt},
                                {"n_gen", r.gen},
                                {"repetitions", r.samples.size()},
                                {"samples_tok_s", r.samples},
                                {"avg_tok_s", r.mean},
                                {"stddev_tok_s", r.stddev}};
    j["read_gbs"] = tg ? nlohmann::json(r.read_gbs) : nlohmann::json();
    j["roofline_tok_s"] = tg ? nlohmann::json(r.roofline) : nlohmann::json();
    j["roofline_ratio"] = tg ? nlohmann::json(r.mean / r.roofline) : nlohmann::json();
    results.push_back(j);
  };
  // Progress by timed runs (a warm-up and the repetitions per row); Ctrl-C stops between runs,
  // and the rows measured so far are reported.
  int64_t rows = 0;
  for (int64_t p : a.prompt) rows += p != 0;
  for (int64_t g : a.gen) rows += g != 0;
  const int64_t runs = int64_t(threads.size()) * rows * (1 + a.repetitions);
  int64_t run = 0;
  ProgressBar bar(stderr, isatty(fileno(stderr)), 0.5, "runs");
  auto timed = [&](const char* test, const auto& seconds) {
    stop.throw_if_requested();
    bar.update(test, run, runs);
    const double s = seconds();
    bar.update(test, ++run, runs);
    return s;
  };
  try {
    for (int64_t n : threads) {
      ThreadPool::set_global_threads(int(n));
      for (int64_t p : a.prompt) {
        if (p == 0) continue;
        Row r{.threads = n, .prompt = p};
        timed("bench pp", [&] { return prompt_seconds(lm, p); });
        for (int64_t i = 0; i < a.repetitions; ++i)
          r.samples.push_back(double(p) / timed("bench pp", [&] { return prompt_seconds(lm, p); }));
        summarize(r);
        bar.finish();
        report(r);
      }
      double read_gbs = 0;
      for (int64_t g : a.gen) {
        if (g == 0) continue;
        if (read_gbs == 0) read_gbs = runner.read_bandwidth_gbs(kReadBandwidthBytes);
        Row r{.threads = n, .gen = g, .read_gbs = read_gbs};
        r.roofline = read_gbs * 1e9 / double(weight_bytes);
        timed("bench tg", [&] { return generation_seconds(lm, g); });
        for (int64_t i = 0; i < a.repetitions; ++i)
          r.samples.push_back(double(g) /
                              timed("bench tg", [&] { return generation_seconds(lm, g); }));
        summarize(r);
        bar.finish();
        report(r);
      }
    }
  } catch (const StopOnCtrlC::Stopped&) {
    bar.finish();
    if (!md) std::printf("%s\n", results.dump(2).c_str());
    std::fprintf(stderr, "tformers: bench: stopped (Ctrl-C) after %lld of %lld runs\n",
                 (long long)run, (long long)runs);
    return StopOnCtrlC::kExitCode;
  }
  if (md) {
    // XLA's CPU plugin keeps its buffers in host memory (Backend::read_bandwidth_gbs).
    const bool host = lm.device() == "cpu" || lm.device() == "xla-cpu";
    const std::string memory =
        host ? "anonymous memory with that many threads" : lm.device() + " memory, summed there";
    std::printf(
        "\ntformers %s, device %s, CPU target %s; read GB/s: streaming reads of %zu MiB of %s; "
        "roofline tok/s = read GB/s / MB/token\n",
        TFORMERS_VERSION, lm.device().c_str(),
        std::string(cpu::target_name(cpu::active_target())).c_str(), kReadBandwidthBytes >> 20,
        memory.c_str());
  } else {
    std::printf("%s\n", results.dump(2).c_str());
  }
  return 0;
}

}  // namespace tformers::cli
