// `tformers kernels list | lock | verify` through the real command.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>

#include "hub_test_util.h"
#include "tformers/kernels.h"

namespace tformers {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

struct Result {
  int code;
  std::string out;
};

Result cli(const std::string& env, const std::string& args) {
  std::string cmd = env + " '" + std::string(TFORMERS_CLI) + "' kernels " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(KernelsCli, LockVerifyListAndTamper) {
  TempDir cache;
  const std::string repo = "tformers-community/fused-norms";
  fs::path snap =
      testing::install_package(cache.path(), repo, 1, "abc123", testing::fused_norms(1));
  testing::install_package(cache.path(), repo, 2, "def456", testing::fused_norms(2));
  const std::string env = "TFORMERS_KERNELS_PATH='" + cache.str() + "'";
  const std::string lock = (cache.path() / "kernels.lock").string();

  Result r = cli(env, "lock " + repo + "@v1 " + repo + "@2 --lock-file '" + lock + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("locked " + repo + "@v1 revision abc123: 3 variants"), std::string::npos)
      << r.out;
  LockFile l = LockFile::load(lock);
  ASSERT_EQ(l.kernels.size(), 2u);
  // The lock agrees with an independent hash of the same file.
  const std::string so = "build/cabi1-cpu-x86_64-linux/libfused_norms.so";
  EXPECT_EQ(l.find(repo, 1)->variants.at("cabi1-cpu-x86_64-linux").at(so),
            sha256_file((snap / so).string()));

  r = cli(env, "verify --lock-file '" + lock + "'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2 kernels verified"), std::string::npos) << r.out;

  r = cli(env, "list");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(repo + "@v2  2.0.0  revision def456"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("* cabi1-cpu-x86_64-"), std::string::npos) << r.out;

  // One changed byte in a variant that is not even the one this machine would load.
  {
    std::fstream f(snap / so, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  r = cli(env, "verify --lock-file '" + lock + "'");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("MISMATCH " + repo + "@v1: " + so + " has sha256"), std::string::npos)
      << r.out;

  // Re-locking with no packages named re-pins what the lock holds.
  r = cli(env, "lock --lock-file '" + lock + "'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(cli(env, "verify --lock-file '" + lock + "'").code, 0);

  r = cli(env, "lock not-a-spec --lock-file '" + lock + "'");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("is not a kernel spec"), std::string::npos) << r.out;
  r = cli(env, "frobnicate");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("unknown kernels command"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tformers
