// `tformers serve --tp 2` under `tformers launch`: rank 0 takes the requests and schedules, rank 1
// runs the steps rank 0 sends it. The split server must answer what one process answers, alone
// and batched, and end on SIGTERM as one process does: running streams finish, every rank exits.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error_of.h"
#include "common/missing_dependency.h"
#include "serve/serve_process.h"

namespace tformers::serve::testing {
namespace {

bool have_mpirun() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

// A greedy completion's text, or what went wrong.
std::string complete(const ServeProcess& server, const std::string& prompt) {
  httplib::Client c = server.client();
  const nlohmann::json body = {{"model", kModel},
                               {"prompt", prompt},
                               {"max_tokens", 16},
                               {"temperature", 0},
                               {"ignore_eos", true}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  if (!r) return "no answer";
  if (r->status != 200) return "status " + std::to_string(r->status) + ": " + r->body;
  return nlohmann::json::parse(r->body)["choices"][0]["text"].get<std::string>();
}

const std::vector<std::string> kPrompts = {"And God said", "Blessed are the", "In the beginning",
                                           "Thou shalt not", "The LORD is my"};

TEST(ServeTp, TwoRanksAnswerWhatOneProcessAnswersAndDrainOnSigterm) {
  if (!have_mpirun()) TF_SKIP_MISSING_DEPENDENCY("mpirun not found (Debian: openmpi-bin)");
  std::vector<std::string> want;
  {
    ServeProcess one({"--device", "cpu"});
    for (const std::string& p : kPrompts) want.push_back(complete(one, p));
  }
  // A grace that the streams' 200 tokens fit in under the sanitizers too.
  ServeProcess two({"--device", "cpu", "--tp", "2", "--shutdown-timeout", "50"}, {},
                   {"--nproc-per-node", "2"});
  ASSERT_NE(two.port(), 0) << two.log();
  // One request at a time (prefill and decode of batch 1), then all at once (admitted together,
  // decoded as one batch, a repeated prefix found in the cache).
  for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(complete(two, kPrompts[i]), want[i]);
  std::vector<std::future<std::string>> batch;
  for (const std::string& p : kPrompts)
    batch.push_back(std::async(std::launch::async, [&two, p] { return complete(two, p); }));
  for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(batch[i].get(), want[i]);

  // SIGTERM to launch reaches every rank (as SIGUSR1): rank 0 lets its streams finish, then
  // stops rank 1, and launch exits 0.
  std::optional<int> status;
  for (const std::string& stream : sigterm_while_streaming(two, 2, status)) {
    EXPECT_CONTAINS(stream, R"("finish_reason":"length")");
    EXPECT_CONTAINS(stream, "data: [DONE]");
  }
  ASSERT_TRUE(status.has_value()) << "the job did not end:\n" << two.log();
  EXPECT_EQ(*status, 0) << two.log();
  EXPECT_CONTAINS(two.log(), "tformers: serve: stopped");
  EXPECT_EQ(two.log().find("rank 1"), std::string::npos) << two.log();
}

TEST(ServeTp, RanksWithoutTpAreRefusedBeforeLoading) {
  if (!have_mpirun()) TF_SKIP_MISSING_DEPENDENCY("mpirun not found (Debian: openmpi-bin)");
  const std::string cmd = std::string(TFORMERS_CLI) + " launch --nproc-per-node 2 -- " +
                          TFORMERS_CLI + " serve -m " + TFORMERS_SOURCE_DIR + "/" + kModel +
                          " --port 0 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  EXPECT_NE(pclose(f), 0) << out;
  EXPECT_CONTAINS(out, "serve: started on 2 ranks; give --tp 2");
}

}  // namespace
}  // namespace tformers::serve::testing
