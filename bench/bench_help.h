// Every bench program answers -h or --help with its usage on stdout and exit status 0 before
// it does anything else: some of them run for many minutes, and a user asking how to call one
// should not have to wait for it (or kill it) to find out.
#pragma once

#include <cstdio>
#include <string_view>

namespace tformers::bench {

// True when -h or --help is among the arguments; the usage has then been printed.
inline bool answered_help(int argc, char** argv, const char* usage) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(usage, stdout);
      return true;
    }
  }
  return false;
}

}  // namespace tformers::bench
