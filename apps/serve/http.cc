#include "serve/http.h"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tformers/error.h"

namespace tformers::serve::http {

namespace {

using Clock = std::chrono::steady_clock;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// RFC 9110's token characters: what a method and a field name are made of.
bool is_tchar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != '\0';
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The comma-separated elements of a field value, trimmed; empty ones dropped.
std::vector<std::string_view> list_elements(std::string_view value) {
  std::vector<std::string_view> out;
  while (!value.empty()) {
    const size_t comma = value.find(',');
    const std::string_view one = trim(value.substr(0, comma));
    if (!one.empty()) out.push_back(one);
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return out;
}

// Shows a client's bytes in an error message: at most 40 of them, others than printable ASCII
// escaped.
std::string shown(std::string_view s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 40; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out + (s.size() > 40 ? "...'" : "'");
}

HeadResult failed(int status, std::string message) {
  HeadResult r;
  r.status = HeadResult::kError;
  r.error = {status, std::move(message)};
  return r;
}

// The request line: METHOD SP target SP HTTP/1.x, with single spaces.
std::optional<ParseError> parse_request_line(std::string_view line, RequestHead& head) {
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return ParseError{400, "the request line " + shown(line) +
                               " is not METHOD TARGET HTTP/1.1, separated by single spaces"};
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (method.empty() || !std::all_of(method.begin(), method.end(), is_tchar))
    return ParseError{400, "the method " + shown(method) + " is not an HTTP token"};
  if (version == "HTTP/1.1") {
    head.minor_version = 1;
  } else if (version == "HTTP/1.0") {
    head.minor_version = 0;
  } else if (version.substr(0, 5) == "HTTP/") {
    return ParseError{505, "HTTP version " + shown(version) + " is not served; use HTTP/1.1"};
  } else {
    return ParseError{400, "the request line ends in " + shown(version) + ", not HTTP/1.1"};
  }
  for (const char c : target)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      return ParseError{400, "the request target " + shown(target) + " holds a control byte"};
  std::string_view path = target;
  // The absolute form (what a client sends to a proxy) names the path after its authority.
  for (const std::string_view scheme : {"http://", "https://"})
    if (lower(path.substr(0, scheme.size())) == scheme) {
      path.remove_prefix(scheme.size());
      const size_t slash = path.find('/');
      path = slash == std::string_view::npos ? "/" : path.substr(slash);
    }
  if (path.empty() || (path[0] != '/' && path != "*"))
    return ParseError{400, "the request target " + shown(target) + " does not start with '/'"};
  head.method = std::string(method);
  head.target = std::string(target);
  const size_t q = path.find('?');
  head.path = std::string(path.substr(0, q));
  if (q != std::string_view::npos) head.query = std::string(path.substr(q + 1));
  return std::nullopt;
}

// Content-Length, Transfer-Encoding, Connection and Expect, checked for what two parsers could
// read differently (RFC 9112 section 6.3: such a request is refused, not guessed at).
std::optional<ParseError> read_framing(RequestHead& head, const Limits& limits) {
  std::optional<int64_t> length;
  std::vector<std::string> codings;
  bool has_te = false;
  head.keep_alive = head.minor_version == 1;
  for (const Header& h : head.headers) {
    if (h.name == "content-length") {
      for (const std::string_view v : list_elements(h.value)) {
        if (!std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
          return ParseError{400, "Content-Length " + shown(v) + " is not a number of bytes"};
        // More digits than an int64_t holds is over any limit.
        if (v.size() > 18)
          return ParseError{413, "Content-Length " + shown(v) + " is over the body limit"};
        const int64_t n = std::stoll(std::string(v));
        if (length && *length != n)
          return ParseError{400, "two different Content-Lengths (" + std::to_string(*length) +
                                     " and " + std::to_string(n) + "); send one"};
        length = n;
      }
      if (!length) return ParseError{400, "an empty Content-Length"};
    } else if (h.name == "transfer-encoding") {
      has_te = true;
      for (const std::string_view v : list_elements(h.value)) codings.push_back(lower(v));
    } else if (h.name == "connection") {
      for (const std::string_view v : list_elements(h.value)) {
        const std::string option = lower(v);
        if (option == "close") head.keep_alive = false;
        if (option == "keep-alive" && head.minor_version == 0) head.keep_alive = true;
      }
    } else if (h.name == "expect") {
      if (lower(trim(h.value)) != "100-continue")
        return ParseError{417, "the expectation " + shown(h.value) + " is not supported"};
      head.expect_continue = head.minor_version == 1;
    }
  }
  if (has_te) {
    if (length)
      return ParseError{400,
                        "both Content-Length and Transfer-Encoding are given; send one of them"};
    if (head.minor_version == 0)
      return ParseError{400, "Transfer-Encoding is not HTTP/1.0; send a Content-Length"};
    if (codings.size() != 1 || codings[0] != "chunked")
      return ParseError{501, "Transfer-Encoding: only 'chunked' is supported"};
    head.chunked = true;
  }
  head.content_length = length.value_or(0);
  if (head.content_length > limits.max_body)
    return ParseError{413, "Content-Length " + std::to_string(head.content_length) +
                               " is over the body limit of " + std::to_string(limits.max_body) +
                               " bytes"};
  return std::nullopt;
}

}  // namespace

std::string RequestHead::header(std::string_view name) const {
  for (const Header& h : headers)
    if (h.name == name) return h.value;
  return "";
}

HeadResult parse_head(std::string_view bytes, const Limits& limits, size_t& scanned) {
  // Empty lines before a request line are skipped (RFC 9112 section 2.2), within the head limit.
  size_t start = 0;
  while (start < bytes.size() && (bytes[start] == '\r' || bytes[start] == '\n')) ++start;
  if (start > limits.max_head) return failed(400, "the request starts with too many empty lines");
  scanned = std::max(scanned, start);
  // Each call looks only at lines it has not seen: `scanned` is where the unfinished line starts.
  for (;;) {
    const size_t eol = bytes.find('\n', scanned);
    const size_t line_end = eol == std::string_view::npos ? bytes.size() : eol;
    const bool request_line = scanned == start;
    if (line_end - scanned > limits.max_line + 1)  // +1: the CR of CRLF
      return request_line ? failed(414, "the request line is longer than " +
                                            std::to_string(limits.max_line) + " bytes")
                          : failed(431, "a header line is longer than " +
                                            std::to_string(limits.max_line) + " bytes");
    if (line_end - start > limits.max_head)
      return failed(
          431, "the request head is larger than " + std::to_string(limits.max_head) + " bytes");
    if (eol == std::string_view::npos) return {};
    const bool empty_line = eol == scanned || (eol == scanned + 1 && bytes[scanned] == '\r');
    if (!(empty_line && !request_line)) {
      scanned = eol + 1;
      continue;
    }
    // The head is complete: read it.
    HeadResult r;
    r.status = HeadResult::kComplete;
    r.consumed = eol + 1;
    std::string_view rest = bytes.substr(start, scanned - start);
    bool first = true;
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      std::string_view line = rest.substr(0, nl);
      rest.remove_prefix(nl + 1);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.find('\r') != std::string_view::npos)
        return failed(400, "a bare CR inside " + shown(line));
      if (first) {
        first = false;
        if (auto e = parse_request_line(line, r.head)) return failed(e->status, e->message);
        continue;
      }
      if (line[0] == ' ' || line[0] == '\t')
        return failed(
            400, "a header line starts with whitespace (obsolete line folding): " + shown(line));
      const size_t colon = line.find(':');
      const std::string_view name = line.substr(0, colon);
      if (colon == std::string_view::npos || name.empty() ||
          !std::all_of(name.begin(), name.end(), is_tchar))
        return failed(400, "the header line " + shown(line) + " is not NAME: VALUE");
      const std::string_view value = trim(line.substr(colon + 1));
      for (const char c : value)
        if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f)
          return failed(400, "the value of header " + shown(name) + " holds a control byte");
      if (r.head.headers.size() == limits.max_headers)
        return failed(431, "more than " + std::to_string(limits.max_headers) + " header fields");
      r.head.headers.push_back({lower(name), std::string(value)});
    }
    if (auto e = read_framing(r.head, limits)) return failed(e->status, e->message);
    return r;
  }
}

ChunkedDecoder::Status ChunkedDecoder::feed(std::string_view bytes, int64_t max_body,
                                            std::string& body, size_t& consumed) {
  // A chunk-size line (with extensions) or a trailer line longer than this is refused.
  constexpr size_t kMaxLine = 4096;
  constexpr size_t kMaxTrailer = 8192;
  size_t pos = 0;
  const auto fail = [&](int status, std::string message) {
    error_ = {status, std::move(message)};
    consumed = pos;
    return kError;
  };
  while (state_ != kDone) {
    consumed = pos;
    const std::string_view rest = bytes.substr(pos);
    if (state_ == kSize || state_ == kTrailer) {
      const size_t eol = rest.find('\n');
      const size_t have = eol == std::string_view::npos ? rest.size() : eol;
      if (state_ == kSize && have > kMaxLine) return fail(400, "a chunk-size line is too long");
      if (state_ == kTrailer && trailer_bytes_ + have > kMaxTrailer)
        return fail(431, "the chunked body's trailer is larger than 8192 bytes");
      if (eol == std::string_view::npos) return kIncomplete;
      std::string_view line = rest.substr(0, eol);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      pos += eol + 1;
      if (state_ == kTrailer) {
        trailer_bytes_ += eol + 1;
        if (line.empty()) state_ = kDone;
        continue;
      }
      const std::string_view digits = trim(line.substr(0, line.find(';')));
      if (digits.empty() || digits.size() > 15 ||
          !std::all_of(digits.begin(), digits.end(), [](char c) {
            return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
          }))
        return fail(400, "the chunk size " + shown(line) + " is not a hexadecimal number");
      left_ = std::stoull(std::string(digits), nullptr, 16);
      if (int64_t(left_) > max_body - int64_t(body.size()))
        return fail(413, "the chunked body is over the body limit of " + std::to_string(max_body) +
                             " bytes");
      state_ = left_ == 0 ? kTrailer : kData;
    } else if (state_ == kData) {
      if (rest.empty()) return kIncomplete;
      const size_t take = size_t(std::min<uint64_t>(left_, rest.size()));
      body.append(rest.data(), take);
      pos += take;
      left_ -= take;
      if (left_ == 0) state_ = kDataEnd;
    } else {  // kDataEnd: the line end after a chunk's data
      if (rest.empty()) return kIncomplete;
      if (rest[0] == '\n') {
        pos += 1;
      } else if (rest[0] == '\r') {
        if (rest.size() < 2) return kIncomplete;
        if (rest[1] != '\n') return fail(400, "a chunk's data does not end with CRLF");
        pos += 2;
      } else {
        return fail(400, "a chunk holds more bytes than its size says");
      }
      state_ = kSize;
    }
  }
  consumed = pos;
  return kComplete;
}

std::optional<std::string> percent_decoded(std::string_view segment) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < segment.size(); ++i) {
    if (segment[i] != '%') {
      out += segment[i];
      continue;
    }
    if (segment.size() - i < 3) return std::nullopt;
    const int hi = hex(segment[i + 1]), lo = hex(segment[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += char(hi * 16 + lo);
    i += 2;
  }
  return out;
}

std::string_view reason_phrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 414:
      return "URI Too Long";
    case 417:
      return "Expectation Failed";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

namespace {

// The status line and headers of a response (its body, when not streamed, follows).
// `keep_alive_seconds` is sent as Keep-Alive's timeout hint, which clients such as Node's fetch
// read to close an idle connection before the server does (the race in which a request is
// sent on a connection the server is closing then never happens).
std::string response_head(const Response& res, bool keep_alive, bool chunked,
                          double keep_alive_seconds = 0) {
  std::string out = "HTTP/1.1 " + std::to_string(res.status) + " ";
  out += reason_phrase(res.status);
  out += "\r\n";
  if (!res.content_type.empty()) out += "Content-Type: " + res.content_type + "\r\n";
  for (const auto& [name, value] : res.headers) out += name + ": " + value + "\r\n";
  if (chunked)
    out += "Transfer-Encoding: chunked\r\n";
  else if (!res.stream)
    out += "Content-Length: " + std::to_string(res.body.size()) + "\r\n";
  if (keep_alive) {
    out += "Connection: keep-alive\r\n";
    if (keep_alive_seconds >= 1)
      out += "Keep-Alive: timeout=" + std::to_string(int64_t(keep_alive_seconds)) + "\r\n";
  } else {
    out += "Connection: close\r\n";
  }
  return out + "\r\n";
}

// Writes all of `data` to a non-blocking socket, waiting up to `timeout` whenever the client's
// window is full. False when the client has gone or did not read for that long.
bool send_all(int fd, std::string_view data, Clock::duration timeout) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
      const int ms =
          int(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()) + 1;
      int ready;
      while ((ready = ::poll(&p, 1, ms)) < 0 && errno == EINTR) {
      }
      if (ready <= 0 || (p.revents & (POLLERR | POLLHUP))) return false;
      continue;
    }
    return false;
  }
  return true;
}

// False once the client has closed its side or the connection broke.
bool peer_open(int fd) {
  char byte;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return false;
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
  pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
  return !(::poll(&p, 1, 0) > 0 && (p.revents & (POLLERR | POLLHUP)));
}

class SocketSink : public Sink {
 public:
  SocketSink(int fd, bool chunked, Clock::duration timeout)
      : fd_(fd), chunked_(chunked), timeout_(timeout) {}
  bool write(std::string_view data) override {
    if (failed_) return false;
    if (data.empty()) return true;  // an empty chunk would end the body
    if (chunked_) {
      char size[24];
      std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      std::string chunk = size;
      chunk.append(data);
      chunk += "\r\n";
      failed_ = !send_all(fd_, chunk, timeout_);
    } else {
      failed_ = !send_all(fd_, data, timeout_);
    }
    return !failed_;
  }
  bool is_writable() override {
    if (!failed_ && !peer_open(fd_)) failed_ = true;
    return !failed_;
  }
  bool failed() const { return failed_; }

 private:
  int fd_;
  bool chunked_;
  Clock::duration timeout_;
  bool failed_ = false;
};

// How long a connection that was answered and is being closed is still read from (its unread
// bytes discarded), so that closing it does not reset it before the client has read the answer.
constexpr auto kLinger = std::chrono::seconds(2);
// How long accepting stops when every socket is a request being served, or memory is short.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
// How often deadlines are looked at.
constexpr auto kTick = std::chrono::milliseconds(50);
// Connections closed at once to make room at the socket limit (as nginx frees up to 32 kept-alive
// connections when it runs short): one scan of the connections serves many newcomers.
constexpr size_t kEvictBatch = 32;
// Descriptors kept for the process's own files (the model, logs, pipes) below its limit.
constexpr size_t kReservedDescriptors = 64;
// Sockets at most, whatever the descriptor limit: with a full head each, about 17 KiB apiece.
constexpr size_t kMaxSockets = 16384;
// Bytes read from a socket at once.
constexpr size_t kRead = 16384;

}  // namespace

struct Server::Connection {
  enum Phase { kIdle, kHead, kBody, kLinger };
  int fd = -1;
  Phase phase = kIdle;
  std::string in;  // received, not yet taken by a request
  size_t scanned = 0;
  // Progress, for choosing whom to close at the socket limit: bytes received since `since`, when
  // the connection was accepted or last answered.
  Clock::time_point since;
  size_t received = 0;
  Clock::time_point deadline, first_byte, body_start;
  RequestHead head;
  std::optional<ChunkedDecoder> chunked;
  std::string body;
  size_t held = 0;  // of in and body, the bytes counted in the loop's buffered_
};

class Server::Loop {
 public:
  explicit Loop(Server& server) : s_(server) {
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd_ < 0 || wake_fd_ < 0)
      throw IoError(std::string("serve: cannot create an event loop: ") + std::strerror(errno));
    watch(s_.listen_fd_);
    watch(wake_fd_);
  }
  ~Loop() {
    for (auto& [fd, c] : conns_) close_connection(*c);
    ::close(wake_fd_);
    ::close(epoll_fd_);
  }

  void start() {
    thread_ = std::thread([this] { run(); });
  }

  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    wake();
    if (thread_.joinable()) thread_.join();
    {
      std::lock_guard lock(work_mu_);
      quit_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
    std::lock_guard lock(mu_);
    for (auto& c : returned_) close_connection(*c);
    returned_.clear();
  }

 private:
  void watch(int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
  void wake() {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }

  void close_connection(Connection& c) {
    if (c.fd < 0) return;
    ::close(c.fd);
    c.fd = -1;
    s_.sockets_.fetch_sub(1);
  }
  void drop(int fd) {
    auto it = conns_.find(fd);
    if (it == conns_.end()) return;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    close_connection(*it->second);
    buffered_ -= it->second->held;
    conns_.erase(it);
  }

  void run() {
    epoll_event events[256];
    Clock::time_point last_sweep = Clock::now();
    for (;;) {
      {
        std::lock_guard lock(mu_);
        if (stopping_) break;
      }
      const int n = ::epoll_wait(epoll_fd_, events, 256, int(kTick.count()));
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == s_.listen_fd_) {
          accept_all();
        } else if (fd == wake_fd_) {
          uint64_t count;
          [[maybe_unused]] const ssize_t r = ::read(wake_fd_, &count, sizeof count);
          take_returned();
        } else if (conns_.count(fd)) {
          readable(fd);
          after_reading(fd);
        }
      }
      const Clock::time_point now = Clock::now();
      if (accept_paused_until_ && now >= *accept_paused_until_) {
        accept_paused_until_.reset();
        watch(s_.listen_fd_);
      }
      if (now - last_sweep >= kTick) {
        last_sweep = now;
        sweep(now);
      }
    }
    std::vector<int> fds;
    for (auto& [fd, c] : conns_) fds.push_back(fd);
    for (const int fd : fds) drop(fd);
  }

  // Takes every connection waiting in the backlog. At the socket limit (or when the process is
  // out of descriptors), the connections that have made the least progress are closed to make
  // room: a newcomer is never the one turned away. When every socket is a request being served,
  // accepting pauses and newcomers wait in the backlog.
  void accept_all() {
    for (;;) {
      if (s_.sockets_.load() >= s_.max_sockets_ && !make_room()) return pause_accepting();
      const int fd = ::accept4(s_.listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        // Out of descriptors below max_sockets (files opened elsewhere): make room as at the
        // limit. Out of memory: wait.
        if ((errno == EMFILE || errno == ENFILE) && make_room()) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
          pause_accepting();
        return;
      }
      s_.sockets_.fetch_add(1);
      const int yes = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
      auto c = std::make_unique<Connection>();
      c->fd = fd;
      c->since = Clock::now();
      c->deadline = c->since + seconds(s_.limits_.keep_alive_timeout);
      conns_.emplace(fd, std::move(c));
      watch(fd);
    }
  }

  // The listener would stay readable and spin the loop: stop watching it for a moment.
  void pause_accepting() {
    if (accept_paused_until_) return;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, s_.listen_fd_, nullptr);
    accept_paused_until_ = Clock::now() + kAcceptPause;
  }

  // Closes up to `most` of the connections the loop is reading (only those holding bytes of a
  // request when `holding_bytes`), those that have made the least progress first: answered ones
  // lingering before their close, then by the bytes a second they sent since they were accepted or
  // last answered (an idle keep-alive connection, or a socket that sent nothing, has sent none; a
  // slowloris a byte now and then), the longest waiting first among equals. False when there is
  // none (every socket is being served).
  bool make_room(size_t most = kEvictBatch, bool holding_bytes = false) {
    const Clock::time_point now = Clock::now();
    struct Candidate {
      double rate;
      Clock::time_point since;
      int fd;
    };
    std::vector<Candidate> all;
    all.reserve(conns_.size());
    for (auto& [fd, c] : conns_) {
      if (holding_bytes && c->held == 0) continue;
      const double age = std::max(1e-3, std::chrono::duration<double>(now - c->since).count());
      all.push_back(
          {c->phase == Connection::kLinger ? -1.0 : double(c->received) / age, c->since, fd});
    }
    if (all.empty()) return false;
    const size_t n = std::min(most, all.size());
    std::partial_sort(all.begin(), all.begin() + ptrdiff_t(n), all.end(), [](auto& a, auto& b) {
      return a.rate != b.rate ? a.rate < b.rate : a.since < b.since;
    });
    for (size_t i = 0; i < n; ++i) drop(all[i].fd);
    return true;
  }

  // Counts what connection `fd` holds of unfinished requests; past Limits::max_buffered over all
  // connections, those holding bytes that have made the least progress are closed until the total
  // is back within it, so that many large bodies arriving at once cannot exhaust memory.
  void after_reading(int fd) {
    auto it = conns_.find(fd);
    if (it != conns_.end()) {
      Connection& c = *it->second;
      const size_t now = c.in.size() + c.body.size();
      buffered_ = buffered_ - c.held + now;
      c.held = now;
    }
    while (buffered_ > s_.limits_.max_buffered && make_room(1, /*holding_bytes=*/true)) {
    }
  }

  void sweep(Clock::time_point now) {
    std::vector<int> expired;
    for (auto& [fd, c] : conns_)
      if (now >= c->deadline) expired.push_back(fd);
    for (const int fd : expired) {
      Connection& c = *conns_.at(fd);
      if (c.phase == Connection::kHead || c.phase == Connection::kBody) {
        // A request begun and not finished in time (a slow client, or one that stalled).
        Request partial;
        partial.head = c.head;
        partial.arrival = c.first_byte;
        char message[160];
        if (c.phase == Connection::kHead)
          std::snprintf(message, sizeof message,
                        "the request's head did not arrive within %g s of its first byte",
                        s_.limits_.read_timeout);
        else
          std::snprintf(message, sizeof message,
                        "the request's body came at under %lld bytes a second past its first %g s",
                        (long long)s_.limits_.min_body_rate, s_.limits_.read_timeout);
        respond_and_close(c, partial, s_.handlers_.error(408, message));
      } else {
        drop(fd);
      }
    }
  }

  void readable(int fd) {
    Connection& c = *conns_.at(fd);
    // Level-triggered: what is left after this round's reads comes back in the next one.
    for (int round = 0; round < 4; ++round) {
      // While the head arrives, no more than one byte past its limit is held. Bytes are read into
      // the loop's buffer and only what came is kept, so that a connection's buffer is as large
      // as what it sent (a slowloris holds a few bytes, not a read's worth).
      size_t want = kRead;
      if (c.phase == Connection::kIdle || c.phase == Connection::kHead)
        want =
            std::min(kRead, s_.limits_.max_head + 1 - std::min(c.in.size(), s_.limits_.max_head));
      const ssize_t n = ::recv(fd, scratch_, want, 0);
      if (n == 0) return drop(fd);  // closed; a half-sent request has no one to answer
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        return drop(fd);
      }
      if (c.phase == Connection::kLinger) continue;  // discarded
      c.in.append(scratch_, size_t(n));
      c.received += size_t(n);
      if (!advance(c)) return;  // handed to a worker, or answered
    }
  }

  // Reads requests out of c.in. False once the connection has left the loop's reading (given to
  // a worker, or answered and closing).
  bool advance(Connection& c) {
    if (c.phase == Connection::kIdle || c.phase == Connection::kHead) {
      if (!read_head(c)) return false;
      if (c.phase != Connection::kBody) return true;
    }
    // kBody
    const Limits& limits = s_.limits_;
    if (c.chunked) {
      size_t consumed = 0;
      const ChunkedDecoder::Status st = c.chunked->feed(c.in, limits.max_body, c.body, consumed);
      c.in.erase(0, consumed);
      if (st == ChunkedDecoder::kError) {
        Request partial;
        partial.head = c.head;
        partial.arrival = c.first_byte;
        const ParseError& e = c.chunked->error();
        respond_and_close(c, partial, s_.handlers_.error(e.status, e.message));
        return false;
      }
      if (st == ChunkedDecoder::kIncomplete) return body_wait(c);
    } else {
      const size_t need = size_t(c.head.content_length) - c.body.size();
      const size_t take = std::min(need, c.in.size());
      c.body.append(c.in, 0, take);
      c.in.erase(0, take);
      if (c.body.size() < size_t(c.head.content_length)) return body_wait(c);
    }
    dispatch(c);
    return false;
  }

  // The head, from c.in: true while it is incomplete or once it is read (the phase is then
  // kBody); false when it was refused (answered and closing).
  bool read_head(Connection& c) {
    const Limits& limits = s_.limits_;
    if (c.in.empty()) return true;
    if (c.phase == Connection::kIdle) {
      c.phase = Connection::kHead;
      c.first_byte = Clock::now();
      c.deadline = c.first_byte + seconds(limits.read_timeout);
      c.scanned = 0;
    }
    HeadResult r = parse_head(c.in, limits, c.scanned);
    if (r.status == HeadResult::kIncomplete) return true;
    if (r.status == HeadResult::kError) {
      Request partial;
      partial.arrival = c.first_byte;
      respond_and_close(c, partial, s_.handlers_.error(r.error.status, r.error.message));
      return false;
    }
    c.in.erase(0, r.consumed);
    c.head = std::move(r.head);
    if (s_.handlers_.on_head) {
      if (std::optional<Response> refused = s_.handlers_.on_head(c.head)) {
        Request request;
        request.head = c.head;
        request.arrival = c.first_byte;
        refused->close = true;  // its body, if any, is never read
        respond_and_close(c, request, *refused);
        return false;
      }
    }
    c.phase = Connection::kBody;
    c.body_start = Clock::now();
    c.body.clear();
    c.chunked.reset();
    if (c.head.chunked) c.chunked.emplace();
    if (c.head.expect_continue)
      send_all(c.fd, "HTTP/1.1 100 Continue\r\n\r\n", seconds(limits.write_timeout));
    return true;
  }

  // A body still arriving: its deadline moves with its bytes, as Apache's mod_reqtimeout does
  // (body=N,MinRate=R), so that a large upload on a slow link arrives while a client that
  // dribbles its body is closed: read_timeout past the head, plus a second for every
  // min_body_rate bytes that came.
  bool body_wait(Connection& c) {
    const Limits& limits = s_.limits_;
    c.deadline = c.body_start + seconds(limits.read_timeout +
                                        double(c.body.size()) / double(limits.min_body_rate));
    return true;
  }

  // Sends a response from the loop (small: an error) and closes the connection: the write side
  // now, the socket once the client closes or kLinger passes.
  void respond_and_close(Connection& c, const Request& request, Response res) {
    const std::string bytes = response_head(res, /*keep_alive=*/false, false) + res.body;
    ::send(c.fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(c.fd, SHUT_WR);
    c.phase = Connection::kLinger;
    c.deadline = Clock::now() + kLinger;
    std::string().swap(c.in);
    std::string().swap(c.body);
    buffered_ -= c.held;
    c.held = 0;
    if (s_.handlers_.log) s_.handlers_.log(request, res);
  }

  // Hands a whole request to a worker, or answers 503 when max_connections requests are being
  // served already.
  void dispatch(Connection& c) {
    if (s_.serving_.load() >= s_.limits_.max_connections) {
      Request request;
      request.head = c.head;
      request.arrival = c.first_byte;
      respond_and_close(c, request, s_.handlers_.error(503, ""));
      return;
    }
    s_.serving_.fetch_add(1);
    const int fd = c.fd;
    auto it = conns_.find(fd);
    std::unique_ptr<Connection> owned = std::move(it->second);
    // The body is the request's now, bounded by max_connections times max_body.
    buffered_ -= owned->held;
    owned->held = 0;
    conns_.erase(it);
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    Request request;
    request.head = std::move(owned->head);
    request.body = std::move(owned->body);
    request.arrival = owned->first_byte;
    request.id = "req-" + std::to_string(++next_id_);
    owned->phase = Connection::kIdle;
    owned->chunked.reset();
    {
      std::lock_guard lock(work_mu_);
      work_.emplace_back(std::move(owned), std::move(request));
      // Workers are started as the load needs them, and kept; there are never more than the
      // requests being served.
      if (idle_workers_ < work_.size()) workers_.emplace_back([this] { work(); });
    }
    work_cv_.notify_one();
  }

  void work() {
    std::unique_lock lock(work_mu_);
    for (;;) {
      ++idle_workers_;
      work_cv_.wait(lock, [&] { return quit_ || !work_.empty(); });
      --idle_workers_;
      if (work_.empty()) return;
      auto [c, request] = std::move(work_.front());
      work_.pop_front();
      lock.unlock();
      serve(std::move(c), request);
      lock.lock();
    }
  }

  void serve(std::unique_ptr<Connection> c, const Request& request) {
    Response res;
    try {
      res = s_.handlers_.handle(request);
    } catch (const std::exception& e) {
      res = s_.handlers_.error(500, std::string("internal error: ") + e.what());
    }
    res.headers.emplace_back("X-Request-Id", request.id);
    const Clock::duration timeout = seconds(s_.limits_.write_timeout);
    // HTTP/1.0 has no chunked encoding: a stream there is the body up to the close.
    const bool chunked = res.stream && request.head.minor_version == 1;
    bool keep_alive = request.head.keep_alive && !res.close && (!res.stream || chunked);
    // The request's place among max_connections is freed just before its answer's last bytes
    // go out, so before the client can see the answer: a client that sends its next request at
    // once finds the place free.
    Clock::time_point answered;
    bool served = false;
    auto last_bytes = [&] {
      answered = Clock::now();
      if (!served) s_.serving_.fetch_sub(1);
      served = true;
    };
    if (!res.stream) last_bytes();
    bool ok = send_all(
        c->fd, response_head(res, keep_alive, chunked, s_.limits_.keep_alive_timeout) + res.body,
        timeout);
    if (ok && res.stream) {
      SocketSink sink(c->fd, chunked, timeout);
      try {
        while (res.stream(sink)) {
        }
        if (!sink.failed()) last_bytes();
        ok = !sink.failed() && (!chunked || send_all(c->fd, "0\r\n\r\n", timeout));
      } catch (const std::exception& e) {
        // The status line is sent: all that is left is to end the connection mid-body, which
        // the client sees as a broken stream.
        std::fprintf(stderr, "tformers: serve: %s: a stream failed: %s\n", request.id.c_str(),
                     e.what());
        ok = false;
      }
    }
    if (!served) s_.serving_.fetch_sub(1);
    if (s_.handlers_.log) s_.handlers_.log(request, res);
    if (ok && keep_alive) {
      std::lock_guard lock(mu_);
      if (!stopping_) {
        c->since = answered;
        c->deadline = answered + seconds(s_.limits_.keep_alive_timeout);
        returned_.push_back(std::move(c));
        wake();
        return;
      }
    }
    close_connection(*c);
  }

  // Connections whose response is written, back for their next request (which may be here
  // already: a pipelined one is read from what was received).
  void take_returned() {
    std::vector<std::unique_ptr<Connection>> back;
    {
      std::lock_guard lock(mu_);
      back.swap(returned_);
    }
    for (auto& owned : back) {
      const int fd = owned->fd;
      Connection& c = *owned;
      c.received = c.in.size();
      conns_.emplace(fd, std::move(owned));
      watch(fd);
      advance(c);
      after_reading(fd);
    }
  }

  Server& s_;
  int epoll_fd_ = -1, wake_fd_ = -1;
  std::thread thread_;
  std::unordered_map<int, std::unique_ptr<Connection>> conns_;  // the loop's own
  char scratch_[kRead];
  size_t buffered_ = 0;  // the sum of the connections' held bytes
  std::optional<Clock::time_point> accept_paused_until_;
  uint64_t next_id_ = 0;
  std::mutex mu_;  // guards stopping_ and returned_
  bool stopping_ = false;
  std::vector<std::unique_ptr<Connection>> returned_;
  std::mutex work_mu_;  // guards what follows
  std::condition_variable work_cv_;
  std::deque<std::pair<std::unique_ptr<Connection>, Request>> work_;
  std::vector<std::thread> workers_;
  size_t idle_workers_ = 0;
  bool quit_ = false;
};

Server::Server(Limits limits, Handlers handlers)
    : limits_(limits), handlers_(std::move(handlers)) {}

Server::~Server() {
  stop();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

int Server::bind(const std::string& host, int port) {
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    throw IoError("serve: cannot listen on " + where + ": the address '" + host +
                  "' does not resolve (" + ::gai_strerror(rc) +
                  "); give --host an IP address or a known host name, e.g. 127.0.0.1 or 0.0.0.0");
  std::string why = "no address";
  for (addrinfo* a = found; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    // SO_REUSEADDR, so that a restarted server can bind while the old one's connections linger;
    // not SO_REUSEPORT, with which a second server on the port would take half the connections
    // instead of failing.
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      listen_fd_ = fd;
      break;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (listen_fd_ < 0)
    throw IoError("serve: cannot listen on " + where + ": " + why +
                  " (another server on that port? choose one with --port, or 0 for any)");
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

void Server::start() {
  // Each connection takes a descriptor, and the limit on them is what bounds the connections
  // held: raise the soft limit to the hard one (a default soft limit of 1024 is common). The
  // sockets are those descriptors less a reserve for the process's own files.
  rlimit files{};
  size_t descriptors = 1024;
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0) {
    if (files.rlim_cur < files.rlim_max) {
      files.rlim_cur = files.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &files);
      ::getrlimit(RLIMIT_NOFILE, &files);
    }
    descriptors = size_t(std::min<rlim_t>(files.rlim_cur, kMaxSockets + kReservedDescriptors));
  }
  max_sockets_ = std::max(descriptors, 2 * kReservedDescriptors) - kReservedDescriptors;
  loop_ = std::make_unique<Loop>(*this);
  loop_->start();
}

void Server::stop() {
  if (!loop_) return;
  loop_->stop();
  loop_.reset();
}

}  // namespace tformers::serve::http
