// /metrics text: Prometheus' exposition format, with the engine's stats and the server's own
// counters and histograms.
#include <gtest/gtest.h>

#include <string>

#include "common/error_of.h"
#include "serve/metrics.h"

namespace tformers::serve {
namespace {

TEST(Metrics, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1});
  for (double v : {0.05, 0.1, 0.5, 3.0}) h.observe(v);
  std::string out;
  h.write(out, "x");
  EXPECT_EQ(out,
            "x_bucket{le=\"0.1\"} 2\n"
            "x_bucket{le=\"1\"} 3\n"
            "x_bucket{le=\"+Inf\"} 4\n"
            "x_sum 3.65\n"
            "x_count 4\n");
}

TEST(Metrics, RenderHasEveryFamilyWithHelpAndType) {
  Metrics m;
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/chat/completions", 400);
  m.count_finish("stop");
  m.count_finish("disconnected");
  m.count_finish("stop");
  m.observe_time_to_first_token(0.03);
  m.observe_time_per_output_token(0.004);
  ServingStats s;
  s.running = 3;
  s.waiting = 2;
  s.kv_blocks_total = 100;
  s.kv_blocks_used = 30;
  s.kv_blocks_cached = 12;
  s.prefill_tokens = 40;
  s.prefix_cache_queries = 80;
  s.prefix_cache_hits = 20;
  s.preemptions = 3;
  s.prompt_tokens = 50;
  s.generated_tokens = 70;
  s.padded_tokens = 25;
  s.computed_tokens = 100;
  s.steps = 9;
  s.compiles = 6;
  s.compiles_since_ready = 0;
  s.warm_up_seconds = 1.5;
  const std::string text = m.render(s);
  for (const char* line : {
           "# TYPE tformers_requests_total counter\n",
           "tformers_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2\n",
           "tformers_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1\n",
           "tformers_completions_finished_total{reason=\"stop\"} 2\n",
           "tformers_completions_finished_total{reason=\"disconnected\"} 1\n",
           "# TYPE tformers_time_to_first_token_seconds histogram\n",
           "tformers_time_to_first_token_seconds_bucket{le=\"0.04\"} 1\n",
           "tformers_time_to_first_token_seconds_bucket{le=\"0.02\"} 0\n",
           "tformers_time_to_first_token_seconds_count 1\n",
           "tformers_time_per_output_token_seconds_bucket{le=\"0.005\"} 1\n",
           "tformers_time_per_output_token_seconds_bucket{le=\"0.0025\"} 0\n",
           "tformers_prompt_tokens_total 50\n",
           "tformers_generation_tokens_total 70\n",
           "# TYPE tformers_num_requests_running gauge\n",
           "tformers_num_requests_running 3\n",
           "tformers_num_requests_waiting 2\n",
           "tformers_kv_blocks_used 30\n",
           "tformers_kv_blocks_free 70\n",
           "# TYPE tformers_kv_blocks_cached gauge\n",
           "tformers_kv_blocks_cached 12\n",
           "tformers_prefill_tokens_total 40\n",
           "tformers_prefix_cache_queries_total 80\n",
           "tformers_prefix_cache_hits_total 20\n",
           "tformers_prefix_cache_hit_rate 0.25\n",
           "# TYPE tformers_num_preemptions_total counter\n",
           "tformers_num_preemptions_total 3\n",
           "tformers_engine_steps_total 9\n",
           "tformers_compiles_total 6\n",
           "tformers_compiles_since_ready_total 0\n",
           "tformers_padded_tokens_total 25\n",
           "tformers_computed_tokens_total 100\n",
           "tformers_padding_waste_ratio 0.25\n",
           "tformers_warm_up_seconds 1.5\n",
       })
    EXPECT_CONTAINS(text, line);
  // Every sample belongs to a family declared with HELP and TYPE just before it.
  std::string family;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    ASSERT_NE(end, std::string::npos);
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.rfind("# HELP ", 0) == 0) {
      family = line.substr(7, line.find(' ', 7) - 7);
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      EXPECT_EQ(line.rfind("# TYPE " + family + " ", 0), 0u) << line;
      continue;
    }
    EXPECT_EQ(line.rfind(family, 0), 0u) << line << " outside its family " << family;
  }
}

TEST(Metrics, NoPaddingRatioBeforeAnythingRan) {
  EXPECT_CONTAINS(Metrics().render({}), "tformers_padding_waste_ratio 0\n");
}

}  // namespace
}  // namespace tformers::serve
