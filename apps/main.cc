// The `tformers` command.
#include <cstdio>
#include <string>

#include "core/cpu_features.h"
#include "core/thread_pool.h"

int main(int argc, char** argv) {
  std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "env") {
    std::printf("tformers %s\n", TFORMERS_VERSION);
    std::printf("cpu features: %s\n", std::string(tformers::cpu::feature_string()).c_str());
    std::printf("cpu target: %s\n",
                std::string(tformers::cpu::target_name(tformers::cpu::active_target())).c_str());
    std::printf("threads: %d\n", tformers::ThreadPool::global().num_threads());
    return 0;
  }
  std::fprintf(stderr, "usage: tformers env\n");
  return 2;
}
