// Decode and prefill speed of a Qwen3-0.6B-shaped model with random bf16 weights, beside the
// streaming-read bandwidth measured in the same run. Decode is reported as a fraction of the
// memory roofline: (weight bytes + KV bytes read per token) / bandwidth.
//
//   build/release/bench/bench_model [--threads 1,2] [--decode 32] [--prefill 128] [--dir /tmp/x]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "tformers/model.h"

namespace {

using namespace tformers;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Writes config.json and random bf16 weights with Qwen3-0.6B's shapes (tied embeddings).
void make_model(const std::string& dir) {
  if (std::filesystem::exists(dir + "/model.safetensors")) return;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({
  "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
  "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
  "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
  "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "hidden_act": "silu"})";
  std::vector<std::pair<std::string, Tensor>> ts;
  std::mt19937 rng(7);
  auto add = [&](const std::string& name, Shape shape, float scale) {
    Tensor t = Tensor::zeros(shape, DType::bf16);
    uint16_t* p = t.data<uint16_t>();
    uint32_t s = rng();
    for (int64_t i = 0; i < t.numel(); ++i) {
      s ^= s << 13, s ^= s >> 17, s ^= s << 5;  // xorshift: fast enough for 600M values
      p[i] = f32_to_bf16(scale * (float(s >> 8) * 0x1p-24f - 0.5f));
    }
    ts.push_back({name, t});
  };
  add("model.embed_tokens.weight", {151936, 1024}, 0.1f);
  for (int l = 0; l < 28; ++l) {
    std::string n = "model.layers." + std::to_string(l) + ".";
    add(n + "input_layernorm.weight", {1024}, 1.0f);
    add(n + "post_attention_layernorm.weight", {1024}, 1.0f);
    add(n + "self_attn.q_proj.weight", {2048, 1024}, 0.05f);
    add(n + "self_attn.k_proj.weight", {1024, 1024}, 0.05f);
    add(n + "self_attn.v_proj.weight", {1024, 1024}, 0.05f);
    add(n + "self_attn.o_proj.weight", {1024, 2048}, 0.05f);
    add(n + "self_attn.q_norm.weight", {128}, 1.0f);
    add(n + "self_attn.k_norm.weight", {128}, 1.0f);
    add(n + "mlp.gate_proj.weight", {3072, 1024}, 0.05f);
    add(n + "mlp.up_proj.weight", {3072, 1024}, 0.05f);
    add(n + "mlp.down_proj.weight", {1024, 3072}, 0.05f);
  }
  add("model.norm.weight", {1024}, 1.0f);
  io::save_safetensors(dir + "/model.safetensors", ts);
}

// Streaming-read bandwidth in GB/s over a 1 GiB buffer: the median of 5 passes.
double read_bandwidth(ThreadPool& pool) {
  static std::vector<uint64_t> buf(size_t(1) << 27, 1);  // 1 GiB
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    std::vector<uint64_t> sums(size_t(pool.num_threads()) * 8, 0);
    auto t = Clock::now();
    pool.parallel_for(
        int64_t(buf.size()),
        [&](int64_t b, int64_t e, int th) {
          uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
          for (int64_t i = b; i + 3 < e; i += 4)
            s0 += buf[i], s1 += buf[i + 1], s2 += buf[i + 2], s3 += buf[i + 3];
          sums[size_t(th) * 8] = s0 + s1 + s2 + s3;
        },
        4096);
    runs.push_back(double(buf.size() * 8) / seconds_since(t) / 1e9);
    if (sums[0] == 42) std::puts("");  // keeps the loads
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  int decode_steps = 32, prefill_len = 128;
  std::string dir = "/tmp/tformers-bench-qwen3-0.6b";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--threads") {
      threads.clear();
      for (size_t p = 0; p < v.size();) {
        threads.push_back(std::stoi(v.substr(p)));
        p = v.find(',', p);
        p = p == std::string::npos ? v.size() : p + 1;
      }
    } else if (k == "--decode") {
      decode_steps = std::stoi(v);
    } else if (k == "--prefill") {
      prefill_len = std::stoi(v);
    } else if (k == "--dir") {
      dir = v;
    }
  }
  auto t = Clock::now();
  make_model(dir);
  std::printf("model files ready in %.1f s (%s)\n", seconds_since(t), dir.c_str());
  t = Clock::now();
  CausalLM lm =
      AutoModelForCausalLM::from_pretrained(dir, {.dtype = bfloat16, .device_map = "cpu"});
  std::printf("load: %.3f s (weights mmap'd)\n", seconds_since(t));

  const ModelConfig& c = lm.config();
  // Bytes read per decode token: every matrix once (the tied embedding as lm_head), norms.
  double weight_bytes =
      2.0 * (c.vocab_size * c.hidden_size +
             c.num_hidden_layers * (c.hidden_size * c.head_dim *
                                        (2 * c.num_attention_heads + 2 * c.num_key_value_heads) +
                                    3 * c.hidden_size * c.intermediate_size));
  const int64_t cache_len = 512, prompt = 16;
  std::printf("weights read per token: %.3f GB\n\n", weight_bytes / 1e9);
  std::printf(
      "| threads | read GB/s | decode tok/s | roofline tok/s | decode/roofline | prefill %d tok/s "
      "|\n",
      prefill_len);
  std::printf("|---|---|---|---|---|---|\n");
  for (int n : threads) {
    ThreadPool::set_global_threads(n);
    double bw = read_bandwidth(ThreadPool::global());
    // Decode: a 16-token prompt, then timed single-token steps.
    lm.reset_cache(1, cache_len);
    ForwardArgs a;
    std::vector<int32_t> ids(prompt);
    for (int i = 0; i < prompt; ++i) ids[i] = 100 + i;
    a.input_ids = Tensor::from_vector<int32_t>({1, prompt}, DType::i32, ids);
    lm.forward(a);
    ForwardArgs s;
    s.input_ids = Tensor::from_vector<int32_t>({1, 1}, DType::i32, {42});
    s.cache_position = prompt;
    lm.forward(s);  // compile outside the timed loop
    t = Clock::now();
    double kv_bytes = 0;
    for (int i = 0; i < decode_steps; ++i) {
      s.cache_position = prompt + 1 + i;
      lm.forward(s);
      kv_bytes += 2.0 * 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim *
                  double(s.cache_position + 1);
    }
    double decode_s = seconds_since(t) / decode_steps;
    double roofline = bw * 1e9 / (weight_bytes + kv_bytes / decode_steps);
    // Prefill: one pass over prefill_len tokens (compiled first).
    lm.reset_cache(1, cache_len);
    ForwardArgs p;
    std::vector<int32_t> pids(prefill_len);
    for (int i = 0; i < prefill_len; ++i) pids[i] = 1000 + i;
    p.input_ids = Tensor::from_vector<int32_t>({1, prefill_len}, DType::i32, pids);
    lm.forward(p);
    t = Clock::now();
    lm.forward(p);
    double prefill_s = seconds_since(t);
    std::printf("| %d | %.1f | %.2f | %.2f | %.2f | %.1f |\n", n, bw, 1 / decode_s, roofline,
                (1 / decode_s) / roofline, prefill_len / prefill_s);
    std::fflush(stdout);
  }
  return 0;
}
