// Incremental SHA-256 for pinning kernel package files, computed by OpenSSL's libcrypto (EVP):
// security code from a library that is reviewed and maintained, not written here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tformers::kernels_hub {

class Sha256 {
 public:
  Sha256();  // Error if libcrypto cannot start a digest
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t size);
  // Finishes the digest: 64 lower-case hex digits. The object is spent afterwards.
  std::string hex();

 private:
  struct Context;
  std::unique_ptr<Context> ctx_;
};

// Kernel libraries are a few MB; the cap keeps a hostile package from filling memory.
inline constexpr uint64_t kMaxKernelFileBytes = uint64_t(1) << 32;  // 4 GiB

// A whole regular file of at most kMaxKernelFileBytes (io::RegularFile's errors: NotFoundError
// when missing, IoError for a FIFO or device, FormatError when too large).
std::vector<char> read_file_bytes(const std::string& path);

}  // namespace tformers::kernels_hub
