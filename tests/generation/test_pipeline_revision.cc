// pipeline(..., {.revision = R}) and AutoTokenizer::from_pretrained(id, R) read the tokenizer
// from revision R's snapshot in the Hub cache, the same one as the weights.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tformers/error.h"
#include "tformers/pipeline.h"

namespace tformers {
namespace {

namespace fs = std::filesystem;

// A Hub cache whose "main" snapshot has no tokenizer.json and whose "v2" snapshot is complete:
// only a tokenizer read at v2 loads.
class HubCache : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("tformers_rev_" + std::to_string(::getpid()));
    const fs::path repo = root_ / "models--org--tiny";
    const fs::path model = fs::path(TFORMERS_TEST_DATA) / "models" / "tiny-qwen3";
    for (const char* commit : {"aaaa", "bbbb"}) {
      fs::create_directories(repo / "snapshots" / commit);
      for (const auto& f : fs::directory_iterator(model))
        if (std::string(commit) == "bbbb" || f.path().filename() != "tokenizer.json")
          fs::copy_file(f.path(), repo / "snapshots" / commit / f.path().filename());
    }
    fs::create_directories(repo / "refs");
    std::ofstream(repo / "refs" / "main") << "aaaa";
    std::ofstream(repo / "refs" / "v2") << "bbbb";
    const char* old = std::getenv("HF_HUB_CACHE");
    if (old) old_ = old;
    setenv("HF_HUB_CACHE", root_.c_str(), 1);
  }
  void TearDown() override {
    if (old_) {
      setenv("HF_HUB_CACHE", old_->c_str(), 1);
    } else {
      unsetenv("HF_HUB_CACHE");
    }
    fs::remove_all(root_);
  }
  fs::path root_;
  std::optional<std::string> old_;
};

TEST_F(HubCache, TokenizerFollowsTheRevision) {
  EXPECT_THROW(AutoTokenizer::from_pretrained("org/tiny"), NotFoundError);
  EXPECT_FALSE(AutoTokenizer::from_pretrained("org/tiny", "v2").encode("The theory").empty());
  auto pipe = pipeline("text-generation", "org/tiny",
                       {.dtype = float32, .device_map = "cpu", .revision = "v2"});
  EXPECT_EQ(pipe("The theory", {.max_new_tokens = 2}).rfind("The theory", 0), 0u);
  EXPECT_THROW(pipeline("text-generation", "org/tiny", {.dtype = float32, .device_map = "cpu"}),
               NotFoundError);
}

}  // namespace
}  // namespace tformers
