// Ctrl-C in a long command (perplexity, quantize, bench). Left to its default, SIGINT ends the
// process at once: a progress bar stays half drawn, a quantized folder may be half written, the
// work done so far goes unsaid. While a StopOnCtrlC lives, the first Ctrl-C only raises a flag
// that the command polls between its steps; there it stops cleanly (erases its bar, says what
// it had done) and exits with 130, 128 + SIGINT, as a shell expects of an interrupted command.
// The handler resets itself, so a second Ctrl-C ends the process at once.
#pragma once

#include <signal.h>

#include <csignal>

namespace tformers::cli {

class StopOnCtrlC {
 public:
  static constexpr int kExitCode = 130;

  StopOnCtrlC() {
    raised_ = 0;
    struct sigaction sa = {};
    sa.sa_handler = [](int) { raised_ = 1; };
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &previous_);
  }
  ~StopOnCtrlC() { sigaction(SIGINT, &previous_, nullptr); }
  StopOnCtrlC(const StopOnCtrlC&) = delete;
  StopOnCtrlC& operator=(const StopOnCtrlC&) = delete;

  bool requested() const { return raised_ != 0; }
  // For work that polls through a callback (a load's progress): throws Stopped when requested,
  // for the command to catch where it can tidy up.
  struct Stopped {};
  void throw_if_requested() const {
    if (requested()) throw Stopped{};
  }

 private:
  static inline volatile std::sig_atomic_t raised_ = 0;
  struct sigaction previous_ = {};
};

}  // namespace tformers::cli
