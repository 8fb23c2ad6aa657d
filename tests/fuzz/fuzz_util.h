// Shared by the libFuzzer targets: a scratch folder for inputs that must be files, and the rule
// every target checks: any input either works or throws a tformers::Error. Any other exception
// escapes LLVMFuzzerTestOneInput and libFuzzer reports it as a crash, as it does sanitizer
// reports, timeouts and out-of-memory.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "tformers/error.h"

namespace tformers::fuzz {

// A folder private to this process, removed at exit.
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tformers_fuzz_XXXXXX").string();
    std::filesystem::path p = mkdtemp(tmpl.data());
    static struct Remove {
      std::filesystem::path p;
      ~Remove() {
        std::error_code ec;
        std::filesystem::remove_all(p, ec);
      }
    } remove{p};
    return p;
  }();
  return dir;
}

inline std::string write_file(const std::string& name, std::string_view bytes) {
  std::string path = (scratch() / name).string();
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), std::streamsize(bytes.size()));
  return path;
}

// Runs f; tformers errors are the expected outcome of bad input.
template <typename F>
void expect_ok_or_error(F&& f) {
  try {
    f();
  } catch (const Error&) {
  }
}

// Splits a fuzz input at the first "\n---\n" into two parts (the second empty when absent), so
// one input can carry, say, a template and its messages.
inline std::pair<std::string_view, std::string_view> split_input(const uint8_t* data, size_t n) {
  std::string_view all(reinterpret_cast<const char*>(data), n);
  size_t at = all.find("\n---\n");
  if (at == std::string_view::npos) return {all, {}};
  return {all.substr(0, at), all.substr(at + 5)};
}

}  // namespace tformers::fuzz
