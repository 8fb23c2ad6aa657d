// The `tformers` command line, read apart from running it: parse_command_line() builds the
// options, reads argv and checks what can be checked without a model, and never touches a file,
// a model or the process (apps/main.cc runs the result). The libFuzzer target
// tests/fuzz/fuzz_cli.cc feeds it arbitrary argument lists.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/thread_limit.h"
#include "tformers/distributed.h"
#include "tformers/dtype.h"
#include "tformers/error.h"
#include "tformers/generation.h"

namespace tformers::cli {

using tformers::kMaxThreads;  // core/thread_limit.h: --threads and TFORMERS_NUM_THREADS

// Exit statuses: 0 success, 1 a runtime failure (a model that does not load, a failed
// generation), 2 a usage error (a flag unknown, missing or out of its range), as in sh and grep.
constexpr int kUsageExitCode = 2;

// A usage error found after parsing (flags that exclude each other, a malformed list or JSON
// value): main() reports it as any error, with kUsageExitCode.
struct UsageError : tformers::InvalidArgumentError {
  using tformers::InvalidArgumentError::InvalidArgumentError;
};

// Options shared by the commands that load a model.
struct GenerateArgs {
  std::string model, revision = "main", prompt, prompt_file, prompt_ids, system, dtype,
                     device = "auto", quantize, early_stopping, load_mode = "copy";
  std::string chat_template;  // --chat-template: a file or the template; "": the tokenizer's
  bool chat = false, verbose = false, verbose_all_ranks = false, do_sample = false,
       ignore_eos = false, json = false, use_kernels = false;
  bool hide_reasoning = false;  // chat: a reasoning model's reasoning is not shown
  int64_t tp = 0;  // tensor-parallel processes (under tformers launch); 0: the whole model here
  std::string tp_plan;  // JSON object for DistributedConfig.tp_plan; "": the default plan
  std::optional<int64_t> max_new_tokens, top_k, seed, no_repeat_ngram_size, ctx_size, num_beams;
  std::optional<int64_t> prompt_lookup;  // --prompt-lookup: prompt_lookup_num_tokens
  std::string assistant_model;           // --assistant-model: assisted generation's assistant
  std::optional<int64_t> num_assistant_tokens;
  std::optional<double> temperature, top_p, min_p, typical_p, repetition_penalty, length_penalty;
  std::vector<std::string> stop;
};

struct TokenizeArgs {
  std::string model, revision = "main", text;
  bool add_special_tokens = false, json = false;
};

// How bench and perplexity load their model: generate's flags of the same names.
struct ModelFlags {
  std::string model, revision = "main", dtype, quantize, load_mode = "copy";
  bool use_kernels = false;  // hub kernels (tformers::default_kernel_mapping())
};

// bench's generation tests start after this many prompt tokens (untimed), so that every timed
// step is a decode step over a few cached positions, as in generate().
constexpr int64_t kBenchGenPrompt = 8;

struct BenchArgs {
  ModelFlags model;
  std::vector<int64_t> prompt = {512}, gen = {128};  // -p, -n: token counts; 0 skips one
  std::vector<int64_t> threads;                      // -t; empty: the global pool's size
  int64_t repetitions = 5;
  std::string output = "md";
  std::string device = "cpu";
};

// compile: a model's steps compiled for a TPU topology without a TPU (apps/compile.h).
struct CompileArgs {
  ModelFlags model;
  std::string device = "tpu", topology, output = "md";
  int64_t batch = 1;
  std::optional<int64_t> cache_len;  // default: the model's positions, up to 4096
};

// perplexity's window without --ctx: this, or the model's positions when it has fewer.
constexpr int64_t kPerplexityCtx = 512;

struct PerplexityArgs {
  ModelFlags model;
  std::string file;
  std::optional<int64_t> ctx;
  bool json = false;
};

// serve (apps/serve/server.h): how to load the model (generate's flags of the same names), the
// address, the engine's sizes and the server's limits.
struct ServeArgs {
  ModelFlags model;
  std::string device = "auto";
  std::string served_model_name;  // the `model` requests name; default: --model as given
  std::string chat_template;      // --chat-template: a file or the template; "": the tokenizer's
  std::string host = "127.0.0.1";
  int port = 8080;      // 0: any free port (the one taken is printed)
  std::string api_key;  // default: TFORMERS_API_KEY; empty: no key needed
  bool verbose = false;
  int64_t max_num_seqs = 8, max_model_len = 0;
  bool enable_prefix_caching = true;  // vLLM's flag and default
  int64_t max_body_bytes = int64_t(4) << 20;
  int64_t max_connections = 64;
  int64_t max_buffered_bytes = int64_t(256) << 20;
  double request_timeout = 600;  // seconds from arrival to the last token; then cancelled
  double read_timeout = 30, write_timeout = 30, keep_alive_timeout = 5;
  double shutdown_timeout = 10;  // how long running requests may finish after SIGTERM
  int64_t tp = 0;                // as generate's: rank 0 serves, the others run its steps
  std::string tp_plan;
};

// quantize: the model, the scheme (--to) and the folder to write.
struct QuantizeArgs {
  std::string model, revision = "main", to, dtype, out;
};

struct CommandLine {
  // The subcommand to run: env, kernels, generate, chat, tokenize, bench, perplexity, serve,
  // quantize or compile (or launch, which main() hands to the launcher before parsing). Empty when
  // parsing ended the command: --help, --version or a usage error, already written to the streams
  // given; the process then exits with exit_code.
  std::string command;
  int exit_code = 0;
  int64_t threads = 0;               // --threads, 1 to kMaxThreads; 0: the default
  bool env_json = false;             // env --json
  GenerateArgs generate;             // generate and chat
  TokenizeArgs tokenize;             // tokenize
  BenchArgs bench;                   // bench
  PerplexityArgs perplexity;         // perplexity
  ServeArgs serve;                   // serve
  QuantizeArgs quantize;             // quantize
  CompileArgs compile;               // compile
  std::vector<std::string> kernels;  // kernels: the arguments after "kernels"
};

// Reads `tformers ARGS...` (argv[0] is the program). Help and version text go to `out`, usage
// errors to `err` (as CLI11 writes them; "error: unknown subcommand ..." for a first argument
// that names none; "error: unknown option --promt; did you mean --prompt?" for a flag the
// command lacks; a value out of its range names the range), and then exit_code is
// kUsageExitCode. llama.cpp's flags are read too: -t, --temp, -s, --n-predict, --repeat-penalty
// as aliases, and -ngl/--n-gpu-layers N with a note on `err` that it is ignored (tformers puts
// the whole model on one device). `launch` is run by main() before this, which only knows it as
// a subcommand.
CommandLine parse_command_line(int argc, const char* const* argv, std::ostream& out,
                               std::ostream& err);

// --prompt-ids: comma-separated token ids; InvalidArgumentError names the first bad one.
std::vector<int32_t> parse_ids(const std::string& s);

// --tp-plan's JSON object {"module pattern": "style"}, as DistributedConfig.tp_plan takes it.
std::map<std::string, std::string> parse_tp_plan(const std::string& text);
// What --tp and --tp-plan ask for; none when neither is given (the whole model in each process).
std::optional<DistributedConfig> distributed_config(int64_t tp, const std::string& tp_plan);

// --dtype: "auto" or nothing is none (the checkpoint's torch_dtype, as dtype="auto" in
// Transformers); else a float dtype name (parse_dtype). UsageError naming the accepted ones.
std::optional<DType> parse_dtype_flag(const std::string& s);

// --chat-template's template: the file it names (at most 1 MiB), or the text itself when it is
// Jinja (holds "{{" or "{%"), as vLLM reads it; InvalidArgumentError otherwise.
std::string chat_template_from(const std::string& arg);

// Checks what can be checked without the model, so that a bad flag fails before loading.
void check_args(const GenerateArgs& a);
// bench: token counts >= 0 and not all 0, thread counts 1 to kMaxThreads, repetitions >= 1.
void check_bench_args(const BenchArgs& a);
// perplexity: a --ctx of at least 2 tokens.
void check_perplexity_args(const PerplexityArgs& a);

// compile: a step's peak device memory, and what to change when steps need more than one chip's
// `hbm` bytes at their peak, naming them ("" when every step fits).
struct StepPeak {
  std::string step;
  int64_t tokens = 0, peak_bytes = 0;
};
std::string over_hbm_advice(const std::vector<StepPeak>& steps, int64_t hbm,
                            const std::string& topology);

// A fresh 63-bit seed (it must read back through --seed, which is signed).
uint64_t random_seed();

// The flags as a GenerationConfig layered over the model's generation_config.json. Notes about
// how a flag was read go to `notes` (none when null), before anything streams.
GenerationConfig generation_config(const GenerateArgs& a, std::FILE* notes = stderr);

}  // namespace tformers::cli
