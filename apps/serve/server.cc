#include "serve/server.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include <unistd.h>

#include "serve/http.h"
#include "serve/metrics.h"
#include "serve/openai.h"
#include "tformers/error.h"
#include "tformers/serving.h"
#include "tformers/tokenizer.h"

namespace tformers::serve {

using cli::ServeArgs;

namespace {

using Clock = std::chrono::steady_clock;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

std::string number_text(double x) {
  char s[32];
  std::snprintf(s, sizeof s, "%g", x);
  return s;
}

// How often a request's thread wakes while it waits for tokens: to see whether a streaming
// client is still there, and for the request timeout.
constexpr auto kPoll = std::chrono::milliseconds(250);
// SIGTERM and SIGINT write a byte to this pipe, which the main thread waits on; a second signal
// ends the process at once.
int g_signal_pipe[2] = {-1, -1};
std::atomic<int> g_signals{0};

void on_stop_signal(int sig) {
  if (g_signals.fetch_add(1) > 0) _exit(128 + sig);
  const char byte = 1;
  [[maybe_unused]] const ssize_t written = ::write(g_signal_pipe[1], &byte, 1);
}

void install_stop_signals() {
  if (::pipe(g_signal_pipe) != 0)
    throw IoError(std::string("serve: cannot create a pipe: ") + std::strerror(errno));
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

void wait_for_stop_signal() {
  char byte;
  while (::read(g_signal_pipe[0], &byte, 1) < 0 && errno == EINTR) {
  }
}

http::Response error_response(const ApiError& e) {
  http::Response res;
  res.status = e.status();
  res.body = e.body();
  return res;
}

// The events of one request, queued by the engine's callback (on the scheduler thread) for the
// request's own thread.
struct Job {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<ServingEvent> events;
  int64_t tokens = 0;
  Clock::time_point first_token, last_token;
};

class Server;

// One completion request from submit to its last event, as its HTTP thread follows it.
class Completion {
 public:
  Completion(Server& server, ApiRequest request, Clock::time_point arrival);
  ~Completion();
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;

  // Queues the request in the engine; what the engine refuses becomes an ApiError.
  void submit(ServingRequest request);
  // Waits up to `wait` (never past the request's deadline) for events and returns the text they
  // add, with their log-probabilities when asked for (else null). Empty `arrived` when none came.
  struct Delta {
    bool arrived = false;
    std::string text;
    Json logprobs;
  };
  Delta advance(Clock::duration wait);
  bool finished() const { return finished_; }
  // Why a finished request produced no normal ending (timeout, shutdown, engine error).
  const std::optional<ApiError>& error() const { return error_; }

  // The whole response, once finished without an error.
  Json response() const;
  // Writes what has arrived as SSE chunks. True while there is more to come; false once the
  // stream has ended or the client has gone (the request is then cancelled).
  bool stream(http::Sink& sink);
  const Usage& usage() const { return usage_; }

 private:
  void cancel();
  void finish(const ServingEvent& last);

  Server& server_;
  const ApiRequest request_;
  const ResponseHead head_;
  const Clock::time_point arrival_, deadline_;
  std::shared_ptr<Job> job_ = std::make_shared<Job>();
  OutputText text_;
  std::string all_text_;
  std::vector<ServingEvent> token_events_;  // with logprobs: every token's event
  std::vector<size_t> text_offsets_;
  Usage usage_;
  uint64_t id_ = 0;
  bool submitted_ = false, cancelled_ = false, timed_out_ = false, finished_ = false;
  bool started_stream_ = false;
  std::string finish_reason_;
  std::optional<ApiError> error_;
};

class Server {
 public:
  Server(const ServeArgs& args, ServingEngine& engine, const Tokenizer& tokenizer,
         int64_t vocab_size, std::string api_key)
      : args_(args),
        engine_(engine),
        tokenizer_(tokenizer),
        vocab_size_(vocab_size),
        max_prompt_bytes_(max_prompt_bytes(tokenizer, engine.config().max_model_len)),
        api_key_(std::move(api_key)),
        model_name_(args.served_model_name.empty() ? args.model.model : args.served_model_name),
        created_(std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count()),
        http_(limits(args), handlers()) {}
  // A failure after the listener started (in the warm-up, say) still ends it, before the engine
  // it calls goes away.
  ~Server() { http_.stop(); }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the address (IoError when it cannot) and returns the port taken.
  int bind() { return http_.bind(args_.host, args_.port); }
  void listen_in_background() { http_.start(); }
  void set_ready() { ready_ = true; }

  // Stops admitting requests, lets the running ones finish for up to `grace` (then they are
  // aborted), waits for their answers to be written, and stops the listener.
  void stop(Clock::duration grace) {
    draining_ = true;
    engine_.shutdown(std::chrono::duration_cast<std::chrono::milliseconds>(grace));
    {
      std::unique_lock lock(in_flight_mu_);
      in_flight_cv_.wait_for(lock, seconds(args_.write_timeout) + std::chrono::seconds(1),
                             [&] { return in_flight_ == 0; });
    }
    http_.stop();
  }

 private:
  friend class Completion;

  static http::Limits limits(const ServeArgs& args);
  http::Handlers handlers();
  void authorize(const http::RequestHead& head) const;
  http::Response handle(const http::Request& req);
  http::Response complete(Endpoint endpoint, const http::Request& req);
  http::Response refused(int status, const std::string& message) const;
  void log(const http::Request& req, const http::Response& res);
  void refuse_unless_ready() const {
    if (draining_) throw ApiError(503, "the server is shutting down", "", "shutting_down");
    if (!ready_)
      throw ApiError(503, "the model is warming up; GET /health answers 200 once it is ready", "",
                     "warming_up");
  }
  void enter() {
    std::lock_guard lock(in_flight_mu_);
    ++in_flight_;
  }
  void leave() {
    std::lock_guard lock(in_flight_mu_);
    if (--in_flight_ == 0) in_flight_cv_.notify_all();
  }

  const ServeArgs& args_;
  ServingEngine& engine_;
  const Tokenizer& tokenizer_;
  const int64_t vocab_size_;
  const size_t max_prompt_bytes_;
  const std::string api_key_, model_name_;
  const int64_t created_;
  Metrics metrics_;
  http::Server http_;
  std::atomic<bool> ready_{false}, draining_{false};
  std::mutex in_flight_mu_;
  std::condition_variable in_flight_cv_;
  int64_t in_flight_ = 0;  // completions between arrival and their last byte
};

Completion::Completion(Server& server, ApiRequest request, Clock::time_point arrival)
    : server_(server),
      request_(std::move(request)),
      head_(new_response_head(request_.endpoint, server.model_name_)),
      arrival_(arrival),
      deadline_(arrival + seconds(server.args_.request_timeout)),
      text_(server.tokenizer_, request_.stop) {
  server_.enter();
}

Completion::~Completion() {
  // A response that ended early (the client left, a write failed, the server stopped) must not
  // leave its sequence running.
  if (submitted_ && !finished_) {
    server_.engine_.cancel(id_);
    server_.metrics_.count_finish("disconnected");
  }
  server_.leave();
}

void Completion::submit(ServingRequest request) {
  usage_.prompt_tokens = int64_t(request.prompt.size());
  std::shared_ptr<Job> job = job_;
  try {
    id_ = server_.engine_.submit(std::move(request), [job](const ServingEvent& e) {
      std::lock_guard lock(job->mu);
      if (e.token >= 0) {
        const Clock::time_point now = Clock::now();
        if (job->tokens++ == 0) job->first_token = now;
        job->last_token = now;
      }
      job->events.push_back(e);
      job->cv.notify_one();
    });
  } catch (const InvalidArgumentError& e) {
    throw ApiError(400, e.what());
  } catch (const ResourceError& e) {
    throw ApiError(503, std::string("the server is not admitting requests: ") + e.what(), "",
                   "shutting_down");
  }
  submitted_ = true;
}

void Completion::cancel() {
  if (cancelled_) return;
  cancelled_ = true;
  server_.engine_.cancel(id_);
}

Completion::Delta Completion::advance(Clock::duration wait) {
  std::deque<ServingEvent> events;
  {
    std::unique_lock lock(job_->mu);
    job_->cv.wait_until(lock, std::min(Clock::now() + wait, deadline_),
                        [&] { return !job_->events.empty(); });
    events.swap(job_->events);
  }
  if (!finished_ && !timed_out_ && Clock::now() >= deadline_) {
    timed_out_ = true;
    cancel();  // the engine answers with an "abort" event
  }
  Delta d;
  d.arrived = !events.empty();
  const size_t first_logprob = token_events_.size();
  for (const ServingEvent& e : events) {
    if (e.token >= 0) {
      ++usage_.completion_tokens;
      if (request_.logprobs) {
        token_events_.push_back(e);
        text_offsets_.push_back(text_.offset());
      }
      d.text += text_.put(e.token);
      // This side saw a stop string before the engine did (it decodes the same tokens, but may
      // cut the text elsewhere): the request ends here.
      if (text_.stopped() && e.finish_reason.empty()) cancel();
    }
    if (!e.finish_reason.empty()) {
      d.text += text_.finish();
      finish(e);
    }
  }
  if (token_events_.size() > first_logprob)
    d.logprobs = logprobs_json(request_.endpoint, server_.tokenizer_,
                               std::span(token_events_).subspan(first_logprob),
                               std::span(text_offsets_).subspan(first_logprob));
  all_text_ += d.text;
  return d;
}

void Completion::finish(const ServingEvent& last) {
  finished_ = true;
  std::string why;
  if (text_.stopped()) {
    finish_reason_ = why = "stop";
  } else if (last.finish_reason == "stop" || last.finish_reason == "length") {
    finish_reason_ = why = last.finish_reason;
  } else if (last.finish_reason == "error") {
    why = "error";
    error_ = ApiError(500, "generation failed: " + last.error);
  } else if (timed_out_) {
    why = "timeout";
    error_ = ApiError(504,
                      "the request ran longer than the server's --request-timeout of " +
                          number_text(server_.args_.request_timeout) + " s and was cancelled",
                      "", "timeout");
  } else {
    why = "shutdown";
    error_ = ApiError(503, "the server is shutting down; the request was cancelled", "",
                      "shutting_down");
  }
  server_.metrics_.count_finish(why);
  // The callback wrote these before queueing the last event, which this thread has taken.
  std::lock_guard lock(job_->mu);
  if (job_->tokens > 0)
    server_.metrics_.observe_time_to_first_token(seconds_between(arrival_, job_->first_token));
  if (job_->tokens > 1)
    server_.metrics_.observe_time_per_output_token(
        seconds_between(job_->first_token, job_->last_token) / double(job_->tokens - 1));
}

Json Completion::response() const {
  const Json logprobs = request_.logprobs ? logprobs_json(request_.endpoint, server_.tokenizer_,
                                                          token_events_, text_offsets_)
                                          : Json();
  return response_json(head_, all_text_, finish_reason_, logprobs, usage_);
}

bool Completion::stream(http::Sink& sink) {
  std::string out;
  if (!started_stream_ && request_.endpoint == Endpoint::kChatCompletions)
    out += sse_event(chunk_json(head_, {.first = true, .usage_null = request_.include_usage}));
  started_stream_ = true;
  const Delta d = advance(kPoll);
  if (!d.arrived && out.empty()) {
    // Nothing to send: only see whether the client is still there.
    if (sink.is_writable()) return true;
    cancel();
    return false;
  }
  const bool ended = finished_ && !error_;
  if (!d.text.empty() || !d.logprobs.is_null() || ended) {
    Chunk chunk{.text = d.text, .logprobs = d.logprobs, .usage_null = request_.include_usage};
    if (ended) chunk.finish_reason = finish_reason_;
    out += sse_event(chunk_json(head_, chunk));
  }
  if (finished_) {
    // An error mid-stream is sent as OpenAI does, as an event holding {"error": ...}.
    if (error_) out += "data: " + error_->body() + "\n\n";
    if (ended && request_.include_usage) out += sse_event(usage_chunk_json(head_, usage_));
    out += kSseDone;
  }
  if (!out.empty() && !sink.write(out)) {
    cancel();
    return false;
  }
  return !finished_;
}

// The bearer token, compared in time that does not depend on where it differs.
void Server::authorize(const http::RequestHead& head) const {
  if (api_key_.empty()) return;
  const std::string given = head.header("authorization");
  const std::string want = "Bearer " + api_key_;
  unsigned char diff = given.size() != want.size();
  for (size_t i = 0; i < std::min(given.size(), want.size()); ++i) diff |= given[i] ^ want[i];
  if (diff)
    throw ApiError(401,
                   given.empty() ? "no API key given: send the header Authorization: Bearer KEY"
                                 : "incorrect API key",
                   "", "invalid_api_key");
}

http::Response Server::complete(Endpoint endpoint, const http::Request& req) {
  const Clock::time_point arrival = Clock::now();
  refuse_unless_ready();
  ApiRequest request = parse_request(endpoint, req.body);
  if (request.model != model_name_)
    throw ApiError(404,
                   "model: '" + request.model + "' is not served here; this server serves '" +
                       model_name_ + "' (GET /v1/models)",
                   "model", "model_not_found");
  ServingRequest engine_request = to_engine_request(
      request, tokenizer_, engine_.config().max_model_len, vocab_size_, max_prompt_bytes_);
  const bool stream = request.stream;
  auto completion = std::make_shared<Completion>(*this, std::move(request), arrival);
  completion->submit(std::move(engine_request));
  http::Response res;
  res.tokens = [completion] {
    return std::pair(completion->usage().prompt_tokens, completion->usage().completion_tokens);
  };
  if (stream) {
    res.content_type = "text/event-stream";
    res.headers.emplace_back("Cache-Control", "no-cache");
    res.stream = [completion](http::Sink& sink) { return completion->stream(sink); };
    return res;
  }
  while (!completion->finished()) completion->advance(kPoll);
  if (completion->error()) throw *completion->error();
  res.body = dump(completion->response());
  return res;
}

http::Response Server::handle(const http::Request& req) {
  const std::string& method = req.head.method;
  const std::string& path = req.head.path;
  try {
    if (method == "POST" && path == "/v1/chat/completions")
      return complete(Endpoint::kChatCompletions, req);
    if (method == "POST" && path == "/v1/completions") return complete(Endpoint::kCompletions, req);
    http::Response res;
    if (method == "GET" && path == "/v1/models") {
      const Json model = {{"id", model_name_},
                          {"object", "model"},
                          {"created", created_},
                          {"owned_by", "tformers"},
                          {"max_model_len", engine_.config().max_model_len}};
      res.body = dump({{"object", "list"}, {"data", Json::array({model})}});
    } else if (method == "GET" && path == "/health") {
      refuse_unless_ready();
      res.body = dump({{"status", "ok"}});
    } else if (method == "GET" && path == "/metrics") {
      res.content_type = "text/plain; version=0.0.4";
      res.body = metrics_.render(engine_.stats());
    } else {
      throw ApiError(404, "no route for " + method + " " + path);
    }
    return res;
  } catch (const ApiError& e) {
    return error_response(e);
  } catch (const std::exception& e) {
    return error_response(ApiError(500, std::string("internal error: ") + e.what()));
  }
}

// What the HTTP layer answers by itself: a malformed request, one over a limit, or a connection
// over --max-connections; each with OpenAI's error body, and the flag to change where one
// applies.
http::Response Server::refused(int status, const std::string& message) const {
  if (status == 503) {
    http::Response res =
        error_response(ApiError(503,
                                "the server has " + std::to_string(args_.max_connections) +
                                    " connections open, its limit (--max-connections); retry later",
                                "", "too_many_connections"));
    res.headers.emplace_back("Retry-After", "1");
    return res;
  }
  if (status == 413)
    return error_response(ApiError(413,
                                   "the request body is over the server's limit of " +
                                       std::to_string(args_.max_body_bytes) +
                                       " bytes (--max-body-bytes)",
                                   "", "request_too_large"));
  if (status == 408)
    return error_response(ApiError(
        408, message + " (--read-timeout): send the whole request at once", "", "request_timeout"));
  return error_response(ApiError(status, message));
}

// The route a request counts under in /metrics; any other path is "other", so that clients
// cannot add label values.
std::string route_of(const std::string& path) {
  for (const char* route :
       {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"})
    if (path == route) return route;
  return "other";
}

void Server::log(const http::Request& req, const http::Response& res) {
  metrics_.count_request(route_of(req.head.path), res.status);
  if (!args_.verbose) return;
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - req.arrival).count();
  std::string tokens;
  if (res.tokens) {
    const auto [in, out] = res.tokens();
    tokens = " tokens_in=" + std::to_string(in) + " tokens_out=" + std::to_string(out);
  }
  const std::string method = req.head.method.empty() ? "-" : req.head.method;
  const std::string path = req.head.path.empty() ? "-" : req.head.path;
  std::fprintf(stderr, "tformers: serve: %s %s %s %d %.1f ms%s\n",
               req.id.empty() ? "-" : req.id.c_str(), method.c_str(), path.c_str(), res.status, ms,
               tokens.c_str());
}

http::Limits Server::limits(const ServeArgs& args) {
  http::Limits l;
  l.max_body = args.max_body_bytes;
  l.read_timeout = args.read_timeout;
  l.write_timeout = args.write_timeout;
  l.keep_alive_timeout = args.keep_alive_timeout;
  l.max_connections = size_t(args.max_connections);
  return l;
}

http::Handlers Server::handlers() {
  http::Handlers h;
  // The key is checked on the head, so that a client without it cannot make the server read
  // (and hold) a body. Health checks and scrapes need none.
  h.on_head = [this](const http::RequestHead& head) -> std::optional<http::Response> {
    if (head.path.rfind("/v1/", 0) != 0) return std::nullopt;
    try {
      authorize(head);
    } catch (const ApiError& e) {
      return error_response(e);
    }
    return std::nullopt;
  };
  h.handle = [this](const http::Request& req) { return handle(req); };
  h.log = [this](const http::Request& req, const http::Response& res) { log(req, res); };
  h.error = [this](int status, const std::string& message) { return refused(status, message); };
  return h;
}

}  // namespace

int run_serve(const ServeArgs& args, const ModelLoader& load_model) {
  const char* env_key = std::getenv("TFORMERS_API_KEY");
  const std::string api_key = !args.api_key.empty() ? args.api_key : env_key ? env_key : "";
  install_stop_signals();

  Tokenizer tokenizer = AutoTokenizer::from_pretrained(args.model.model, args.model.revision);
  CausalLM model = load_model(args);
  ServingEngine engine(model,
                       {.max_num_seqs = args.max_num_seqs,
                        .max_model_len = args.max_model_len,
                        .enable_prefix_caching = args.enable_prefix_caching},
                       &tokenizer);
  Server server(args, engine, tokenizer, model.config().vocab_size, api_key);
  const int port = server.bind();
  server.listen_in_background();
  std::fprintf(stderr, "tformers: serve: listening on http://%s:%d (warming up)\n",
               args.host.c_str(), port);
  if (api_key.empty() && args.host != "127.0.0.1" && args.host != "localhost" && args.host != "::1")
    std::fprintf(stderr,
                 "tformers: serve: warning: listening beyond this machine without an API key; "
                 "give --api-key or TFORMERS_API_KEY\n");

  const double warm_up_seconds = engine.warm_up();
  engine.start();
  server.set_ready();
  std::fprintf(stderr,
               "tformers: serve: ready: warm-up took %.2f s; %lld sequences of up to %lld tokens\n",
               warm_up_seconds, (long long)engine.config().max_num_seqs,
               (long long)engine.config().max_model_len);

  wait_for_stop_signal();
  std::fprintf(stderr,
               "tformers: serve: stopping: no new requests; running ones have %g s to finish\n",
               args.shutdown_timeout);
  server.stop(seconds(args.shutdown_timeout));
  std::fprintf(stderr, "tformers: serve: stopped\n");
  return 0;
}

}  // namespace tformers::serve
