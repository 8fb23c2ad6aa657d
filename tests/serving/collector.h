// Collects one serving request's events (tokens, log-probabilities, the finish reason and error)
// from the scheduler thread, for the serving tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "tformers/serving.h"

namespace tformers::testing {

class Collector {
 public:
  ServingCallback callback() {
    return [this](const ServingEvent& e) {
      std::lock_guard<std::mutex> lock(mu_);
      if (e.token >= 0) {
        tokens_.push_back(e.token);
        logprobs_.push_back(e.logprob);
        top_.push_back(e.top_logprobs);
      }
      if (!e.finish_reason.empty()) {
        reason_ = e.finish_reason;
        error_ = e.error;
        cv_.notify_all();
      }
    };
  }
  // The finish reason, after waiting up to a minute for it.
  std::string wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(60), [&] { return !reason_.empty(); });
    return reason_;
  }
  std::vector<int32_t> tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_;
  }
  std::vector<float> logprobs() {
    std::lock_guard<std::mutex> lock(mu_);
    return logprobs_;
  }
  std::vector<std::vector<TokenLogprob>> top() {
    std::lock_guard<std::mutex> lock(mu_);
    return top_;
  }
  std::string error() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> tokens_;
  std::vector<float> logprobs_;
  std::vector<std::vector<TokenLogprob>> top_;
  std::string reason_, error_;
};

}  // namespace tformers::testing
