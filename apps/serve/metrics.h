// /metrics of `tformers serve`, in Prometheus' text format: the server's own counters (requests
// by endpoint and status, latency histograms) and the engine's ServingStats at scrape time.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tformers/serving.h"

namespace tformers::serve {

// A Prometheus histogram over fixed bucket bounds (upper bounds, ascending).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // Appends name_bucket{le=...} (cumulative, ending with +Inf), name_sum and name_count.
  void write(std::string& out, const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last is above every bound
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  // One answered request; `endpoint` is its route, or "other".
  void count_request(const std::string& endpoint, int status);
  // One completion ended: "stop", "length", "timeout", "shutdown", "error", or "disconnected"
  // (the client left, or a write to it failed, before the end).
  void count_finish(const std::string& reason);
  // Seconds from a request's arrival to its first token, and the mean seconds between its later
  // tokens (requests with two tokens or more).
  void observe_time_to_first_token(double seconds);
  void observe_time_per_output_token(double seconds);
  // The text of /metrics.
  std::string render(const ServingStats& stats) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> finished_;
  Histogram ttft_, tpot_;
};

}  // namespace tformers::serve
