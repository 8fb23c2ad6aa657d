// A `tformers serve` process for end-to-end tests: started on a free port with the shipped tiny
// model, waited for until /health answers 200, stopped with a signal; and a raw HTTP connection
// for what a well-behaved client library will not do (hold a connection idle, send a chunked
// body, hang up mid-stream).
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace tformers::serve::testing {

using namespace std::chrono_literals;

inline const std::string kModel = "models/kjv-fortunes-tiny";

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ServeProcess {
 public:
  // Starts `tformers serve -m MODEL --port 0 ARGS...` from the source tree (MODEL: the shipped
  // tiny model unless `model` says otherwise), with `env` ("NAME=value") added to the environment,
  // and waits until it is ready. With `launch` flags ("--nproc-per-node", "2"), under `tformers
  // launch LAUNCH... --`; pid() is then mpirun's, whose stderr carries rank 0's. `prefix` is a
  // command that execs the rest (a shell setting a limit, say).
  explicit ServeProcess(std::vector<std::string> args = {}, std::vector<std::string> env = {},
                        std::vector<std::string> launch = {}, std::string model = kModel,
                        std::vector<std::string> prefix = {}) {
    log_ =
        (std::filesystem::temp_directory_path() /
         ("tformers_serve_" + std::to_string(::getpid()) + "_" + std::to_string(++count_) + ".log"))
            .string();
    std::vector<std::string> argv = prefix;
    if (!launch.empty()) {
      argv = {TFORMERS_CLI, "launch"};
      argv.insert(argv.end(), launch.begin(), launch.end());
      argv.push_back("--");
    }
    argv.insert(argv.end(), {TFORMERS_CLI, "serve", "-m", model, "--port", "0"});
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    std::vector<char*> cenv;
    for (char** e = environ; *e; ++e) cenv.push_back(*e);
    for (std::string& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&files, 1, "/dev/null", O_WRONLY, 0);
    // Relative paths (the model) are read from the source tree.
    const std::filesystem::path cwd = std::filesystem::current_path();
    std::filesystem::current_path(TFORMERS_SOURCE_DIR);
    const int spawned = posix_spawn(&pid_, cargv[0], &files, nullptr, cargv.data(), cenv.data());
    std::filesystem::current_path(cwd);
    posix_spawn_file_actions_destroy(&files);
    if (spawned != 0) {
      ADD_FAILURE() << "cannot start " << TFORMERS_CLI;
      pid_ = -1;
      return;
    }
    wait_ready();
  }

  ~ServeProcess() {
    if (pid_ > 0 && !exit_status_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::filesystem::remove(log_);
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string log() const { return slurp(log_); }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }

  // Sends `sig` and waits up to `limit` for the exit: its status, or nothing if it did not end
  // (then it is killed).
  std::optional<int> stop(int sig = SIGTERM, std::chrono::seconds limit = 30s) {
    ::kill(pid_, sig);
    const auto end = std::chrono::steady_clock::now() + limit;
    int status = 0;
    while (std::chrono::steady_clock::now() < end) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return exit_status_;
      }
      std::this_thread::sleep_for(20ms);
    }
    return std::nullopt;
  }

 private:
  void wait_ready() {
    static const std::regex listening(R"(listening on http://127\.0\.0\.1:(\d+))");
    const auto end = std::chrono::steady_clock::now() + 120s;
    std::smatch m;
    while (std::chrono::steady_clock::now() < end) {
      const std::string text = log();
      if (port_ == 0 && std::regex_search(text, m, listening)) port_ = std::stoi(m[1]);
      if (port_ != 0) {
        httplib::Client c("127.0.0.1", port_);
        if (auto r = c.Get("/health"); r && r->status == 200) return;
      }
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        exit_status_ = -1;
        ADD_FAILURE() << "tformers serve exited before it was ready:\n" << text;
        return;
      }
      std::this_thread::sleep_for(50ms);
    }
    ADD_FAILURE() << "tformers serve was not ready within 120 s:\n" << log();
  }

  static inline int count_ = 0;
  std::string log_;
  pid_t pid_ = -1;
  int port_ = 0;
  std::optional<int> exit_status_;
};

// A value of /metrics: the sample whose line starts with `name` (labels included) and a space;
// -1 when there is none.
inline double metric(const ServeProcess& server, const std::string& name) {
  auto r = server.client().Get("/metrics");
  if (!r || r->status != 200) return -1;
  std::istringstream lines(r->body);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  return -1;
}

// Runs the Node check tools/serve/SCRIPT (the official openai client) against `server`, then
// validates the JSON outputs it wrote against their schemas with the jsonschema package
// (tools/grammar/validate_outputs.py): both must succeed. `tag` names its temporary file.
inline void expect_client_outputs_validate(const ServeProcess& server, const std::string& script,
                                           const std::string& tag) {
  auto run = [](const std::string& cmd) {
    const int status = std::system((cmd + " 2>&1").c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  ASSERT_TRUE(std::filesystem::exists(TFORMERS_NPM_DIR "/openai"))
      << "the openai npm package is missing: run scripts/setup.sh --tests";
  ASSERT_EQ(run("'" TFORMERS_PYTHON "' -c 'import jsonschema' > /dev/null"), 0) << TFORMERS_PYTHON
      " cannot import jsonschema: run scripts/setup.sh --tests, which installs "
      "pyproject.toml's `test` group into .venv";
  const std::filesystem::path out =
      std::filesystem::temp_directory_path() /
      ("tformers_" + tag + "_" + std::to_string(::getpid()) + ".json");
  EXPECT_EQ(run("node " TFORMERS_SOURCE_DIR "/tools/serve/" + script + " --base-url " +
                server.base_url() + " --model " + kModel + " --out " + out.string()),
            0);
  ASSERT_TRUE(std::filesystem::exists(out));
  EXPECT_EQ(run("'" TFORMERS_PYTHON "' " TFORMERS_SOURCE_DIR "/tools/grammar/validate_outputs.py " +
                out.string()),
            0);
  std::filesystem::remove(out);
}

// Waits up to `limit` for a metric to reach `value`; returns the last value seen.
inline double wait_for_metric(const ServeProcess& server, const std::string& name, double value,
                              std::chrono::seconds limit = 20s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  double seen = metric(server, name);
  while (seen != value && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(50ms);
    seen = metric(server, name);
  }
  return seen;
}

// One TCP connection to the server, spoken to byte by byte.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
      ADD_FAILURE() << "cannot connect to port " << port;
    timeval tv{.tv_sec = 30, .tv_usec = 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~RawConnection() { close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  // False once the server has closed the connection.
  bool send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == ssize_t(bytes.size());
  }
  // Reads until `until` appears in what was read, the server closes, or 30 s pass.
  std::string read_until(const std::string& until = "") {
    char buf[4096];
    while (until.empty() || received_.find(until) == std::string::npos) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      received_.append(buf, size_t(n));
    }
    return received_;
  }
  // What has been read so far, after taking what has arrived without waiting.
  const std::string& read_available() {
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT)) > 0;)
      received_.append(buf, size_t(n));
    return received_;
  }
  // Whether the server has closed the connection (an end of stream or a reset is waiting), without
  // waiting for one.
  bool closed_by_peer() {
    char byte;
    const ssize_t n = ::recv(fd_, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  std::string received_;
};

// A POST of a JSON body as raw bytes, on a connection that closes after the answer.
inline std::string post_request(const std::string& path, const std::string& body,
                                const std::string& extra_headers = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
         extra_headers + "Content-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

// Starts `n` streams, sends SIGTERM once each has its first token, and returns what each read.
inline std::vector<std::string> sigterm_while_streaming(ServeProcess& server, int n,
                                                        std::optional<int>& exit_status) {
  std::vector<std::unique_ptr<RawConnection>> streams;
  for (int i = 0; i < n; ++i) {
    streams.push_back(std::make_unique<RawConnection>(server.port()));
    streams.back()->send(post_request(
        "/v1/chat/completions",
        nlohmann::json{
            {"model", kModel},
            {"messages", {{{"role", "user"}, {"content", "Tell me " + std::to_string(i)}}}},
            {"max_tokens", 200},
            {"ignore_eos", true},
            {"stream", true}}
            .dump()));
  }
  // The first chunk with text (the first chunk of all only names the role).
  for (auto& s : streams) s->read_until("\"delta\":{\"content\":\"");
  exit_status = server.stop(SIGTERM, 60s);
  std::vector<std::string> read;
  for (auto& s : streams) read.push_back(s->read_until("data: [DONE]"));
  return read;
}

}  // namespace tformers::serve::testing
