// tformers serve end to end with the official openai client (tools/serve/*.mjs, node): chat and
// completions streamed and not, then a 32-client load test; each server must exit 0 on SIGTERM.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/error_of.h"
#include "serve/openai.h"
#include "serve/serve_process.h"

namespace tformers::serve::testing {
namespace {

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

TEST(Serve, LoadTestOf32StreamingClients) {
  ServeProcess server({"--max-num-seqs", "16"});
  ASSERT_NE(server.port(), 0);
  // 60 s of load after 10 s of warm-up; RSS may not grow more than 16 MiB past the warm-up.
  EXPECT_EQ(node("load_test.mjs", "--base-url " + server.base_url() + " --model " + kModel +
                                      " --pid " + std::to_string(server.pid()) +
                                      " --clients 32 --duration 60 --rss-growth-mib 16"),
            0);
  EXPECT_EQ(server.stop(), 0) << server.log();
}

}  // namespace
}  // namespace tformers::serve::testing
