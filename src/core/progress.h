// A one-line progress bar on a terminal, for work that may or may not take long (loading and
// converting weights, scoring a text). It stays silent for the first `delay` seconds, so instant
// loads (weights used from the mapping as stored) print nothing, and it never draws when the stream
// is not a terminal, so piped output and logs stay clean.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace tformers {

// "quantizing to int8  45% [#########.........] 540/1192 MB  1.2 s", `width` columns of bar.
// `done` and `total` are bytes, shown in MB, when `unit` is empty, else counts of `unit`
// ("12/152 windows").
constexpr int kProgressWidth = 30;
std::string format_progress(std::string_view what, int64_t done, int64_t total, double elapsed_s,
                            int width = kProgressWidth, std::string_view unit = {});

class ProgressBar {
 public:
  // Draws on `out` only when `enabled` (callers pass isatty) and after `delay_s` seconds;
  // `unit` as format_progress takes it (empty: bytes).
  ProgressBar(std::FILE* out, bool enabled, double delay_s = 0.5, std::string unit = {});
  ~ProgressBar() { finish(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void update(std::string_view what, int64_t done, int64_t total);
  // Erases the bar (when one was drawn) so that what follows starts on a clean line.
  void finish();
  bool drawn() const { return drawn_; }

 private:
  using Clock = std::chrono::steady_clock;
  std::FILE* out_;
  bool enabled_;
  double delay_s_;
  std::string unit_;
  Clock::time_point start_ = Clock::now(), last_draw_{};
  bool drawn_ = false;
  size_t last_len_ = 0;
};

}  // namespace tformers
