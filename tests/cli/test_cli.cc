// The `tformers` command end to end: the README's commands, streams (text on stdout, every
// diagnostic on stderr on its own line), each option, tokenize, env, and errors on bad input.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/error_of.h"
#include "common/missing_dependency.h"
#include "common/run_command.h"
#include "io/json.h"

namespace {

struct CmdResult {
  int status;
  std::string out;
};

// Runs a shell command from the source tree, capturing stdout and stderr.
CmdResult sh(const std::string& cmd) {
  std::string full = "cd " TFORMERS_SOURCE_DIR " && " + cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int st = pclose(p);
  return {WEXITSTATUS(st), out};
}

using tformers::testing::run;
using tformers::testing::Streams;

const std::string kCli = TFORMERS_CLI;
const std::string kKjv = " -m models/kjv-fortunes-tiny";

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string line; std::getline(ss, line);) out.push_back(line);
  return out;
}

// The first command of README.md's first code block.
std::string readme_first_command() {
  std::ifstream in(TFORMERS_SOURCE_DIR "/README.md");
  std::string line;
  bool in_block = false;
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0) {
      in_block = !in_block;
      continue;
    }
    if (in_block && !line.empty() && line[0] != '#') return line;
  }
  return "";
}

TEST(Cli, ReadmeFirstCommandGeneratesText) {
  std::string cmd = readme_first_command();
  ASSERT_NE(cmd.find("tformers generate"), std::string::npos) << cmd;
  // The setup part has already run (this test is built by it); run the command as written.
  CmdResult r = sh(cmd);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("compiles 2"), std::string::npos) << r.out;
}

// Every line of the README's "The command line" block, with `tformers` the built binary and DIR
// the shipped model, run from a folder holding the prompt.txt it names.
TEST(Cli, ReadmeCommandLineExamplesRun) {
  std::ifstream in(TFORMERS_SOURCE_DIR "/README.md");
  std::string line;
  bool in_section = false, in_block = false;
  std::vector<std::string> commands;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) in_section = line == "## The command line";
    if (!in_section) continue;
    if (line.rfind("```", 0) == 0) {
      if (in_block) break;
      in_block = true;
      continue;
    }
    if (in_block) commands.push_back(line.substr(0, line.find("  #")));
  }
  ASSERT_GE(commands.size(), 8u);
  const auto dir =
      std::filesystem::temp_directory_path() / ("tformers_readme_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "prompt.txt") << "And the LORD said";
  for (std::string cmd : commands) {
    ASSERT_EQ(cmd.rfind("tformers ", 0), 0u) << cmd;
    cmd = kCli + cmd.substr(std::string("tformers").size());
    for (size_t p; (p = cmd.find(" DIR")) != std::string::npos;)
      cmd.replace(p, 4, " " TFORMERS_SOURCE_DIR "/models/kjv-fortunes-tiny");
    Streams r = run("cd " + dir.string() + " && " + cmd);
    EXPECT_EQ(r.status, 0) << cmd << "\n" << r.out << r.err;
    EXPECT_FALSE(r.out.empty()) << cmd << "\n" << r.err;
  }
  std::filesystem::remove_all(dir);
}

// The issue's example: stdout is exactly the prompt and its continuation; the compile notes and
// statistics are on stderr, after the text. Through one pipe (2>&1) no diagnostic starts
// mid-line.
TEST(Cli, StdoutHoldsOnlyTextAndDiagnosticsKeepToTheirOwnLines) {
  const std::string cmd =
      kCli + " generate" + kKjv + " --prompt 'And the LORD said' -n 40 --seed 0 --verbose";
  Streams r = run(cmd);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.rfind("And the LORD said", 0), 0u) << r.out;
  EXPECT_EQ(r.out.find("tformers"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_NE(r.err.find("compiled step"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("compiles 2, cache hits 0"), std::string::npos) << r.err;
  for (const std::string& l : lines_of(r.err)) EXPECT_EQ(l.rfind("tformers: ", 0), 0u) << l;

  CmdResult both = sh(cmd);
  ASSERT_EQ(both.status, 0) << both.out;
  for (const std::string& l : lines_of(both.out)) {
    const size_t at = l.find("tformers:");
    EXPECT_TRUE(at == std::string::npos || at == 0) << "diagnostic mid-line: " << l;
  }
  // Statistics come after the text's final newline.
  EXPECT_EQ(lines_of(both.out).back().rfind("tformers: load", 0), 0u) << both.out;
}

// A warning from generate()'s checks comes before the text, and a later, shorter diagnostic
// comes out alone (the held stderr once replayed the tail of the longer one before it).
TEST(Cli, HeldDiagnosticsComeOutWholeAndInOrder) {
  CmdResult r = sh(kCli + " generate" + kKjv + " --prompt And -n 3 --length-penalty 2 --verbose");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto ls = lines_of(r.out);
  size_t warning = ls.size(), text = ls.size();
  for (size_t i = 0; i < ls.size(); ++i) {
    if (ls[i].find("warning: length_penalty") != std::string::npos) warning = i;
    if (ls[i].rfind("And", 0) == 0) text = i;
    if (ls[i].rfind("And", 0) != 0) {
      EXPECT_EQ(ls[i].rfind("tformers: ", 0), 0u) << ls[i];
    }
  }
  EXPECT_LT(warning, text) << r.out;
  EXPECT_LT(text, ls.size()) << r.out;
}

// A bad setting is found before the prompt is echoed: nothing on stdout.
TEST(Cli, ArgumentErrorsComeBeforeAnyOutput) {
  for (const char* bad : {" -n 0", " --top-p 2 --do-sample", " --seed -2", " --ctx-size 1"}) {
    Streams r = run(kCli + " generate" + kKjv + " --prompt 'And the LORD said'" + bad);
    EXPECT_EQ(r.status, 2) << bad;  // usage errors: each flag's range is checked at parse
    EXPECT_EQ(r.out, "") << bad;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << bad << ": " << r.err;
  }
}

// Usage errors found after parsing exit 2 as the parser's do, each with its own message.
TEST(Cli, UsageErrorsAfterParsingExitTwo) {
  const std::pair<const char*, const char*> cases[] = {
      {" --prompt And --prompt-ids 1,2", "give exactly one of --prompt, --file and --prompt-ids"},
      {" --prompt-ids 1,x", "--prompt-ids: 'x' is not a token id"},
      {" --prompt And --tp-plan '{'", "--tp-plan: not valid JSON"},
      {" --prompt And --tp-plan '[1]'", "--tp-plan must be a JSON object"},
      {" --prompt And --dtype float7", "--dtype float7: use auto"}};
  for (const auto& [flags, message] : cases) {
    Streams r = run(kCli + " generate" + kKjv + flags);
    EXPECT_EQ(r.status, 2) << flags << ": " << r.err;
    EXPECT_EQ(r.out, "") << flags;
    EXPECT_NE(r.err.find(message), std::string::npos) << flags << ": " << r.err;
  }
}

TEST(Cli, ChatRejectsBadSettingsBeforeThePrompt) {
  Streams r = run(kCli + " chat" + kKjv + " --top-p 2", "hello\n");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("error: --top-p: '2' is outside the range (0, 1]"), std::string::npos)
      << r.err;
  // A setting only the model's config can judge is still refused before the prompt (status 1).
  r = run(kCli + " chat" + kKjv + " --ctx-size 100000", "hello\n");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("more than the model's 256 positions"), std::string::npos) << r.err;
}

TEST(Cli, ThreadsGoesAfterTheSubcommandAndIsRangeChecked) {
  Streams r = run(kCli + " generate" + kKjv + " --prompt And -n 3 --threads 1");
  EXPECT_EQ(r.status, 0) << r.err;
  r = run(kCli + " --threads 1 generate" + kKjv + " --prompt And -n 3");
  EXPECT_EQ(r.status, 0) << r.err;
  r = run(kCli + " generate" + kKjv + " --prompt And -n 3 --threads 100000");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--threads: '100000' is outside the range [1, 1024]"), std::string::npos)
      << r.err;
}

// 2^62 cache positions overflowed the cache mask's byte count: a 64-byte buffer, then a write
// past it (SIGSEGV in left_pad). Now a clear error naming the model's positions.
TEST(Cli, HugeCtxSizeIsAnErrorNotACrash) {
  for (const char* size : {"4611686018427387904", "9223372036854775807", "257"}) {
    Streams r = run(kCli + " generate" + kKjv + " --prompt 'And the' -n 4 --ctx-size " + size);
    EXPECT_EQ(r.status, 1) << size << ": " << r.err;
    EXPECT_NE(r.err.find(std::string("max_cache_len = ") + size +
                         " is more than the model's 256 positions"),
              std::string::npos)
        << r.err;
  }
}

// Accepted once, then "internal error ... (this is a bug)" at the first token: the float the
// processors scale by was 0.
TEST(Cli, TinyTemperatureIsRefusedWithTheRange) {
  Streams r =
      run(kCli + " generate" + kKjv + " --prompt And -n 3 --do-sample --temperature 1e-300");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("temperature must be a strictly positive float in [1.17549e-38, "),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("this is a bug"), std::string::npos) << r.err;
  r = run(kCli + " generate" + kKjv + " --prompt And -n 3 --do-sample --temperature 1e-37");
  EXPECT_EQ(r.status, 0) << r.err;  // works: overflowing scores saturate
}

TEST(Cli, MaxNewTokensAtInt64MaxIsALengthError) {
  Streams r = run(kCli + " generate" + kKjv + " --prompt And -n 9223372036854775807");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("max_new_tokens to at most 255"), std::string::npos) << r.err;
}

TEST(Cli, SeedMinusOneIsFreshAndPrintedTemperatureZeroIsGreedy) {
  Streams a = run(kCli + " generate" + kKjv + " --prompt And -n 20 --seed -1 --verbose");
  ASSERT_EQ(a.status, 0) << a.err;
  const size_t at = a.err.find("tformers: seed ");
  ASSERT_NE(at, std::string::npos) << a.err;
  const std::string seed = a.err.substr(at + 15, a.err.find('\n', at) - at - 15);
  Streams again = run(kCli + " generate" + kKjv + " --prompt And -n 20 --seed " + seed);
  EXPECT_EQ(again.out, a.out) << "seed " << seed;

  Streams g1 = run(kCli + " generate" + kKjv + " --prompt And -n 20 --temperature 0 --seed 1");
  Streams g2 = run(kCli + " generate" + kKjv + " --prompt And -n 20 --temperature 0 --seed 2");
  EXPECT_EQ(g1.out, g2.out);
  EXPECT_NE(g1.err.find("--temperature 0 means greedy decoding"), std::string::npos) << g1.err;
}

// A prompt file longer than the context could ever hold is refused before it is read (it was
// read whole, up to 64 MiB, and tokenized first); an endless one (a device) is never read.
TEST(Cli, PromptFileIsBoundByTheContext) {
  const std::string file = std::filesystem::temp_directory_path() /
                           ("tformers_long_prompt_" + std::to_string(::getpid()) + ".txt");
  std::ofstream(file) << std::string(256 * 32 + 1, 'a');
  Streams r = run(kCli + " generate" + kKjv + " -f " + file + " -n 3");
  std::filesystem::remove(file);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("is 8193 bytes, more than the model's context of 256 tokens "
                       "(max_position_embeddings) can hold (at most 8192 bytes"),
            std::string::npos)
      << r.err;
  r = run(kCli + " generate" + kKjv + " -f /dev/zero -n 3");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("/dev/zero"), std::string::npos) << r.err;
}

// --assistant-model (assisted generation) gives greedy search's tokens; an assistant of another
// vocabulary is an error that says so, and --tp is refused with it.
TEST(Cli, AssistantModelGivesGreedyTokens) {
  const std::string base = kCli +
                           " generate -m tests/data/models/hf-llama --prompt-ids 1,93,211,7 "
                           "-n 16 --json";
  auto ids = [](const Streams& r) { return tformers::io::Json::parse(r.out)["ids"]; };
  const Streams plain = run(base);
  const Streams assisted =
      run(base + " --assistant-model tests/data/models/tiny-llama --draft-max 4");
  ASSERT_EQ(assisted.status, 0) << assisted.err;
  EXPECT_EQ(ids(assisted), ids(plain));
  const tformers::io::Json counts = tformers::io::Json::parse(assisted.out);
  EXPECT_GT(counts["draft_tokens"].get<int64_t>(), 0);
  EXPECT_LE(counts["accepted_draft_tokens"], counts["draft_tokens"]);
  const Streams other = run(base + " --assistant-model models/kjv-fortunes-tiny");
  EXPECT_NE(other.status, 0);
  EXPECT_CONTAINS(other.err, "must share the model's tokenizer");
  const Streams tp = run(base + " --assistant-model tests/data/models/tiny-llama --tp 2");
  EXPECT_NE(tp.status, 0);
  EXPECT_CONTAINS(tp.err, "assisted generation runs in one process");
  // A chat of three turns, its cache kept between them: the same replies with the model's own
  // weights assisting.
  const std::string chat = kCli + " chat" + kKjv + " -n 24 --temperature 0";
  const std::string turns = "And the LORD said\nHow long\nBlessed are\n";
  const Streams alone = run(chat, turns);
  const Streams assisted_chat = run(chat + " --assistant-model models/kjv-fortunes-tiny", turns);
  ASSERT_EQ(assisted_chat.status, 0) << assisted_chat.err;
  EXPECT_EQ(assisted_chat.out, alone.out);
}

TEST(Cli, FileStopIgnoreEosAndJson) {
  const std::string file = std::filesystem::temp_directory_path() /
                           ("tformers_prompt_" + std::to_string(::getpid()) + ".txt");
  std::ofstream(file) << "And the LORD said";
  Streams from_file = run(kCli + " generate" + kKjv + " -f " + file + " -n 10 --seed 4");
  Streams from_flag =
      run(kCli + " generate" + kKjv + " --prompt 'And the LORD said' -n 10 --seed 4");
  std::filesystem::remove(file);
  EXPECT_EQ(from_file.status, 0) << from_file.err;
  EXPECT_EQ(from_file.out, from_flag.out);

  // --stop is repeatable: the text ends at whichever comes first.
  Streams stop = run(kCli + " generate" + kKjv +
                     " --prompt 'And the LORD said' -n 60 --seed 0 --stop , --stop Jeremiah");
  EXPECT_EQ(stop.out, "And the LORD said unto Jeremiah\n") << stop.err;

  // Seed 3 ends with an eos token at 54 tokens; --ignore-eos runs to --max-new-tokens.
  auto json = [&](const std::string& extra) {
    Streams r = run(kCli + " generate" + kKjv + " --prompt And -n 60 --seed 3 --json" + extra);
    EXPECT_EQ(r.status, 0) << r.err;
    return tformers::io::Json::parse(r.out);
  };
  tformers::io::Json stopped = json(""), ignored = json(" --ignore-eos");
  EXPECT_EQ(stopped["finish_reason"], "stop");
  EXPECT_LT(stopped["ids"].size(), 60u);
  EXPECT_EQ(ignored["finish_reason"], "length");
  EXPECT_EQ(ignored["ids"].size(), 60u);
  EXPECT_EQ(ignored["prompt_ids"], tformers::io::Json::array({319}));
  EXPECT_EQ(ignored["seed"], 3);
  EXPECT_FALSE(ignored["text"].get<std::string>().empty());
  for (const char* k :
       {"load_s", "time_to_first_token_s", "generated_tokens", "tokens_per_s_after_first"})
    EXPECT_TRUE(ignored["timings"].contains(k)) << k;
}

TEST(Cli, BeamSearchFlagsOnASamplingModel) {
  Streams r = run(kCli + " generate" + kKjv +
                  " --prompt 'And the LORD said' -n 8 --num-beams 3 --early-stopping never --json");
  ASSERT_EQ(r.status, 0) << r.err;
  tformers::io::Json j = tformers::io::Json::parse(r.out);
  EXPECT_LT(j["sequences_score"].get<double>(), 0);
  // Beam search is deterministic: the same text whatever the seed.
  auto text_part = [](const std::string& json) { return json.substr(0, json.find("\"seed\"")); };
  EXPECT_EQ(text_part(run(kCli + " generate" + kKjv +
                          " --prompt 'And the LORD said' -n 8 --num-beams 3 --early-stopping "
                          "never --json")
                          .out),
            text_part(r.out));
}

TEST(Cli, HelpVersionAndSubcommands) {
  Streams r = run(kCli + " --version");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "tformers " TFORMERS_VERSION "\n");
  r = run(kCli + " serve-everything");
  EXPECT_EQ(r.status, 2);  // a usage error
  EXPECT_NE(r.err.find("unknown subcommand 'serve-everything'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("generate, chat, tokenize"), std::string::npos) << r.err;
  r = run(kCli + " launch --help");
  EXPECT_EQ(r.status, 0);
  for (const char* opt : {"--nproc-per-node N", "--nnodes M", "--node-rank R", "--master-addr A",
                          "--master-port P", "--hostfile F", "RANK, LOCAL_RANK"})
    EXPECT_NE(r.out.find(opt), std::string::npos) << opt << " missing from\n" << r.out;
  // Every option of every command has a description after its name and type.
  for (const char* cmd : {"generate", "chat", "tokenize"}) {
    r = run(kCli + " " + cmd + " --help");
    EXPECT_EQ(r.status, 0);
    const auto ls = lines_of(r.out);
    for (size_t i = 0; i < ls.size(); ++i) {
      const std::string& l = ls[i];
      if (l.rfind("  -", 0) != 0) continue;
      // Words other than the option's names and its TYPE (INT, TEXT=main, TEXT:{a,b}); CLI11
      // puts a long name's description on the next line, indented.
      auto has_words = [](const std::string& text) {
        std::stringstream ss(text);
        for (std::string w; ss >> w;)
          if (w[0] != '-' && w.find_first_of("=:") == std::string::npos &&
              std::any_of(w.begin(), w.end(), [](char c) { return std::islower(c); }))
            return true;
        return false;
      };
      const bool described =
          has_words(l) ||
          (i + 1 < ls.size() && ls[i + 1].rfind("        ", 0) == 0 && has_words(ls[i + 1]));
      EXPECT_TRUE(described) << cmd << ": " << l;
    }
  }
}

// Under launch every rank runs the command; only rank 0 writes text and diagnostics, unless
// --verbose-all-ranks.
// Process counts are bounded before they are multiplied into the world size.
TEST(Cli, LaunchRejectsHugeProcessCounts) {
  Streams r = run(kCli + " launch --nproc-per-node 9223372036854775807 --nnodes 2 --hostfile " +
                  kCli + " -- true");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--nproc-per-node must be in [1, 4096]"), std::string::npos) << r.err;
  r = run(kCli + " launch --nproc-per-node 2 --nnodes 5000 -- true");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--nnodes must be in [1, 4096]"), std::string::npos) << r.err;
}

TEST(Cli, UnderLaunchOnlyRankZeroWrites) {
  if (std::system("command -v mpirun >/dev/null") != 0)
    TF_SKIP_MISSING_DEPENDENCY("no mpirun (Debian: openmpi-bin)");
  const std::string ranks = " --nproc-per-node 2 -- " + kCli + " generate" + kKjv +
                            " --prompt And -n 5 --seed 1 --verbose";
  // Under AddressSanitizer, Open MPI's own allocations need the suppressions the distributed
  // tests use (tests/CMakeLists.txt); other builds ignore the variable.
  const std::string lsan =
      "LSAN_OPTIONS=fast_unwind_on_malloc=0:print_suppressions=0:"
      "suppressions=" TFORMERS_SOURCE_DIR "/tests/lsan_mpi.supp ";
  const std::string cmd = lsan + kCli + " launch" + ranks;
  Streams r = run(cmd);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(lines_of(r.out).size(), 1u) << r.out;
  auto count = [](const std::string& s, const std::string& what) {
    int n = 0;
    for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count(r.err, "tformers: load"), 1) << r.err;
  // On the command, or on launch for whatever command it runs.
  for (const std::string& all :
       {cmd + " --verbose-all-ranks", lsan + kCli + " launch --verbose-all-ranks" + ranks}) {
    r = run(all);
    ASSERT_EQ(r.status, 0) << all << ": " << r.err;
    EXPECT_EQ(lines_of(r.out).size(), 1u) << r.out;
    EXPECT_EQ(count(r.err, "tformers: load"), 2) << all << ": " << r.err;
  }
}

// The Hub error suggests --revision, which every model command takes.
TEST(Cli, RevisionPicksTheHubSnapshot) {
  const auto cache =
      std::filesystem::temp_directory_path() / ("tformers_cli_hub_" + std::to_string(::getpid()));
  const auto snap = cache / "models--org--tiny" / "snapshots" / "c0ffee";
  std::filesystem::create_directories(snap);
  std::filesystem::create_directories(cache / "models--org--tiny" / "refs");
  std::ofstream(cache / "models--org--tiny" / "refs" / "v1") << "c0ffee";
  for (const auto& f :
       std::filesystem::directory_iterator(std::string(TFORMERS_TEST_DATA) + "/models/tiny-qwen3"))
    std::filesystem::copy_file(f.path(), snap / f.path().filename());
  const std::string env = "HF_HUB_CACHE=" + cache.string() + " ";
  Streams missing = run(env + kCli + " generate -m org/tiny --prompt-ids 1,2 -n 2");
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("pass one with --revision"), std::string::npos) << missing.err;
  for (const std::string cmd : {" generate -m org/tiny --prompt hi -n 2 --revision v1",
                                " tokenize -m org/tiny hi --revision v1"}) {
    Streams r = run(env + kCli + cmd);
    EXPECT_EQ(r.status, 0) << cmd << ": " << r.err;
  }
  std::filesystem::remove_all(cache);
}

// Strings from model files are escaped in errors: an architecture name with an escape sequence
// shows as \x1b, never as a raw ESC byte that would recolour the terminal.
TEST(Cli, StringsFromModelFilesAreEscaped) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("tformers_hostile_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json")
      << R"({"architectures": ["Evil\u001b[31mForCausalLM"], "model_type": "x"})";
  Streams r = run(kCli + " generate -m " + dir.string() + " --prompt-ids 1,2");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("Evil\\x1b[31mForCausalLM"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
}

// A chat session: one static cache for all turns, so a turn whose prompt is as long as an
// earlier one compiles nothing, and a turn computes only what follows the tokens the last one
// left in it; old turns are dropped with a note once the history outgrows --ctx-size, the
// system message kept; /reset confirms.
TEST(Cli, ChatKeepsItsCacheTrimsHistoryAndConfirmsReset) {
  Streams r = run(kCli +
                      " chat -m tests/data/models/tiny-qwen3 --dtype float32 -n 8 "
                      "--ctx-size 64 --system 'Be brief.' --verbose",
                  "hello\n/reset\nhello\ntell me more\nand more\nand then\n");
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<std::string> turns;
  for (const std::string& l : lines_of(r.err))
    if (l.find("chat: prompt") != std::string::npos) turns.push_back(l);
  ASSERT_EQ(turns.size(), 5u) << r.err;
  EXPECT_NE(turns[0].find("(0 kept from the last turn, "), std::string::npos) << turns[0];
  EXPECT_NE(turns[0].find("compiles +2"), std::string::npos) << turns[0];
  // The same prompt after /reset: all of it kept but its last token, computed for its logits.
  const int first = std::stoi(turns[0].substr(turns[0].find("prompt ") + 7));
  EXPECT_NE(turns[1].find("prompt " + std::to_string(first) + " tokens (" +
                          std::to_string(first - 1) + " kept from the last turn, 1 computed)"),
            std::string::npos)
      << turns[1];
  // After trimming, the system message is still the prompt's head.
  for (size_t t = 2; t < turns.size(); ++t)
    EXPECT_EQ(turns[t].find("(0 kept"), std::string::npos) << turns[t];
  EXPECT_NE(r.err.find("history cleared (the system message is kept)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("oldest message"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("to fit the context of 64 tokens"), std::string::npos) << r.err;
  // Every trimmed prompt still fits with a full reply.
  for (const std::string& t : turns) {
    const int prompt = std::stoi(t.substr(t.find("prompt ") + 7));
    EXPECT_LE(prompt + 8, 64) << t;
  }
  // Once trimming holds the prompt at its longest, the decode step never recompiles.
  EXPECT_NE(turns.back().find("compiles +0"), std::string::npos) << turns.back();
  EXPECT_EQ(r.out.find("tformers"), std::string::npos) << r.out;
}

// A chat line is read in bounded pieces: an endless one (stdin from /dev/zero) is refused once it
// passes what the context can hold, instead of growing the process by gigabytes first.
TEST(Cli, ChatRefusesALineLongerThanTheContextCanHold) {
  const Streams r = run("(" + kCli +
                        " chat -m tests/data/models/tiny-qwen3 --dtype float32 -n 8 "
                        "--ctx-size 64 </dev/zero)");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_CONTAINS(r.err, "a line of input is longer than 2048 bytes");
  EXPECT_CONTAINS(r.err, "--ctx-size");
}

// One seed per session: the same message after /reset gets a new reply (turn i samples with
// seed + i), and the same seed replays the whole session.
TEST(Cli, ChatSamplesWithOneSeedPerSession) {
  const std::string cmd = kCli + " chat" + kKjv + " -n 16 --seed 7";
  const std::string input = "hello\n/reset\nhello\n";
  Streams a = run(cmd, input), b = run(cmd, input);
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  // Piped input is not echoed: each line is prompts ("> ", one more after /reset), then a reply.
  auto replies = lines_of(a.out);
  ASSERT_GE(replies.size(), 2u) << a.out;
  for (std::string& r : replies)
    while (r.rfind("> ", 0) == 0) r.erase(0, 2);
  EXPECT_NE(replies[0], replies[1]) << a.out;
}

TEST(Cli, TextPromptStreamsText) {
  CmdResult r = sh(std::string(TFORMERS_CLI) +
                   " generate --model tests/data/models/tiny-qwen3 --prompt 'The theory' "
                   "--max-new-tokens 8 --dtype float32");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.rfind("The theory", 0), 0u) << r.out;
  EXPECT_GT(r.out.size(), std::string("The theory\n").size()) << r.out;
}

TEST(Cli, TokenizeShowsIdsAndPieces) {
  CmdResult r =
      sh(std::string(TFORMERS_CLI) + " tokenize --model tests/data/models/tiny-qwen3 'The theory'");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("ids: 84,380,257,104,285,114,121"), std::string::npos) << r.out;
}

// tokenize --json and env --json: one JSON object on stdout, for scripts.
TEST(Cli, TokenizeAndEnvPrintJson) {
  Streams r = run(kCli + " tokenize --model tests/data/models/tiny-qwen3 'The theory' --json");
  ASSERT_EQ(r.status, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ids"], nlohmann::json({84, 380, 257, 104, 285, 114, 121})) << r.out;
  ASSERT_EQ(j["tokens"].size(), 7u) << r.out;
  EXPECT_EQ(j["tokens"][0], "T") << r.out;
  r = run(kCli + " env --json");
  ASSERT_EQ(r.status, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["version"].get<std::string>().empty(), false) << r.out;
  EXPECT_EQ(j["backends"][0].get<std::string>().rfind("cpu: available", 0), 0u) << r.out;
  const std::vector<std::string> archs = j["architectures"];
  EXPECT_NE(std::find(archs.begin(), archs.end(), "Qwen3ForCausalLM"), archs.end()) << r.out;
  EXPECT_TRUE(j["accelerator_available"].is_boolean()) << r.out;
}

// A chat line that starts with an unknown command is answered, not sent to the model (with
// --verbose each reply logs "chat: prompt"); a path is a message.
TEST(Cli, ChatAnswersAnUnknownCommand) {
  Streams r = run(kCli + " chat -m tests/data/models/tiny-qwen3 --dtype float32 -n 2 --verbose",
                  "/foo bar\n/usr/bin is where?\n");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("unknown command /foo (/help lists them)"), std::string::npos) << r.err;
  size_t prompts = 0;
  for (const std::string& l : lines_of(r.err))
    prompts += l.find("chat: prompt") != std::string::npos;
  EXPECT_EQ(prompts, 1u) << r.err;
}

TEST(Cli, EnvListsBackends) {
  CmdResult r = sh(std::string(TFORMERS_CLI) + " env");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("backend cpu: available"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Qwen3ForCausalLM"), std::string::npos) << r.out;
}

// The weight prefetch hint follows the CPU's vendor, read here from /proc/cpuinfo rather than
// CPUID: non-temporal on AMD and Hygon, T0 on the rest; TFORMERS_CPU_PREFETCH overrides it, and
// a value that is neither hint is an error naming the variable and the choices.
TEST(Cli, WeightPrefetchFollowsTheVendorOrTheEnvironment) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, vendor;
  while (vendor.empty() && std::getline(cpuinfo, line))
    if (line.starts_with("vendor_id")) vendor = line.substr(line.find(':') + 2);
  if (vendor.empty()) GTEST_SKIP() << "no vendor_id in /proc/cpuinfo";
  const std::string expected = vendor == "AuthenticAMD" || vendor == "HygonGenuine"
                                   ? "weight prefetch nta"
                                   : "weight prefetch t0";
  CmdResult r = sh(std::string(TFORMERS_CLI) + " env");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(expected), std::string::npos) << vendor << "\n" << r.out;
  for (const char* hint : {"nta", "t0"}) {
    r = sh("TFORMERS_CPU_PREFETCH=" + std::string(hint) + " " + TFORMERS_CLI + " env");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("weight prefetch " + std::string(hint) + ","), std::string::npos) << r.out;
  }
  r = sh("TFORMERS_CPU_PREFETCH=l2 " + std::string(TFORMERS_CLI) +
         " generate --model tests/data/models/tiny-qwen3 --prompt-ids 1,2 --max-new-tokens 1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("TFORMERS_CPU_PREFETCH='l2' is not a prefetch: use nta or t0"),
            std::string::npos)
      << r.out;
}

TEST(Cli, BadInputIsAClearErrorAndNonZeroExit) {
  CmdResult r = sh(std::string(TFORMERS_CLI) + " generate --model /nonexistent --prompt-ids 1,2");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("error: "), std::string::npos) << r.out;
  r = sh(std::string(TFORMERS_CLI) +
         " generate --model tests/data/models/tiny-qwen3 --prompt-ids 1,x,3");
  EXPECT_EQ(r.status, 2);  // a usage error
  EXPECT_NE(r.out.find("'x' is not a token id"), std::string::npos) << r.out;
  r = sh(std::string(TFORMERS_CLI) +
         " generate --model tests/data/models/tiny-qwen3 --prompt-ids 1 --device tpu");
  EXPECT_EQ(r.status, 1);
  // Where libtpu is not installed, the places looked for it; where it is (the plugins group in
  // .venv/), the device files looked for. Either way the fix: device_map="cpu".
  EXPECT_NE(r.out.find("looked"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Use device_map=\"cpu\""), std::string::npos) << r.out;
}

// TFORMERS_API_KEY set but empty asks for a key and gives none: refused before the model loads,
// as --api-key "" is, rather than serving without authentication.
TEST(Cli, ServeRefusesAnEmptyApiKeyVariable) {
  const Streams r = run("TFORMERS_API_KEY= " + kCli +
                        " serve -m models/kjv-fortunes-tiny --port 0 --max-model-len 64");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("TFORMERS_API_KEY is set but empty"), std::string::npos) << r.err;
}

}  // namespace
