#include "serve/metrics.h"

#include <algorithm>
#include <charconv>

namespace tformers::serve {

namespace {

// The shortest text that reads back as the same double.
std::string number(double x) {
  char s[32];
  return std::string(s, std::to_chars(s, s + sizeof s, x).ptr);
}

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const char* type, const char* help,
            double value) {
  header(out, name, type, help);
  out += name + " " + number(value) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  counts_[std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin()]++;
  sum_ += value;
  count_++;
}

void Histogram::write(std::string& out, const std::string& name) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    out += name + "_bucket{le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_sum " + number(sum_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
}

// vLLM's buckets, with time per output token starting at 1 ms rather than 10 ms: a small model
// decodes a token in a few milliseconds.
Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,
             0.4,   0.5,    0.75,  1.0,  2.5,   5.0,  7.5,   10.0, 20.0, 40.0, 80.0}) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  requests_[{endpoint, status}]++;
}

void Metrics::count_finish(const std::string& reason) {
  std::lock_guard lock(mu_);
  finished_[reason]++;
}

void Metrics::observe_time_to_first_token(double seconds) {
  std::lock_guard lock(mu_);
  ttft_.observe(seconds);
}

void Metrics::observe_time_per_output_token(double seconds) {
  std::lock_guard lock(mu_);
  tpot_.observe(seconds);
}

std::string Metrics::render(const ServingStats& s) const {
  std::string out;
  {
    std::lock_guard lock(mu_);
    header(out, "tformers_requests_total", "counter",
           "HTTP requests answered, by route and status.");
    for (const auto& [key, n] : requests_)
      out += "tformers_requests_total{endpoint=\"" + key.first + "\",status=\"" +
             std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
    header(out, "tformers_completions_finished_total", "counter",
           "Completions ended, by why: stop, length, timeout, shutdown, error, disconnected.");
    for (const auto& [reason, n] : finished_)
      out += "tformers_completions_finished_total{reason=\"" + reason + "\"} " + std::to_string(n) +
             "\n";
    header(out, "tformers_time_to_first_token_seconds", "histogram",
           "Seconds from a request's arrival to its first generated token.");
    ttft_.write(out, "tformers_time_to_first_token_seconds");
    header(out, "tformers_time_per_output_token_seconds", "histogram",
           "Mean seconds between a request's generated tokens after the first.");
    tpot_.write(out, "tformers_time_per_output_token_seconds");
  }
  sample(out, "tformers_prompt_tokens_total", "counter", "Prompt tokens of requests admitted.",
         double(s.prompt_tokens));
  sample(out, "tformers_generation_tokens_total", "counter", "Tokens generated.",
         double(s.generated_tokens));
  sample(out, "tformers_num_requests_running", "gauge", "Sequences being decoded.",
         double(s.running));
  sample(out, "tformers_num_requests_waiting", "gauge", "Requests waiting for a row or KV blocks.",
         double(s.waiting));
  sample(out, "tformers_kv_blocks_used", "gauge", "KV cache blocks held by sequences.",
         double(s.kv_blocks_used));
  sample(out, "tformers_kv_blocks_free", "gauge",
         "KV cache blocks no sequence holds (never used, freed, or cached).",
         double(s.kv_blocks_total - s.kv_blocks_used));
  sample(out, "tformers_kv_blocks_cached", "gauge",
         "KV cache blocks kept under a prefix hash, held by a sequence or not.",
         double(s.kv_blocks_cached));
  sample(out, "tformers_prefill_tokens_total", "counter",
         "Tokens prefilled, padding and cached prefixes excluded.", double(s.prefill_tokens));
  sample(out, "tformers_prefix_cache_queries_total", "counter",
         "Tokens looked up in the prefix cache at admission.", double(s.prefix_cache_queries));
  sample(out, "tformers_prefix_cache_hits_total", "counter",
         "Tokens found in the prefix cache at admission.", double(s.prefix_cache_hits));
  sample(
      out, "tformers_prefix_cache_hit_rate", "gauge",
      "Share of the tokens looked up that the prefix cache held, since start.",
      s.prefix_cache_queries ? double(s.prefix_cache_hits) / double(s.prefix_cache_queries) : 0.0);
  sample(out, "tformers_num_preemptions_total", "counter",
         "Running sequences that gave their KV blocks up, to be computed again.",
         double(s.preemptions));
  sample(out, "tformers_engine_steps_total", "counter", "Engine steps (prefills and decodes).",
         double(s.steps));
  sample(out, "tformers_compiles_total", "counter", "Compiles of the model's steps since load.",
         double(s.compiles));
  sample(out, "tformers_compiles_since_ready_total", "counter",
         "Compiles since warm-up finished; 0 while every shape comes from the warm-up plan.",
         double(s.compiles_since_ready));
  sample(out, "tformers_padded_tokens_total", "counter",
         "Positions computed only as padding (bucketed prompts, padded decode batches).",
         double(s.padded_tokens));
  sample(out, "tformers_computed_tokens_total", "counter", "Positions computed, padding included.",
         double(s.computed_tokens));
  sample(out, "tformers_padding_waste_ratio", "gauge",
         "Share of computed positions that were padding, since start.",
         s.computed_tokens ? double(s.padded_tokens) / double(s.computed_tokens) : 0.0);
  sample(out, "tformers_warm_up_seconds", "gauge", "Seconds the warm-up compiles took.",
         s.warm_up_seconds);
  return out;
}

}  // namespace tformers::serve
