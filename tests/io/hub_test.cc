// Model id resolution over a Hugging Face cache tree built in a temporary folder.
#include "io/hub.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>

#include "io/io_test_util.h"

namespace tformers::io {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::TempDir;
using testing::write_bytes;

constexpr const char* kMain = "0123456789abcdef0123456789abcdef01234567";
constexpr const char* kOld = "fedcba9876543210fedcba9876543210fedcba98";

class Hub : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) {
      const char* cur = std::getenv(v);
      saved_.push_back(cur ? std::optional<std::string>(cur) : std::nullopt);
      unsetenv(v);
    }
  }
  void TearDown() override {
    for (size_t i = 0; i < std::size(kVars); ++i) {
      if (saved_[i])
        setenv(kVars[i], saved_[i]->c_str(), 1);
      else
        unsetenv(kVars[i]);
    }
  }
  // A cached model as huggingface_hub lays it out: refs/<branch> holds a commit hash,
  // snapshots/<commit>/ holds the files (symlinks to blobs/).
  static fs::path add_model(const fs::path& cache, const std::string& folder) {
    fs::path repo = cache / folder;
    write_bytes((repo / "blobs" / "abc").string(), "{}");
    for (const char* commit : {kMain, kOld}) {
      fs::create_directories(repo / "snapshots" / commit);
      fs::create_symlink("../../blobs/abc", repo / "snapshots" / commit / "config.json");
    }
    write_bytes((repo / "refs" / "main").string(), std::string(kMain) + "\n");
    write_bytes((repo / "refs" / "v1.0").string(), kOld);
    return repo;
  }
  static constexpr const char* kVars[] = {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME",
                                          "XDG_CACHE_HOME", "HOME"};
  std::vector<std::optional<std::string>> saved_;
  TempDir tmp_;
};

TEST_F(Hub, ExistingFolderIsReturnedAsIs) {
  EXPECT_EQ(resolve_model_path(tmp_.path().string()), tmp_.path().string());
}

TEST_F(Hub, HfHubCacheAndRefsMain) {
  fs::path repo = add_model(tmp_.path() / "hubcache", "models--Qwen--Qwen3-0.6B");
  setenv("HF_HUB_CACHE", (tmp_.path() / "hubcache").c_str(), 1);
  std::string got = resolve_model_path("Qwen/Qwen3-0.6B");
  EXPECT_EQ(fs::path(got), repo / "snapshots" / kMain);
  EXPECT_TRUE(fs::exists(fs::path(got) / "config.json"));
}

TEST_F(Hub, HfHomeWhenHubCacheUnset) {
  fs::path repo = add_model(tmp_.path() / "home" / "hub", "models--org--m");
  setenv("HF_HOME", (tmp_.path() / "home").c_str(), 1);
  EXPECT_EQ(fs::path(resolve_model_path("org/m")), repo / "snapshots" / kMain);
}

TEST_F(Hub, HfHubCacheTakesPrecedenceOverHfHome) {
  add_model(tmp_.path() / "home" / "hub", "models--org--m");
  fs::create_directories(tmp_.path() / "hubcache");
  setenv("HF_HOME", (tmp_.path() / "home").c_str(), 1);
  setenv("HF_HUB_CACHE", (tmp_.path() / "hubcache").c_str(), 1);
  // Like huggingface_hub, only the chosen cache is used.
  std::string msg = error_of<NotFoundError>([&] { resolve_model_path("org/m"); });
  EXPECT_HAS(msg, (tmp_.path() / "hubcache" / "models--org--m").string());
  EXPECT_HAS(msg, "$HF_HUB_CACHE");
  fs::path repo = add_model(tmp_.path() / "hubcache", "models--org--m");
  EXPECT_EQ(fs::path(resolve_model_path("org/m")), repo / "snapshots" / kMain);
}

TEST_F(Hub, DefaultCacheUnderHome) {
  fs::path repo = add_model(tmp_.path() / ".cache" / "huggingface" / "hub", "models--gpt2");
  setenv("HOME", tmp_.path().c_str(), 1);
  EXPECT_EQ(fs::path(resolve_model_path("gpt2")), repo / "snapshots" / kMain);
}

TEST_F(Hub, ExplicitRevisionBranchOrCommit) {
  fs::path repo = add_model(tmp_.path(), "models--org--m");
  setenv("HF_HUB_CACHE", tmp_.path().c_str(), 1);
  EXPECT_EQ(fs::path(resolve_model_path("org/m", "v1.0")), repo / "snapshots" / kOld);
  EXPECT_EQ(fs::path(resolve_model_path("org/m", kOld)), repo / "snapshots" / kOld);
  std::string msg = error_of<NotFoundError>([&] { resolve_model_path("org/m", "v2"); });
  EXPECT_HAS(msg, (repo / "refs" / "v2").string());
  EXPECT_HAS(msg, (repo / "snapshots" / "v2").string());
  EXPECT_HAS(msg, "main, v1.0");  // what the cache does have
}

TEST_F(Hub, RefPointingAtMissingSnapshot) {
  fs::path repo = add_model(tmp_.path(), "models--org--m");
  fs::remove_all(repo / "snapshots" / kMain);
  setenv("HF_HUB_CACHE", tmp_.path().c_str(), 1);
  std::string msg = error_of<NotFoundError>([&] { resolve_model_path("org/m"); });
  EXPECT_HAS(msg, (repo / "refs" / "main").string());
  EXPECT_HAS(msg, (repo / "snapshots" / kMain).string());
  write_bytes((repo / "refs" / "main").string(), "../../../etc");
  EXPECT_HAS(error_of<FormatError>([&] { resolve_model_path("org/m"); }), "expected a commit");
}

TEST_F(Hub, MissingModelListsEveryPlaceLooked) {
  setenv("HF_HOME", (tmp_.path() / "home").c_str(), 1);
  std::string msg = error_of<NotFoundError>([&] { resolve_model_path("org/absent"); });
  EXPECT_HAS(msg, fs::absolute("org/absent").string());
  EXPECT_HAS(msg, (tmp_.path() / "home" / "hub" / "models--org--absent").string());
  EXPECT_HAS(msg, "$HF_HOME/hub");
  EXPECT_HAS(msg, "never downloads");
}

TEST_F(Hub, InvalidIdsAndRevisions) {
  setenv("HF_HUB_CACHE", tmp_.path().c_str(), 1);
  for (const char* bad : {"../x", "a/b/c", "org/..", "a--b/c", "-org/m", "org/m.", "/abs/none"}) {
    SCOPED_TRACE(bad);
    EXPECT_HAS(error_of<NotFoundError>([&] { resolve_model_path(bad); }), bad);
  }
  for (const char* bad : {"../main", "", "a/../../b", "/main"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(resolve_model_path("org/m", bad), InvalidArgumentError);
  }
  EXPECT_THROW(resolve_model_path(""), InvalidArgumentError);
}

}  // namespace
}  // namespace tformers::io
