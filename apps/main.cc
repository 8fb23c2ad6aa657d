// The `tformers` command: generate, chat, tokenize, env, launch, kernels.
//
// Streams: stdout carries only generated text (or --json, or the listing a command asks for);
// everything else goes to stderr on its own lines. While text streams, stderr is held back and
// written out whenever stdout reaches the start of a line (HeldStderr), so a compile note or a
// warning never lands inside a line of text. Arguments are checked, and the model's generation
// config resolved, before anything is printed.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

#ifdef TFORMERS_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

#include "core/cpu_features.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "distributed/launcher.h"
#include "errors.h"
#include "io/file.h"
#include "io/hub.h"
#include "kernels_hub/cli.h"
#include "terminal.h"
#include "tformers/accelerator.h"
#include "tformers/distributed.h"
#include "tformers/error.h"
#include "tformers/model.h"
#include "tformers/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
using tformers::cli::escape_for_terminal;
using tformers::cli::HeldStderr;

// Where errors go: stderr, or on a rank that is not rank 0 (whose stderr is silenced) a copy of
// the original stderr, so a failing rank is still heard.
int g_error_fd = 2;

// Writes generated text to stdout and remembers whether the last byte ended a line, so that a
// diagnostic can be started on a fresh line.
class Stdout {
 public:
  void write(std::string_view s) {
    if (s.empty()) return;
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
    mid_line_ = s.back() != '\n';
  }
  void end_line() {
    if (mid_line_) write("\n");
  }
  // The user's Enter, echoed by the terminal, ended the line.
  void line_entered() { mid_line_ = false; }
  bool mid_line() const { return mid_line_; }

 private:
  bool mid_line_ = false;
};
Stdout g_out;

// Set by SIGINT while a chat reply streams; the reply stops at the next token.
volatile std::sig_atomic_t g_interrupted = 0;

constexpr int64_t kMaxThreads = 1024;

// Set by `launch --verbose-all-ranks` for the ranks it starts, which inherit it.
constexpr const char* kVerboseAllRanksEnv = "TFORMERS_VERBOSE_ALL_RANKS";

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
                                           "e.g. 72,101,108)");
    ids.push_back(int32_t(v));
  }
  return ids;
}

// A prompt file: a regular file (never a FIFO or device) of at most this many bytes.
constexpr uint64_t kMaxPromptFileBytes = uint64_t(64) << 20;

// Options shared by the commands that load a model.
struct GenerateArgs {
  std::string model, revision = "main", prompt, prompt_file, prompt_ids, system, dtype,
                     device = "auto", quantize, early_stopping, load_mode = "copy";
  bool chat = false, verbose = false, verbose_all_ranks = false, do_sample = false,
       ignore_eos = false, json = false;
  int64_t tp = 0;  // tensor-parallel processes (under tformers launch); 0: the whole model here
  std::string tp_plan;  // JSON object for DistributedConfig.tp_plan; "": the default plan
  std::optional<int64_t> max_new_tokens, top_k, seed, no_repeat_ngram_size, ctx_size, num_beams;
  std::optional<double> temperature, top_p, min_p, typical_p, repetition_penalty, length_penalty;
  std::vector<std::string> stop;
};

// A fresh 63-bit seed (it must read back through --seed, which is signed).
uint64_t random_seed() {
  std::random_device rd;
  return ((uint64_t(rd()) << 32) ^ uint64_t(rd())) >> 1;
}

// The flags as a GenerationConfig layered over the model's generation_config.json. Notes about
// how a flag was read go to stderr here, before anything streams.
tformers::GenerationConfig generation_config(const GenerateArgs& a) {
  tformers::GenerationConfig gc;
  gc.max_new_tokens = a.max_new_tokens;
  if (a.do_sample) gc.do_sample = true;
  gc.temperature = a.temperature;
  if (a.temperature == 0.0) {
    // llama.cpp's convention; Transformers rejects temperature 0 when sampling.
    std::fprintf(stderr,
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
  gc.num_beams = a.num_beams;
  // Beam sampling is not implemented: a model whose generation_config.json samples would refuse
  // --num-beams without this.
  if (a.num_beams > 1 && !a.do_sample) gc.do_sample = false;
  gc.length_penalty = a.length_penalty;
  if (a.early_stopping == "true") gc.early_stopping = tformers::EarlyStopping::kTrue;
  if (a.early_stopping == "false") gc.early_stopping = tformers::EarlyStopping::kFalse;
  if (a.early_stopping == "never") gc.early_stopping = tformers::EarlyStopping::kNever;
  if (!a.stop.empty()) gc.stop_strings = a.stop;
  if (a.ignore_eos) gc.eos_token_id = std::vector<int64_t>{};
  gc.max_cache_len = a.ctx_size;
  if (a.seed) gc.seed = *a.seed == -1 ? random_seed() : uint64_t(*a.seed);
  return gc;
}

// Checks what can be checked without the model, so that a bad flag fails before loading.
void check_args(const GenerateArgs& a) {
  if (a.seed && *a.seed < -1)
    throw tformers::InvalidArgumentError("--seed " + std::to_string(*a.seed) +
                                         ": give a seed >= 0, or -1 for a fresh random one");
  if (a.ctx_size && *a.ctx_size < 2)
    throw tformers::InvalidArgumentError("--ctx-size " + std::to_string(*a.ctx_size) +
                                         ": the context must hold at least 2 tokens");
  for (const std::string& s : a.stop)
    if (s.empty()) throw tformers::InvalidArgumentError("--stop: give a non-empty string");
}

// Under tformers launch every rank runs the same command; only rank 0 prints, and its stderr is
// the only one unless --verbose-all-ranks.
void quiet_other_ranks(const GenerateArgs& a) {
  if (tformers::distributed::is_main_process()) return;
  if (!std::freopen("/dev/null", "w", stdout)) return;
  if (a.verbose_all_ranks || std::getenv(kVerboseAllRanksEnv)) return;
  g_error_fd = ::dup(2);
  const int null_fd = ::open("/dev/null", O_WRONLY);
  if (null_fd >= 0) {
    ::dup2(null_fd, 2);
    ::close(null_fd);
  }
}

// The tokenizer of a model folder, or nothing when it ships none.
std::optional<tformers::Tokenizer> maybe_tokenizer(const std::string& model,
                                                   const std::string& revision) {
  std::string dir = tformers::io::resolve_model_path(model, revision);
  if (!std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json")) return std::nullopt;
  return tformers::AutoTokenizer::from_pretrained(dir);
}

int cmd_env() {
  std::printf("tformers %s\n", TFORMERS_VERSION);
  std::printf("cpu features: %s\n", std::string(tformers::cpu::feature_string()).c_str());
  // Backend lines name the plugin files found on disk.
  for (const std::string& line : tformers::accelerator::describe_backends())
    std::printf("backend %s\n", escape_for_terminal(line).c_str());
  std::printf("accelerator available: %s\n", tformers::accelerator::is_available() ? "yes" : "no");
  std::string archs;
  for (const auto& a : tformers::supported_architectures())
    archs += (archs.empty() ? "" : ", ") + a;
  std::printf("architectures: %s\n", archs.c_str());
  return 0;
}

// --tp-plan's JSON object {"module pattern": "style"}, as DistributedConfig.tp_plan takes it.
std::map<std::string, std::string> parse_tp_plan(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw tformers::InvalidArgumentError("--tp-plan: not valid JSON: " + std::string(e.what()));
  }
  if (!j.is_object())
    throw tformers::InvalidArgumentError(
        "--tp-plan must be a JSON object {\"module pattern\": \"style\", ...}, got " + j.dump());
  std::map<std::string, std::string> plan;
  for (const auto& [key, style] : j.items()) {
    if (!style.is_string())
      throw tformers::InvalidArgumentError("--tp-plan: the style of \"" + key +
                                           "\" must be a string, got " + style.dump());
    plan[key] = style.get<std::string>();
  }
  return plan;
}

// Loads the model, with a progress bar on a terminal when that takes more than half a second.
tformers::CausalLM load_model(const GenerateArgs& a) {
  tformers::LoadOptions opt;
  opt.device_map = a.device;
  opt.revision = a.revision;
  opt.verbose = a.verbose;
  opt.quantize = a.quantize;
  opt.load_mode = a.load_mode;
  if (!a.dtype.empty()) opt.dtype = tformers::parse_dtype(a.dtype);
  if (a.tp > 0 || !a.tp_plan.empty()) {
    tformers::DistributedConfig dc;
    if (a.tp > 0) dc.tp_size = a.tp;
    if (!a.tp_plan.empty()) dc.tp_plan = parse_tp_plan(a.tp_plan);
    opt.distributed_config = dc;
  }
  tformers::ProgressBar bar(stderr,
                            isatty(fileno(stderr)) && tformers::distributed::is_main_process());
  opt.progress = [&bar](std::string_view stage, int64_t done, int64_t total) {
    bar.update(stage, done, total);
  };
  return tformers::AutoModelForCausalLM::from_pretrained(a.model, opt);
}

double seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

int cmd_generate(const GenerateArgs& a) {
  check_args(a);
  if (int(!a.prompt.empty()) + int(!a.prompt_file.empty()) + int(!a.prompt_ids.empty()) != 1)
    throw tformers::InvalidArgumentError(
        "generate: give exactly one of --prompt, --file and --prompt-ids");
  quiet_other_ranks(a);
  const std::string prompt =
      a.prompt_file.empty()
          ? a.prompt
          : tformers::io::read_regular_file(a.prompt_file, kMaxPromptFileBytes, "--file prompt");
  auto t0 = Clock::now();
  std::optional<tformers::Tokenizer> tok = maybe_tokenizer(a.model, a.revision);
  std::vector<int32_t> ids;
  if (!a.prompt_ids.empty()) {
    ids = parse_ids(a.prompt_ids);
  } else {
    if (!tok)
      throw tformers::NotFoundError("generate: " + a.model +
                                    " has no tokenizer.json, so a text prompt cannot be encoded; "
                                    "use --prompt-ids");
    std::string text = prompt;
    if (a.chat) {
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
      messages.push_back({{"role", "user"}, {"content", prompt}});
      text = tok->apply_chat_template(messages, /*add_generation_prompt=*/true);
    }
    // A rendered chat template already holds its special tokens.
    ids = tok->encode(text, /*add_special_tokens=*/!a.chat);
  }
  if (!a.stop.empty() && !tok)
    throw tformers::InvalidArgumentError(
        "generate: --stop needs the model's tokenizer.json to read the text; " + a.model +
        " has none");
  tformers::CausalLM lm = load_model(a);
  auto t1 = Clock::now();

  tformers::GenerationConfig gc = generation_config(a);
  if (!gc.seed && !lm.generation_config().seed) gc.seed = random_seed();
  const tformers::GenerationConfig merged = lm.generation_config().merged_with(gc);
  const uint64_t seed = *merged.seed;
  if (a.verbose && merged.do_sample.value_or(false))
    std::fprintf(stderr, "tformers: seed %llu\n", (unsigned long long)seed);

  // generate() checks the config before the first token, and the prompt is echoed with that
  // token, so a config error is reported before anything is printed.
  const bool beams = merged.num_beams.value_or(1) > 1, streaming = !a.json && !beams;
  std::optional<tformers::TokenStreamer> streamer;
  if (tok) streamer.emplace(*tok, /*skip_special_tokens=*/true);
  int64_t n = 0;
  Clock::time_point first_token;
  tformers::GenerateOutput out;
  {
    std::optional<HeldStderr> held;
    if (streaming) held.emplace();
    // Held diagnostics go out whenever stdout is at the start of a line: before the first text
    // (warnings from generate()'s checks) and after each newline.
    auto put = [&](std::string_view text) {
      if (held && !g_out.mid_line()) held->release();
      g_out.write(text);
      if (held && !g_out.mid_line()) held->release();
    };
    // The prompt is echoed with the first token, so a warning from generate() comes before it.
    bool echo = streaming && tok && !a.chat && a.prompt_ids.empty();
    auto on_token = [&](int64_t, int32_t id) {
      if (n++ == 0) first_token = Clock::now();
      if (!streaming) return true;
      if (echo) put(prompt);
      echo = false;
      put(streamer ? streamer->put(id) : (n == 1 ? "" : ",") + std::to_string(id));
      return true;
    };
    out = tformers::generate(lm, {ids}, gc, beams ? tformers::TokenCallback{} : on_token,
                             tok ? &*tok : nullptr);
    if (streaming) {
      if (streamer) put(streamer->end());
      g_out.end_line();
    }
  }
  auto t2 = Clock::now();
  if (beams) first_token = t2;
  const std::vector<int32_t> generated(out.sequences[0].begin() + int64_t(ids.size()),
                                       out.sequences[0].end());
  const std::string text =
      tok ? tok->decode(generated, {.skip_special_tokens = true}) : std::string();
  const double decode_s = seconds(first_token, t2);
  const double rate = n > 1 && decode_s > 0 ? double(n - 1) / decode_s : 0.0;
  if (a.json) {
    nlohmann::ordered_json j = {{"prompt_ids", ids},
                                {"ids", generated},
                                {"text", text},
                                {"finish_reason", out.finish_reasons[0]},
                                {"seed", seed}};
    if (beams) j["sequences_score"] = out.sequences_scores[0];
    j["timings"] = {{"load_s", seconds(t0, t1)},
                    {"time_to_first_token_s", seconds(t1, first_token)},
                    {"generated_tokens", generated.size()},
                    {"tokens_per_s_after_first", rate}};
    // Invalid UTF-8 in the text becomes U+FFFD rather than an exception.
    g_out.write(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  } else if (beams && tok) {
    g_out.write((a.chat || !a.prompt_ids.empty() ? "" : prompt) + text);
    g_out.end_line();
  } else if (beams) {
    std::string listed;
    for (int32_t id : generated) listed += (listed.empty() ? "" : ",") + std::to_string(id);
    g_out.write(listed + "\n");
  }
  if (a.verbose) {
    auto st = lm.compile_stats();
    std::fprintf(stderr,
                 "tformers: load %.3f s; prompt %zu tokens, time to first token %.3f s; %zu "
                 "tokens at %.1f tokens/s after the first; finish reason %s; compiles %llu, "
                 "cache hits %llu\n",
                 seconds(t0, t1), ids.size(), seconds(t1, first_token), generated.size(), rate,
                 out.finish_reasons[0].c_str(), (unsigned long long)st.compiles,
                 (unsigned long long)st.hits);
  }
  return 0;
}

// One line of chat input with the prompt shown; false at end of input. On a terminal with
// libedit, the line can be edited and earlier lines recalled.
bool read_line(std::string& line) {
#ifdef TFORMERS_HAVE_LIBEDIT
  if (isatty(STDIN_FILENO)) {
    char* got = readline("> ");
    if (!got) return false;
    line = got;
    std::free(got);
    if (!line.empty()) add_history(line.c_str());
    return true;
  }
#endif
  g_out.write("> ");
  if (!std::getline(std::cin, line)) return false;
  g_out.line_entered();
  return true;
}

void on_sigint(int) { g_interrupted = 1; }

void set_sigint(void (*handler)(int)) {
  struct sigaction sa = {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);  // no SA_RESTART: a read in progress returns
}

// An interactive multi-turn chat. Each turn renders the conversation through the chat template
// and streams the reply. The session has one static cache of --ctx-size positions, so every turn
// reuses the compiled decode step, and prefill steps are shared by all prompts of a length
// bucket; old turns are dropped (the system message kept) when the history outgrows it. Turn i
// samples with the session seed + i: reproducible from one seed, without repeating replies.
// Commands: /reset clears the history, /exit (or end of input, or Ctrl-C at the prompt) quits;
// Ctrl-C during a reply stops it.
int cmd_chat(const GenerateArgs& a) {
  check_args(a);
  quiet_other_ranks(a);
  tformers::Tokenizer tok = tformers::AutoTokenizer::from_pretrained(a.model, a.revision);
  if (tok.chat_template().empty())
    throw tformers::InvalidArgumentError("chat: " + a.model +
                                         " has no chat_template in tokenizer_config.json; use "
                                         "`tformers generate` for plain text");
  tformers::CausalLM lm = load_model(a);
  const int64_t positions = lm.config().max_position_embeddings;
  const int64_t ctx = a.ctx_size.value_or(std::min<int64_t>(positions, 4096));
  if (ctx > positions)
    throw tformers::InvalidArgumentError("chat: --ctx-size " + std::to_string(ctx) +
                                         " is more than the model's " + std::to_string(positions) +
                                         " positions; give at most " + std::to_string(positions));
  tformers::GenerationConfig gc = generation_config(a);
  // Without a limit a reply could fill the whole context; 256 tokens is a long answer.
  if (!gc.max_new_tokens)
    gc.max_new_tokens =
        lm.generation_config().max_new_tokens.value_or(std::min<int64_t>(256, ctx / 2));
  const int64_t max_new = *gc.max_new_tokens;
  if (max_new >= ctx)
    throw tformers::InvalidArgumentError("chat: --max-new-tokens " + std::to_string(max_new) +
                                         " leaves no room for the prompt in " + "a context of " +
                                         std::to_string(ctx) + "; lower it or raise --ctx-size");
  gc.max_cache_len = ctx;
  // Bad settings fail here, before the first prompt, rather than after the user's first line.
  tformers::resolve(lm.generation_config().merged_with(gc), 1, lm.config().vocab_size, positions);
  const std::optional<uint64_t> set_seed = gc.seed ? gc.seed : lm.generation_config().seed;
  const uint64_t session_seed = set_seed ? *set_seed : random_seed();
  if (a.verbose)
    std::fprintf(stderr,
                 "tformers: chat: context %lld tokens, up to %lld new per reply, seed %llu\n",
                 (long long)ctx, (long long)max_new, (unsigned long long)session_seed);

  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  auto reset = [&] {
    messages = nlohmann::ordered_json::array();
    if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
  };
  auto render = [&] {
    return tok.encode(tok.apply_chat_template(messages, /*add_generation_prompt=*/true), false);
  };
  reset();
  const size_t first_turn = a.system.empty() ? 0 : 1;
  std::string line;
  for (uint64_t turn = 0;; ++turn) {
    set_sigint(SIG_DFL);  // Ctrl-C at the prompt quits
    if (!read_line(line) || line == "/exit") break;
    if (line == "/reset") {
      reset();
      std::fprintf(stderr, "tformers: chat: history cleared%s\n",
                   a.system.empty() ? "" : " (the system message is kept)");
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    std::vector<int32_t> ids = render();
    // Drop the oldest turns (a user message and the reply to it), never the system message or
    // the new message, until the prompt and a full reply fit in the context.
    size_t dropped = 0;
    while (int64_t(ids.size()) + max_new > ctx && messages.size() > first_turn + 1) {
      do {
        messages.erase(messages.begin() + int64_t(first_turn));
        ++dropped;
      } while (messages.size() > first_turn + 1 && messages[first_turn]["role"] != "user");
      ids = render();
    }
    if (dropped)
      std::fprintf(stderr,
                   "tformers: chat: dropped the %zu oldest message%s to fit the context of %lld "
                   "tokens (--ctx-size)\n",
                   dropped, dropped == 1 ? "" : "s", (long long)ctx);
    if (int64_t(ids.size()) + max_new > ctx) {
      std::fprintf(stderr,
                   "tformers: chat: this message is %zu tokens with the template; with %lld new "
                   "tokens it does not fit a context of %lld; write a shorter one, or raise "
                   "--ctx-size or lower --max-new-tokens\n",
                   ids.size(), (long long)max_new, (long long)ctx);
      messages.erase(messages.end() - 1);
      continue;
    }
    gc.seed = session_seed + turn;
    const tformers::CompileStats before = lm.compile_stats();
    tformers::TokenStreamer streamer(tok, /*skip_special_tokens=*/true);
    std::string reply;
    g_interrupted = 0;
    set_sigint(on_sigint);
    {
      HeldStderr held;
      auto put = [&](const std::string& piece) {
        reply += piece;
        if (!g_out.mid_line()) held.release();
        g_out.write(piece);
        if (!g_out.mid_line()) held.release();
      };
      tformers::generate(
          lm, {ids}, gc,
          [&](int64_t, int32_t id) {
            put(streamer.put(id));
            return !g_interrupted;
          },
          &tok);
      put(streamer.end());
      g_out.end_line();
    }
    if (g_interrupted) std::fprintf(stderr, "tformers: chat: reply stopped (Ctrl-C)\n");
    messages.push_back({{"role", "assistant"}, {"content", reply}});
    if (a.verbose) {
      const tformers::CompileStats now = lm.compile_stats();
      std::fprintf(stderr, "tformers: chat: prompt %zu tokens; compiles +%llu, cache hits +%llu\n",
                   ids.size(), (unsigned long long)(now.compiles - before.compiles),
                   (unsigned long long)(now.hits - before.hits));
    }
  }
  g_out.end_line();
  return 0;
}

int cmd_tokenize(const std::string& model, const std::string& revision, const std::string& text,
                 bool special) {
  tformers::Tokenizer tok = tformers::AutoTokenizer::from_pretrained(model, revision);
  std::vector<int32_t> ids = tok.encode(text, special);
  std::vector<std::string> pieces = tok.convert_ids_to_tokens(ids);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? "," : "") + std::to_string(ids[i]);
  std::printf("ids: %s\n", line.c_str());
  // Pieces come from tokenizer.json: control bytes in them are shown, not sent to the terminal.
  for (size_t i = 0; i < ids.size(); ++i)
    std::printf("%8d  %s\n", ids[i], escape_for_terminal(pieces[i]).c_str());
  return 0;
}

const char* const kLaunchUsage =
    R"(tformers launch: start one process per chip through mpirun, as torchrun does

usage: tformers launch --nproc-per-node N [options] -- CMD [ARGS...]

options:
  --nproc-per-node N  processes on this node, one per chip (required)
  --nnodes M          nodes in all (default 1); more than one needs --hostfile
  --node-rank R       this node's index in 0..M-1 (default 0); node 0 starts every process
  --master-addr A     address of node 0 (default 127.0.0.1), exported as MASTER_ADDR
  --master-port P     port on node 0 (default 29500), exported as MASTER_PORT
  --hostfile F        Open MPI hostfile listing the nodes
  --verbose-all-ranks every rank writes diagnostics to stderr (default: rank 0 only)
  -h, --help          show this help

Each process runs CMD with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set, its chip visible as device 0 (CUDA_VISIBLE_DEVICES, TPU_VISIBLE_CHIPS), and
TFORMERS_NUM_THREADS set to its share of the cores unless already set. mpirun runs with
--allow-run-as-root when run as root and --oversubscribe when N exceeds the cores. Only rank 0
writes text and diagnostics unless --verbose-all-ranks is given (here or to generate or chat);
errors are written by every rank.

example:
  tformers launch --nproc-per-node 2 -- build/release/tformers generate -m DIR --prompt "Hi" --tp 2
)";

// `launch --help` (before `--`) gets the full usage; everything else is the launcher's.
bool wants_launch_help(int argc, char** argv) {
  for (int i = 2; i < argc && std::string_view(argv[i]) != "--"; ++i)
    if (std::string_view(argv[i]) == "-h" || std::string_view(argv[i]) == "--help") return true;
  return false;
}

// Takes `--verbose-all-ranks` out of launch's own options (before `--`) and passes it to the
// ranks through the environment they inherit. Returns the new argc.
int take_verbose_all_ranks(int argc, char** argv) {
  for (int i = 2; i < argc && std::string_view(argv[i]) != "--"; ++i)
    if (std::string_view(argv[i]) == "--verbose-all-ranks") {
      setenv(kVerboseAllRanksEnv, "1", 1);
      std::copy(argv + i + 1, argv + argc, argv + i);
      return argc - 1;
    }
  return argc;
}

int fail(const std::string& message) {
  g_out.end_line();
  const std::string line = "error: " + escape_for_terminal(message) + "\n";
  // A failed write has nowhere left to be reported.
  [[maybe_unused]] const ssize_t written = ::write(g_error_fd, line.data(), line.size());
  return 1;
}

int run(int argc, char** argv) {
  CLI::App app{"tformers: run Hugging Face causal language models natively"};
  app.set_version_flag("--version", std::string("tformers ") + TFORMERS_VERSION,
                       "Print the version and exit");
  app.require_subcommand(1);
  int64_t threads = 0;
  const std::string threads_help = "CPU threads, 1 to " + std::to_string(kMaxThreads) +
                                   " (default: TFORMERS_NUM_THREADS or all cores)";
  app.add_option("--threads", threads, threads_help);

  CLI::App* env =
      app.add_subcommand("env", "Print the version, CPU features, backends and accelerators");
  app.add_subcommand("launch", tformers::distributed::kLaunchHelp)->allow_extras();

  GenerateArgs g;
  CLI::App* gen = app.add_subcommand("generate", "Generate text from a prompt");
  CLI::App* chat = app.add_subcommand("chat", "Chat with a model, turn by turn, in the terminal");
  std::string tok_model, tok_revision = "main", tok_text;
  bool tok_special = false;
  CLI::App* tokz = app.add_subcommand("tokenize", "Show the token ids and pieces of a text");
  for (CLI::App* sub : {gen, chat, tokz}) sub->add_option("--threads", threads, threads_help);
  for (CLI::App* sub : {gen, chat}) {
    sub->add_option("--model,-m", g.model, "Model folder or Hub id in the local cache")->required();
    sub->add_option("--revision", g.revision,
                    "Hub revision (branch, tag or commit) of a cached model")
        ->capture_default_str();
    sub->add_option("--system", g.system, "System message");
    sub->add_option("--max-new-tokens,-n", g.max_new_tokens,
                    "Tokens to generate (generate: default from generation_config.json, else up "
                    "to 20 in all; chat: 256 per reply)");
    sub->add_flag("--do-sample", g.do_sample, "Sample instead of greedy decoding");
    sub->add_option("--temperature", g.temperature,
                    "Sampling temperature (1: unchanged); 0 means greedy decoding");
    sub->add_option("--top-k", g.top_k, "Sample from the K most likely tokens only (0: all)");
    sub->add_option("--top-p", g.top_p,
                    "Sample from the smallest set of tokens whose probability reaches P (1: all)");
    sub->add_option("--min-p", g.min_p, "Drop tokens less likely than P times the most likely one");
    sub->add_option("--typical-p", g.typical_p, "Locally typical sampling mass (1: off)");
    sub->add_option("--repetition-penalty", g.repetition_penalty,
                    "Divide the scores of tokens already seen by this (1: off)");
    sub->add_option("--no-repeat-ngram-size", g.no_repeat_ngram_size,
                    "Never repeat an n-gram of this size (0: off)");
    sub->add_option("--seed", g.seed,
                    "Sampling seed: the same seed gives the same text; -1 draws a fresh one "
                    "(shown with --verbose)");
    sub->add_option("--stop", g.stop, "Stop when the text contains STR (repeatable)")
        ->allow_extra_args(false);
    sub->add_flag("--ignore-eos", g.ignore_eos,
                  "Keep generating past end-of-sequence tokens, up to --max-new-tokens");
    sub->add_option("--ctx-size,--max-cache-len,-c", g.ctx_size,
                    "KV cache positions (max_cache_len; chat: the whole conversation, default "
                    "the model's positions up to 4096)");
    sub->add_option("--dtype", g.dtype,
                    "float32 or bfloat16 (default: the checkpoint's torch_dtype)");
    sub->add_option("--device", g.device, "cpu, auto, tpu or cuda")->capture_default_str();
    sub->add_option("--quantize", g.quantize,
                    "int8: weight-only int8 linears, one scale per 32 weights (as Q8_0)");
    sub->add_option("--load-mode", g.load_mode,
                    "copy: weights in anonymous huge-page memory (fast decode); mmap: use the "
                    "checkpoint's mapping (instant load, low memory)")
        ->check(CLI::IsMember({"copy", "mmap"}))
        ->capture_default_str();
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
  gen->add_option("--num-beams", g.num_beams, "Beam search with N beams (1: off)");
  gen->add_option("--length-penalty", g.length_penalty,
                  "Beam search: scores are divided by length ** this (default 1)");
  gen->add_option("--early-stopping", g.early_stopping,
                  "Beam search: stop at num_beams finished (true), when no beam is likely to "
                  "improve (false, default) or when none can (never)")
      ->check(CLI::IsMember({"true", "false", "never"}));
  gen->add_option("--tp", g.tp, "Split the model over N processes (run under tformers launch)");
  gen->add_option("--tp-plan", g.tp_plan,
                  "Tensor-parallel overrides as a JSON object, e.g. "
                  "'{\"layers.*.self_attn.q_proj\": \"replicated_with_grad_allreduce\"}'");

  tokz->add_option("--model,-m", tok_model, "Model folder or Hub id in the local cache")
      ->required();
  tokz->add_option("--revision", tok_revision, "Hub revision of a cached model")
      ->capture_default_str();
  tokz->add_option("text", tok_text, "Text to tokenize")->required();
  tokz->add_flag("--add-special-tokens", tok_special, "Add the post-processor's special tokens");

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
      return fail("unknown subcommand '" + std::string(argv[1]) + "'; the subcommands are " +
                  names + " (tformers --help shows them)");
    }
  }
  CLI11_PARSE(app, argc, argv);
  if (threads != 0) {
    if (threads < 1 || threads > kMaxThreads)
      throw tformers::InvalidArgumentError(
          "--threads " + std::to_string(threads) + " is out of range: give 1 to " +
          std::to_string(kMaxThreads) + " (this machine has " +
          std::to_string(std::thread::hardware_concurrency()) + " cores)");
    tformers::ThreadPool::set_global_threads(int(threads));
  }
  if (env->parsed()) return cmd_env();
  if (kernels->parsed()) return tformers::kernels_hub::kernels_cli(kernels->remaining());
  if (gen->parsed()) return cmd_generate(g);
  if (chat->parsed()) return cmd_chat(g);
  if (tokz->parsed()) return cmd_tokenize(tok_model, tok_revision, tok_text, tok_special);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // `launch` takes a command after `--`, so it parses its own arguments.
  if (argc > 1 && tformers::distributed::is_launcher_command(argv[1])) {
    if (std::string_view(argv[1]) == "launch" && wants_launch_help(argc, argv)) {
      std::fputs(kLaunchUsage, stdout);
      return 0;
    }
    if (std::string_view(argv[1]) == "launch") argc = take_verbose_all_ranks(argc, argv);
    return tformers::distributed::launcher_main(argc - 1, argv + 1);
  }
  // Every failure is one line on stderr and exit status 1; under mpirun, fail() of the
  // distributed layer also ends the other ranks, so none waits for this one.
  try {
    return run(argc, argv);
  } catch (...) {
    return tformers::distributed::fail(fail(tformers::cli::current_error_message()));
  }
}
