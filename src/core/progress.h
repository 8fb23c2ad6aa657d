// A one-line progress bar on a terminal, for work that may or may not take long (loading and
// converting weights). It stays silent for the first `delay` seconds, so instant loads (weights
// used from the mapping as stored) print nothing, and it never draws when the stream is not a
// terminal, so piped output and logs stay clean.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace tformers {

// "quantizing to int8  45% [#########.........] 540/1192 MB  1.2 s", `width` columns of bar.
std::string format_progress(std::string_view what, int64_t done, int64_t total, double elapsed_s,
                            int width = 30);

class ProgressBar {
 public:
  // Draws on `out` only when `enabled` (callers pass isatty) and after `delay_s` seconds.
  ProgressBar(std::FILE* out, bool enabled, double delay_s = 0.5);
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
  Clock::time_point start_ = Clock::now(), last_draw_{};
  bool drawn_ = false;
  size_t last_len_ = 0;
};

}  // namespace tformers
