// `tformers serve --device xla-cpu` end to end: the official openai client's mix of requests runs
// on the shapes compiled at warm-up, and greedy completions are the CPU server's, token for token.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "backends/pjrt/plugin_discovery.h"
#include "common/error_of.h"
#include "common/missing_dependency.h"
#include "io/json.h"
#include "serve/serve_process.h"

namespace tformers::serve::testing {
namespace {

// Both servers at one shape plan: 4 sequences, 128 positions.
const std::vector<std::string> kPlan = {"--max-num-seqs", "4", "--max-model-len", "128"};

std::vector<std::string> plan_on(const std::string& device) {
  std::vector<std::string> args = kPlan;
  args.insert(args.end(), {"--device", device});
  return args;
}

// The ids of a greedy completion of `prompt` (from its logprobs, so no detokenizing can hide a
// difference), or the response body when it is not a completion.
std::string greedy_tokens(const ServeProcess& server, const std::string& prompt) {
  const io::Json request = {{"model", kModel},  {"prompt", prompt}, {"max_tokens", 16},
                            {"temperature", 0}, {"logprobs", 1},    {"ignore_eos", true}};
  auto r = server.client().Post("/v1/completions", request.dump(), "application/json");
  if (!r || r->status != 200) return r ? r->body : "no response";
  const io::Json reply = io::Json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (!reply.is_object() || !reply.contains("choices")) return r->body;
  return reply["choices"][0]["logprobs"]["tokens"].dump();
}

TEST(XlaCpuServe, OpenAiClientRunsWithNoCompilesAfterWarmUpAndCpuTokens) {
  const backends::pjrt::PluginProbe probe = backends::pjrt::probe_plugin("xla-cpu");
  if (probe.path.empty())
    TF_SKIP_MISSING_DEPENDENCY("XLA's CPU PJRT plugin is not installed (" + probe.package + ")");
  if (!std::filesystem::exists(TFORMERS_NPM_DIR "/openai"))
    TF_SKIP_MISSING_DEPENDENCY("the openai npm package is missing: run scripts/setup.sh --tests");
  ServeProcess xla(plan_on("xla-cpu"));
  ASSERT_NE(xla.port(), 0);
  EXPECT_CONTAINS(xla.log(), "ready: warm-up took");
  const std::string cmd = "node " TFORMERS_SOURCE_DIR "/tools/serve/openai_client.mjs --base-url " +
                          xla.base_url() + " --model " + kModel + " 2>&1";
  const int status = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << xla.log();
  EXPECT_GT(metric(xla, "tformers_generation_tokens_total"), 0);

  ServeProcess cpu(plan_on("cpu"));
  for (const char* prompt : {"And the LORD said", "Blessed are", "In the beginning God"}) {
    const std::string on_xla = greedy_tokens(xla, prompt);
    const io::Json tokens = io::Json::parse(on_xla, nullptr, /*allow_exceptions=*/false);
    EXPECT_TRUE(tokens.is_array() && tokens.size() == 16) << on_xla;
    EXPECT_EQ(on_xla, greedy_tokens(cpu, prompt)) << prompt;
  }
  EXPECT_EQ(metric(xla, "tformers_compiles_since_ready_total"), 0) << xla.log();
  EXPECT_EQ(xla.stop(), 0) << xla.log();
  EXPECT_EQ(cpu.stop(), 0) << cpu.log();
}

}  // namespace
}  // namespace tformers::serve::testing
