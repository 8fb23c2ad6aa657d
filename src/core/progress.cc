#include "core/progress.h"

#include <algorithm>
#include <utility>

namespace tformers {

std::string format_progress(std::string_view what, int64_t done, int64_t total, double elapsed_s,
                            int width, std::string_view unit) {
  const double frac = total > 0 ? std::clamp(double(done) / double(total), 0.0, 1.0) : 0.0;
  const int filled = int(frac * width);
  std::string bar(size_t(filled), '#');
  bar.append(size_t(width - filled), '.');
  const bool bytes = unit.empty();
  const std::string shown(bytes ? std::string_view("MB") : unit);
  char tail[160];
  std::snprintf(tail, sizeof tail, "%3d%% [%s] %lld/%lld %s  %.1f s", int(frac * 100), bar.c_str(),
                (long long)(bytes ? done >> 20 : done), (long long)(bytes ? total >> 20 : total),
                shown.c_str(), elapsed_s);
  return std::string(what) + "  " + tail;
}

ProgressBar::ProgressBar(std::FILE* out, bool enabled, double delay_s, std::string unit)
    : out_(out), enabled_(enabled), delay_s_(delay_s), unit_(std::move(unit)) {}

void ProgressBar::update(std::string_view what, int64_t done, int64_t total) {
  if (!enabled_) return;
  const Clock::time_point now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  // Redraw at most ten times a second, and always the final state once the bar is up.
  if (elapsed < delay_s_ ||
      (drawn_ && done < total && now - last_draw_ < std::chrono::milliseconds(100)))
    return;
  std::string line =
      "tformers: " + format_progress(what, done, total, elapsed, kProgressWidth, unit_);
  // Pad over a longer previous line (the label may change between stages).
  const size_t len = line.size();
  if (len < last_len_) line.append(last_len_ - len, ' ');
  std::fprintf(out_, "\r%s", line.c_str());
  std::fflush(out_);
  last_len_ = len;
  last_draw_ = now;
  drawn_ = true;
}

void ProgressBar::finish() {
  if (!drawn_) return;
  std::fprintf(out_, "\r%s\r", std::string(last_len_, ' ').c_str());
  std::fflush(out_);
  drawn_ = false;
  last_len_ = 0;
}

}  // namespace tformers
