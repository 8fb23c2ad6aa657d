// `tformers bench` and `tformers perplexity` end to end on the shipped model: bench's JSON and
// markdown results, its roofline bytes, perplexity against the PyTorch reference's goldens
// (tools/reference/perplexity.py), and errors that name the flag or file at fault.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/error_of.h"
#include "common/run_command.h"
#include "io/json.h"

namespace {

using tformers::io::Json;
using tformers::testing::run;
using tformers::testing::Streams;

const std::string kCli = TFORMERS_CLI;
const std::string kKjv = " -m models/kjv-fortunes-tiny";

// kjv-fortunes-tiny: 3,410,688 float32 parameters, the embedding tied to the head, so a decode
// step reads every one once. With int8, the 3,407,872 linear weights (the head's own copy
// included) take 1 + 4/32 bytes, the 2,816 norm weights stay float32, and the embedding, of
// which a step gathers one row, is not counted.
constexpr int64_t kKjvBytes = 3410688 * 4, kKjvInt8Bytes = 3407872 * 9 / 8 + 2816 * 4;

Json bench_json(const std::string& flags) {
  Streams r = run(kCli + " bench" + kKjv + flags + " -o json");
  EXPECT_EQ(r.status, 0) << flags << "\n" << r.err;
  return r.status == 0 ? Json::parse(r.out) : Json::array();
}

TEST(Bench, JsonHasEachTestWithPositiveFiguresAndTheRoofline) {
  const Json rows = bench_json(" -p 16 -n 4 -t 1 -r 2");
  ASSERT_EQ(rows.size(), 2u) << rows.dump(2);
  for (const Json& r : rows) {
    EXPECT_EQ(r["model"], "kjv-fortunes-tiny");
    EXPECT_EQ(r["architecture"], "Qwen3ForCausalLM");
    EXPECT_EQ(r["dtype"], "float32");
    EXPECT_EQ(r["quantize"], "");
    EXPECT_EQ(r["load_mode"], "copy");
    EXPECT_EQ(r["threads"], 1);
    EXPECT_EQ(r["repetitions"], 2);
    EXPECT_EQ(r["weight_bytes_per_token"], kKjvBytes);
    ASSERT_EQ(r["samples_tok_s"].size(), 2u);
    double mean = 0;
    for (const Json& s : r["samples_tok_s"]) {
      EXPECT_GT(s.get<double>(), 0);
      mean += s.get<double>() / 2;
    }
    EXPECT_NEAR(r["avg_tok_s"].get<double>(), mean, 1e-9 * mean);
    EXPECT_GE(r["stddev_tok_s"].get<double>(), 0);
  }
  EXPECT_EQ(rows[0]["test"], "pp16");
  EXPECT_EQ(rows[0]["n_prompt"], 16);
  EXPECT_EQ(rows[0]["n_gen"], 0);
  EXPECT_TRUE(rows[0]["roofline_tok_s"].is_null());
  const Json& tg = rows[1];
  EXPECT_EQ(tg["test"], "tg4");
  EXPECT_EQ(tg["n_prompt"], 0);
  EXPECT_EQ(tg["n_gen"], 4);
  const double gbs = tg["read_gbs"].get<double>(), roof = tg["roofline_tok_s"].get<double>();
  EXPECT_GT(gbs, 0);
  EXPECT_NEAR(roof, gbs * 1e9 / double(kKjvBytes), 1e-9 * roof);
  EXPECT_NEAR(tg["roofline_ratio"].get<double>(), tg["avg_tok_s"].get<double>() / roof, 1e-9);
}

TEST(Bench, Int8RooflineCountsTheQuantizedBytesAndSkipsTheGatheredEmbedding) {
  const Json rows = bench_json(" -p 0 -n 2 -t 1 -r 1 --quantize int8 --load-mode mmap");
  ASSERT_EQ(rows.size(), 1u) << rows.dump(2);
  EXPECT_EQ(rows[0]["test"], "tg2");
  EXPECT_EQ(rows[0]["quantize"], "int8");
  EXPECT_EQ(rows[0]["load_mode"], "mmap");
  EXPECT_EQ(rows[0]["weight_bytes_per_token"], kKjvInt8Bytes);
}

TEST(Bench, MarkdownTableHasARowPerTestAndThreadCount) {
  Streams r = run(kCli + " bench" + kKjv + " -p 8,16 -n 2 -t 1,2 -r 1");
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<std::string> rows;
  std::stringstream ss(r.out);
  for (std::string line; std::getline(ss, line);)
    if (line.rfind("| kjv-fortunes-tiny | float32 | - | 13.6 | copy | ", 0) == 0)
      rows.push_back(line);
  ASSERT_EQ(rows.size(), 6u) << r.out;
  const std::vector<std::string> tests = {"1 | pp8 |", "1 | pp16 |", "1 | tg2 |",
                                          "2 | pp8 |", "2 | pp16 |", "2 | tg2 |"};
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_CONTAINS(rows[i], tests[i]);
    EXPECT_CONTAINS(rows[i], " ± ");
    EXPECT_EQ(std::count(rows[i].begin(), rows[i].end(), '|'), 12) << rows[i];
  }
  EXPECT_EQ(r.out.rfind("| model | dtype | quantize | MB/token |", 0), 0u) << r.out;
}

TEST(Bench, BadFlagsAreErrorsThatNameTheFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {" -p 0 -n 0", "nothing to run"},
      {" -p -3", "-p/--n-prompt -3: give token counts >= 1"},
      {" -n 1,-2", "-n/--n-gen -2"},
      {" -t 0", "-t/--threads 0 is out of range: give 1 to 1024"},
      {" -r 0", "--repetitions: '0' is outside the range [1, 1000000]"},
      {" -p 300",
       "-p/--n-prompt 300 is more than the model's 256 positions "
       "(max_position_embeddings); give at most 256"},
      {" -p 0 -n 250",
       "-n/--n-gen 250 after the 8-token prompt is more than the model's 256 "
       "positions (max_position_embeddings); give at most 248"},
      // The prompt plus this wrapped to a negative sum that passed the check.
      {" -p 0 -n 9223372036854775807",
       "-n/--n-gen 9223372036854775807 after the 8-token prompt is more than the model's 256 "
       "positions"},
      {" -o csv", "--output"},
      {" -p x", "--n-prompt"},
      {" --load-mode disk", "--load-mode"},
      {" --quantize int3", "quantize 'int3' is not supported"},
  };
  for (const auto& [flags, message] : cases) {
    Streams r = run(kCli + " bench" + kKjv + flags);
    EXPECT_NE(r.status, 0) << flags;
    EXPECT_EQ(r.out, "") << flags;
    EXPECT_CONTAINS(r.err, message);
  }
}

Json golden() {
  std::ifstream in(TFORMERS_TEST_DATA "/goldens/perplexity.kjv-fortunes-tiny.float32.json");
  return Json::parse(in);
}

Json perplexity_json(const std::string& flags) {
  Streams r = run(kCli + " perplexity" + kKjv + flags + " --json");
  EXPECT_EQ(r.status, 0) << flags << "\n" << r.err;
  return r.status == 0 ? Json::parse(r.out) : Json::object();
}

// Every window setting of the golden: the same tokens, windows and scored tokens, and the same
// mean NLL, perplexity and standard errors as the PyTorch reference, to float32 accuracy
// (measured: 2e-9 relative). With the model's own window, the NLL is also the held-out loss the
// model's README states (heldout.json, from tools/train/heldout_loss.py).
TEST(Perplexity, MatchesThePyTorchReferenceAndTheModelCard) {
  const Json g = golden();
  std::ifstream card_file(TFORMERS_SOURCE_DIR "/models/kjv-fortunes-tiny/heldout.json");
  const Json card = Json::parse(card_file);
  ASSERT_EQ(g["cases"].size(), 2u);
  for (const Json& want : g["cases"]) {
    const int64_t ctx = want["ctx"].get<int64_t>();
    const Json got =
        perplexity_json(" -f " + g["text"].get<std::string>() + " --ctx " + std::to_string(ctx));
    ASSERT_FALSE(got.empty()) << "ctx " << ctx;
    for (const char* k : {"ctx", "tokens", "windows", "scored_tokens"})
      EXPECT_EQ(got[k], want[k]) << k << ", ctx " << ctx;
    EXPECT_EQ(got["dtype"], "float32");
    for (const char* k : {"nll", "perplexity", "nll_stderr", "perplexity_stderr"}) {
      const double w = want[k].get<double>();
      EXPECT_NEAR(got[k].get<double>(), w, 1e-6 * w) << k << ", ctx " << ctx;
    }
    // heldout.json rounds to 6 decimals a loss summed from float32 cross-entropies.
    if (ctx == card["window"].get<int64_t>()) {
      EXPECT_NEAR(got["nll"].get<double>(), card["loss"].get<double>(), 2e-6);
    }
  }
}

// The first `bytes` of the held-out text, cut at a line end, in a file of its own.
std::string heldout_excerpt(size_t bytes) {
  std::ifstream in(TFORMERS_SOURCE_DIR "/models/kjv-fortunes-tiny/heldout.txt");
  std::string text(bytes, '\0');
  in.read(text.data(), std::streamsize(bytes));
  text.resize(text.rfind('\n') + 1);
  const std::string path = std::filesystem::temp_directory_path() /
                           ("tformers_excerpt_" + std::to_string(::getpid()) + ".txt");
  std::ofstream(path) << text;
  return path;
}

// Without --json: one line on stdout, a summary on stderr; the default window is the model's
// 256 positions (fewer than 512).
TEST(Perplexity, PrintsOneLineAndASummary) {
  const std::string file = heldout_excerpt(4000);
  Streams r = run(kCli + " perplexity" + kKjv + " -f " + file);
  const Json j = perplexity_json(" -f " + file);
  std::filesystem::remove(file);
  ASSERT_EQ(r.status, 0) << r.err;
  char want[96];
  std::snprintf(want, sizeof want, "perplexity: %.4f ± %.4f\n", j["perplexity"].get<double>(),
                j["perplexity_stderr"].get<double>());
  EXPECT_EQ(r.out, want);
  EXPECT_EQ(j["ctx"], 256);
  EXPECT_CONTAINS(r.err, "tformers: perplexity: " + j["tokens"].dump() + " tokens in " +
                             j["windows"].dump() + " windows of up to 256");
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

// Runs `command`, sends it SIGINT (Ctrl-C) after `seconds` (timeout(1)) and returns what it did;
// its own exit status is kept, so a command killed by the signal reads 130 too, and only what
// it wrote tells a clean stop. --foreground: otherwise timeout signals the command and then its
// whole process group, and that second SIGINT is a second Ctrl-C, which ends it at once.
Streams interrupted(const std::string& command, double seconds) {
  return run("timeout --foreground -s INT --preserve-status " + std::to_string(seconds) + " " +
             command);
}

// Ctrl-C stops a long perplexity run at the next window: what was scored is reported, the
// progress is tidied up, and the exit status is 130, as for any interrupted command.
TEST(Perplexity, CtrlCStopsAtTheNextWindowAndSaysHowFarItGot) {
  const std::string file = heldout_excerpt(1 << 20);
  std::string text;
  {
    std::ifstream in(file);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  std::ofstream(file) << text << text << text << text;  // about 20,000 windows of 8 tokens
  const Streams r = interrupted(kCli + " perplexity" + kKjv + " -f " + file + " --ctx 8", 3);
  std::filesystem::remove(file);
  EXPECT_EQ(r.status, 130) << r.err;
  EXPECT_CONTAINS(r.err, "tformers: perplexity: stopped (Ctrl-C) after ");
  EXPECT_EQ(r.out, "");
}

// Ctrl-C stops bench between timed runs; the rows measured so far are still printed.
TEST(Bench, CtrlCStopsBetweenRunsAndPrintsWhatWasMeasured) {
  const Streams r = interrupted(kCli + " bench" + kKjv + " -p 16 -n 4 -t 1 -r 100000 -o json", 3);
  EXPECT_EQ(r.status, 130) << r.err;
  EXPECT_CONTAINS(r.err, "tformers: bench: stopped (Ctrl-C) after ");
  EXPECT_TRUE(Json::parse(r.out, nullptr, false).is_array()) << r.out;
}

// --dtype auto is the checkpoint's torch_dtype (float32 here); float16 loads and runs.
TEST(Bench, DtypeAutoIsTheCheckpointsAndFloat16Runs) {
  for (const auto& [flag, want] :
       {std::pair{" --dtype auto", "float32"}, std::pair{" --dtype float16", "float16"}}) {
    const Json rows = bench_json(" -p 16 -n 4 -t 1 -r 1" + std::string(flag));
    ASSERT_EQ(rows.size(), 2u) << flag;
    EXPECT_EQ(rows[0]["dtype"], want) << flag;
  }
}

// Weight-only int8 (one scale per 32 weights) and bfloat16 weights may cost a little quality,
// not much: within 1 % of the float32 perplexity, on the first 2,400 or so held-out tokens.
TEST(Perplexity, Int8AndBfloat16StayCloseToFloat32) {
  const std::string file = heldout_excerpt(10000);
  const double f32 = perplexity_json(" -f " + file)["perplexity"].get<double>();
  for (const char* flags : {" --quantize int8", " --dtype bfloat16"}) {
    const Json got = perplexity_json(" -f " + file + flags);
    EXPECT_NEAR(got["perplexity"].get<double>(), f32, 0.01 * f32) << flags;
    EXPECT_NE(got["perplexity"].get<double>(), f32) << flags << ": not what was asked for?";
  }
  std::filesystem::remove(file);
}

TEST(Perplexity, BadInputIsAnErrorThatNamesTheFlagOrFile) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("tformers_ppl_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/empty.txt") << "";
  std::ofstream(dir + "/one.txt") << "A";
  const std::string text = " -f models/kjv-fortunes-tiny/heldout.txt";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {kKjv + text + " --ctx 1", "--ctx: '1' is outside the range [2, 2^63-1]"},
      {kKjv + text + " --ctx 257",
       "--ctx 257 is more than the model's 256 positions (max_position_embeddings)"},
      {kKjv + " -f " + dir + "/missing.txt", "--file " + dir + "/missing.txt: no such file"},
      {kKjv + " -f " + dir + "/empty.txt", "empty.txt encodes to 0 tokens"},
      {kKjv + " -f " + dir + "/one.txt", "one.txt encodes to 1 token;"},
      {kKjv + " -f " + dir, dir + ": is a directory, expected a regular --file text"},
      {kKjv, "--file is required"},
      {" -m tests/data/models/tiny-llama" + text, "tokenizer.json"},
  };
  for (const auto& [flags, message] : cases) {
    Streams r = run(kCli + " perplexity" + flags);
    EXPECT_NE(r.status, 0) << flags;
    EXPECT_EQ(r.out, "") << flags;
    EXPECT_CONTAINS(r.err, message);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
