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

// Kernel libraries are a few MB; the cap keeps a hostile package from filling memory.
inline constexpr uint64_t kMaxKernelFileBytes = uint64_t(1) << 32;  // 4 GiB

// A whole regular file of at most kMaxKernelFileBytes (io::RegularFile's errors: NotFoundError
// when missing, IoError for a FIFO or device, FormatError when too large).
std::vector<char> read_file_bytes(const std::string& path);

}  // namespace tformers::kernels_hub
