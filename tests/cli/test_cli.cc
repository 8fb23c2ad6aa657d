// The `tformers` command end to end: the README's first command exactly as written, text
// prompts, tokenize, env, and errors on bad input.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

namespace {

struct CmdResult {
  int status;
  std::string out;
};

// Runs a shell command from the source tree, capturing stdout and stderr.
CmdResult sh(const std::string& cmd) {
  std::string full = "cd " TFORMERS_SOURCE_DIR " && " + cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int st = pclose(p);
  return {WEXITSTATUS(st), out};
}

// The first command of README.md's first code block.
std::string readme_first_command() {
  std::ifstream in(TFORMERS_SOURCE_DIR "/README.md");
  std::string line;
  bool in_block = false;
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0) {
      in_block = !in_block;
      continue;
    }
    if (in_block && !line.empty() && line[0] != '#') return line;
  }
  return "";
}

TEST(Cli, ReadmeFirstCommandGeneratesText) {
  std::string cmd = readme_first_command();
  ASSERT_NE(cmd.find("tformers generate"), std::string::npos) << cmd;
  // The setup part has already run (this test is built by it); run the command as written.
  CmdResult r = sh(cmd);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("compiles 2"), std::string::npos) << r.out;
}

TEST(Cli, TextPromptStreamsText) {
  CmdResult r = sh(std::string(TFORMERS_CLI) +
                   " generate --model tests/data/models/tiny-qwen3 --prompt 'The theory' "
                   "--max-new-tokens 8 --dtype float32");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.rfind("The theory", 0), 0u) << r.out;
  EXPECT_GT(r.out.size(), std::string("The theory\n").size()) << r.out;
}

TEST(Cli, TokenizeShowsIdsAndPieces) {
  CmdResult r =
      sh(std::string(TFORMERS_CLI) + " tokenize --model tests/data/models/tiny-qwen3 'The theory'");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("ids: 84,380,257,104,285,114,121"), std::string::npos) << r.out;
}

TEST(Cli, EnvListsBackends) {
  CmdResult r = sh(std::string(TFORMERS_CLI) + " env");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("backend cpu: available"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Qwen3ForCausalLM"), std::string::npos) << r.out;
}

TEST(Cli, BadInputIsAClearErrorAndNonZeroExit) {
  CmdResult r = sh(std::string(TFORMERS_CLI) + " generate --model /nonexistent --prompt-ids 1,2");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("error: "), std::string::npos) << r.out;
  r = sh(std::string(TFORMERS_CLI) +
         " generate --model tests/data/models/tiny-qwen3 --prompt-ids 1,x,3");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("'x' is not a token id"), std::string::npos) << r.out;
  r = sh(std::string(TFORMERS_CLI) +
         " generate --model tests/data/models/tiny-qwen3 --prompt-ids 1 --device tpu");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("looked in"), std::string::npos) << r.out;
}

}  // namespace
