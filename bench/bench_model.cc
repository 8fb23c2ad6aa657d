// Decode, prefill and time to first token of two model shapes with random bf16 weights (Qwen3-0.6B
// and Llama-3.2-1B, tied embeddings), as stored (bf16) and quantized at load (int8, int4), beside
// the hardware measured in the same run:
// - decode against the memory roofline: (weight bytes + KV bytes read per token) / streaming-read
//   bandwidth with the same number of threads (the multi-stream loop of core/stream_read.h), two
//   ways: that loop over the very bytes decode streams (the bf16 weights where the load put them,
//   the quantized copies for int8 and int4), alternated with the decode steps in the child
//   (medians); and over a fresh 1 GiB anonymous buffer in the parent just before. The first judges
//   decode on its own pages at its own moment; the second drifts with this shared machine's load;
// - prefill against the matmul peak: register-only FMA (or, on AVX-512 BF16 machines, vdpbf16ps)
//   throughput with the same number of threads;
// - peak RSS (getrusage) against weights + KV cache + the planned activation arenas of every
//   compiled step. Each model and weight type runs in its own child process so that each RSS
//   is its own.
// And decode at a used length of 256 with max_cache_len 512 against 32768 (64 pairs of steps,
// taken in turn by two models on the same weights).
//
//   build/release/bench/bench_model [--threads 1,2] [--decode 16] [--ttft 128] [--prefill 512]
//                                   [--context 16] [--models qwen3,llama] [--dir /tmp]
//                                   [--weights bf16,int8,int4]
//
// --context N decodes at used lengths from N on (the cache's contents do not change the cost, so
// the cache is not filled first); the roofline then counts the K and V bytes read.
//
// Prefill (--prefill tokens, 0 = skip) runs with bf16 weights at the largest thread count only:
// it is the slowest part (about a TFLOP for the Llama shape).
// GCC 12's AVX-512 headers (peak.h) build "undefined" vectors by self-initialization, which -Wall
// reports at every inlined call although the value is never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bench_help.h"
#include "core/cpu_features.h"
#include "core/stream_read.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "model_shapes.h"
#include "models/model_runner.h"
#include "peak.h"
#include "tformers/model.h"

namespace {

using namespace tformers;
using namespace tformers::bench;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Streaming-read bandwidth in GB/s over the bytes one decode step streams
// (CausalLM::Impl::decode_weight_spans: the mmap'd checkpoint pages or their copies for bf16, the
// quantized copies for int8 and int4), buffer by buffer as decode reads them, with the loop of
// read_bandwidth.
double spans_bandwidth(const std::vector<CausalLM::Impl::WeightSpan>& spans, ThreadPool& pool) {
  std::vector<uint64_t> sums(size_t(pool.num_threads()) * 8, 0);
  double bytes = 0;
  auto t = Clock::now();
  for (const auto& [data, span_bytes] : spans) {
    const uint64_t* p = static_cast<const uint64_t*>(data);
    pool.parallel_for(
        span_bytes / 8,
        [&](int64_t b, int64_t e, int th) { sums[size_t(th) * 8] += stream_sum(p, b, e); }, 4096);
    bytes += double(span_bytes);
  }
  const double gbs = bytes / seconds_since(t) / 1e9;
  if (sums[0] == 42) std::puts("");  // keeps the loads
  return gbs;
}

// The bf16 matmul peak of the active target in GFLOP/s, every pool thread at once.
double matmul_peak(ThreadPool& pool) {
  return bench::peak_gflops(bench::matmul_peak_loop(cpu::active_target()), pool);
}

struct Machine {
  std::map<int, double> bw, peak;  // by thread count
};

struct Options {
  std::vector<int> threads = {1, 2};
  int decode = 16, ttft = 128, prefill = 512;
  int context = 16;  // the used length decode starts at
};

// The sizes the roofline needs, from config.json.
struct Sizes {
  double vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
      num_key_value_heads, head_dim;
};
Sizes shape_of(const PretrainedConfig& config) {
  const auto& j = config.json;
  const double heads = j.at("num_attention_heads").get<double>();
  return {j.at("vocab_size").get<double>(),
          j.at("hidden_size").get<double>(),
          j.at("intermediate_size").get<double>(),
          j.at("num_hidden_layers").get<double>(),
          heads,
          j.value("num_key_value_heads", heads),
          j.value("head_dim", j.at("hidden_size").get<double>() / heads)};
}

// Linear weights (every matrix multiplied per token, the tied head included).
double linear_params(const Sizes& c) {
  return double(c.vocab_size) * c.hidden_size +
         double(c.num_hidden_layers) *
             (double(c.hidden_size) * c.head_dim *
                  (2 * c.num_attention_heads + 2 * c.num_key_value_heads) +
              3.0 * c.hidden_size * c.intermediate_size);
}

// Bytes of K and V read by one decode token at a used length of `len` (bf16 cache).
double kv_bytes(const Sizes& c, double len) {
  return 2.0 * 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * len;
}

Tensor ids_tensor(int64_t n, int32_t first) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = first + int32_t(i);
  return Tensor::from_vector<int32_t>({1, n}, DType::i32, ids);
}

// Seconds per decode step at cache slots [pos, pos + steps) (the cache content does not change
// the cost: attention reads exactly the used slots).
double decode_seconds(CausalLM& lm, int64_t pos, int steps) {
  ForwardArgs s;
  s.input_ids = ids_tensor(1, 42);
  s.cache_position = pos;
  lm.forward(s);  // compiles outside the timed loop
  auto t = Clock::now();
  for (int i = 0; i < steps; ++i) {
    s.cache_position = pos + 1 + i;
    lm.forward(s);
  }
  return seconds_since(t) / steps;
}

double forward_seconds(CausalLM& lm, int64_t tokens) {
  ForwardArgs p;
  p.input_ids = ids_tensor(tokens, 1000);
  auto t = Clock::now();
  lm.forward(p);
  return seconds_since(t);
}

// One model and weight type; prints its table rows. Runs in a child process.
void run_model(const std::string& dir, const std::string& quantize, const Machine& hw,
               const Options& o) {
  auto t = Clock::now();
  CausalLM lm = AutoModelForCausalLM::from_pretrained(
      dir, {.dtype = bfloat16, .device_map = "cpu", .quantize = quantize});
  const double load_s = seconds_since(t);
  const Sizes c = shape_of(lm.config());
  const models::ModelRunner runner(lm);
  const auto spans = runner.decode_weight_spans();
  double weight_bytes = 0;
  for (const auto& span : spans) weight_bytes += double(span.bytes);
  const int64_t prompt = o.context, cache_len = std::max<int64_t>(512, prompt + o.decode + 8);
  const int max_threads = *std::max_element(o.threads.begin(), o.threads.end());
  std::map<int, double> decode_tps, read_gbs;  // by thread count
  // Every executable compiled stays alive in the compile cache, arena included: all count.
  std::map<const backends::Executable*, double> arenas_seen;
  auto collect = [&] {
    for (const auto& [exe, bytes] : runner.step_arena_bytes()) arenas_seen[exe] = double(bytes);
  };
  for (int n : o.threads) {
    ThreadPool::set_global_threads(n);
    collect();
    lm.reset_cache(1, cache_len);
    ForwardArgs a;
    a.input_ids = ids_tensor(std::min<int64_t>(prompt, 16), 100);
    lm.forward(a);
    // Rounds of one read pass over the decode's own bytes, then o.decode / kRounds steps:
    // medians of each, so the roofline and the decode it judges are measured alike in time.
    constexpr int kRounds = 4;
    const int steps = std::max(1, o.decode / kRounds);
    std::vector<double> decs, bws;
    for (int r = 0; r < kRounds; ++r) {
      bws.push_back(spans_bandwidth(spans, ThreadPool::global()));
      decs.push_back(decode_seconds(lm, prompt + r * (steps + 1), steps));
    }
    const double dec = median(decs), bw_own = median(bws);
    const double kv = kv_bytes(c, prompt + kRounds * (steps + 1) / 2.0);  // mean used length
    const double roof = bw_own * 1e9 / (weight_bytes + kv);
    const double roof_buffer = hw.bw.at(n) * 1e9 / (weight_bytes + kv);
    decode_tps[n] = 1 / dec;
    read_gbs[n] = bw_own;
    // Time to first token: the prompt's forward pass (logits of its last position).
    collect();
    lm.reset_cache(1, cache_len);
    const double ttft = o.ttft > 0 ? forward_seconds(lm, o.ttft) : 0;
    std::string prefill = "-";
    if (o.prefill > 0 && quantize.empty() && n == max_threads) {
      collect();
      lm.reset_cache(1, std::max<int64_t>(cache_len, o.prefill));
      const double s = forward_seconds(lm, o.prefill);
      // Linear FLOPs plus causal attention (QK^T and PV over T^2 / 2 pairs per head). The output
      // layer runs on the last position only (ForwardArgs::logits_to_keep = 1, as generate()).
      const double lm_head = double(c.vocab_size) * c.hidden_size;
      const double flops = 2.0 * (linear_params(c) - lm_head) * o.prefill + 2.0 * lm_head +
                           2.0 * 2 * c.num_hidden_layers * c.num_attention_heads * c.head_dim *
                               o.prefill * o.prefill / 2;
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.1f (%.0f%% of %.0f GFLOP/s)", o.prefill / s,
                    100.0 * flops / s / 1e9 / hw.peak.at(n), hw.peak.at(n));
      prefill = buf;
    }
    std::printf("| %s | %s | %d | %.1f / %.1f | %.2f | %.2f | %.2f | %.2f | %.0f | %s |\n",
                std::filesystem::path(dir).filename().c_str(),
                quantize.empty() ? "bf16" : quantize.c_str(), n, hw.bw.at(n), bw_own, 1 / dec, roof,
                (1 / dec) / roof, (1 / dec) / roof_buffer, ttft * 1e3, prefill.c_str());
    std::fflush(stdout);
  }
  // Memory: what the model holds against what the process peaked at. The KV cache is the one
  // alive now (the largest of the run when --prefill exceeds 512).
  const double weights = double(runner.weight_bytes()), cache = double(runner.state_bytes());
  double arenas = 0;
  collect();
  for (const auto& [exe, bytes] : arenas_seen) arenas += bytes;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double rss = double(ru.ru_maxrss) * 1024;
  std::string ratio;
  if (o.threads.size() >= 2 && decode_tps.count(1) && decode_tps.count(2)) {
    char buf[64];
    // Beside the read loop's own scaling over the same bytes: decode cannot scale past it.
    std::snprintf(buf, sizeof buf, "; 2 vs 1 threads: decode %.2fx, weights read %.2fx",
                  decode_tps[2] / decode_tps[1], read_gbs[2] / read_gbs[1]);
    ratio = buf;
  }
  std::printf(
      "|   | load %.3f s; peak RSS %.0f MB vs weights %.0f + KV %.0f + arenas %.0f = %.0f MB "
      "(%.2fx)%s |\n",
      load_s, rss / 1e6, weights / 1e6, cache / 1e6, arenas / 1e6, (weights + cache + arenas) / 1e6,
      rss / (weights + cache + arenas), ratio.c_str());
  std::fflush(stdout);
}

// Decode at a used length of 256 with max_cache_len 512 and 32768: two models on the same
// mmap'd weights, one cache each, take decode steps in turn (which goes first alternates), and
// the ratio is the median over the pairs of steps. Steps a tenth of a second apart see the same
// bandwidth on this shared machine; runs of 16 steps seconds apart did not (the median of 5 such
// pairs' ratios still swung 0.92-1.10x). The used length cycles through 256-271.
void run_long_cache(const std::string& dir, int threads, int pairs) {
  ThreadPool::set_global_threads(threads);
  auto load = [&](int64_t cache_len) {
    CausalLM lm =
        AutoModelForCausalLM::from_pretrained(dir, {.dtype = bfloat16, .device_map = "cpu"});
    lm.reset_cache(1, cache_len);
    return lm;
  };
  CausalLM small_lm = load(512), large_lm = load(32768);
  ForwardArgs s;
  s.input_ids = ids_tensor(1, 42);
  auto step = [&](CausalLM& lm, int64_t pos) {
    s.cache_position = pos;
    auto t = Clock::now();
    lm.forward(s);
    return seconds_since(t);
  };
  step(small_lm, 255);  // compiles outside the timed steps
  step(large_lm, 255);
  std::vector<double> small, large, ratios;
  for (int i = 0; i < pairs; ++i) {
    const int64_t pos = 256 + i % 16;
    double ts, tl;
    if (i % 2) {
      tl = step(large_lm, pos);
      ts = step(small_lm, pos);
    } else {
      ts = step(small_lm, pos);
      tl = step(large_lm, pos);
    }
    small.push_back(ts);
    large.push_back(tl);
    ratios.push_back(ts / tl);
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf(
      "%s, %d threads, used length 256: decode %.2f tok/s with max_cache_len 512, %.2f with "
      "32768 (medians); 32768 / 512 over %d pairs of steps: median %.3fx (middle half "
      "%.3f-%.3f)\n",
      std::filesystem::path(dir).filename().c_str(), threads, 1 / median(small), 1 / median(large),
      pairs, median(ratios), ratios[ratios.size() / 4], ratios[ratios.size() * 3 / 4]);
  std::fflush(stdout);
}

// Runs fn in a child process (own RSS, own thread pool) and waits for it.
template <class Fn>
void in_child(Fn fn) {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      _exit(1);
    }
    std::exit(0);  // runs atexit handlers: TFORMERS_PROFILE=1 prints each child's op times
  }
  int status = 0;
  waitpid(pid, &status, 0);
}

std::vector<std::string> split(const std::string& v) {
  std::vector<std::string> out;
  for (size_t p = 0; p <= v.size();) {
    size_t e = v.find(',', p);
    if (e == std::string::npos) e = v.size();
    out.push_back(v.substr(p, e - p));
    p = e + 1;
  }
  return out;
}

}  // namespace

const char* const kUsage =
    R"(usage: bench_model [--threads 1,2] [--decode 16] [--ttft 128] [--prefill 512] [--context 16]
                   [--models qwen3,llama] [--dir /tmp] [--weights bf16,int8,int4]
Decode, prefill and time to first token of Qwen3-0.6B- and Llama-3.2-1B-shaped models with
random weights, against the memory roofline and the matmul peak measured in the same run.
)";

int main(int argc, char** argv) {
  if (tformers::bench::answered_help(argc, argv, kUsage)) return 0;
  Options o;
  std::vector<std::string> models = {"qwen3", "llama"}, weights = {"bf16", "int8", "int4"};
  std::string dir = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--threads") {
      o.threads.clear();
      for (const auto& s : split(v)) o.threads.push_back(std::stoi(s));
    } else if (k == "--decode") {
      o.decode = std::stoi(v);
    } else if (k == "--context") {
      o.context = std::stoi(v);
    } else if (k == "--ttft") {
      o.ttft = std::stoi(v);
    } else if (k == "--prefill") {
      o.prefill = std::stoi(v);
    } else if (k == "--models") {
      models = split(v);
    } else if (k == "--weights") {
      weights = split(v);
    } else if (k == "--dir") {
      dir = v;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  auto t = Clock::now();
  // Hardware in this process, with pools that are gone before any child forks.
  Machine hw;
  auto measure = [&](bool peak) {
    for (int n : o.threads) {
      ThreadPool pool(n);
      hw.bw[n] = read_bandwidth(pool);
      if (peak) hw.peak[n] = matmul_peak(pool);
    }
  };
  measure(true);
  std::printf("target %s; ", std::string(cpu::target_name(cpu::active_target())).c_str());
  for (int n : o.threads)
    std::printf("%d threads: read %.1f GB/s, matmul peak %.1f GFLOP/s; ", n, hw.bw[n], hw.peak[n]);
  std::printf("\n");
  std::vector<std::string> dirs;
  for (const auto& m : models) {
    const ModelShape& shape = m == "llama" ? kLlama : kQwen3;
    dirs.push_back(dir + "/tformers-bench-" + shape.name);
    make_model(shape, dirs.back());
  }
  std::printf("model files ready in %.1f s\n\n", seconds_since(t));
  std::printf(
      "| model | weights | threads | read GB/s: 1 GiB buffer / weights | decode tok/s | roofline "
      "tok/s (weights) | decode/roofline (weights) | decode/roofline (1 GiB buffer) | TTFT %d ms "
      "| prefill %d tok/s (of matmul peak) |\n",
      o.ttft, o.prefill);
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& d : dirs)
    for (const std::string& w : weights) {
      measure(true);  // bandwidth and peak again, right before the run they judge
      in_child([&] { run_model(d, w == "bf16" ? "" : w, hw, o); });
    }
  std::printf("\n");
  const int max_threads = *std::max_element(o.threads.begin(), o.threads.end());
  in_child([&] { run_long_cache(dirs.back(), max_threads, 64); });
  std::printf("total %.0f s\n", seconds_since(t));
  return 0;
}
