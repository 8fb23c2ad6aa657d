// Incremental SHA-256 (FIPS 180-4) for pinning kernel package files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tformers::kernels_hub {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  // Finishes the digest: 64 lower-case hex digits. The object is spent afterwards.
  std::string hex();

 private:
  void block(const uint8_t* p);
  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t length_ = 0;
};

// A whole file; NotFoundError when it cannot be opened.
std::vector<char> read_file_bytes(const std::string& path);

}  // namespace tformers::kernels_hub
