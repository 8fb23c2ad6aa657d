// SHA-256 against the FIPS 180 example vectors and against the system's sha256sum.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "hub_test_util.h"
#include "kernels_hub/sha256.h"
#include "tformers/kernels.h"

namespace tformers {
namespace {

std::string hash(const std::string& s) { return sha256_hex(s.data(), s.size()); }

// The examples of FIPS 180-2 appendix B and the NIST example files for SHA-256.
TEST(Sha256, FipsExampleVectors) {
  EXPECT_EQ(hash(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hash("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hash("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hash("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopq"
                 "klmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(hash(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Padding boundaries: 55, 56 and 64 bytes change how many blocks the padding takes. Feeding
// the same bytes in uneven pieces must give the one-shot digest.
TEST(Sha256, IncrementalUpdatesMatchOneShot) {
  for (size_t n : {0u, 1u, 55u, 56u, 63u, 64u, 65u, 119u, 120u, 1000u}) {
    std::string s;
    for (size_t i = 0; i < n; ++i) s += char('a' + (i * 7) % 26);
    kernels_hub::Sha256 h;
    for (size_t i = 0; i < n;) {
      size_t step = std::min(n - i, 1 + i % 13);
      h.update(s.data() + i, step);
      i += step;
    }
    EXPECT_EQ(h.hex(), hash(s)) << n << " bytes";
  }
}

// An independent implementation: coreutils' sha256sum over a built kernel library.
TEST(Sha256, MatchesSha256sumOnAKernelLibrary) {
  auto lib = testing::fixture_library("good");
  FILE* p = popen(("sha256sum '" + lib.string() + "' 2>/dev/null").c_str(), "r");
  ASSERT_TRUE(p);
  char buf[65] = {0};
  size_t got = fread(buf, 1, 64, p);
  int rc = pclose(p);
  if (rc != 0 || got != 64) GTEST_SKIP() << "sha256sum is not available";
  EXPECT_EQ(sha256_file(lib.string()), std::string(buf, 64));
}

}  // namespace
}  // namespace tformers
