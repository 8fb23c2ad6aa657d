// Helpers for the hub-kernel tests: temporary kernel caches filled from the packages and
// fixture libraries the build made (next to the tformers CLI, under kernels/).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "tformers/kernels.h"

namespace tformers::testing {

namespace fs = std::filesystem;

// ${CMAKE_BINARY_DIR}/kernels: the project's packages and the fixture libraries.
inline fs::path built_kernels() { return fs::path(TFORMERS_CLI).parent_path() / "kernels"; }
inline fs::path fused_norms(int major) {
  return built_kernels() / "tformers-community" / "fused-norms" / ("v" + std::to_string(major));
}
inline fs::path fixture_library(const std::string& kind) {
  return built_kernels() / "fixtures" / ("libfixture_" + kind + ".so");
}

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("tformers-hub-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

inline void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// Copies a package folder into <root>/kernels--org--name/snapshots/<revision> and points
// refs/v<major> at it; returns the snapshot folder.
inline fs::path install_package(const fs::path& root, const std::string& repo_id, int major,
                                const std::string& revision, const fs::path& package) {
  std::string folder = "kernels--" + repo_id.substr(0, repo_id.find('/')) + "--" +
                       repo_id.substr(repo_id.find('/') + 1);
  fs::path snap = root / folder / "snapshots" / revision;
  fs::create_directories(snap);
  fs::copy(package, snap, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  write_text(root / folder / "refs" / ("v" + std::to_string(major)), revision + "\n");
  return snap;
}

// The manifest the fixture libraries are built for (tests/kernels_hub/fixtures).
inline const char* kFixtureManifest = R"({
  "name": "fixture", "version": "1.0.0", "license": "MIT", "backends": ["cpu"],
  "layers": {"RMSNorm": {"inputs": ["x:f32", "weight:f32"], "attributes": ["eps:f32"],
                         "output": "y:f32"}}
})";

// A package folder holding one fixture library as variant cabi1-cpu-x86_64-linux.
inline fs::path make_fixture_package(const fs::path& dir, const std::string& kind,
                                     const std::string& manifest = kFixtureManifest,
                                     const std::string& variant = "cabi1-cpu-x86_64-linux") {
  write_text(dir / "manifest.json", manifest);
  fs::create_directories(dir / "build" / variant);
  fs::copy_file(fixture_library(kind), dir / "build" / variant / ("libfixture_" + kind + ".so"),
                fs::copy_options::overwrite_existing);
  return dir;
}

// Options for a cache at `root` with a lock file at `lock` (which may not exist yet).
inline KernelOptions cache_options(const TempDir& root, const std::string& lock = "") {
  KernelOptions o;
  o.cache_dirs = {root.str()};
  o.lock_file = lock.empty() ? (root.path() / "kernels.lock").string() : lock;
  return o;
}

// Pins packages into the options' lock file.
inline void pin(const KernelOptions& o, const std::string& repo_id, int major) {
  LockFile lock;
  if (fs::exists(o.lock_file)) lock = LockFile::load(o.lock_file);
  lock.upsert(lock_kernel(repo_id, major, o));
  lock.save(o.lock_file);
}

}  // namespace tformers::testing
