// SHA-256 through OpenSSL's EVP interface (libssl-dev on Debian), which picks the machine's
// SHA extensions where they exist.
#include "kernels_hub/sha256.h"

#include <openssl/evp.h>

#include <cstdio>
#include <vector>

#include "io/file.h"
#include "tformers/error.h"
#include "tformers/kernels.h"

namespace tformers {

namespace kernels_hub {

struct Sha256::Context {
  EVP_MD_CTX* md = nullptr;
  ~Context() { EVP_MD_CTX_free(md); }
};

Sha256::Sha256() : ctx_(std::make_unique<Context>()) {
  ctx_->md = EVP_MD_CTX_new();
  if (!ctx_->md || EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) != 1)
    throw Error("sha256: libcrypto could not start a SHA-256 digest (EVP_DigestInit_ex failed)");
}

Sha256::~Sha256() = default;

void Sha256::update(const void* data, size_t size) {
  if (size && EVP_DigestUpdate(ctx_->md, data, size) != 1)
    throw Error("sha256: libcrypto failed to hash " + std::to_string(size) + " bytes");
}

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_DigestFinal_ex(ctx_->md, digest, &n) != 1 || n != 32)
    throw Error("sha256: libcrypto failed to finish the digest");
  char out[65];
  for (unsigned int i = 0; i < n; ++i) std::snprintf(out + 2 * i, 3, "%02x", digest[i]);
  return std::string(out, 64);
}

std::vector<char> read_file_bytes(const std::string& path) {
  io::RegularFile file(path, kMaxKernelFileBytes, "kernel package file");
  std::vector<char> bytes(file.size());
  file.read_at(0, bytes.data(), bytes.size());
  return bytes;
}

}  // namespace kernels_hub

std::string sha256_hex(const void* data, size_t size) {
  kernels_hub::Sha256 h;
  h.update(data, size);
  return h.hex();
}

std::string sha256_file(const std::string& path) {
  std::vector<char> bytes = kernels_hub::read_file_bytes(path);
  return sha256_hex(bytes.data(), bytes.size());
}

}  // namespace tformers
