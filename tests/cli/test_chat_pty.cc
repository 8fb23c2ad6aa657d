// `tformers chat` driven through a pseudo-terminal for two turns, as a person would use it. The
// replies must be what the library gives for the same conversation (the second turn sees the
// first one's history). Also a reasoning model's reply, on a terminal and through pipes.
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/run_command.h"
#include "tformers/pipeline.h"

namespace {

// Reads from the terminal until `text` has appeared `count` times in all output so far, or 60 s.
bool read_until(int fd, std::string& out, const std::string& text, int count) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto occurrences = [&] {
    int n = 0;
    for (size_t p = out.find(text); p != std::string::npos; p = out.find(text, p + 1)) ++n;
    return n;
  };
  while (occurrences() < count) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, 200) <= 0) continue;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) return false;
    out.append(buf, size_t(n));
  }
  return true;
}

// libedit draws the prompt, then puts the terminal in raw mode for its first read. A key typed
// in between meets the canonical line discipline, which turns Ctrl-D into an end-of-file mark
// that reads as a NUL once raw mode is on (seen under load: the session never ended). So a test
// types at a prompt only once the terminal (whose modes the master reads too) is raw.
bool wait_raw(int fd) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    termios t{};
    if (tcgetattr(fd, &t) != 0) return false;
    if (!(t.c_lflag & ICANON)) return true;
    usleep(5 * 1000);
  }
  return false;
}

std::string crlf(std::string s) {
  std::string out;
  for (char c : s) out += c == '\n' ? std::string("\r\n") : std::string(1, c);
  return out;
}

TEST(Cli, ChatTwoTurnsThroughAPseudoTerminal) {
  const std::string model = std::string(TFORMERS_TEST_DATA) + "/models/tiny-qwen3";
  int fd = -1;
  pid_t pid = forkpty(&fd, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(TFORMERS_CLI, TFORMERS_CLI, "chat", "--model", model.c_str(), "--max-new-tokens", "6",
          "--dtype", "float32", (char*)nullptr);
    _exit(127);
  }
  std::string out;
  ASSERT_TRUE(read_until(fd, out, "> ", 1)) << out;
  ASSERT_TRUE(wait_raw(fd));
  ASSERT_EQ(write(fd, "hello\n", 6), 6);
  ASSERT_TRUE(read_until(fd, out, "> ", 2)) << out;
  ASSERT_TRUE(wait_raw(fd));
  ASSERT_EQ(write(fd, "tell me more\n", 13), 13);
  ASSERT_TRUE(read_until(fd, out, "> ", 3)) << out;
  ASSERT_TRUE(wait_raw(fd));
  ASSERT_EQ(write(fd, "/exit\n", 6), 6);
  int status = 0;
  waitpid(pid, &status, 0);
  close(fd);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;

  auto pipe = tformers::pipeline("text-generation", model, {.dtype = tformers::float32});
  tformers::GenerationConfig gc{.max_new_tokens = 6};
  nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "hello"}}};
  std::string first = pipe.chat(messages, gc);
  messages.push_back({{"role", "assistant"}, {"content", first}});
  messages.push_back({{"role", "user"}, {"content", "tell me more"}});
  std::string second = pipe.chat(messages, gc);
  EXPECT_NE(out.find("hello\r\n" + crlf(first) + "\r\n> "), std::string::npos) << out;
  EXPECT_NE(out.find("tell me more\r\n" + crlf(second) + "\r\n> "), std::string::npos) << out;
}

// waitpid for up to 60 s, reading the terminal meanwhile; then the child is killed (and the
// status says so), so a session that failed to end fails the test instead of hanging it.
int wait_exit(pid_t pid, int fd, std::string& out) {
  int status = 0;
  // What the child wrote last may still sit in the terminal after it exits: read it all.
  auto drain = [&] {
    for (;;) {
      pollfd pfd{fd, POLLIN, 0};
      if (poll(&pfd, 1, 200) <= 0) return;
      char buf[4096];
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) return;
      out.append(buf, size_t(n));
    }
  };
  for (int i = 0; i < 600; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      drain();
      return status;
    }
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, 100) > 0) {
      char buf[4096];
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n > 0) out.append(buf, size_t(n));
    }
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return status;
}

// Starts `tformers chat ARGS...` on a pseudo-terminal; returns its pid and the terminal.
pid_t start_chat(int& fd, const std::vector<const char*>& args) {
  pid_t pid = forkpty(&fd, nullptr, nullptr, nullptr);
  if (pid == 0) {
    std::vector<const char*> argv = {TFORMERS_CLI, "chat"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back(nullptr);
    execv(TFORMERS_CLI, const_cast<char* const*>(argv.data()));
    _exit(127);
  }
  return pid;
}

// A chat session on a pseudo-terminal that types `line` at the first prompt and /quit at the
// second: everything the terminal showed, after checking that the session ended cleanly.
std::string one_line_session(const std::vector<const char*>& args, const std::string& line) {
  int fd = -1;
  const pid_t pid = start_chat(fd, args);
  std::string out;
  EXPECT_GE(pid, 0);
  if (pid < 0) return out;
  const std::string typed = line + "\n";
  const bool ok = read_until(fd, out, "> ", 1) && wait_raw(fd) &&
                  write(fd, typed.data(), typed.size()) == ssize_t(typed.size()) &&
                  read_until(fd, out, "> ", 2) && wait_raw(fd) && write(fd, "/quit\n", 6) == 6;
  EXPECT_TRUE(ok) << out;
  const int status = wait_exit(pid, fd, out);
  close(fd);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  return out;
}

// /help and /quit are commands: neither reaches the model (with --verbose every reply would log
// "chat: prompt ..."); /help lists the commands.
TEST(Cli, ChatHelpAndQuitAreCommandsNotMessages) {
  const std::string model = std::string(TFORMERS_TEST_DATA) + "/models/tiny-qwen3";
  const std::string out =
      one_line_session({"--model", model.c_str(), "-n", "2", "--dtype", "float32", "-v"}, "/help");
  EXPECT_NE(out.find("commands: /help shows this; /reset clears the history"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("chat: prompt"), std::string::npos) << out;
}

// Ctrl-C while a reply streams stops that reply and gives the prompt back; Ctrl-C at the
// prompt discards the half-typed line (the session goes on: it used to end).
// On a terminal a line longer than the context can hold (32 bytes per position) is skipped
// with a note, and the session goes on at a fresh prompt.
TEST(Cli, ChatSkipsATypedLineLongerThanTheContextCanHold) {
  const std::string model = std::string(TFORMERS_TEST_DATA) + "/models/tiny-qwen3";
  int fd = -1;
  pid_t pid = start_chat(
      fd, {"--model", model.c_str(), "-n", "2", "--dtype", "float32", "--ctx-size", "64", "-v"});
  ASSERT_GE(pid, 0);
  std::string out;
  ASSERT_TRUE(read_until(fd, out, "> ", 1)) << out;
  ASSERT_TRUE(wait_raw(fd));
  const std::string line = std::string(3000, 'a') + "\n";
  ASSERT_EQ(write(fd, line.data(), line.size()), ssize_t(line.size()));
  ASSERT_TRUE(read_until(fd, out, "it was skipped", 1)) << out;
  ASSERT_TRUE(read_until(fd, out, "> ", 2)) << out;
  ASSERT_TRUE(wait_raw(fd));
  ASSERT_EQ(write(fd, "/quit\n", 6), 6);
  const int status = wait_exit(pid, fd, out);
  close(fd);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_NE(out.find("a line of input is longer than 2048 bytes"), std::string::npos) << out;
  EXPECT_EQ(out.find("chat: prompt"), std::string::npos) << out;
}

TEST(Cli, ChatCtrlCStopsAReplyAndClearsALine) {
  const std::string model = std::string(TFORMERS_SOURCE_DIR) + "/models/kjv-fortunes-tiny";
  int fd = -1;
  // 240 tokens take a few tenths of a second here or more, time enough to interrupt.
  pid_t pid =
      start_chat(fd, {"--model", model.c_str(), "-n", "240", "--ignore-eos", "--seed", "1"});
  ASSERT_GE(pid, 0);
  std::string out;
  ASSERT_TRUE(read_until(fd, out, "> ", 1)) << out;
  ASSERT_TRUE(wait_raw(fd));
  ASSERT_EQ(write(fd, "hello\n", 6), 6);
  ASSERT_TRUE(read_until(fd, out, "hello\r\n", 1)) << out;
  // Some of the reply, then Ctrl-C (the terminal turns it into SIGINT).
  const int words = int(std::count(out.begin(), out.end(), ' '));
  ASSERT_TRUE(read_until(fd, out, " ", words + 5)) << out;
  ASSERT_EQ(write(fd, "\x03", 1), 1);
  ASSERT_TRUE(read_until(fd, out, "reply stopped (Ctrl-C)", 1)) << out;
  ASSERT_TRUE(read_until(fd, out, "> ", 2)) << out;
  ASSERT_TRUE(wait_raw(fd));
  ASSERT_EQ(write(fd, "half a li", 9), 9);
  ASSERT_TRUE(read_until(fd, out, "half a li", 1)) << out;  // echoed: it is on the line
  ASSERT_EQ(write(fd, "\x03", 1), 1);
  ASSERT_TRUE(read_until(fd, out, "> ", 3)) << out;
  ASSERT_TRUE(wait_raw(fd));
  ASSERT_EQ(write(fd, "/quit\n", 6), 6);
  const int status = wait_exit(pid, fd, out);
  close(fd);
  // Had the discarded text stayed on the line, "half a li/quit" would have gone to the model and
  // the session been killed above.
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
}

// Ctrl-D on an empty line ends the session with the terminal on a new line.
TEST(Cli, ChatCtrlDEndsOnANewLine) {
  const std::string model = std::string(TFORMERS_TEST_DATA) + "/models/tiny-qwen3";
  int fd = -1;
  pid_t pid = start_chat(fd, {"--model", model.c_str(), "-n", "2", "--dtype", "float32"});
  ASSERT_GE(pid, 0);
  std::string out;
  ASSERT_TRUE(read_until(fd, out, "> ", 1)) << out;
  ASSERT_TRUE(wait_raw(fd));
  const size_t before_eof = out.size();
  ASSERT_EQ(write(fd, "\x04", 1), 1);
  const int status = wait_exit(pid, fd, out);
  close(fd);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_NE(out.find("\n", before_eof), std::string::npos) << "Ctrl-D left the line open: " << out;
}

// Keys typed while a reply streams meet the canonical line discipline (libedit is not reading):
// a Ctrl-D there ends the session once the reply is done, and a whole line is the next message.
TEST(Cli, ChatTypeAheadDuringAReply) {
  const std::string model = std::string(TFORMERS_SOURCE_DIR) + "/models/kjv-fortunes-tiny";
  for (const char* typed : {"\x04", "/quit\n"}) {
    int fd = -1;
    pid_t pid =
        start_chat(fd, {"--model", model.c_str(), "-n", "240", "--ignore-eos", "--seed", "1"});
    ASSERT_GE(pid, 0);
    std::string out;
    ASSERT_TRUE(read_until(fd, out, "> ", 1)) << out;
    ASSERT_TRUE(wait_raw(fd));
    ASSERT_EQ(write(fd, "hello\n", 6), 6);
    ASSERT_TRUE(read_until(fd, out, "hello\r\n", 1)) << out;
    const int words = int(std::count(out.begin(), out.end(), ' '));
    ASSERT_TRUE(read_until(fd, out, " ", words + 3)) << out;
    termios t{};
    ASSERT_EQ(tcgetattr(fd, &t), 0);
    EXPECT_TRUE(t.c_lflag & ICANON) << "the reply streams with the terminal in canonical mode";
    ASSERT_EQ(write(fd, typed, strlen(typed)), ssize_t(strlen(typed)));
    const int status = wait_exit(pid, fd, out);
    close(fd);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << typed << ": " << out;
  }
}

// The shipped model with its chat markers renamed <think> and </think>: the same token ids, so
// the same replies, but its template now leaves a <think> block open at every generation prompt
// (as Qwen3's thinking-2507 templates do), so chat reads each whole reply as reasoning. No small
// model writes reasoning markup of its own.
std::string think_model() {
  namespace fs = std::filesystem;
  const fs::path kjv = fs::path(TFORMERS_SOURCE_DIR) / "models/kjv-fortunes-tiny";
  // One folder per process (tests run side by side; see test_reasoning.cc's harmony tokenizer).
  const fs::path dir = fs::path(::testing::TempDir()) / ("kjv-think-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char* file : {"config.json", "generation_config.json", "model.safetensors"})
    fs::copy_file(kjv / file, dir / file, fs::copy_options::overwrite_existing);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    std::ifstream in(kjv / file, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    std::string s = text.str();
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"<|im_start|>", "<think>"},
                                   {"<|im_end|>", "</think>"}})
      for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at))
        s.replace(at, from.size(), to);
    std::ofstream(dir / file, std::ios::binary) << s;
  }
  return dir.string();
}

// Through pipes the reasoning is plain, between its labels; --hide-reasoning leaves the answer
// alone (here none, with a note when the reply ran out of tokens in its reasoning). The model
// without a reasoning format streams exactly what the library generates, as before.
TEST(Cli, ChatShowsReasoningBetweenLabelsThroughPipes) {
  using tformers::testing::run;
  const std::string cli = TFORMERS_CLI, model = think_model();
  const tformers::testing::Streams plain =
      run(cli + " chat -m models/kjv-fortunes-tiny -n 16 --seed 7", "hello\n");
  ASSERT_EQ(plain.status, 0) << plain.err;
  auto pipe =
      tformers::pipeline("text-generation", TFORMERS_SOURCE_DIR "/models/kjv-fortunes-tiny");
  const std::string reply =
      pipe.chat({{{"role", "user"}, {"content", "hello"}}}, {.max_new_tokens = 16, .seed = 7});
  ASSERT_EQ(plain.out, "> " + reply + "\n> \n");

  const tformers::testing::Streams think =
      run(cli + " chat -m " + model + " -n 16 --seed 7", "hello\n");
  ASSERT_EQ(think.status, 0) << think.err;
  const size_t begin = reply.find_first_not_of(" \n"), end = reply.find_last_not_of(" \n") + 1;
  EXPECT_EQ(think.out,
            "> Thinking...\n" + reply.substr(begin, end - begin) + "\n...done thinking.\n> \n");
  EXPECT_EQ(think.err.find("before an answer"), std::string::npos) << think.err;

  const tformers::testing::Streams hidden =
      run(cli + " chat -m " + model + " -n 4 --seed 7 --hide-reasoning", "hello\n");
  ASSERT_EQ(hidden.status, 0) << hidden.err;
  EXPECT_EQ(hidden.out, "> > \n");
  EXPECT_NE(hidden.err.find("reached --max-new-tokens (4) in its reasoning, before an answer"),
            std::string::npos)
      << hidden.err;
}

// On a terminal each label and piece of reasoning is dimmed (SGR 2), and intensity is back to
// normal (SGR 22) before each line ends.
TEST(Cli, ChatDimsReasoningOnATerminal) {
  const std::string model = think_model();
  const std::string out =
      one_line_session({"--model", model.c_str(), "-n", "16", "--seed", "7"}, "hello");
  EXPECT_NE(out.find("hello\r\n\x1b[2mThinking...\x1b[22m\r\n\x1b[2m"), std::string::npos) << out;
  EXPECT_NE(out.find("\x1b[22m\r\n\x1b[2m...done thinking.\x1b[22m\r\n> "), std::string::npos)
      << out;
}

}  // namespace
