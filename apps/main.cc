// The `tformers` command: generate, env.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>

#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "distributed/launcher.h"
#include "tformers/accelerator.h"
#include "tformers/distributed.h"
#include "tformers/error.h"
#include "tformers/model.h"

namespace {

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX)
      throw tformers::InvalidArgumentError("--prompt-ids: '" + item +
                                           "' is not a token id (use comma-separated integers, "
                                           "e.g. 785,8585,49041)");
    ids.push_back(int32_t(v));
  }
  return ids;
}

int cmd_env() {
  std::printf("tformers %s\n", TFORMERS_VERSION);
  std::printf("cpu features: %s\n", std::string(tformers::cpu::feature_string()).c_str());
  for (const std::string& line : tformers::accelerator::describe_backends())
    std::printf("backend %s\n", line.c_str());
  std::printf("accelerator available: %s\n", tformers::accelerator::is_available() ? "yes" : "no");
  std::string archs;
  for (const auto& a : tformers::supported_architectures())
    archs += (archs.empty() ? "" : ", ") + a;
  std::printf("architectures: %s\n", archs.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // `launch` takes a command after `--`, so it parses its own arguments.
  if (argc > 1 && tformers::distributed::is_launcher_command(argv[1]))
    return tformers::distributed::launcher_main(argc - 1, argv + 1);
  CLI::App app{"tformers: run Hugging Face causal language models natively"};
  app.require_subcommand(1);
  int threads = 0;
  app.add_option("--threads", threads, "CPU threads (default: TFORMERS_NUM_THREADS or all cores)");

  CLI::App* env =
      app.add_subcommand("env", "Print the version, CPU features, backends and accelerators");

  app.add_subcommand("launch", tformers::distributed::kLaunchHelp)->allow_extras();

  CLI::App* gen = app.add_subcommand("generate", "Generate tokens from a prompt");
  std::string model, prompt_ids, dtype, device = "auto";
  int64_t max_new_tokens = 20;
  bool verbose = false;
  gen->add_option("--model", model, "Model folder or Hub id in the local cache")->required();
  gen->add_option("--prompt-ids", prompt_ids, "Prompt token ids, comma-separated")->required();
  gen->add_option("--max-new-tokens", max_new_tokens, "Tokens to generate")->capture_default_str();
  gen->add_option("--dtype", dtype, "float32 or bfloat16 (default: the checkpoint's torch_dtype)");
  gen->add_option("--device", device, "cpu, auto, tpu or cuda")->capture_default_str();
  gen->add_flag("--verbose,-v", verbose, "Show compiles, cache hits and tokens/s");
  int64_t tp = 0;
  gen->add_option("--tp", tp, "Split the model over N processes (run under tformers launch)");

  CLI11_PARSE(app, argc, argv);
  try {
    if (threads > 0) tformers::ThreadPool::set_global_threads(threads);
    if (env->parsed()) return cmd_env();
    if (gen->parsed()) {
      tformers::LoadOptions opt;
      opt.device_map = device;
      opt.verbose = verbose;
      if (!dtype.empty()) opt.dtype = tformers::parse_dtype(dtype);
      if (tp > 0) opt.distributed_config = tformers::DistributedConfig{.tp_size = tp};
      std::vector<int32_t> ids = parse_ids(prompt_ids);
      auto t0 = std::chrono::steady_clock::now();
      tformers::CausalLM lm = tformers::AutoModelForCausalLM::from_pretrained(model, opt);
      auto t1 = std::chrono::steady_clock::now();
      tformers::GenerationConfig gc;
      gc.max_new_tokens = max_new_tokens;
      auto out = lm.generate({ids}, gc);
      auto t2 = std::chrono::steady_clock::now();
      std::string line;
      for (size_t i = ids.size(); i < out[0].size(); ++i)
        line += (line.empty() ? "" : ",") + std::to_string(out[0][i]);
      if (!tformers::distributed::is_main_process()) return 0;  // rank 0 prints
      std::printf("%s\n", line.c_str());
      if (verbose) {
        double load = std::chrono::duration<double>(t1 - t0).count();
        double run = std::chrono::duration<double>(t2 - t1).count();
        auto st = lm.compile_stats();
        std::fprintf(stderr,
                     "tformers: load %.3f s, generate %.3f s (%.1f tokens/s incl. prefill), "
                     "compiles %llu, cache hits %llu\n",
                     load, run, double(out[0].size() - ids.size()) / run,
                     (unsigned long long)st.compiles, (unsigned long long)st.hits);
      }
    }
  } catch (const tformers::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return tformers::distributed::fail(1);  // under mpirun: end every rank, none waits for this one
  }
  return 0;
}
