// `tformers quantize`: the folder it writes generates what --quantize at load generates, holds
// the source's tokenizer, and is never written over.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

struct Result {
  int status;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::stringstream ss;
  ss << std::ifstream(p, std::ios::binary).rdbuf();
  return ss.str();
}

// Runs `tformers ARGS` from the source tree, stdout and stderr apart.
Result tformers(const std::string& args) {
  const fs::path base = fs::temp_directory_path() / ("tformers_qcli_" + std::to_string(::getpid()));
  const std::string cmd = "cd " TFORMERS_SOURCE_DIR " && " TFORMERS_CLI " " + args + " >" +
                          base.string() + ".out 2>" + base.string() + ".err </dev/null";
  const int st = std::system(cmd.c_str());
  Result r{WEXITSTATUS(st), slurp(base.string() + ".out"), slurp(base.string() + ".err")};
  fs::remove(base.string() + ".out");
  fs::remove(base.string() + ".err");
  return r;
}

class QuantizeCli : public ::testing::Test {
 protected:
  void SetUp() override { fs::remove_all(out_); }
  void TearDown() override { fs::remove_all(out_); }
  const fs::path out_ = fs::temp_directory_path() / ("tformers_qcli_" + std::to_string(::getpid()));
};

TEST_F(QuantizeCli, WritesAFolderThatGeneratesAsQuantizeAtLoad) {
  const std::string model = "tests/data/models/tiny-qwen3";
  for (const std::string scheme : {"int4", "int8"}) {
    fs::remove_all(out_);
    const Result q = tformers("quantize -m " + model + " --to " + scheme + " " + out_.string());
    ASSERT_EQ(q.status, 0) << q.err;
    EXPECT_EQ(q.out, "");
    EXPECT_NE(q.err.find("wrote " + out_.string() + " (" + scheme + ")"), std::string::npos)
        << q.err;
    EXPECT_EQ(slurp(out_ / "tokenizer.json"),
              slurp(fs::path(TFORMERS_SOURCE_DIR) / model / "tokenizer.json"));
    const std::string gen = " --prompt \"The French Bread\" -n 12 --ignore-eos";
    const Result stored = tformers("generate -m " + out_.string() + gen);
    const Result at_load = tformers("generate -m " + model + " --quantize " + scheme + gen);
    ASSERT_EQ(stored.status, 0) << stored.err;
    EXPECT_FALSE(stored.out.empty());
    EXPECT_EQ(stored.out, at_load.out) << scheme;
  }
}

TEST_F(QuantizeCli, RefusesAFolderThatHasFiles) {
  fs::create_directories(out_);
  std::ofstream(out_ / "keep.txt") << "mine";
  const Result r = tformers("quantize -m tests/data/models/tiny-qwen3 --to int4 " + out_.string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("exists and is not an empty folder"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(out_ / "keep.txt"), "mine");
}

TEST_F(QuantizeCli, NeedsAKnownScheme) {
  const Result r = tformers("quantize -m tests/data/models/tiny-qwen3 --to int3 " + out_.string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--to"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out_));
}

}  // namespace
