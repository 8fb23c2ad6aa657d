// Tensor-parallel decode on the Qwen3-0.6B shape (random bf16 weights, tied embeddings): tokens/s
// for tp=1 and tp=2 on the same cores, and the checkpoint bytes each rank reads.
//
//   build/release/bench/bench_tp [--threads 1,4] [--decode 32] [--dir /tmp/...-qwen3-0.6b]
//                                [--quantize int8|int4]
//
// --quantize: every process quantizes its linears at load (under tp, each rank its own slice).
//
// The driver writes the model once, then runs itself: as one process with 1 and 2 threads, and
// under mpirun as 2 ranks of 1 thread each. Each rank reports the bytes of checkpoint data it
// read (its slices) and the resident size of its mapping of the checkpoint (4 KiB pages, so a
// column slice of rows no longer than a page or two costs whole pages).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "bench_help.h"
#include "distributed/process_group.h"
#include "io/safetensors.h"
#include "models/model_runner.h"
#include "tformers/distributed.h"
#include "tformers/model.h"

namespace {

using namespace tformers;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Qwen3-0.6B's config with random bf16 weights (uniform, small), written once.
void write_model(const std::string& dir) {
  if (std::filesystem::exists(dir + "/model.safetensors")) return;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({
  "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
  "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
  "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
  "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "hidden_act": "silu"})";
  std::vector<std::pair<std::string, Tensor>> tensors;
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto make = [&](const std::string& name, Shape shape, float amplitude) {
    Tensor t = Tensor::zeros(shape, DType::bf16);
    auto* p = t.data<uint16_t>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;  // LCG
      float u = float(state >> 40) * 0x1p-24f - 0.5f;
      p[i] = f32_to_bf16(amplitude * u);
    }
    tensors.push_back({name, t});
  };
  make("model.embed_tokens.weight", {151936, 1024}, 0.1f);
  for (int l = 0; l < 28; ++l) {
    const std::string n = "model.layers." + std::to_string(l) + ".";
    make(n + "input_layernorm.weight", {1024}, 1.0f);
    make(n + "post_attention_layernorm.weight", {1024}, 1.0f);
    make(n + "self_attn.q_proj.weight", {2048, 1024}, 0.05f);
    make(n + "self_attn.k_proj.weight", {1024, 1024}, 0.05f);
    make(n + "self_attn.v_proj.weight", {1024, 1024}, 0.05f);
    make(n + "self_attn.o_proj.weight", {1024, 2048}, 0.05f);
    make(n + "self_attn.q_norm.weight", {128}, 1.0f);
    make(n + "self_attn.k_norm.weight", {128}, 1.0f);
    make(n + "mlp.gate_proj.weight", {3072, 1024}, 0.05f);
    make(n + "mlp.up_proj.weight", {3072, 1024}, 0.05f);
    make(n + "mlp.down_proj.weight", {1024, 3072}, 0.05f);
  }
  make("model.norm.weight", {1024}, 1.0f);
  io::save_safetensors(dir + "/model.safetensors", tensors);
}

// Resident bytes of this process's mappings of files whose path ends with `file`. smaps has a
// header line per mapping ("start-end perms offset dev inode path") then "Key: value" lines.
uint64_t mapped_rss(const std::string& file) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in = false;
  uint64_t kb = 0;
  while (std::getline(smaps, line)) {
    const std::string first = line.substr(0, line.find(' '));
    if (first.find('-') != std::string::npos && first.find(':') == std::string::npos) {
      in = line.size() >= file.size() &&
           line.compare(line.size() - file.size(), file.size(), file) == 0;
    } else if (in && first == "Rss:") {
      kb += std::stoull(line.substr(4));
    }
  }
  return kb * 1024;
}

int worker(const std::string& dir, int decode_steps, bool tp, const std::string& quantize) {
  LoadOptions opt{.dtype = bfloat16, .device_map = "cpu", .quantize = quantize};
  if (tp) opt.distributed_config = DistributedConfig{};
  auto t = Clock::now();
  CausalLM lm = AutoModelForCausalLM::from_pretrained(dir, opt);
  const double load_s = seconds_since(t);
  const int prompt = 16;
  lm.reset_cache(1, 256);
  ForwardArgs p;
  std::vector<int32_t> ids(prompt);
  for (int i = 0; i < prompt; ++i) ids[size_t(i)] = 100 + 37 * i;
  p.input_ids = Tensor::from_vector<int32_t>({1, prompt}, DType::i32, ids);
  lm.forward(p);
  ForwardArgs s;
  s.input_ids = Tensor::from_vector<int32_t>({1, 1}, DType::i32, {42});
  s.cache_position = prompt;
  lm.forward(s);  // compiles the decode step outside the timed loop
  t = Clock::now();
  for (int i = 0; i < decode_steps; ++i) {
    s.cache_position = prompt + 1 + i;
    lm.forward(s);
  }
  const double tok_s = decode_steps / seconds_since(t);
  uint64_t read = 0, full = 0;
  if (auto bytes = models::ModelRunner(lm).tp_checkpoint_bytes()) {
    std::tie(read, full) = *bytes;
  } else {
    full = read = io::Checkpoint::open(dir).total_bytes();
  }
  const int rank = distributed::world_rank(), size = distributed::world_size();
  const char* threads = std::getenv("TFORMERS_NUM_THREADS");
  std::printf("| %d | %d | %s | %.2f | %.2f | %.3f | %.3f | %.2f | %.3f |\n", tp ? size : 1, rank,
              threads ? threads : "?", tok_s, load_s, read / 1e9, full / 1e9,
              double(read) / double(full), mapped_rss("model.safetensors") / 1e9);
  std::fflush(stdout);
  if (tp && size > 1) {
    // The collective a decode step makes 2 per layer: all_reduce of one hidden vector.
    // The model is split over every rank of the job: its group spans the world.
    distributed::ProcessGroup& g = *distributed::world();
    std::vector<float> x(size_t(lm.config().hidden_size), 1.0f), y(x.size());
    for (int i = 0; i < 100; ++i) g.all_reduce_sum(x.data(), y.data(), int64_t(x.size()));
    t = Clock::now();
    const int n = 2000;
    for (int i = 0; i < n; ++i) g.all_reduce_sum(x.data(), y.data(), int64_t(x.size()));
    const double us = seconds_since(t) / n * 1e6;
    if (rank == 0)
      std::printf("\nall_reduce of %lld floats: %.1f us; a decode step makes %lld collectives\n",
                  (long long)x.size(), us, (long long)(2 * lm.config().num_hidden_layers + 2));
  }
  return 0;
}

}  // namespace

const char* const kUsage =
    R"(usage: bench_tp [--threads 1,4] [--decode 32] [--dir /tmp/tformers-bench-qwen3-0.6b]
                [--quantize int8|int4]
Tensor-parallel decode on the Qwen3-0.6B shape: tokens/s for tp=1 and tp=2 (under mpirun) on
the same cores, and the checkpoint bytes each rank reads.
)";

int main(int argc, char** argv) {
  if (tformers::bench::answered_help(argc, argv, kUsage)) return 0;
  std::string dir = "/tmp/tformers-bench-qwen3-0.6b";
  int decode_steps = 32;
  bool as_worker = false, tp = false;
  std::string quantize;
  std::vector<int> threads = {1};
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--worker")
      as_worker = true;
    else if (k == "--tp")
      tp = true;
    else if (k == "--dir" && i + 1 < argc)
      dir = argv[++i];
    else if (k == "--decode" && i + 1 < argc)
      decode_steps = std::atoi(argv[++i]);
    else if (k == "--quantize" && i + 1 < argc)
      quantize = argv[++i];
    else if (k == "--threads" && i + 1 < argc) {
      threads.clear();
      std::stringstream list(argv[++i]);
      for (std::string n; std::getline(list, n, ',');)
        threads.push_back(std::max(1, std::atoi(n.c_str())));
    }
  }
  if (as_worker) return worker(dir, decode_steps, tp, quantize);

  auto t = Clock::now();
  write_model(dir);
  std::printf("model ready in %.1f s (%s)\n", seconds_since(t), dir.c_str());
  if (std::ifstream load("/proc/loadavg"); load) {
    std::string avg;
    std::getline(load, avg);
    std::printf("load average at start (other work on these cores): %s\n", avg.c_str());
  }
  std::printf("\n");
  std::printf(
      "| tp | rank | threads/rank | decode tok/s | load s | GB read | GB of those tensors | "
      "read fraction | mapping RSS GB |\n|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string args = " --worker --dir " + dir + " --decode " + std::to_string(decode_steps);
  if (!quantize.empty()) args += " --quantize " + quantize;
  // Ranks yield while waiting in a collective: on a machine whose cores are shared with other
  // work, a spinning rank would hold the core its peer needs to reach the same collective.
  std::string mpirun = "mpirun -np 2 --bind-to none --mca mpi_yield_when_idle 1";
  if (geteuid() == 0) mpirun += " --allow-run-as-root";
  int rc = 0;
  // For each per-rank thread count n: one process with n and with 2n threads, then two ranks of
  // n threads (the same cores as the 2n-thread process).
  for (int n : threads) {
    const std::string one = "TFORMERS_NUM_THREADS=" + std::to_string(n) + " ";
    const std::string two = "TFORMERS_NUM_THREADS=" + std::to_string(2 * n) + " ";
    rc |= std::system((one + self + args).c_str());
    rc |= std::system((two + self + args).c_str());
    rc |= std::system(
        (mpirun + " -x TFORMERS_NUM_THREADS=" + std::to_string(n) + " " + self + args + " --tp")
            .c_str());
  }
  return rc ? 1 : 0;
}
