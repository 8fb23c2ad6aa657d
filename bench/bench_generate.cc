// The C++ side of bench/python_generate.py: CausalLM::generate() timed one call at a time, on
// request, so that the Python script can alternate its own calls with these in one run.
//   build/release/bench/bench_generate MODEL_DIR MAX_NEW_TOKENS PROMPT_IDS
// Loads the model in float32, warms up (compiles the steps) with one call, prints "ready", then
// for every line read on stdin runs one greedy generate() of exactly MAX_NEW_TOKENS tokens after
// PROMPT_IDS (comma-separated) and prints its wall seconds and the new ids. Ends at end of input.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_help.h"
#include "tformers/error.h"
#include "tformers/model.h"

namespace {

const char* kUsage =
    "usage: bench_generate MODEL_DIR MAX_NEW_TOKENS PROMPT_IDS\n"
    "  Times CausalLM::generate() once per line read on stdin (bench/python_generate.py drives "
    "it).\n";

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');) ids.push_back(int32_t(std::stoi(part)));
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  if (tformers::bench::answered_help(argc, argv, kUsage)) return 0;
  if (argc != 4) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  try {
    auto model = tformers::AutoModelForCausalLM::from_pretrained(
        argv[1], {.dtype = tformers::float32, .device_map = "cpu"});
    const int64_t n = std::stoll(argv[2]);
    const std::vector<std::vector<int32_t>> prompt = {parse_ids(argv[3])};
    const tformers::GenerationConfig config{
        .max_new_tokens = n, .min_new_tokens = n, .do_sample = false};
    model.generate(prompt, config);
    std::printf("ready\n");
    std::fflush(stdout);
    for (std::string line; std::getline(std::cin, line);) {
      const auto start = std::chrono::steady_clock::now();
      const auto out = model.generate(prompt, config);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("%.6f", secs);
      for (size_t i = prompt[0].size(); i < out[0].size(); ++i) std::printf(" %d", out[0][i]);
      std::printf("\n");
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_generate: %s\n", e.what());
    return 1;
  }
  return 0;
}
