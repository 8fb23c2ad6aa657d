// The command line's parser on its own (apps/cli.cc, also fuzzed by tests/fuzz/fuzz_cli.cc): what
// it reads, what it writes to the streams it is given, and the checks made before a model loads.
#include <gtest/gtest.h>

#include <climits>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../../apps/cli.h"
#include "tformers/error.h"

namespace tformers::cli {
namespace {

struct Parsed {
  CommandLine cl;
  std::string out, err;
};

Parsed parse(std::vector<std::string> args) {
  args.insert(args.begin(), "tformers");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  std::ostringstream out, err;
  Parsed p;
  p.cl = parse_command_line(int(args.size()), argv.data(), out, err);
  p.out = out.str();
  p.err = err.str();
  return p;
}

TEST(CommandLine, ReadsGenerateFlags) {
  Parsed p = parse({"generate", "-m", "DIR", "--prompt", "And", "-n", "40", "--seed", "-1",
                    "--stop", ",", "--stop", "Jeremiah", "--threads", "2", "--load-mode", "mmap"});
  EXPECT_EQ(p.cl.command, "generate");
  EXPECT_EQ(p.cl.exit_code, 0);
  EXPECT_EQ(p.cl.threads, 2);
  EXPECT_EQ(p.cl.generate.model, "DIR");
  EXPECT_EQ(p.cl.generate.prompt, "And");
  EXPECT_EQ(p.cl.generate.max_new_tokens, 40);
  EXPECT_EQ(p.cl.generate.seed, -1);
  EXPECT_EQ(p.cl.generate.stop, (std::vector<std::string>{",", "Jeremiah"}));
  EXPECT_EQ(p.cl.generate.load_mode, "mmap");
  EXPECT_EQ(p.cl.generate.revision, "main");
  EXPECT_EQ(p.out + p.err, "");
}

TEST(CommandLine, ReadsTokenizeKernelsAndEnv) {
  Parsed p = parse({"tokenize", "-m", "DIR", "The theory", "--add-special-tokens"});
  EXPECT_EQ(p.cl.command, "tokenize");
  EXPECT_EQ(p.cl.tokenize.model, "DIR");
  EXPECT_EQ(p.cl.tokenize.text, "The theory");
  EXPECT_TRUE(p.cl.tokenize.add_special_tokens);
  p = parse({"kernels", "lock", "--help"});
  EXPECT_EQ(p.cl.command, "kernels");
  EXPECT_EQ(p.cl.kernels, (std::vector<std::string>{"lock", "--help"}));
  EXPECT_EQ(parse({"--threads", "1", "env"}).cl.command, "env");
  EXPECT_TRUE(parse({"env", "--json"}).cl.env_json);
  EXPECT_TRUE(parse({"tokenize", "-m", "DIR", "x", "--json"}).cl.tokenize.json);
}

// llama.cpp's habits: its flags are aliases of ours, and -ngl (GPU layers) is answered with a
// note rather than read as -n with the value "gl".
TEST(CommandLine, ReadsLlamaCppFlags) {
  Parsed p = parse({"generate", "-m", "DIR", "-p", "Hi", "-t", "2", "--temp", "0.5", "-s", "7",
                    "-c", "64", "-n", "8", "--repeat-penalty", "1.1"});
  EXPECT_EQ(p.cl.exit_code, 0) << p.err;
  EXPECT_EQ(p.cl.threads, 2);
  EXPECT_EQ(p.cl.generate.temperature, 0.5);
  EXPECT_EQ(p.cl.generate.seed, 7);
  EXPECT_EQ(p.cl.generate.ctx_size, 64);
  EXPECT_EQ(p.cl.generate.max_new_tokens, 8);
  EXPECT_EQ(p.cl.generate.repetition_penalty, 1.1);
  EXPECT_EQ(p.out + p.err, "");
  EXPECT_EQ(parse({"chat", "-m", "DIR", "--n-predict", "9"}).cl.generate.max_new_tokens, 9);
  EXPECT_EQ(parse({"tokenize", "-m", "DIR", "TEXT", "-t", "3"}).cl.threads, 3);
  EXPECT_EQ(parse({"perplexity", "-m", "DIR", "-f", "FILE", "-t", "3"}).cl.threads, 3);
  EXPECT_EQ(parse({"serve", "-m", "DIR", "-t", "3"}).cl.threads, 3);
  EXPECT_EQ(parse({"serve", "-m", "DIR", "-c", "2048"}).cl.serve.max_model_len, 2048);
  // vLLM's `vllm serve MODEL` and --chat-template.
  p = parse({"serve", "Qwen/Qwen3-0.6B", "--chat-template", "t.jinja", "--port", "0"});
  EXPECT_EQ(p.cl.exit_code, 0) << p.err;
  EXPECT_EQ(p.cl.serve.model.model, "Qwen/Qwen3-0.6B");
  EXPECT_EQ(p.cl.serve.chat_template, "t.jinja");
  EXPECT_NE(parse({"serve", "A", "-m", "B"}).cl.exit_code, 0) << "two models";
  EXPECT_NE(parse({"serve", "--port", "0"}).cl.exit_code, 0) << "no model";
  EXPECT_EQ(parse({"chat", "-m", "DIR", "--chat-template", "{{ x }}"}).cl.generate.chat_template,
            "{{ x }}");
  EXPECT_EQ(parse({"-t", "3", "env"}).cl.threads, 3);
  for (const std::vector<std::string>& gpu :
       {std::vector<std::string>{"-ngl", "99"}, {"--n-gpu-layers=99"}, {"--gpu-layers", "99"}}) {
    std::vector<std::string> args = {"chat", "-m", "DIR"};
    args.insert(args.end(), gpu.begin(), gpu.end());
    args.insert(args.end(), {"-t", "1"});
    p = parse(args);
    EXPECT_EQ(p.cl.command, "chat") << p.err;
    EXPECT_EQ(p.cl.threads, 1);
    EXPECT_NE(p.err.find(" 99 is ignored: tformers runs the whole model on one device"),
              std::string::npos)
        << p.err;
    EXPECT_NE(p.err.find("there are no GPU layers on this backend"), std::string::npos) << p.err;
  }
  p = parse({"generate", "-m", "DIR", "-ngl"});
  EXPECT_EQ(p.cl.exit_code, kUsageExitCode);
  EXPECT_EQ(p.err,
            "error: -ngl needs a number of layers (it is llama.cpp's; tformers ignores it)\n");
}

TEST(CommandLine, ReadsBenchAndPerplexityFlags) {
  Parsed p = parse({"bench", "-m", "DIR", "-p", "16,64", "-n", "4", "-t", "1,2", "-r", "2", "-o",
                    "json", "--quantize", "int8", "--load-mode", "mmap"});
  EXPECT_EQ(p.cl.command, "bench");
  EXPECT_EQ(p.cl.bench.model.model, "DIR");
  EXPECT_EQ(p.cl.bench.prompt, (std::vector<int64_t>{16, 64}));
  EXPECT_EQ(p.cl.bench.gen, (std::vector<int64_t>{4}));
  EXPECT_EQ(p.cl.bench.threads, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(p.cl.bench.repetitions, 2);
  EXPECT_EQ(p.cl.bench.output, "json");
  EXPECT_EQ(p.cl.bench.model.quantize, "int8");
  EXPECT_EQ(p.cl.bench.model.load_mode, "mmap");
  EXPECT_EQ(p.out + p.err, "");
  // The defaults are llama-bench's.
  p = parse({"bench", "-m", "DIR"});
  EXPECT_EQ(p.cl.bench.prompt, (std::vector<int64_t>{512}));
  EXPECT_EQ(p.cl.bench.gen, (std::vector<int64_t>{128}));
  EXPECT_TRUE(p.cl.bench.threads.empty());
  EXPECT_EQ(p.cl.bench.repetitions, 5);
  EXPECT_EQ(p.cl.bench.output, "md");

  p = parse({"perplexity", "-m", "DIR", "-f", "text.txt", "--ctx", "64", "--json", "--dtype",
             "bfloat16", "--threads", "1"});
  EXPECT_EQ(p.cl.command, "perplexity");
  EXPECT_EQ(p.cl.threads, 1);
  EXPECT_EQ(p.cl.perplexity.model.model, "DIR");
  EXPECT_EQ(p.cl.perplexity.file, "text.txt");
  EXPECT_EQ(p.cl.perplexity.ctx, 64);
  EXPECT_TRUE(p.cl.perplexity.json);
  EXPECT_EQ(p.cl.perplexity.model.dtype, "bfloat16");
  p = parse({"perplexity", "-m", "DIR"});
  EXPECT_EQ(p.cl.command, "");
  EXPECT_NE(p.err.find("--file is required"), std::string::npos) << p.err;
}

// Help and version go to the `out` stream given, usage errors to `err`; nothing runs.
TEST(CommandLine, ReadsServeFlags) {
  Parsed p = parse({"serve", "-m", "DIR", "--port", "0", "--api-key", "k", "--max-num-seqs", "16",
                    "--request-timeout", "0.5", "--quantize", "int8", "--threads", "2"});
  EXPECT_EQ(p.cl.command, "serve");
  EXPECT_EQ(p.cl.threads, 2);
  EXPECT_EQ(p.cl.serve.model.model, "DIR");
  EXPECT_EQ(p.cl.serve.model.quantize, "int8");
  EXPECT_EQ(p.cl.serve.port, 0);
  EXPECT_EQ(p.cl.serve.api_key, "k");
  EXPECT_EQ(p.cl.serve.max_num_seqs, 16);
  EXPECT_EQ(p.cl.serve.request_timeout, 0.5);
  // Defaults: loopback only, and the limits of cli.h.
  EXPECT_EQ(p.cl.serve.host, "127.0.0.1");
  EXPECT_EQ(p.cl.serve.max_connections, 64);
  EXPECT_TRUE(p.cl.serve.enable_prefix_caching);
  EXPECT_EQ(p.out + p.err, "");
  // vLLM's name for --tp.
  p = parse({"serve", "-m", "DIR", "--tensor-parallel-size", "2"});
  EXPECT_EQ(p.cl.command, "serve");
  EXPECT_EQ(p.cl.serve.tp, 2);
  EXPECT_FALSE(
      parse({"serve", "-m", "DIR", "--no-enable-prefix-caching"}).cl.serve.enable_prefix_caching);
  EXPECT_TRUE(
      parse({"serve", "-m", "DIR", "--enable-prefix-caching"}).cl.serve.enable_prefix_caching);
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"serve", "-m", "DIR", "--port", "70000"},
        {"serve", "-m", "DIR", "--max-connections", "0"},
        {"serve", "-m", "DIR", "--request-timeout", "0"},
        {"serve", "--port", "1"}}) {
    p = parse(bad);
    EXPECT_TRUE(p.cl.command.empty()) << bad.back();
    EXPECT_NE(p.cl.exit_code, 0) << bad.back();
    EXPECT_FALSE(p.err.empty()) << bad.back();
  }
}

TEST(CommandLine, HelpVersionAndUsageErrorsGoToTheStreamsGiven) {
  Parsed p = parse({"--version"});
  EXPECT_EQ(p.cl.command, "");
  EXPECT_EQ(p.cl.exit_code, 0);
  EXPECT_EQ(p.out, "tformers " TFORMERS_VERSION "\n");
  p = parse({"generate", "--help"});
  EXPECT_EQ(p.cl.command, "");
  EXPECT_EQ(p.cl.exit_code, 0);
  EXPECT_NE(p.out.find("--prompt-ids"), std::string::npos) << p.out;
  p = parse({"generate", "--prompt", "x"});
  EXPECT_EQ(p.cl.command, "");
  EXPECT_NE(p.cl.exit_code, 0);
  EXPECT_NE(p.err.find("--model is required"), std::string::npos) << p.err;
  EXPECT_EQ(p.out, "");
}

TEST(CommandLine, UnknownSubcommandIsNamedAndEscaped) {
  Parsed p = parse({"serve\x1b[2J-everything"});
  EXPECT_EQ(p.cl.command, "");
  EXPECT_EQ(p.cl.exit_code, kUsageExitCode);
  EXPECT_EQ(
      p.err,
      "error: unknown subcommand 'serve\\x1b[2J-everything'; the subcommands are env, "
      "launch, generate, chat, tokenize, bench, perplexity, serve, quantize, compile, kernels "
      "(tformers --help shows them)\n");
}

TEST(CommandLine, ThreadsOutOfRangeIsAUsageError) {
  Parsed p = parse({"generate", "-m", "DIR", "--threads", "100000"});
  EXPECT_EQ(p.cl.command, "");
  EXPECT_EQ(p.cl.exit_code, kUsageExitCode);
  EXPECT_EQ(p.cl.threads, 0);
  EXPECT_NE(p.err.find("--threads: '100000' is outside the range [1, 1024]"), std::string::npos)
      << p.err;
  // 0 and an empty value used to pass as "not given" (every core).
  for (const std::string bad : {"-1", "0", "", "abc"}) {
    p = parse({"--threads", bad, "env"});
    EXPECT_EQ(p.cl.command, "") << bad;
    EXPECT_EQ(p.cl.exit_code, kUsageExitCode) << bad;
    EXPECT_NE(p.err.find("--threads: '" + bad + "'"), std::string::npos) << p.err;
    p = parse({"generate", "-m", "DIR", "--threads", bad});
    EXPECT_EQ(p.cl.exit_code, kUsageExitCode) << bad;
  }
  p = parse({"--threads", "1024", "env"});
  EXPECT_EQ(p.cl.threads, 1024) << p.err;
}

TEST(CommandLine, AnEmptyApiKeyIsRefused) {
  // It started a server without authentication although the command line asked for a key.
  Parsed p = parse({"serve", "-m", "D", "--api-key", ""});
  EXPECT_EQ(p.cl.command, "");
  EXPECT_EQ(p.cl.exit_code, kUsageExitCode);
  EXPECT_NE(p.err.find("--api-key: an empty key"), std::string::npos) << p.err;
  p = parse({"serve", "-m", "D", "--api-key", "k"});
  EXPECT_EQ(p.cl.command, "serve") << p.err;
  EXPECT_EQ(p.cl.serve.api_key, "k");
}

// One convention: 2 for every usage error, where CLI11 gave its own codes (106 for a missing
// flag, 109 for an extra argument, 105 for a bad value), and a mistyped flag gets the closest
// one, in the order given (CLI11 listed extras reversed: "hi --promt").
TEST(CommandLine, UsageErrorsExitTwoAndSuggestTheFlag) {
  Parsed p = parse({"generate", "-m", "DIR", "--promt", "hi"});
  EXPECT_EQ(p.cl.command, "");
  EXPECT_EQ(p.cl.exit_code, kUsageExitCode);
  EXPECT_EQ(p.err,
            "error: unknown option --promt; did you mean --prompt?; unexpected argument 'hi' "
            "(tformers generate --help lists the options)\n");
  p = parse({"generate", "--prompt", "x"});
  EXPECT_EQ(p.cl.exit_code, kUsageExitCode);
  EXPECT_NE(p.err.find("--model is required"), std::string::npos) << p.err;
  p = parse({"serve", "-m", "DIR", "--max-num-seq", "4"});
  EXPECT_EQ(p.cl.exit_code, kUsageExitCode);
  EXPECT_NE(p.err.find("did you mean --max-num-seqs?"), std::string::npos) << p.err;
  p = parse({"generate", "-m", "DIR", "--temprature=0.5"});
  EXPECT_NE(p.err.find("unknown option --temprature; did you mean --temperature?"),
            std::string::npos)
      << p.err;
}

// Values that parsed and then broke something later: a seed past int64 was clamped to
// INT64_MAX without a word, nan and 1e10 s timeouts made every request a 504, an overflowed
// --ctx-size crashed generation. Each is now refused at parse, naming the range.
TEST(CommandLine, NumbersOutsideTheirRangeAreRefusedWithIt) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"generate", "-m", "D", "--seed", "99999999999999999999"},
       "'99999999999999999999' is outside the range [-1, 2^63-1]"},
      {{"generate", "-m", "D", "--seed", "-2"}, "'-2' is outside the range [-1, 2^63-1]"},
      {{"generate", "-m", "D", "-n", "0"}, "'0' is outside the range [1, 2^63-1]"},
      {{"generate", "-m", "D", "--ctx-size", "1"}, "'1' is outside the range [2, 2^63-1]"},
      {{"generate", "-m", "D", "--ctx-size", "1e3"}, "'1e3' is not an integer"},
      {{"generate", "-m", "D", "--temperature", "nan"}, "'nan' is outside the range [0, "},
      {{"generate", "-m", "D", "--temperature", "-1"}, "'-1' is outside the range [0, "},
      {{"generate", "-m", "D", "--top-p", "0"}, "'0' is outside the range (0, 1]"},
      {{"generate", "-m", "D", "--repetition-penalty", "1e-300"},
       "'1e-300' is outside the range [1.17549e-38, 3.40282e+38]"},
      {{"generate", "-m", "D", "--length-penalty", "inf"}, "'inf' is outside the range"},
      {{"serve", "-m", "D", "--request-timeout", "1e10"}, "'1e10' is outside the range (0, 1e+08]"},
      {{"serve", "-m", "D", "--request-timeout", "nan"}, "'nan' is outside the range (0, 1e+08]"},
      {{"serve", "-m", "D", "--read-timeout", "-5"}, "'-5' is outside the range (0, 1e+08]"},
      {{"serve", "-m", "D", "--shutdown-timeout", "inf"}, "'inf' is outside the range [0, 1e+08]"},
      {{"serve", "-m", "D", "--max-model-len", "99999999999999999999"},
       "outside the range [1, 2^63-1]"},
      {{"serve", "-m", "D", "--max-model-len", "0"}, "'0' is outside the range [1, 2^63-1]"},
      {{"bench", "-m", "D", "-r", "0"}, "'0' is outside the range [1, 1000000]"},
      {{"perplexity", "-m", "D", "-f", "x", "--ctx", "1"}, "'1' is outside the range [2, "},
  };
  for (const Case& c : cases) {
    const Parsed p = parse(c.args);
    EXPECT_EQ(p.cl.command, "") << c.says;
    EXPECT_EQ(p.cl.exit_code, kUsageExitCode) << c.says;
    EXPECT_NE(p.err.find(c.says), std::string::npos) << p.err;
  }
  // The ends of the ranges are accepted.
  Parsed p = parse({"generate", "-m", "D", "--seed", "9223372036854775807", "--temperature", "0",
                    "--top-p", "1", "--ctx-size", "2"});
  EXPECT_EQ(p.cl.command, "generate") << p.err;
  EXPECT_EQ(p.cl.generate.seed, INT64_MAX);
  p = parse({"serve", "-m", "D", "--request-timeout", "1e8", "--shutdown-timeout", "0"});
  EXPECT_EQ(p.cl.command, "serve") << p.err;
  EXPECT_EQ(p.cl.serve.request_timeout, 1e8);
}

// When parsing ends early (with the help or a usage error) the value of --threads is dropped, so
// nothing can act on it.
TEST(CommandLine, ThreadsAreDroppedWhenNothingRuns) {
  Parsed p = parse({"generate", "--threads", "7", "--help"});
  EXPECT_EQ(p.cl.command, "");
  EXPECT_EQ(p.cl.exit_code, 0);
  EXPECT_EQ(p.cl.threads, 0);
  EXPECT_NE(p.out.find("--threads"), std::string::npos) << p.out;
  p = parse({"--threads", "7", "generate", "-m", "DIR", "--bogus"});
  EXPECT_NE(p.cl.exit_code, 0);
  EXPECT_EQ(p.cl.threads, 0);
  EXPECT_EQ(p.err, "error: unknown option --bogus (tformers generate --help lists the options)\n");
}

TEST(CommandLine, ChecksBeforeTheModelLoads) {
  GenerateArgs a;
  a.seed = -2;
  EXPECT_THROW(check_args(a), InvalidArgumentError);
  EXPECT_EQ(parse_ids("72,101,108"), (std::vector<int32_t>{72, 101, 108}));
  try {
    parse_ids("1,99999999999999999999");
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_STREQ(e.what(),
                 "--prompt-ids: '99999999999999999999' is not a token id (use comma-separated "
                 "integers, e.g. 72,101,108)");
  }
  EXPECT_EQ(parse_tp_plan(R"({"lm_head": "colwise_rep"})").at("lm_head"), "colwise_rep");
  try {
    parse_tp_plan(R"({"a": 1})");
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_STREQ(e.what(), "--tp-plan: the style of \"a\" must be a string, got 1");
  }
  BenchArgs b;
  b.threads = {2, 0};
  EXPECT_THROW(check_bench_args(b), InvalidArgumentError);
  b = {};
  b.prompt = {0};
  b.gen = {0};
  EXPECT_THROW(check_bench_args(b), InvalidArgumentError);
  b.gen = {0, 3};
  check_bench_args(b);
  PerplexityArgs pa;
  pa.ctx = 1;
  EXPECT_THROW(check_perplexity_args(pa), InvalidArgumentError);
  a = {};
  a.temperature = 0.0;
  a.do_sample = true;
  const GenerationConfig gc = generation_config(a, nullptr);
  EXPECT_EQ(gc.do_sample, false);
  EXPECT_FALSE(gc.temperature);
}

// --chat-template takes a file, or Jinja text as it is; anything else is refused by name.
TEST(CommandLine, ChatTemplateIsAFileOrTheTemplateItself) {
  const std::string path = ::testing::TempDir() + "/chat_template_flag.jinja";
  { std::ofstream(path) << "{% for m in messages %}{{ m.content }}{% endfor %}"; }
  EXPECT_EQ(chat_template_from(path), "{% for m in messages %}{{ m.content }}{% endfor %}");
  EXPECT_EQ(chat_template_from("{{ bos_token }}"), "{{ bos_token }}");
  try {
    chat_template_from("no-such-template.jinja");
    FAIL() << "a missing file that is no template";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-template.jinja"), std::string::npos) << e.what();
  }
}

// compile's verdict: the steps over one chip's HBM named, with their largest peak and what to
// change; nothing when all fit.
TEST(CommandLine, CompileNamesTheStepsOverOneChipsHbm) {
  const int64_t gib = int64_t(1) << 30;
  const std::vector<StepPeak> steps = {
      {"prefill", 16, 10 * gib}, {"prefill", 4096, 20 * gib}, {"decode", 1, 17 * gib}};
  EXPECT_EQ(over_hbm_advice(steps, 32 * gib, "v6e:1x1"), "");
  const std::string advice = over_hbm_advice(steps, 16 * gib, "v5e:2x2");
  EXPECT_NE(advice.find("does not fit: prefill 4096, decode 1 (peak up to 20480 MiB) need more "
                        "than one v5e chip's 16384 MiB of HBM"),
            std::string::npos)
      << advice;
  EXPECT_NE(advice.find("--max-cache-len"), std::string::npos) << advice;
  EXPECT_NE(advice.find("--quantize"), std::string::npos) << advice;
}

}  // namespace
}  // namespace tformers::cli
