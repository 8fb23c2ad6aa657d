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

// A shell command's exit code and its stdout and stderr together.
Result shell(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

Result cli(const std::string& env, const std::string& args) {
  return shell(env + " '" + std::string(TFORMERS_CLI) + "' kernels " + args);
}

// `tformers generate --use-kernels` with the package pinned in a kernel cache: each layer says
// which kernel it runs, and greedy text is the built-in ops' text.
TEST(KernelsCli, GenerateUseKernelsRunsThePinnedPackage) {
  TempDir cache;
  const std::string repo = "tformers-community/fused-norms";
  testing::install_package(cache.path(), repo, 1, "abc123", testing::fused_norms(1));
  const std::string lock = (cache.path() / "kernels.lock").string();
  const std::string env =
      "TFORMERS_KERNELS_PATH='" + cache.str() + "' TFORMERS_KERNELS_LOCK='" + lock + "'";
  ASSERT_EQ(cli(env, "lock " + repo + "@v1").code, 0);
  const std::string gen = " '" + std::string(TFORMERS_CLI) + "' generate -m '" +
                          TFORMERS_SOURCE_DIR + "/models/kjv-fortunes-tiny' --dtype float32 " +
                          "--prompt 'And the LORD said' -n 12 --temperature 0";
  Result with = shell(env + gen + " --use-kernels");
  Result without = shell(env + gen);
  ASSERT_EQ(with.code, 0) << with.out;
  EXPECT_NE(with.out.find("tformers: kernels: RMSNorm: " + repo), std::string::npos) << with.out;
  EXPECT_NE(with.out.find("tformers: kernels: SiLUAndMul: " + repo), std::string::npos) << with.out;
  // The generated text (the output's last line) is the same.
  auto last_line = [](const std::string& s) {
    const std::string t = s.substr(0, s.find_last_not_of('\n') + 1);
    return t.substr(t.rfind('\n') + 1);
  };
  EXPECT_EQ(last_line(with.out), last_line(without.out)) << with.out << "\n--\n" << without.out;
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
