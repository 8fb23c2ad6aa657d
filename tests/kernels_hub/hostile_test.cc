// Kernel caches laid out by strangers (or by the Hugging Face hub): refs that are not vN,
// snapshot files that are symlinks into blobs/, files that link out of the package, manifests
// that are FIFOs or nested without end.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>

#include "common/error_of.h"
#include "hub_test_util.h"
#include "kernels_hub/package.h"
#include "kernels_hub/sha256.h"
#include "tformers/error.h"
#include "tformers/kernels.h"

namespace tformers {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

const std::string kRepo = "tformers-community/fused-norms";

std::string run(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int status = pclose(p);
  return out + "\nexit " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

using tformers::testing::error_of;

// Moves every file of a snapshot into ../../blobs/<n> and leaves a relative symlink in its place,
// as huggingface_hub stores downloads.
void hubify(const fs::path& snap) {
  fs::path blobs = snap.parent_path().parent_path() / "blobs";
  fs::create_directories(blobs);
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(snap))
    if (e.is_regular_file()) files.push_back(e.path());
  int n = 0;
  for (const auto& f : files) {
    fs::path blob = blobs / ("blob" + std::to_string(n++));
    fs::rename(f, blob);
    fs::create_symlink(fs::relative(blob, f.parent_path()), f);
  }
}

TEST(KernelsHostile, HubLayoutCacheLocksAndVerifies) {
  TempDir cache;
  fs::path snap =
      testing::install_package(cache.path(), kRepo, 1, "abc123", testing::fused_norms(1));
  hubify(snap);
  std::string env = "TFORMERS_KERNELS_PATH='" + cache.str() + "' '" + TFORMERS_CLI + "' kernels ";
  std::string lock = (cache.path() / "kernels.lock").string();
  std::string out = run(env + "lock " + kRepo + "@v1 --lock-file '" + lock + "'");
  EXPECT_CONTAINS(out, "exit 0");
  // Before the fix the lock named files by their blob paths (fs::relative resolved the links),
  // so verify could not find them.
  out = run(env + "verify --lock-file '" + lock + "'");
  EXPECT_CONTAINS(out, "1 kernel");
  EXPECT_CONTAINS(out, "exit 0");
  EXPECT_EQ(out.find("blobs"), std::string::npos) << out;
}

TEST(KernelsHostile, PackageFileLinkingOutOfThePackageIsRefused) {
  TempDir cache;
  fs::path snap =
      testing::install_package(cache.path(), kRepo, 1, "abc123", testing::fused_norms(1));
  fs::create_symlink("/etc/passwd", snap / "build" / "cabi1-cpu-x86_64-linux" / "passwd");
  KernelOptions o;
  o.cache_dirs = {cache.str()};
  o.lock_file = (cache.path() / "kernels.lock").string();
  EXPECT_CONTAINS(error_of<FormatError>([&] { lock_kernel(kRepo, 1, o); }),
                  "\"build/cabi1-cpu-x86_64-linux/passwd\" resolves to /etc/passwd through a "
                  "symbolic link, outside the folder");
}

TEST(KernelsHostile, ListReportsARefThatIsNotAVersion) {
  TempDir cache;
  testing::install_package(cache.path(), kRepo, 1, "abc123", testing::fused_norms(1));
  testing::write_text(cache.path() / "kernels--tformers-community--fused-norms" / "refs" / "vabc",
                      "abc123\n");
  std::string out =
      run("TFORMERS_KERNELS_PATH='" + cache.str() + "' '" + TFORMERS_CLI + "' kernels list");
  // std::stoi threw std::invalid_argument out of the command before.
  EXPECT_CONTAINS(out, kRepo + "@vabc  error: '" + kRepo + "@vabc' is not a kernel spec");
  EXPECT_CONTAINS(out, kRepo + "@v1  1.");
  EXPECT_CONTAINS(out, "exit 0");
}

TEST(KernelsHostile, ManifestThatIsAFifoOrNestedTooDeep) {
  TempDir pkg;
  fs::create_directories(pkg.path());
  std::string manifest = (pkg.path() / "manifest.json").string();
  ASSERT_EQ(mkfifo(manifest.c_str(), 0600), 0);
  EXPECT_EQ(error_of<IoError>([&] { kernels_hub::read_file_bytes(manifest); }),
            manifest + ": is a FIFO, expected a regular kernel package file");
  EXPECT_CONTAINS(error_of<FormatError>([&] {
                    kernels_hub::parse_manifest(std::string(100000, '[') + std::string(100000, ']'),
                                                "manifest.json");
                  }),
                  "manifest.json:1:513: JSON nests deeper than 512 levels");
}

TEST(KernelsHostile, LockVersionOutOfRange) {
  TempDir dir;
  std::string path = (dir.path() / "kernels.lock").string();
  testing::write_text(path, R"({"lock_version": 1, "kernels": [{"repo_id": "a/b",
    "version": 4294967297, "revision": "r", "manifest_sha256": ")" +
                                std::string(64, 'a') + R"(", "variants": {}}]})");
  EXPECT_EQ(error_of<FormatError>([&] { LockFile::load(path); }),
            path +
                ": kernels[0]: field 'version' = 4294967297 is out of range; allowed [0, "
                "2147483647]");
}

}  // namespace
}  // namespace tformers
