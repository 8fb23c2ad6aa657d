// Host overhead of decoding on a PJRT device: the share of each greedy decode step of generate()
// spent outside PJRT's Execute (uploading ids and positions, binding buffers, reading logits
// back, argmax and the loop), measured per step from the time between generate()'s step
// callbacks and the backend's execution clock.
//   build/release/bench/bench_host_overhead [--device xla-cpu]
//       [--shape qwen3-0.6b|llama-3.2-1b|llama-3.1-8b] [--dtype float32|bfloat16] [--new-tokens 32]
//       [--rounds 3] [--dir /tmp]
// Writes the shape's random bf16 checkpoint under --dir once (bench/model_shapes.h), warms up
// with one generate() (every compile), then runs --rounds generate() calls of --new-tokens
// tokens after an 8-token prompt and prints the median step, its median time in Execute and the
// overhead (step - execute) / step, per round and over all steps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_help.h"
#include "model_shapes.h"
#include "models/model_runner.h"
#include "tformers/generation.h"
#include "tformers/model.h"

namespace {

using namespace tformers;

const char* kUsage =
    "usage: bench_host_overhead [--device xla-cpu] [--shape qwen3-0.6b|llama-3.2-1b|llama-3.1-8b]\n"
    "         [--dtype float32|bfloat16] [--new-tokens N] [--rounds R] [--dir DIR]\n"
    "  The share of each decode step of generate() on a PJRT device spent outside Execute.\n";

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Steps {
  std::vector<double> wall, execute;  // seconds, per decode step
};

// One greedy generate() of `n` tokens; each decode step's wall time and time in Execute. The
// first callback follows the prefill, so the intervals after it are the decode steps.
Steps one_round(CausalLM& model, const models::ModelRunner& runner,
                const std::vector<int32_t>& prompt, int64_t n) {
  using clock = std::chrono::steady_clock;
  Steps s;
  clock::time_point last;
  uint64_t last_ns = 0;
  bool first = true;
  const GenerationConfig config{.max_new_tokens = n, .min_new_tokens = n, .do_sample = false};
  generate(model, {prompt}, config, {}, nullptr, [&] {
    const clock::time_point now = clock::now();
    const uint64_t ns = runner.transfer_stats().execute_ns;
    if (!first) {
      s.wall.push_back(std::chrono::duration<double>(now - last).count());
      s.execute.push_back(double(ns - last_ns) * 1e-9);
    }
    first = false;
    last = now;
    last_ns = ns;
    return true;
  });
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (bench::answered_help(argc, argv, kUsage)) return 0;
  std::string device = "xla-cpu", shape = bench::kQwen3.name, dtype = "float32", dir = "/tmp";
  int64_t new_tokens = 32, rounds = 3;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n%s", k.c_str(), kUsage);
      return 2;
    }
    const std::string v = argv[i + 1];
    if (k == "--device") {
      device = v;
    } else if (k == "--shape") {
      shape = v;
    } else if (k == "--dtype") {
      dtype = v;
    } else if (k == "--new-tokens") {
      new_tokens = std::stoll(v);
    } else if (k == "--rounds") {
      rounds = std::stoll(v);
    } else if (k == "--dir") {
      dir = v;
    } else {
      std::fprintf(stderr, "unknown flag %s\n%s", k.c_str(), kUsage);
      return 2;
    }
  }
  const bench::ModelShape* m = bench::find_shape(shape);
  if (!m || new_tokens < 2 || rounds < 1) {
    std::fprintf(
        stderr, "--shape must be %s, %s or %s, --new-tokens at least 2, --rounds at least 1\n",
        bench::kQwen3.name.c_str(), bench::kLlama.name.c_str(), bench::kLlama8B.name.c_str());
    return 2;
  }
  try {
    const std::string model_dir = dir + "/tformers-bench-" + m->name;
    bench::make_model(*m, model_dir);
    CausalLM model = AutoModelForCausalLM::from_pretrained(
        model_dir, {.dtype = parse_dtype(dtype), .device_map = device});
    const models::ModelRunner runner(model);
    const std::vector<int32_t> prompt = {1, 17, 300, 45, 9, 401, 23, 150};
    const auto warm = std::chrono::steady_clock::now();
    one_round(model, runner, prompt, new_tokens);
    std::printf("%s %s on %s: warm-up (compiles) %.1f s; %lld decode steps per round\n\n",
                m->name.c_str(), dtype.c_str(), model.device().c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - warm).count(),
                static_cast<long long>(new_tokens - 1));
    if (runner.transfer_stats().executions == 0) {
      std::fprintf(stderr, "device %s counts no executions: use a PJRT device\n", device.c_str());
      return 2;
    }
    std::printf(
        "| round | step median ms | Execute median ms | host median ms | host overhead |\n"
        "|--:|--:|--:|--:|--:|\n");
    Steps all;
    for (int64_t r = 0; r < rounds; ++r) {
      const uint64_t compiles = runner.compiles();
      const Steps s = one_round(model, runner, prompt, new_tokens);
      if (runner.compiles() != compiles) {
        std::fprintf(stderr, "round %lld compiled: the steps are not warm\n",
                     static_cast<long long>(r));
        return 1;
      }
      std::vector<double> host, overhead;
      for (size_t k = 0; k < s.wall.size(); ++k) {
        host.push_back(s.wall[k] - s.execute[k]);
        overhead.push_back(host.back() / s.wall[k]);
      }
      std::printf("| %lld | %.3f | %.3f | %.3f | %.2f %% |\n", static_cast<long long>(r + 1),
                  1e3 * median(s.wall), 1e3 * median(s.execute), 1e3 * median(host),
                  100 * median(overhead));
      all.wall.insert(all.wall.end(), s.wall.begin(), s.wall.end());
      all.execute.insert(all.execute.end(), s.execute.begin(), s.execute.end());
    }
    double wall = 0, execute = 0;
    for (size_t k = 0; k < all.wall.size(); ++k) wall += all.wall[k], execute += all.execute[k];
    std::printf("\nall %zu steps: %.3f ms per step, %.3f ms in Execute; host overhead %.2f %%\n",
                all.wall.size(), 1e3 * wall / double(all.wall.size()),
                1e3 * execute / double(all.wall.size()), 100 * (wall - execute) / wall);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_host_overhead: %s\n", e.what());
    return 1;
  }
  return 0;
}
