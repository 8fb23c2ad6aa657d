// The `tformers` command: generate, chat, tokenize, bench, perplexity, serve, env, launch,
// kernels.
//
// Streams: stdout carries only generated text (or --json, or the listing a command asks for);
// everything else goes to stderr on its own lines. While text streams, stderr is held back and
// written out whenever stdout reaches the start of a line (HeldStderr), so a compile note or a
// warning never lands inside a line of text. Arguments are checked, and the model's generation
// config resolved, before anything is printed.
#include <algorithm>
#include <cctype>
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
#include <poll.h>
#include <unistd.h>

#include <cerrno>

#ifdef TFORMERS_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

#include "chat_reply.h"
#include "cli.h"
#include "compile.h"
#include "core/cpu_features.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "distributed/launcher.h"
#include "distributed/process_group.h"
#include "errors.h"
#include "eval.h"
#include "io/file.h"
#include "io/hub.h"
#include "kernels_hub/cli.h"
#include "quantize.h"
#include "serve/openai.h"
#include "serve/reasoning.h"
#include "serve/server.h"
#include "terminal.h"
#include "tformers/accelerator.h"
#include "tformers/distributed.h"
#include "tformers/error.h"
#include "tformers/model.h"
#include "tformers/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
using tformers::cli::chat_template_from;
using tformers::cli::check_args;
using tformers::cli::escape_for_terminal;
using tformers::cli::GenerateArgs;
using tformers::cli::generation_config;
using tformers::cli::HeldStderr;
using tformers::cli::parse_ids;
using tformers::cli::random_seed;

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

// Set by `launch --verbose-all-ranks` for the ranks it starts, which inherit it.
constexpr const char* kVerboseAllRanksEnv = "TFORMERS_VERBOSE_ALL_RANKS";

// A prompt file: a regular file (never a FIFO or device) of at most this many bytes.
constexpr uint64_t kMaxPromptFileBytes = uint64_t(64) << 20;
// Bytes of text per token of the context: more than any real text spends on a token (English
// averages about 4), so a longer chat line or prompt file could never fit and is refused unread.
constexpr uint64_t kBytesPerToken = 32;

// Under tformers launch every rank runs the same command; only rank 0 prints, and its stderr is
// the only one unless --verbose-all-ranks.
void quiet_other_ranks(const GenerateArgs& a) {
  if (!tformers::distributed::launched_by_mpi()) return;
  // Why the distributed layer ends the job (a stopped rank: a collective got no answer) must
  // reach the user: on rank 0 past the HeldStderr in force (released first), on the others
  // past the /dev/null below.
  tformers::distributed::set_fatal_output(::dup(2), &HeldStderr::release_active);
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

int cmd_env(bool json) {
  if (json) {
    const nlohmann::ordered_json out = {
        {"version", TFORMERS_VERSION},
        {"cpu_features", std::string(tformers::cpu::feature_string())},
        {"backends", tformers::accelerator::describe_backends()},
        {"accelerator_available", tformers::accelerator::is_available()},
        {"architectures", tformers::supported_architectures()}};
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
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

// Loads the model, with a progress bar on a terminal when that takes more than half a second.
tformers::CausalLM load_model(const GenerateArgs& a) {
  tformers::LoadOptions opt;
  opt.device_map = a.device;
  opt.revision = a.revision;
  opt.verbose = a.verbose;
  opt.quantize = a.quantize;
  opt.load_mode = a.load_mode;
  opt.dtype = tformers::cli::parse_dtype_flag(a.dtype);
  opt.distributed_config = tformers::cli::distributed_config(a.tp, a.tp_plan);
  tformers::ProgressBar bar(stderr,
                            isatty(fileno(stderr)) && tformers::distributed::is_main_process());
  opt.progress = [&bar](std::string_view stage, int64_t done, int64_t total) {
    bar.update(stage, done, total);
  };
  tformers::CausalLM lm = tformers::AutoModelForCausalLM::from_pretrained(a.model, opt);
  if (a.use_kernels) tformers::cli::use_hub_kernels(lm);
  return lm;
}

// --assistant-model's model, loaded as the model is (dtype, device, quantization).
std::optional<tformers::CausalLM> load_assistant(const GenerateArgs& a) {
  if (a.assistant_model.empty()) return std::nullopt;
  GenerateArgs draft = a;
  draft.model = a.assistant_model;
  draft.revision = "main";
  return load_model(draft);
}

double seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// The text of an opened prompt file, unless it is longer than a context of `positions` tokens
// could hold.
std::string read_prompt_file(const tformers::io::RegularFile& file, int64_t positions) {
  const uint64_t most = uint64_t(std::max<int64_t>(positions, 1)) * kBytesPerToken;
  if (file.size() > most)
    throw tformers::InvalidArgumentError(
        "generate: --file prompt " + file.path() + " is " + std::to_string(file.size()) +
        " bytes, more than the model's context of " + std::to_string(positions) +
        " tokens (max_position_embeddings) can hold (at most " + std::to_string(most) +
        " bytes of text at " + std::to_string(kBytesPerToken) +
        " bytes a token); give the part of it the prompt needs");
  return file.read_all();
}

int cmd_generate(const GenerateArgs& a) {
  check_args(a);
  if (int(!a.prompt.empty()) + int(!a.prompt_file.empty()) + int(!a.prompt_ids.empty()) != 1)
    throw tformers::cli::UsageError(
        "generate: give exactly one of --prompt, --file and --prompt-ids");
  quiet_other_ranks(a);
  // A prompt file is opened (and checked to be a regular file) before the model loads, and read
  // once the model's context says how much of it could be used.
  std::optional<tformers::io::RegularFile> prompt_file;
  if (!a.prompt_file.empty())
    prompt_file.emplace(a.prompt_file, kMaxPromptFileBytes, "--file prompt");
  auto t0 = Clock::now();
  std::optional<tformers::Tokenizer> tok = maybe_tokenizer(a.model, a.revision);
  if (tok && !a.chat_template.empty()) tok->set_chat_template(chat_template_from(a.chat_template));
  if (a.prompt_ids.empty() && !tok)
    throw tformers::NotFoundError("generate: " + a.model +
                                  " has no tokenizer.json, so a text prompt cannot be encoded; "
                                  "use --prompt-ids");
  if (!a.stop.empty() && !tok)
    throw tformers::InvalidArgumentError(
        "generate: --stop needs the model's tokenizer.json to read the text; " + a.model +
        " has none");
  tformers::CausalLM lm = load_model(a);
  std::optional<tformers::CausalLM> assistant = load_assistant(a);
  auto t1 = Clock::now();
  const std::string prompt =
      prompt_file ? read_prompt_file(*prompt_file, lm.config().max_position_embeddings) : a.prompt;
  std::vector<int32_t> ids;
  if (!a.prompt_ids.empty()) {
    ids = parse_ids(a.prompt_ids);
  } else {
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
                             tok ? &*tok : nullptr, {}, nullptr, assistant ? &*assistant : nullptr);
    if (streaming) {
      if (streamer) put(streamer->end());
      g_out.end_line();
    }
  }
  if (a.verbose && out.draft_tokens > 0)
    std::fprintf(stderr, "tformers: %s: kept %lld of %lld proposed tokens (%.0f %%)\n",
                 assistant ? "assistant" : "prompt lookup", (long long)out.accepted_draft_tokens,
                 (long long)out.draft_tokens,
                 100.0 * double(out.accepted_draft_tokens) / double(out.draft_tokens));
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
    if (out.draft_tokens > 0) {
      j["draft_tokens"] = out.draft_tokens;
      j["accepted_draft_tokens"] = out.accepted_draft_tokens;
    }
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
    std::fprintf(
        stderr,
        "tformers: load %.3f s; prompt %zu tokens, time to first token %.3f s; %zu "
        "tokens at %.1f tokens/s after the first; finish reason %s; compiles %llu%s, "
        "cache hits %llu\n",
        seconds(t0, t1), ids.size(), seconds(t1, first_token), generated.size(), rate,
        out.finish_reasons[0].c_str(), (unsigned long long)st.compiles,
        st.loaded ? (" (" + std::to_string(st.loaded) + " loaded from the compile cache)").c_str()
                  : "",
        (unsigned long long)st.hits);
  }
  return 0;
}

void on_sigint(int) { g_interrupted = 1; }

void set_sigint(void (*handler)(int)) {
  struct sigaction sa = {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);  // no SA_RESTART: a read in progress returns
}

#ifdef TFORMERS_HAVE_LIBEDIT
bool g_line_discarded = false;  // Ctrl-C ended the line being read

// libedit reads the prompt's keys through this. Ctrl-C (on_sigint sets g_interrupted): the
// half-typed line is entered and then dropped (an empty line, which
// the chat loop skips), so the session goes on at a fresh prompt, as a shell's does.
int prompt_getc(FILE*) {
  for (;;) {
    if (g_interrupted) {
      g_interrupted = 0;
      // Entered, so readline returns; read_line then drops what it returns.
      g_line_discarded = true;
      return '\n';
    }
    // Polled in short waits, not one blocking read: a Ctrl-C that lands while libedit is busy
    // between two reads interrupts no read, and would otherwise wait for the next key.
    pollfd pfd{STDIN_FILENO, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, 100);
    if (ready == 0 || (ready < 0 && errno == EINTR)) continue;
    if (ready < 0) return EOF;
    unsigned char c = 0;
    const ssize_t n = ::read(STDIN_FILENO, &c, 1);
    if (n == 1) return c;
    if (n < 0 && errno == EINTR) continue;
    return EOF;
  }
}
#endif

// What is wrong with a chat line longer than `max_bytes`.
std::string long_line(uint64_t max_bytes) {
  return "chat: a line of input is longer than " + std::to_string(max_bytes) +
         " bytes, more than the context (--ctx-size) can hold";
}

// A line of chat input longer than `max_bytes`: off a terminal (a pipe, a file, /dev/zero) an
// error, before more of it is read; on a terminal the rest of the typed or pasted line is
// skipped and the session goes on at a fresh prompt.
void refuse_long_line(bool terminal, uint64_t max_bytes) {
  const std::string what = long_line(max_bytes);
  if (!terminal)
    throw tformers::InvalidArgumentError(what + "; send shorter messages, or raise --ctx-size");
  for (int c = std::getc(stdin); c != EOF && c != '\n';) c = std::getc(stdin);
  std::fprintf(stderr, "tformers: %s; it was skipped\n", what.c_str());
}

// Reads one line of at most `max_bytes` from stdin, so that an endless line never grows past
// that (refuse_long_line; an empty line then); the newline is dropped. False when nothing was
// read: end of input, an error, or a read interrupted by a signal.
bool read_bounded_line(std::string& line, uint64_t max_bytes, bool terminal) {
  line.clear();
  for (int c = std::getc(stdin); c != EOF; c = std::getc(stdin)) {
    if (c == '\n') return true;
    if (line.size() == max_bytes) {
      refuse_long_line(terminal, max_bytes);
      line.clear();
      return true;
    }
    line += char(c);
  }
  return !line.empty();
}

// One line of chat input with the prompt shown; false at end of input (Ctrl-D), after ending
// the prompt's line so that the shell's prompt starts on its own. On a terminal, Ctrl-C
// discards the line being typed and gives an empty one; with libedit, the line can be edited
// and earlier lines recalled. A line over `max_bytes` is refused (refuse_long_line).
bool read_line(std::string& line, uint64_t max_bytes) {
  const bool terminal = isatty(STDIN_FILENO);
  g_interrupted = 0;
  // Off a terminal there is no line being typed: Ctrl-C (SIGINT) ends the program as usual.
  set_sigint(terminal ? on_sigint : SIG_DFL);
#ifdef TFORMERS_HAVE_LIBEDIT
  if (terminal) {
    rl_catch_signals = 0;  // our handler, not libedit's, sees SIGINT
    rl_getc_function = prompt_getc;
    g_line_discarded = false;
    // What was typed while the reply streamed waits in the terminal's canonical queue. A Ctrl-D
    // there is an end-of-file mark, which libedit's raw mode would read as a NUL (and the
    // session would not end), so a whole line or that mark is taken here, as a canonical read
    // gives it: one line, or 0 bytes for the mark. Half a line is left for libedit to edit.
    pollfd pending{STDIN_FILENO, POLLIN, 0};
    if (::poll(&pending, 1, 0) == 1) {
      char typed[4096];
      const ssize_t n = ::read(STDIN_FILENO, typed, sizeof typed);
      if (n <= 0) {
        g_out.write("> \n");
        return false;
      }
      line.assign(typed, size_t(n));
      if (line.back() == '\n') line.pop_back();
      g_out.write("> " + line + "\n");
      if (!line.empty()) add_history(line.c_str());
      return true;
    }
    char* got = readline("> ");
    if (!got) {
      g_out.write("\n");
      return false;
    }
    line = g_line_discarded ? std::string() : std::string(got);
    std::free(got);
    if (line.size() > max_bytes) {
      std::fprintf(stderr, "tformers: %s; it was skipped\n", long_line(max_bytes).c_str());
      line.clear();
    }
    if (!line.empty()) add_history(line.c_str());
    return true;
  }
#endif
  g_out.write("> ");
  if (!read_bounded_line(line, max_bytes, terminal)) {
    if (!terminal || !g_interrupted) return false;
    // The terminal dropped the typed line itself (canonical mode flushes input on SIGINT).
    std::clearerr(stdin);
    g_out.write("\n");
    line.clear();
    return true;
  }
  g_out.line_entered();
  return true;
}

// An interactive multi-turn chat. Each turn renders the conversation through the chat template
// and streams the reply. The session has one static cache of --ctx-size positions, so every turn
// reuses the compiled decode step, and prefill steps are shared by all prompts of a length
// bucket. The cache is kept between turns (KeptCache): a turn computes only the tokens after
// what the last one left there, usually the reply as the template renders it and the new
// message. Old turns are dropped (the system message kept) when the history outgrows it. Turn i
// samples with the session seed + i: reproducible from one seed, without repeating replies.
// Commands (kChatHelp): /help, /reset clears the history, /exit or /quit (or end of input)
// quits; Ctrl-C during a reply stops it, at the prompt it discards the line being typed. A
// reasoning model's reasoning is shown apart from its answer (chat_reply.h).
const char* const kChatHelp =
    "tformers: chat: commands: /help shows this; /reset clears the history (the system message "
    "is kept); /exit or /quit ends the session, as Ctrl-D does. Ctrl-C stops a reply, and at "
    "the prompt discards the line being typed. Any other line is a message (start it with a "
    "space to send one that begins with /).\n";

// The command a chat line starts with: "/" and letters as its first word ("/foo", "/save x"),
// else "" (a message, such as "/usr/bin is where?" or " /help").
std::string chat_command(const std::string& line) {
  const std::string word = line.substr(0, line.find_first_of(" \t"));
  if (word.size() < 2 || word[0] != '/') return "";
  const bool letters =
      std::all_of(word.begin() + 1, word.end(), [](unsigned char c) { return std::isalpha(c); });
  return letters ? word : "";
}

// How chat shows a model's replies: the reasoning format its template teaches, the markers the
// output text must keep for the parser to see it, and how the reasoning is shown.
struct ReplyFormat {
  tformers::serve::ReasoningFormat reasoning;
  tformers::serve::KeptTokens kept;
  tformers::cli::ReasoningShown shown;
};

ReplyFormat reply_format(const tformers::Tokenizer& tok, bool hide_reasoning) {
  using tformers::cli::ReasoningShown;
  const tformers::serve::ReasoningFormat format = tformers::serve::detect_reasoning_format(tok);
  const ReasoningShown shown = hide_reasoning ? ReasoningShown::kHidden
                               : tformers::cli::styled_terminal(STDOUT_FILENO)
                                   ? ReasoningShown::kDimmed
                                   : ReasoningShown::kPlain;
  return {format, tformers::serve::kept_reasoning_tokens(format, tok), shown};
}

struct Reply {
  nlohmann::ordered_json message;  // for the history
  int64_t reused = 0;              // prompt tokens the kept cache held
};

// Generates and streams one chat reply to stdout until its end or a Ctrl-C. Diagnostics are held
// while it streams and let out whenever stdout is at the start of a line.
Reply stream_reply(tformers::CausalLM& lm, const tformers::Tokenizer& tok,
                   const std::vector<int32_t>& ids, const tformers::GenerationConfig& gc,
                   const ReplyFormat& format, tformers::KeptCache& kept,
                   tformers::CausalLM* assistant) {
  const bool think_open = format.reasoning == tformers::serve::ReasoningFormat::kThink &&
                          tformers::serve::prompt_opens_think(ids, tok);
  tformers::serve::OutputText text(tok, {}, format.kept);
  g_interrupted = 0;
  set_sigint(on_sigint);
  HeldStderr held;
  tformers::cli::ChatReply reply(format.reasoning, think_open, format.shown,
                                 [&](std::string_view piece) {
                                   if (!g_out.mid_line()) held.release();
                                   g_out.write(piece);
                                   if (!g_out.mid_line()) held.release();
                                 });
  const tformers::GenerateOutput out = tformers::generate(
      lm, {ids}, gc,
      [&](int64_t, int32_t id) {
        reply.put(text.put(id));
        return !g_interrupted;
      },
      &tok, {}, &kept, assistant);
  reply.put(text.finish());
  reply.finish();
  g_out.end_line();
  // A reasoning model can spend the whole reply on its reasoning, which --hide-reasoning leaves
  // as no reply at all.
  if (out.finish_reasons[0] == "length" && reply.only_reasoning())
    std::fprintf(stderr,
                 "tformers: chat: the reply reached --max-new-tokens (%lld) in its reasoning, "
                 "before an answer; raise it for room to answer\n",
                 (long long)*gc.max_new_tokens);
  return {reply.message(), out.cached_prompt_tokens};
}

int cmd_chat(const GenerateArgs& a) {
  check_args(a);
  quiet_other_ranks(a);
  tformers::Tokenizer tok = tformers::AutoTokenizer::from_pretrained(a.model, a.revision);
  if (!a.chat_template.empty()) tok.set_chat_template(chat_template_from(a.chat_template));
  if (tok.chat_template().empty())
    throw tformers::InvalidArgumentError("chat: " + a.model +
                                         " has no chat template (neither chat_template.jinja "
                                         "nor a chat_template in tokenizer_config.json); use "
                                         "`tformers generate` for plain text");
  const ReplyFormat format = reply_format(tok, a.hide_reasoning);
  tformers::CausalLM lm = load_model(a);
  std::optional<tformers::CausalLM> assistant = load_assistant(a);
  const int64_t positions = lm.config().max_position_embeddings;
  const int64_t ctx = a.ctx_size.value_or(std::min<int64_t>(positions, 4096));
  if (ctx > positions)
    throw tformers::InvalidArgumentError("chat: --ctx-size " + std::to_string(ctx) +
                                         " is more than the model's " + std::to_string(positions) +
                                         " positions; give at most " + std::to_string(positions));
  tformers::GenerationConfig gc = generation_config(a);
  // Without a limit a reply could fill the whole context; 256 tokens is a long answer. The
  // --max-new-tokens help states this rule.
  if (!gc.max_new_tokens)
    gc.max_new_tokens =
        lm.generation_config().max_new_tokens.value_or(std::min<int64_t>(256, ctx / 2));
  const int64_t max_new = *gc.max_new_tokens;
  if (max_new >= ctx)
    throw tformers::InvalidArgumentError("chat: --max-new-tokens " + std::to_string(max_new) +
                                         " leaves no room for the prompt in " + "a context of " +
                                         std::to_string(ctx) + "; lower it or raise --ctx-size");
  gc.max_cache_len = ctx;
  // A harmony reply ends at <|return|> or <|call|>, whatever generation_config.json lists.
  if (format.reasoning == tformers::serve::ReasoningFormat::kHarmony && !gc.eos_token_id)
    gc.eos_token_id = tformers::serve::harmony_eos_ids(
        tok, lm.generation_config().eos_token_id.value_or(std::vector<int64_t>{}));
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
  tformers::KeptCache kept;
  const size_t first_turn = a.system.empty() ? 0 : 1;
  std::string line;
  for (uint64_t turn = 0;; ++turn) {
    if (!read_line(line, uint64_t(ctx) * kBytesPerToken) || line == "/exit" || line == "/quit")
      break;
    if (line == "/help") {
      std::fputs(kChatHelp, stderr);
      continue;
    }
    if (line == "/reset") {
      reset();
      std::fprintf(stderr, "tformers: chat: history cleared%s\n",
                   a.system.empty() ? "" : " (the system message is kept)");
      continue;
    }
    if (line.empty()) continue;
    if (const std::string command = chat_command(line); !command.empty()) {
      std::fprintf(stderr,
                   "tformers: chat: unknown command %s (/help lists them); to send a message "
                   "that starts with /, start it with a space\n",
                   escape_for_terminal(command).c_str());
      continue;
    }
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
    Reply reply = stream_reply(lm, tok, ids, gc, format, kept, assistant ? &*assistant : nullptr);
    if (g_interrupted) std::fprintf(stderr, "tformers: chat: reply stopped (Ctrl-C)\n");
    messages.push_back(std::move(reply.message));
    if (a.verbose) {
      const tformers::CompileStats now = lm.compile_stats();
      std::fprintf(stderr,
                   "tformers: chat: prompt %zu tokens (%lld kept from the last turn, %lld "
                   "computed); compiles +%llu, cache hits +%llu\n",
                   ids.size(), (long long)reply.reused,
                   (long long)(int64_t(ids.size()) - reply.reused),
                   (unsigned long long)(now.compiles - before.compiles),
                   (unsigned long long)(now.hits - before.hits));
    }
  }
  g_out.end_line();
  return 0;
}

int cmd_tokenize(const tformers::cli::TokenizeArgs& a) {
  tformers::Tokenizer tok = tformers::AutoTokenizer::from_pretrained(a.model, a.revision);
  std::vector<int32_t> ids = tok.encode(a.text, a.add_special_tokens);
  std::vector<std::string> pieces = tok.convert_ids_to_tokens(ids);
  if (a.json) {
    const nlohmann::ordered_json out = {{"ids", ids}, {"tokens", pieces}};
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line += ',';
    line += std::to_string(ids[i]);
  }
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
errors are written by every rank. SIGTERM to launch reaches every rank as SIGUSR1, on which
serve drains its streams and exits; a second SIGTERM ends the job at once.

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

int fail(const std::string& message, int code = 1) {
  g_out.end_line();
  const std::string line = "error: " + escape_for_terminal(message) + "\n";
  // A failed write has nowhere left to be reported.
  [[maybe_unused]] const ssize_t written = ::write(g_error_fd, line.data(), line.size());
  return code;
}

int run(int argc, char** argv) {
  const tformers::cli::CommandLine cl =
      tformers::cli::parse_command_line(argc, argv, std::cout, std::cerr);
  if (cl.command.empty()) return cl.exit_code;
  if (cl.threads != 0) tformers::ThreadPool::set_global_threads(int(cl.threads));
  if (cl.command == "env") return cmd_env(cl.env_json);
  if (cl.command == "kernels") return tformers::kernels_hub::kernels_cli(cl.kernels);
  if (cl.command == "generate") return cmd_generate(cl.generate);
  if (cl.command == "chat") return cmd_chat(cl.generate);
  if (cl.command == "tokenize") return cmd_tokenize(cl.tokenize);
  if (cl.command == "bench") return tformers::cli::run_bench(cl.bench);
  if (cl.command == "perplexity") return tformers::cli::run_perplexity(cl.perplexity);
  if (cl.command == "serve")
    return tformers::serve::run_serve(cl.serve, [](const tformers::cli::ServeArgs& a) {
      return tformers::cli::load_with_progress(a.model, a.device,
                                               tformers::cli::distributed_config(a.tp, a.tp_plan));
    });
  if (cl.command == "quantize") return tformers::cli::run_quantize(cl.quantize);
  if (cl.command == "compile") return tformers::cli::run_compile(cl.compile);
  return 0;  // launch: main() runs it before parsing
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
  // Every failure is one line on stderr and exit status 1 (2 for a usage error); under mpirun,
  // fail() of the distributed layer also ends the other ranks, so none waits for this one.
  try {
    return run(argc, argv);
  } catch (const tformers::cli::UsageError& e) {
    return tformers::distributed::fail(fail(e.what(), tformers::cli::kUsageExitCode));
  } catch (...) {
    return tformers::distributed::fail(fail(tformers::cli::current_error_message()));
  }
}
