// The HTTP/1.1 layer of `tformers serve`: a request parser with hard limits, and a server whose
// connections are read by one event loop (epoll) until a whole request has arrived, and only
// then handed to a worker thread.
//
// Why its own layer and not cpp-httplib (which it replaced) or Boost.Beast: see docs/serving.md.
// In short, the limits below are the point of the layer, and each is a few lines here:
//   - a request line over Limits::max_line bytes is refused (414) as it arrives, a head over
//     max_head bytes or with more than max_headers fields is refused (431), so a client that
//     never ends its head costs at most max_head bytes;
//   - a request's head must arrive within Limits::read_timeout of its first byte, and its body
//     at Limits::min_body_rate bytes a second once read_timeout has passed; an idle connection
//     is closed after keep_alive_timeout: a slow client holds a socket and a buffer the size of
//     what it sent, never a thread;
//   - the bytes of requests still arriving are bounded over all connections (max_buffered): past
//     it, the connections holding bytes that have made the least progress are closed;
//   - requests being served (in worker threads) are limited, not sockets: the loop holds as many
//     connections as the descriptor limit allows, and at that limit closes those that have made
//     the least progress, never the newcomer;
//   - framing that two parsers could read differently (Content-Length with Transfer-Encoding,
//     two different Content-Lengths, a length that is not digits) is refused (400) at once;
//   - the authorization check (on_head) runs on the head, before a byte of the body is read.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tformers::serve::http {

struct Limits {
  size_t max_line = 8192;         // the request line, and any one header line
  size_t max_head = 16384;        // request line and headers together, with their line ends
  size_t max_headers = 100;       // header fields
  int64_t max_body = 4 << 20;     // body bytes, by Content-Length or chunked
  double read_timeout = 30;       // seconds for a head from its first byte, and see below
  double write_timeout = 30;      // seconds one write may wait for a client that does not read
  double keep_alive_timeout = 5;  // seconds an idle connection waits for its next request
  int64_t min_body_rate = 1024;   // bytes a second a body must average past read_timeout
  size_t max_connections = 64;    // requests being served at once; one more is answered 503
  // Bytes of requests still arriving, over all connections (see Server::Loop::after_reading).
  size_t max_buffered = size_t(256) << 20;
};

struct Header {
  std::string name;  // lower case
  std::string value;
};

struct RequestHead {
  std::string method, target, path, query;
  int minor_version = 1;  // HTTP/1.<minor>
  std::vector<Header> headers;
  bool chunked = false;
  int64_t content_length = 0;  // when not chunked
  bool keep_alive = true;
  bool expect_continue = false;
  // The value of the first field named `name` (lower case); empty when there is none.
  std::string header(std::string_view name) const;
};

// Why a request was refused before it reached a handler.
struct ParseError {
  int status = 400;
  std::string message;
};

struct HeadResult {
  enum Status { kIncomplete, kComplete, kError } status = kIncomplete;
  size_t consumed = 0;  // bytes of the head, when complete
  RequestHead head;
  ParseError error;
};

// Reads a request head from the start of `bytes`. kIncomplete means more bytes are needed (and
// none of the limits is passed yet); the head ends at the first empty line. `scanned` carries how
// far an earlier call looked, so that a head sent a byte at a time is not scanned again and
// again; start it at 0 for each new head.
HeadResult parse_head(std::string_view bytes, const Limits& limits, size_t& scanned);

// A chunked body, decoded as it arrives.
class ChunkedDecoder {
 public:
  enum Status { kIncomplete, kComplete, kError };
  // Decodes what it can of `bytes` into `body`; `consumed` is how many bytes it took. After
  // kComplete, the bytes past `consumed` belong to the next request.
  Status feed(std::string_view bytes, int64_t max_body, std::string& body, size_t& consumed);
  const ParseError& error() const { return error_; }

 private:
  enum State { kSize, kData, kDataEnd, kTrailer, kDone } state_ = kSize;
  uint64_t left_ = 0;         // bytes of the current chunk still to come
  size_t trailer_bytes_ = 0;  // trailer fields read, bounded like a head
  ParseError error_;
};

struct Request {
  RequestHead head;
  std::string body;
  std::string id;                                 // "req-<n>", for logs and the X-Request-Id header
  std::chrono::steady_clock::time_point arrival;  // when its first byte came
};

// Writes a streamed body; what Response::stream is given.
class Sink {
 public:
  virtual ~Sink() = default;
  // False when the client has gone or stopped reading for --write-timeout.
  virtual bool write(std::string_view data) = 0;
  // False once the client has closed its side of the connection.
  virtual bool is_writable() = 0;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  bool close = false;  // end the connection after this response
  // When set, the body is streamed with chunked encoding: called until it returns false (the
  // stream ends: done, or the client is gone).
  std::function<bool(Sink&)> stream;
  // Tokens in and out, for the log line; -1 when the request had none.
  std::function<std::pair<int64_t, int64_t>()> tokens;
};

struct Handlers {
  // Runs on the event loop once a head is complete, before the body is read: a response here
  // (an authorization failure, say) is sent instead, and the connection closed.
  std::function<std::optional<Response>(const RequestHead&)> on_head;
  // Runs on a worker thread with the whole request.
  std::function<Response(const Request&)> handle;
  // Every response's end: sent by the server itself (a refused head) or by handle. Takes the
  // request (its head may be partial when parsing failed), the status and the response.
  std::function<void(const Request&, const Response&)> log;
  // The response for a request refused by the server (malformed, over a limit, over
  // max_connections: status 503).
  std::function<Response(int status, const std::string& message)> error;
};

// The reason phrase of a status code.
std::string_view reason_phrase(int status);

// A path segment with its percent-escapes (RFC 3986: "%2F" for "/") decoded; nullopt when a '%'
// is not followed by two hex digits.
std::optional<std::string> percent_decoded(std::string_view segment);

class Server {
 public:
  Server(Limits limits, Handlers handlers);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (port 0: any free one) and returns the port; throws IoError with the reason
  // when it cannot.
  int bind(const std::string& host, int port);
  // Starts the event loop on a thread of its own.
  void start();
  // Stops accepting, closes every connection and joins the threads. Requests still being
  // handled finish first (their writes then fail).
  void stop();

  // The connections it holds at most (known once started).
  size_t max_sockets() const { return max_sockets_; }

 private:
  struct Connection;
  class Loop;
  friend class Loop;

  Limits limits_;
  Handlers handlers_;
  int listen_fd_ = -1;
  size_t max_sockets_ = 0;
  std::atomic<size_t> sockets_{0};  // client sockets open
  std::atomic<size_t> serving_{0};  // requests in workers, until their answer's last bytes
  std::unique_ptr<Loop> loop_;
};

}  // namespace tformers::serve::http
