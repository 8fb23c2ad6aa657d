// tformers serve end to end with the official openai client (tools/serve/*.mjs, node): chat and
// completions streamed and not, then a 32-client load test; each server must exit 0 on SIGTERM.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error_of.h"
#include "common/sanitizers.h"
#include "io/io_test_util.h"
#include "serve/openai.h"
#include "serve/serve_process.h"

namespace tformers::serve::testing {
namespace {

// Runs a shell command and returns its stdout.
std::string run_capture(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  pclose(p);
  return out;
}

// Runs a script of tools/serve with node; its output goes to the test's log.
int node(const std::string& script, const std::string& args) {
  if (!std::filesystem::exists(TFORMERS_NPM_DIR "/openai")) {
    ADD_FAILURE() << "the openai npm package is missing: run scripts/setup.sh --tests";
    return -1;
  }
  const std::string cmd =
      "node " TFORMERS_SOURCE_DIR "/tools/serve/" + script + " " + args + " 2>&1";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The code blocks of README.md's "## tformers serve" section, in order.
std::vector<std::string> readme_serve_blocks() {
  std::ifstream in(TFORMERS_SOURCE_DIR "/README.md");
  std::vector<std::string> blocks;
  bool in_section = false, in_block = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) in_section = line == "## tformers serve";
    if (!in_section) continue;
    if (line.rfind("```", 0) == 0) {
      in_block = !in_block;
      if (in_block) blocks.emplace_back();
      continue;
    }
    if (in_block) blocks.back() += line + "\n";
  }
  return blocks;
}

std::string with_port(std::string text, int port) {
  for (size_t p; (p = text.find("127.0.0.1:8080")) != std::string::npos;)
    text.replace(p, 14, "127.0.0.1:" + std::to_string(port));
  return text;
}

// The README's curl command and openai client example, as written, against a server on the
// README's address (here a free port in its place).
TEST(Serve, ReadmeExamplesRun) {
  const std::vector<std::string> blocks = readme_serve_blocks();
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].rfind("tformers serve -m models/kjv-fortunes-tiny ", 0), 0u) << blocks[0];
  ServeProcess server;
  const auto dir =
      std::filesystem::temp_directory_path() / ("tformers_readme_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "curl.sh") << with_port(blocks[1], server.port());
  const std::string answer = run_capture("sh " + (dir / "curl.sh").string());
  const Json reply = Json::parse(answer, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(reply.is_object()) << answer;
  EXPECT_FALSE(reply["choices"][0]["message"]["content"].get<std::string>().empty()) << answer;
  // The example imports 'openai' as an installed package would be found: from node_modules.
  std::filesystem::create_directory_symlink(TFORMERS_NPM_DIR, dir / "node_modules");
  std::ofstream(dir / "example.mjs") << with_port(blocks[2], server.port());
  const std::string text = run_capture("node " + (dir / "example.mjs").string());
  EXPECT_GT(text.size(), 1u) << text;
  EXPECT_EQ(
      metric(server, "tformers_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}"),
      2);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(server.stop(), 0);
}

TEST(Serve, OpenAiClientThenNoCompilesAndSigtermExitsZero) {
  ServeProcess server;
  ASSERT_NE(server.port(), 0);
  EXPECT_CONTAINS(server.log(), "ready: warm-up took");
  EXPECT_EQ(node("openai_client.mjs", "--base-url " + server.base_url() + " --model " + kModel), 0);
  // That mix of requests (chat and completions, prompt lengths, streamed or not, logprobs,
  // sampling) ran on the shapes compiled at warm-up.
  EXPECT_EQ(metric(server, "tformers_compiles_since_ready_total"), 0) << server.log();
  EXPECT_GT(metric(server, "tformers_generation_tokens_total"), 0);
  EXPECT_EQ(server.stop(), 0) << server.log();
  EXPECT_CONTAINS(server.log(), "stopped");
}

TEST(Serve, APortInUseIsAClearError) {
  ServeProcess first;
  // Bounded: a second server that did bind would serve until killed.
  const std::string out =
      run_capture("cd " TFORMERS_SOURCE_DIR " && timeout 60 " TFORMERS_CLI " serve -m " + kModel +
                  " --port " + std::to_string(first.port()) + " 2>&1; echo status $?");
  EXPECT_CONTAINS(out, "error: serve: cannot listen on 127.0.0.1:" + std::to_string(first.port()));
  EXPECT_CONTAINS(out, "choose one with --port");
  EXPECT_CONTAINS(out, "status 1");
  EXPECT_EQ(first.stop(), 0);
}

// Past its end-of-sequence tokens (skipped in the text) and partial characters, a stream has
// tokens that add no text; it must still run to its last chunk and [DONE].
TEST(Serve, StreamsOfTokensWithoutTextRunToTheEnd) {
  ServeProcess server;
  RawConnection raw(server.port());
  raw.send(post_request("/v1/chat/completions",
                        Json{{"model", kModel},
                             {"messages", {{{"role", "user"}, {"content", "Tell me a fortune"}}}},
                             {"max_tokens", 200},
                             {"ignore_eos", true},
                             {"temperature", 0},
                             {"stream", true},
                             {"stream_options", {{"include_usage", true}}}}
                            .dump()));
  const std::string stream = raw.read_until("data: [DONE]");
  EXPECT_CONTAINS(stream, R"("finish_reason":"length")");
  EXPECT_CONTAINS(stream, R"("completion_tokens":200)");
  EXPECT_CONTAINS(stream, "data: [DONE]");
  EXPECT_EQ(server.stop(), 0);
}

// A prompt sent twice: the second time its whole blocks come from the prefix cache, as /metrics
// counts, and the answer is the same; --no-enable-prefix-caching turns the cache off.
TEST(Serve, PrefixCachingShowsInMetricsAndTurnsOff) {
  const std::string body = Json{
      {"model", kModel},
      {"prompt",
       "And the LORD spake unto Moses, saying, Speak unto the children of Israel, "
       "and say unto them, When ye be come into the land"},
      {"max_tokens", 8},
      {"temperature", 0}}.dump();
  for (bool on : {true, false}) {
    ServeProcess server(on ? std::vector<std::string>{}
                           : std::vector<std::string>{"--no-enable-prefix-caching"});
    std::vector<std::string> texts;
    std::vector<int64_t> cached;
    for (int i = 0; i < 2; ++i) {
      auto r = server.client().Post("/v1/completions", body, "application/json");
      ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
      const Json j = Json::parse(r->body);
      texts.push_back(j["choices"][0]["text"].get<std::string>());
      cached.push_back(j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>());
    }
    EXPECT_EQ(texts[0], texts[1]);
    // Each request's own hit, in its usage as OpenAI and vLLM report it: none the first time,
    // the second the first one's whole blocks (those metrics count below).
    EXPECT_EQ(cached[0], 0);
    if (on)
      EXPECT_GE(cached[1], 16);
    else
      EXPECT_EQ(cached[1], 0);
    const double queries = metric(server, "tformers_prefix_cache_queries_total");
    const double hits = metric(server, "tformers_prefix_cache_hits_total");
    EXPECT_EQ(queries, metric(server, "tformers_prompt_tokens_total")) << on;  // no preemption
    if (on) {
      EXPECT_GE(hits, 16) << server.log();  // at least a block of 16 positions
      EXPECT_EQ(double(cached[1]), hits);
      EXPECT_GT(metric(server, "tformers_kv_blocks_cached"), 0);
      EXPECT_GT(metric(server, "tformers_prefix_cache_hit_rate"), 0);
    } else {
      EXPECT_EQ(hits, 0) << server.log();
      EXPECT_EQ(metric(server, "tformers_kv_blocks_cached"), 0);
    }
    EXPECT_EQ(metric(server, "tformers_num_preemptions_total"), 0);
    EXPECT_EQ(server.stop(), 0) << server.log();
  }
}

// RSS may not grow more than this past the load test's warm-up. AddressSanitizer keeps freed
// memory in quarantine (up to 256 MiB), so there RSS says nothing; LeakSanitizer checks the
// server at exit instead.
#if TFORMERS_TEST_ASAN
constexpr int kRssGrowthMib = 1 << 20;
#else
constexpr int kRssGrowthMib = 8;
#endif

TEST(Serve, LoadTestOf32StreamingClients) {
  ServeProcess server({"--max-num-seqs", "16"});
  ASSERT_NE(server.port(), 0);
  // 60 s of load after 10 s of warm-up.
  EXPECT_EQ(node("load_test.mjs", "--base-url " + server.base_url() + " --model " + kModel +
                                      " --pid " + std::to_string(server.pid()) +
                                      " --clients 32 --duration 60 --rss-growth-mib " +
                                      std::to_string(kRssGrowthMib)),
            0);
  EXPECT_EQ(server.stop(), 0) << server.log();
}

// The same load with prompts of about 1k tokens, chunked and prefilled beside the others'
// decodes, on the tiny model with a longer context (its config with max_position_embeddings
// 2048, its weights and tokenizer linked: rope works at any position). Without prefix caching,
// so that every request prefills its whole prompt: the load repeats 8 prompts, which the cache
// would otherwise serve after their first run.
TEST(Serve, LoadTestOf32StreamingClientsWith1kTokenPrompts) {
  const io::testing::TempDir dir;
  const std::filesystem::path tiny = TFORMERS_SOURCE_DIR "/" + kModel;
  for (const auto& f : std::filesystem::directory_iterator(tiny))
    if (f.path().filename() != "config.json")
      std::filesystem::create_symlink(f.path(), dir.path() / f.path().filename());
  Json config = Json::parse(slurp((tiny / "config.json").string()));
  config["max_position_embeddings"] = 2048;
  std::ofstream(dir.file("config.json")) << config.dump();
  ServeProcess server(
      {"--max-num-seqs", "16", "--max-model-len", "1100", "--no-enable-prefix-caching"}, {}, {},
      dir.path().string());
  ASSERT_NE(server.port(), 0);
  EXPECT_EQ(
      node("load_test.mjs", "--base-url " + server.base_url() + " --model " + dir.path().string() +
                                " --pid " + std::to_string(server.pid()) +
                                " --clients 32 --duration 60 --prompt-tokens 1024" +
                                " --rss-growth-mib " + std::to_string(kRssGrowthMib)),
      0);
  EXPECT_EQ(server.stop(), 0) << server.log();
}

}  // namespace
}  // namespace tformers::serve::testing
