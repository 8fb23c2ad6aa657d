// Runs a shell command from the source tree with stdout and stderr captured apart, for the tests
// of the `tformers` command (tests/cli).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace tformers::testing {

struct Streams {
  int status;
  std::string out, err;
};

// `cmd` run by the shell in TFORMERS_SOURCE_DIR with `input` on stdin; its exit status and what
// it wrote to each stream.
inline Streams run(const std::string& cmd, const std::string& input = "") {
  const std::string base =
      std::filesystem::temp_directory_path() / ("tformers_cli_" + std::to_string(::getpid()));
  std::ofstream(base + ".in") << input;
  const int st = std::system(("cd " TFORMERS_SOURCE_DIR " && " + cmd + " >" + base + ".out 2>" +
                              base + ".err <" + base + ".in")
                                 .c_str());
  auto slurp = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  Streams r{WEXITSTATUS(st), slurp(base + ".out"), slurp(base + ".err")};
  for (const char* ext : {".in", ".out", ".err"}) std::filesystem::remove(base + ext);
  return r;
}

}  // namespace tformers::testing
