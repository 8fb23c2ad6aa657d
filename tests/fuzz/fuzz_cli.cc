// The command line: an argument list through parse_command_line and the checks that run before a
// model loads: for generate and chat check_args, --prompt-ids, --tp-plan, the flags as a
// GenerationConfig and resolve() of it for a small model; for bench and perplexity their own. The
// input is the arguments after `tformers`, one per line, or separated by NUL bytes when it holds
// any (so that an argument can hold a newline).
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "../../apps/cli.h"
#include "fuzz_util.h"
#include "tformers/generation.h"

namespace {

constexpr size_t kMaxArgs = 256;

std::vector<std::string> split_args(const uint8_t* data, size_t n) {
  std::string_view all(reinterpret_cast<const char*>(data), n);
  const char sep = all.find('\0') == std::string_view::npos ? '\n' : '\0';
  std::vector<std::string> args;
  // Each separator ends an argument; the last one needs none.
  for (size_t at = 0; at < all.size() && args.size() < kMaxArgs;) {
    size_t end = all.find(sep, at);
    if (end == std::string_view::npos) end = all.size();
    args.emplace_back(all.substr(at, end - at));
    at = end + 1;
  }
  return args;
}

// What parse_command_line promises about its result; a broken promise is a crash.
void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_cli: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tformers;
  std::vector<std::string> args = split_args(data, size);
  std::vector<const char*> argv = {"tformers"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  const int argc = int(argv.size()) - 1;

  fuzz::expect_ok_or_error([&] {
    std::ostringstream out, err;
    const cli::CommandLine cl = cli::parse_command_line(argc, argv.data(), out, err);
    check(cl.threads == 0 || (cl.threads >= 1 && cl.threads <= cli::kMaxThreads),
          "--threads out of range");
    if (cl.command.empty()) {
      // --help, --version or a usage error, and a usage error says what was wrong.
      check(cl.exit_code == 0 || !err.str().empty(), "a failure with no message");
      return;
    }
    check(cl.exit_code == 0, "a command to run with a failing exit code");
    if (cl.command == "bench") cli::check_bench_args(cl.bench);
    if (cl.command == "perplexity") cli::check_perplexity_args(cl.perplexity);
    if (cl.command != "generate" && cl.command != "chat") return;
    const cli::GenerateArgs& g = cl.generate;
    cli::check_args(g);
    int64_t prompt_len = 3;
    if (!g.prompt_ids.empty()) prompt_len = int64_t(cli::parse_ids(g.prompt_ids).size());
    if (!g.tp_plan.empty()) cli::parse_tp_plan(g.tp_plan);
    const GenerationConfig gc = cli::generation_config(g, nullptr);
    // A tiny model's own settings under the flags, as generate() layers them.
    GenerationConfig model_gc;
    model_gc.do_sample = true;
    model_gc.eos_token_id = std::vector<int64_t>{2};
    resolve(model_gc.merged_with(gc), prompt_len, /*vocab_size=*/1000, /*max_positions=*/512);
  });
  return 0;
}
