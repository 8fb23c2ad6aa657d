// Helpers for the io tests: a scratch folder, raw safetensors files built byte by byte (so tests
// can write headers that save_safetensors would never produce), and error assertions.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error_of.h"
#include "tformers/error.h"

namespace tformers::io::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tformers_io_XXXXXX").string();
    char* p = mkdtemp(tmpl.data());
    if (!p) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char(uint8_t(n >> (8 * i)));
  return s;
}

// A safetensors file from a header text and a data buffer; the length field is the header's
// unless `length` overrides it.
inline std::string raw_safetensors(const std::string& header, const std::string& data,
                                   int64_t length = -1) {
  return le64(length < 0 ? header.size() : uint64_t(length)) + header + data;
}

using ::tformers::testing::error_of;

}  // namespace tformers::io::testing

// EXPECT that a message contains a fragment, printing both on failure (no gmock dependency).
#define EXPECT_HAS(message, fragment)                                          \
  do {                                                                         \
    const std::string tf_msg_ = (message);                                     \
    const std::string tf_frag_ = (fragment);                                   \
    EXPECT_NE(tf_msg_.find(tf_frag_), std::string::npos)                       \
        << "message: " << tf_msg_ << "\nexpected it to contain: " << tf_frag_; \
  } while (0)
