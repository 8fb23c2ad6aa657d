#include "cli.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <random>
#include <sstream>
#include <string_view>

#include <nlohmann/json.hpp>

#include "distributed/launcher.h"
#include "io/file.h"
#include "terminal.h"
#include "tformers/error.h"

namespace tformers::cli {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

std::string range_text(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

// An integer flag in [lo, hi], checked on the text: CLI11 would clamp a number past int64 to
// INT64_MAX without a word (--seed 99999999999999999999 became 9223372036854775807).
CLI::Validator int_in(int64_t lo, int64_t hi) {
  const std::string range =
      "[" + std::to_string(lo) + ", " + (hi == kInt64Max ? "2^63-1" : std::to_string(hi)) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec == std::errc::result_out_of_range)
          return "'" + text + "' is outside the range " + range;
        if (ec != std::errc() || ptr != end || text.empty())
          return "'" + text + "' is not an integer; give one in " + range;
        if (v < lo || v > hi) return "'" + text + "' is outside the range " + range;
        return "";
      },
      "INT in " + range);
}

// A finite decimal flag in [lo, hi], or (lo, hi] when lo_open: CLI11's own ranges let nan
// through (every comparison with it is false), and inf or 1e10 seconds overflowed the clocks.
CLI::Validator number_in(double lo, double hi, bool lo_open = false) {
  const std::string range =
      std::string(lo_open ? "(" : "[") + range_text(lo) + ", " + range_text(hi) + "]";
  return CLI::Validator(
      [lo, hi, lo_open, range](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size())
          return "'" + text + "' is not a number; give one in " + range;
        if (!std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo))
          return "'" + text + "' is outside the range " + range;
        return "";
      },
      "NUMBER in " + range);
}

// Timeouts become clock durations in nanoseconds; 1e8 s (over 3 years) is far below what an
// int64 of nanoseconds holds (292 years), added to any time the steady clock can show.
constexpr double kMaxTimeoutSeconds = 1e8;

// The flags that say which model to load and how, with the same meaning in every command;
// --use-kernels where the command runs the model (use_kernels not null).
// `positional`: the model may also come as the first bare argument (vLLM's `vllm serve MODEL`).
void add_model_flags(CLI::App* sub, std::string& model, std::string& revision, std::string& dtype,
                     std::string& quantize, std::string& load_mode, bool* use_kernels,
                     bool positional = false) {
  sub->add_option(positional ? "model,--model,-m" : "--model,-m", model,
                  "Model folder or Hub id in the local cache")
      ->required();
  sub->add_option("--revision", revision, "Hub revision (branch, tag or commit) of a cached model")
      ->capture_default_str();
  sub->add_option("--dtype", dtype,
                  "auto (the checkpoint's torch_dtype, the default), float32, bfloat16 or "
                  "float16");
  sub->add_option("--quantize", quantize,
                  "Weight-only linears, one scale per 32 weights: int8 (as Q8_0) or int4 (as "
                  "Q4_0)");
  sub->add_option("--load-mode", load_mode,
                  "copy: weights in anonymous huge-page memory (fast decode); mmap: use the "
                  "checkpoint's mapping (instant load, low memory)")
      ->check(CLI::IsMember({"copy", "mmap"}))
      ->capture_default_str();
  if (!use_kernels) return;
  sub->add_flag("--use-kernels", *use_kernels,
                "Swap RMSNorm and SiLU-and-mul for the hub kernels of "
                "tformers-community/fused-norms v1 (kernel cache, pinned by kernels.lock)");
}

void add_model_flags(CLI::App* sub, ModelFlags& m, bool positional = false) {
  add_model_flags(sub, m.model, m.revision, m.dtype, m.quantize, m.load_mode, &m.use_kernels,
                  positional);
}

// vLLM's and llama.cpp's --chat-template: the tokenizer's template replaced by a file's or by
// the text given.
void add_chat_template_flag(CLI::App* sub, std::string& chat_template) {
  sub->add_option("--chat-template", chat_template,
                  "A Jinja chat template to use instead of the tokenizer's: a file, or the "
                  "template itself");
}

void add_tp_flags(CLI::App* sub, int64_t& tp, std::string& tp_plan) {
  sub->add_option("--tp,--tensor-parallel-size", tp,
                  "Split the model over N processes (run under tformers launch)")
      ->check(int_in(0, 65536));
  sub->add_option("--tp-plan", tp_plan,
                  "Tensor-parallel overrides as a JSON object, e.g. "
                  "'{\"layers.*.self_attn.q_proj\": \"replicated_with_grad_allreduce\"}'");
}

void add_serve_flags(CLI::App* s, ServeArgs& a) {
  add_model_flags(s, a.model, /*positional=*/true);
  add_chat_template_flag(s, a.chat_template);
  add_tp_flags(s, a.tp, a.tp_plan);
  s->add_option("--device", a.device, "cpu, auto, tpu, cuda or xla-cpu")->capture_default_str();
  s->add_option("--served-model-name", a.served_model_name,
                "The name requests give as `model` (default: --model as given)");
  s->add_option("--host", a.host, "Address to listen on (0.0.0.0: every interface)")
      ->capture_default_str();
  s->add_option("--port", a.port, "Port to listen on; 0 takes any free one and prints it")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  s->add_option("--api-key", a.api_key,
                "Requests to /v1 must send Authorization: Bearer KEY (default: TFORMERS_API_KEY; "
                "none: no key needed)")
      ->check(CLI::Validator(
          [](std::string& key) -> std::string {
            // An empty key would serve without authentication while the command line asks for
            // it.
            return key.empty() ? "an empty key; give one, or leave --api-key out to need none" : "";
          },
          "KEY"));
  s->add_option("--max-num-seqs", a.max_num_seqs, "Sequences decoded together")
      ->check(int_in(1, 1024))
      ->capture_default_str();
  s->add_option("--max-model-len,--ctx-size,-c", a.max_model_len,
                "Prompt + completion tokens of one request (default: the model's positions, up "
                "to 4096)")
      ->check(int_in(1, kInt64Max));
  s->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", a.enable_prefix_caching,
              "Keep full KV blocks by prefix, so that a prompt repeating a cached prefix prefills "
              "only the rest (default on)");
  s->add_option("--max-body-bytes", a.max_body_bytes, "Largest request body (413 beyond)")
      ->check(int_in(1024, int64_t(1) << 30))
      ->capture_default_str();
  s->add_option("--max-buffered-bytes", a.max_buffered_bytes,
                "Bytes of requests still arriving, over all connections; past it the connections "
                "that have sent slowest are closed")
      ->check(int_in(1 << 20, int64_t(1) << 40))
      ->capture_default_str();
  s->add_option("--max-connections", a.max_connections,
                "Requests served at once (503 beyond); a connection still sending its request, "
                "or idle, holds a socket and at most 16 KiB, not a place")
      ->check(int_in(1, 65536))
      ->capture_default_str();
  s->add_option("--request-timeout", a.request_timeout,
                "Seconds a completion may take from arrival to its last token; then it is "
                "cancelled (504, or an error event when streaming)")
      ->check(number_in(0, kMaxTimeoutSeconds, /*lo_open=*/true))
      ->capture_default_str();
  s->add_option("--read-timeout", a.read_timeout, "Seconds to wait for a client's bytes")
      ->check(number_in(0, kMaxTimeoutSeconds, /*lo_open=*/true))
      ->capture_default_str();
  s->add_option("--write-timeout", a.write_timeout,
                "Seconds a write may wait for a client that does not read")
      ->check(number_in(0, kMaxTimeoutSeconds, /*lo_open=*/true))
      ->capture_default_str();
  s->add_option("--keep-alive-timeout", a.keep_alive_timeout,
                "Seconds an idle connection stays open for its next request")
      ->check(number_in(1.0, 3600.0))
      ->capture_default_str();
  s->add_option("--shutdown-timeout", a.shutdown_timeout,
                "On SIGTERM or SIGINT, seconds running requests may take to finish before they "
                "are aborted")
      ->check(number_in(0, kMaxTimeoutSeconds))
      ->capture_default_str();
  s->add_flag("--verbose,-v", a.verbose, "Log each request on stderr");
}

// Levenshtein distance: how many one-character edits turn a into b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// "unknown option --promt; did you mean --prompt?" for each argument `where` did not take.
std::string unexpected_arguments_message(const CLI::App& where, const CLI::App& top) {
  std::vector<std::string> flags;
  for (const CLI::App* app : {&where, &top})
    for (const CLI::Option* opt : app->get_options()) {
      for (const std::string& name : opt->get_lnames()) flags.push_back("--" + name);
      for (const std::string& name : opt->get_snames()) flags.push_back("-" + name);
    }
  std::string message;
  std::vector<std::string> extras = where.remaining();
  if (extras.empty()) extras = top.remaining();
  for (const std::string& arg : extras) {
    if (!message.empty()) message += "; ";
    const std::string name = arg.substr(0, arg.find('='));
    if (name.size() < 2 || name[0] != '-') {
      message += "unexpected argument '" + arg + "'";
      continue;
    }
    message += "unknown option " + name;
    if (name.size() > 64) continue;  // no flag is that long; and the distance costs len^2
    std::string best;
    size_t best_distance = std::max<size_t>(2, name.size() / 3) + 1;
    for (const std::string& flag : flags) {
      const size_t d = edit_distance(name, flag);
      if (d < best_distance) best = flag, best_distance = d;
    }
    if (!best.empty()) message += "; did you mean " + best + "?";
  }
  const std::string command = &where == &top ? "tformers" : "tformers " + where.get_name();
  return message + " (" + command + " --help lists the options)";
}

// llama.cpp's -ngl/--n-gpu-layers N: how many layers it offloads to a GPU. tformers runs the
// whole model on one device (--device), so the flag and its value are taken out of the arguments
// with a note; CLI11 would read -ngl as -n with the value "gl". Returns the other arguments, or
// sets `error` for a flag without a value.
std::vector<const char*> take_gpu_layers(int argc, const char* const* argv, std::ostream& err,
                                         std::string& error) {
  std::vector<const char*> kept(argv, argv + std::min(argc, 1));  // the program
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") {  // what follows is not ours to read
      kept.insert(kept.end(), argv + i, argv + argc);
      break;
    }
    const std::string_view name = arg.substr(0, arg.find('='));
    if (name != "-ngl" && name != "--n-gpu-layers" && name != "--gpu-layers") {
      kept.push_back(argv[i]);
      continue;
    }
    std::string value;
    if (name.size() < arg.size())
      value = arg.substr(name.size() + 1);
    else if (i + 1 < argc)
      value = argv[++i];
    if (value.empty() || value[0] == '-') {
      error =
          std::string(name) + " needs a number of layers (it is llama.cpp's; tformers ignores it)";
      return kept;
    }
    err << "tformers: note: " << escape_for_terminal(std::string(name) + " " + value)
        << " is ignored: tformers runs the whole model on one device, chosen with --device "
           "(auto, cpu, cuda, tpu or xla-cpu); there are no GPU layers on this backend\n"
        << std::flush;
  }
  return kept;
}

}  // namespace

CommandLine parse_command_line(int raw_argc, const char* const* raw_argv, std::ostream& out,
                               std::ostream& err) {
  CommandLine cl;
  std::string gpu_layers_error;
  const std::vector<const char*> args = take_gpu_layers(raw_argc, raw_argv, err, gpu_layers_error);
  if (!gpu_layers_error.empty()) {
    err << "error: " << escape_for_terminal(gpu_layers_error) << "\n" << std::flush;
    cl.exit_code = kUsageExitCode;
    return cl;
  }
  const int argc = int(args.size());
  const char* const* argv = args.data();
  CLI::App app{"tformers: run Hugging Face causal language models natively"};
  app.set_version_flag("--version", std::string("tformers ") + TFORMERS_VERSION,
                       "Print the version and exit");
  app.require_subcommand(1);
  int64_t& threads = cl.threads;
  const std::string threads_help = "CPU threads, 1 to " + std::to_string(kMaxThreads) +
                                   " (default: TFORMERS_NUM_THREADS or all cores)";
  app.add_option("--threads,-t", threads, threads_help)->check(int_in(1, kMaxThreads));

  CLI::App* env =
      app.add_subcommand("env", "Print the version, CPU features, backends and accelerators");
  env->add_flag("--json", cl.env_json, "Print one JSON object instead of lines");
  CLI::App* launch =
      app.add_subcommand("launch", tformers::distributed::kLaunchHelp)->allow_extras();

  GenerateArgs& g = cl.generate;
  CLI::App* gen = app.add_subcommand("generate", "Generate text from a prompt");
  CLI::App* chat = app.add_subcommand("chat", "Chat with a model, turn by turn, in the terminal");
  std::string &tok_model = cl.tokenize.model, &tok_revision = cl.tokenize.revision,
              &tok_text = cl.tokenize.text;
  bool& tok_special = cl.tokenize.add_special_tokens;
  CLI::App* tokz = app.add_subcommand("tokenize", "Show the token ids and pieces of a text");
  BenchArgs& b = cl.bench;
  CLI::App* bench = app.add_subcommand(
      "bench", "Measure prompt processing and token generation speed (tokens/s), as llama-bench");
  PerplexityArgs& p = cl.perplexity;
  CLI::App* ppl = app.add_subcommand(
      "perplexity", "Perplexity of a model on a text file, over non-overlapping windows");
  CLI::App* serve = app.add_subcommand(
      "serve", "Serve the model over HTTP with OpenAI's API (chat/completions, completions)");
  for (CLI::App* sub : {gen, chat, tokz, ppl, serve})
    sub->add_option("--threads,-t", threads, threads_help)->check(int_in(1, kMaxThreads));
  for (CLI::App* sub : {gen, chat}) {
    add_model_flags(sub, g.model, g.revision, g.dtype, g.quantize, g.load_mode, &g.use_kernels);
    add_chat_template_flag(sub, g.chat_template);
    sub->add_option("--system", g.system, "System message");
    sub->add_option("--max-new-tokens,--n-predict,-n", g.max_new_tokens,
                    "Tokens to generate (generate: default from generation_config.json, else up "
                    "to 20 in all; chat, per reply: generation_config.json's max_new_tokens, "
                    "else 256 or half of --ctx-size if less)")
        ->check(int_in(1, kInt64Max));
    sub->add_flag("--do-sample", g.do_sample, "Sample instead of greedy decoding");
    sub->add_option("--temperature,--temp", g.temperature,
                    "Sampling temperature (1: unchanged); 0 means greedy decoding")
        ->check(number_in(0, std::numeric_limits<float>::max()));
    sub->add_option("--top-k", g.top_k, "Sample from the K most likely tokens only (0: all)")
        ->check(int_in(0, kInt64Max));
    sub->add_option("--top-p", g.top_p,
                    "Sample from the smallest set of tokens whose probability reaches P (1: all)")
        ->check(number_in(0, 1, /*lo_open=*/true));
    sub->add_option("--min-p", g.min_p, "Drop tokens less likely than P times the most likely one")
        ->check(number_in(0, 1));
    sub->add_option("--typical-p", g.typical_p, "Locally typical sampling mass (1: off)")
        ->check(number_in(0, 1, /*lo_open=*/true));
    sub->add_option("--repetition-penalty,--repeat-penalty", g.repetition_penalty,
                    "Divide the scores of tokens already seen by this (1: off)")
        ->check(number_in(std::numeric_limits<float>::min(), std::numeric_limits<float>::max()));
    sub->add_option("--no-repeat-ngram-size", g.no_repeat_ngram_size,
                    "Never repeat an n-gram of this size (0: off)")
        ->check(int_in(0, kInt64Max));
    sub->add_option("--prompt-lookup,--prompt-lookup-num-tokens", g.prompt_lookup,
                    "Prompt lookup decoding: check up to N tokens that followed an earlier "
                    "occurrence of the output's last words in one step (greedy; the same tokens, "
                    "fewer steps where the output repeats its prompt)")
        ->check(int_in(0, 64));
    sub->add_option("--assistant-model,--model-draft", g.assistant_model,
                    "Assisted generation: a smaller model of the same vocabulary (folder or Hub "
                    "id) proposes tokens that the model checks several at a time (the same tokens "
                    "greedily, the same distribution sampling; fewer steps of the model)");
    sub->add_option("--draft-max,--num-assistant-tokens", g.num_assistant_tokens,
                    "Assisted generation: tokens the assistant proposes per step (default 20)")
        ->check(int_in(1, 64));
    sub->add_option("--seed,-s", g.seed,
                    "Sampling seed: the same seed gives the same text; -1 draws a fresh one "
                    "(shown with --verbose)")
        ->check(int_in(-1, kInt64Max));
    sub->add_option("--stop", g.stop, "Stop when the text contains STR (repeatable)")
        ->allow_extra_args(false);
    sub->add_flag("--ignore-eos", g.ignore_eos,
                  "Keep generating past end-of-sequence tokens, up to --max-new-tokens");
    sub->add_option("--ctx-size,--max-cache-len,-c", g.ctx_size,
                    "KV cache positions (max_cache_len; chat: the whole conversation, default "
                    "the model's positions up to 4096)")
        ->check(int_in(2, kInt64Max));
    sub->add_option("--device", g.device, "cpu, auto, tpu, cuda or xla-cpu")->capture_default_str();
    sub->add_flag("--verbose,-v", g.verbose,
                  "Show the seed, compiles, cache hits, time to first token, tokens/s on stderr");
    sub->add_flag("--verbose-all-ranks", g.verbose_all_ranks,
                  "Under tformers launch, let every rank write to stderr (default: rank 0 only)");
  }
  gen->add_option("--prompt,-p", g.prompt, "Prompt text (needs the model's tokenizer.json)");
  gen->add_option("--file,-f", g.prompt_file, "Read the prompt text from a file");
  gen->add_option("--prompt-ids", g.prompt_ids, "Prompt token ids, comma-separated");
  gen->add_flag("--chat", g.chat, "Wrap the prompt in the model's chat template");
  gen->add_flag("--json", g.json,
                "Print one JSON object (ids, text, finish reason, timings) instead of streaming");
  gen->add_option("--num-beams", g.num_beams, "Beam search with N beams (1: off)")
      ->check(int_in(1, kInt64Max));
  gen->add_option("--length-penalty", g.length_penalty,
                  "Beam search: scores are divided by length ** this (default 1)")
      ->check(number_in(-std::numeric_limits<double>::max(), std::numeric_limits<double>::max()));
  gen->add_option("--early-stopping", g.early_stopping,
                  "Beam search: stop at num_beams finished (true), when no beam is likely to "
                  "improve (false, default) or when none can (never)")
      ->check(CLI::IsMember({"true", "false", "never"}));
  add_tp_flags(gen, g.tp, g.tp_plan);

  chat->add_flag("--hide-reasoning", g.hide_reasoning,
                 "Show a reasoning model's answer only, not its reasoning (shown by default "
                 "between 'Thinking...' and '...done thinking.', dimmed on a terminal)");

  tokz->add_option("--model,-m", tok_model, "Model folder or Hub id in the local cache")
      ->required();
  tokz->add_option("--revision", tok_revision, "Hub revision of a cached model")
      ->capture_default_str();
  tokz->add_option("text", tok_text, "Text to tokenize")->required();
  tokz->add_flag("--add-special-tokens", tok_special, "Add the post-processor's special tokens");
  tokz->add_flag("--json", cl.tokenize.json,
                 "Print one JSON object {\"ids\": [...], \"tokens\": [...]} instead of lines");

  add_model_flags(bench, b.model);
  bench
      ->add_option("--n-prompt,-p", b.prompt,
                   "Prompt lengths, comma-separated: one forward pass over each (0: none)")
      ->delimiter(',')
      ->capture_default_str();
  bench
      ->add_option("--n-gen,-n", b.gen,
                   "Generation lengths, comma-separated: single-token steps after an " +
                       std::to_string(kBenchGenPrompt) + "-token prompt (0: none)")
      ->delimiter(',')
      ->capture_default_str();
  bench
      ->add_option("--threads,-t", b.threads,
                   "Thread counts, comma-separated (default: TFORMERS_NUM_THREADS or all cores)")
      ->delimiter(',');
  bench->add_option("--repetitions,-r", b.repetitions, "Timed runs of each test, after a warm-up")
      ->check(int_in(1, 1000000))
      ->capture_default_str();
  bench
      ->add_option(
          "--device", b.device,
          "cpu, auto, tpu, cuda or xla-cpu; the roofline is that device's memory bandwidth")
      ->capture_default_str();
  bench->add_option("--output,-o", b.output, "md: a markdown table; json: an array of results")
      ->check(CLI::IsMember({"md", "json"}))
      ->capture_default_str();

  add_model_flags(ppl, p.model);
  ppl->add_option("--file,-f", p.file, "The text to score")->required();
  ppl->add_option("--ctx,-c", p.ctx,
                  "Tokens per window; the first of each is context only (default: " +
                      std::to_string(kPerplexityCtx) + ", or the model's positions if fewer)")
      ->check(int_in(2, kInt64Max));
  ppl->add_flag("--json", p.json,
                "Print one JSON object (perplexity, mean NLL, tokens, windows, time)");

  add_serve_flags(serve, cl.serve);
  QuantizeArgs& q = cl.quantize;
  CLI::App* quant = app.add_subcommand(
      "quantize", "Write a copy of a model with int8 or int4 linear weights, which loads as is");
  quant->add_option("--model,-m", q.model, "Model folder or Hub id in the local cache")->required();
  quant
      ->add_option("--revision", q.revision,
                   "Hub revision (branch, tag or commit) of a cached model")
      ->capture_default_str();
  quant
      ->add_option("--to", q.to,
                   "int8 (one f32 scale per 32 weights, as Q8_0) or int4 (4-bit codes and an f16 "
                   "scale per 32, as Q4_0)")
      ->required()
      ->check(CLI::IsMember({"int8", "int4"}));
  quant->add_option("--dtype", q.dtype,
                    "auto, float32, bfloat16 or float16 for the weights that stay floats "
                    "(embeddings, norms; default: the checkpoint's torch_dtype)");
  quant->add_option("out", q.out, "Folder to write; it must not exist or be empty")->required();

  CompileArgs& c = cl.compile;
  CLI::App* comp = app.add_subcommand(
      "compile",
      "Compile a model's prefill and decode steps for a TPU topology, without a TPU (libtpu), "
      "and print the device memory each needs");
  add_model_flags(comp, c.model.model, c.model.revision, c.model.dtype, c.model.quantize,
                  c.model.load_mode, nullptr);
  comp->add_option("--device", c.device, "tpu: the device compiled for")->capture_default_str();
  comp->add_option("--topology", c.topology,
                   "The TPU slice, as libtpu names it: v5e:1x1, v5e:2x2, v4:2x2x1, v6e:1x1, ...")
      ->required();
  comp->add_option("--batch", c.batch, "Sequences per step")
      ->check(int_in(1, 4096))
      ->capture_default_str();
  comp->add_option("--max-cache-len", c.cache_len,
                   "KV cache positions (default: the model's positions, up to 4096)")
      ->check(int_in(1, kInt64Max));
  comp->add_option("--output,-o", c.output, "md: a markdown table; json: one object")
      ->check(CLI::IsMember({"md", "json"}))
      ->capture_default_str();

  CLI::App* kernels = app.add_subcommand("kernels", "Hub kernels: list | lock | verify (--help)");
  kernels->prefix_command()->set_help_flag();  // its own usage: tformers kernels --help

  // CLI11 would call an unknown subcommand an unexpected argument; name it and list the real ones.
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    const auto subs = app.get_subcommands([](CLI::App*) { return true; });
    for (const CLI::App* sub : subs) known = known || sub->check_name(argv[1]);
    if (!known) {
      std::string names;
      for (const CLI::App* sub : subs) names += (names.empty() ? "" : ", ") + sub->get_name();
      err << "error: "
          << escape_for_terminal("unknown subcommand '" + std::string(argv[1]) +
                                 "'; the subcommands are " + names +
                                 " (tformers --help shows them)")
          << "\n"
          << std::flush;
      cl.exit_code = kUsageExitCode;
      return cl;
    }
  }
  const std::vector<CLI::App*> subs = {env,   launch, kernels, gen,   chat, tokz,
                                       bench, ppl,    serve,   quant, comp};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError& e) {
    // CLI11 lists the extras in reverse order and guesses nothing; name each in the order given,
    // with the closest flag of the command for one that looks like a mistyped flag.
    CLI::App* where = &app;
    for (CLI::App* sub : subs)
      if (sub->parsed()) where = sub;
    err << "error: " << escape_for_terminal(unexpected_arguments_message(*where, app)) << "\n"
        << std::flush;
    cl.exit_code = kUsageExitCode;
    cl.threads = 0;
    return cl;
  } catch (const CLI::ParseError& e) {
    // --help and --version end with 0; every usage error with kUsageExitCode rather than
    // CLI11's internal codes (106 for a missing flag, 109 for an extra argument, ...).
    if (e.get_exit_code() == 0) {
      cl.exit_code = app.exit(e, out, err);
    } else {
      err << "error: " << escape_for_terminal(e.what())
          << "\nRun with --help for more information.\n"
          << std::flush;
      cl.exit_code = kUsageExitCode;
    }
    cl.threads = 0;  // nothing runs
    return cl;
  }
  for (const CLI::App* sub : subs)
    if (sub->parsed()) cl.command = sub->get_name();
  if (kernels->parsed()) cl.kernels = kernels->remaining();
  return cl;
}

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
      throw UsageError("--prompt-ids: '" + item +
                       "' is not a token id (use comma-separated integers, "
                       "e.g. 72,101,108)");
    ids.push_back(int32_t(v));
  }
  return ids;
}

std::map<std::string, std::string> parse_tp_plan(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw UsageError("--tp-plan: not valid JSON: " + std::string(e.what()));
  }
  if (!j.is_object())
    throw UsageError("--tp-plan must be a JSON object {\"module pattern\": \"style\", ...}, got " +
                     j.dump());
  std::map<std::string, std::string> plan;
  for (const auto& [key, style] : j.items()) {
    if (!style.is_string())
      throw UsageError("--tp-plan: the style of \"" + key + "\" must be a string, got " +
                       style.dump());
    plan[key] = style.get<std::string>();
  }
  return plan;
}

std::optional<DistributedConfig> distributed_config(int64_t tp, const std::string& tp_plan) {
  if (tp == 0 && tp_plan.empty()) return std::nullopt;
  DistributedConfig dc;
  if (tp > 0) dc.tp_size = tp;
  if (!tp_plan.empty()) dc.tp_plan = parse_tp_plan(tp_plan);
  return dc;
}

std::optional<DType> parse_dtype_flag(const std::string& s) {
  if (s.empty() || s == "auto") return std::nullopt;
  try {
    return parse_dtype(s);
  } catch (const InvalidArgumentError&) {
    throw UsageError("--dtype " + s +
                     ": use auto (the checkpoint's torch_dtype), float32, bfloat16 or float16");
  }
}

void check_args(const GenerateArgs& a) {
  if (a.seed && *a.seed < -1)
    throw UsageError("--seed " + std::to_string(*a.seed) +
                     ": give a seed >= 0, or -1 for a fresh random one");
  if (a.ctx_size && *a.ctx_size < 2)
    throw UsageError("--ctx-size " + std::to_string(*a.ctx_size) +
                     ": the context must hold at least 2 tokens");
  for (const std::string& s : a.stop)
    if (s.empty()) throw UsageError("--stop: give a non-empty string");
  if (!a.assistant_model.empty() && a.tp > 0)
    throw UsageError(
        "--assistant-model with --tp: assisted generation runs in one process; drop --tp");
}

std::string over_hbm_advice(const std::vector<StepPeak>& steps, int64_t hbm,
                            const std::string& topology) {
  std::string over;
  int64_t most = 0;
  for (const StepPeak& s : steps) {
    if (s.peak_bytes <= hbm) continue;
    over += (over.empty() ? "" : ", ") + s.step + " " + std::to_string(s.tokens);
    most = std::max(most, s.peak_bytes);
  }
  if (over.empty()) return "";
  char line[640];
  std::snprintf(line, sizeof line,
                "does not fit: %s (peak up to %.0f MiB) need more than one %s chip's %.0f MiB of "
                "HBM; a smaller --max-cache-len or --batch shrinks the KV cache and the longest "
                "prefills, --quantize int8 or int4 the weights, and a chip of a later generation "
                "holds more",
                over.c_str(), double(most) / (1 << 20),
                topology.substr(0, topology.find(':')).c_str(), double(hbm) / (1 << 20));
  return line;
}

void check_bench_args(const BenchArgs& a) {
  auto check_lengths = [](const std::vector<int64_t>& values, const char* flag) {
    for (int64_t v : values)
      if (v < 0)
        throw UsageError(std::string("bench: ") + flag + " " + std::to_string(v) +
                         ": give token counts >= 1 (0 skips the test)");
  };
  check_lengths(a.prompt, "-p/--n-prompt");
  check_lengths(a.gen, "-n/--n-gen");
  bool any = false;
  for (int64_t v : a.prompt) any = any || v > 0;
  for (int64_t v : a.gen) any = any || v > 0;
  if (!any) throw UsageError("bench: nothing to run: every -p/--n-prompt and -n/--n-gen is 0");
  for (int64_t t : a.threads)
    if (t < 1 || t > kMaxThreads)
      throw UsageError("bench: -t/--threads " + std::to_string(t) + " is out of range: give 1 to " +
                       std::to_string(kMaxThreads));
  if (a.repetitions < 1)
    throw UsageError("bench: -r/--repetitions " + std::to_string(a.repetitions) +
                     ": give at least 1");
}

void check_perplexity_args(const PerplexityArgs& a) {
  if (a.ctx && *a.ctx < 2)
    throw UsageError("perplexity: --ctx " + std::to_string(*a.ctx) +
                     ": a window must hold at least 2 tokens");
}

std::string chat_template_from(const std::string& arg) {
  std::error_code ec;
  if (std::filesystem::exists(arg, ec))
    return io::RegularFile(arg, uint64_t(1) << 20, "--chat-template file").read_all();
  if (arg.find("{{") != std::string::npos || arg.find("{%") != std::string::npos) return arg;
  throw InvalidArgumentError("--chat-template: '" + arg +
                             "' is neither a file nor a Jinja template (which holds {{ or {%)");
}

uint64_t random_seed() {
  std::random_device rd;
  return ((uint64_t(rd()) << 32) ^ uint64_t(rd())) >> 1;
}

GenerationConfig generation_config(const GenerateArgs& a, std::FILE* notes) {
  GenerationConfig gc;
  gc.max_new_tokens = a.max_new_tokens;
  if (a.do_sample) gc.do_sample = true;
  gc.temperature = a.temperature;
  if (a.temperature == 0.0) {
    // llama.cpp's convention; Transformers rejects temperature 0 when sampling.
    if (notes)
      std::fprintf(notes,
                   "tformers: note: --temperature 0 means greedy decoding (do_sample=false)\n");
    gc.do_sample = false;
    gc.temperature.reset();
  }
  gc.top_k = a.top_k;
  gc.top_p = a.top_p;
  gc.min_p = a.min_p;
  gc.typical_p = a.typical_p;
  gc.repetition_penalty = a.repetition_penalty;
  gc.no_repeat_ngram_size = a.no_repeat_ngram_size;
  gc.prompt_lookup_num_tokens = a.prompt_lookup;
  gc.num_assistant_tokens = a.num_assistant_tokens;
  gc.num_beams = a.num_beams;
  // Beam sampling is not implemented: a model whose generation_config.json samples would refuse
  // --num-beams without this.
  if (a.num_beams > 1 && !a.do_sample) gc.do_sample = false;
  gc.length_penalty = a.length_penalty;
  if (a.early_stopping == "true") gc.early_stopping = EarlyStopping::kTrue;
  if (a.early_stopping == "false") gc.early_stopping = EarlyStopping::kFalse;
  if (a.early_stopping == "never") gc.early_stopping = EarlyStopping::kNever;
  if (!a.stop.empty()) gc.stop_strings = a.stop;
  if (a.ignore_eos) gc.eos_token_id = std::vector<int64_t>{};
  gc.max_cache_len = a.ctx_size;
  if (a.seed) gc.seed = *a.seed == -1 ? random_seed() : uint64_t(*a.seed);
  return gc;
}

}  // namespace tformers::cli
