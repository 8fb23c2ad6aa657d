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
#include <vector>

#include <unistd.h>

#include "io/safetensors.h"
#include "serve/http.h"
#include "serve/metrics.h"
#include "serve/openai.h"
#include "serve/reasoning.h"
#include "serve/responses.h"
#include "tformers/distributed.h"
#include "tformers/error.h"
#include "tformers/serving.h"
#include "tformers/tokenizer.h"

namespace tformers::serve {

using cli::chat_template_from;
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
  // SIGUSR1: what `tformers launch` turns a SIGTERM into for every rank (see launcher.cc).
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaction(sig, &sa, nullptr);
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

// The events of one request's choices, queued by the engine's callbacks (on the scheduler
// thread) for the request's own thread, each with the index of its choice.
struct Job {
  explicit Job(size_t choices) : timing(choices) {}
  struct Timing {
    int64_t tokens = 0;
    Clock::time_point first_token, last_token;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<size_t, ServingEvent>> events;
  std::vector<Timing> timing;  // per choice
};

class Server;

// One completion request from submit to the last event of its last choice, as its HTTP thread
// follows it. Each of its n choices is a sequence of its own in the engine; they share the
// prompt's KV blocks through the prefix cache.
class Completion {
 public:
  // think_open: the prompt leaves a <think> block open (prompt_opens_think).
  Completion(Server& server, ApiRequest request, Clock::time_point arrival, bool think_open);
  ~Completion();
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;

  // Queues the request's choices in the engine, n for each prompt's request; what the engine
  // refuses becomes an ApiError.
  void submit(const std::vector<ServingRequest>& prompts);
  // What the events of one wait added to one choice: its text, its log-probabilities when asked
  // for (else null), and whether it ended there without an error.
  struct Delta {
    std::string text, reasoning;
    Json logprobs;
    bool ended = false;
    std::vector<ToolCall> tool_calls;  // the choice's calls from number first_tool_call on
    size_t first_tool_call = 0;
  };
  struct Progress {
    bool arrived = false;  // any event came
    std::vector<Delta> choices;
  };
  // Waits up to `wait` (never past the request's deadline) for events and returns what they add
  // to each choice.
  Progress advance(Clock::duration wait);
  bool finished() const { return finished_choices_ == choices_.size(); }
  // Why a finished request produced no normal ending (timeout, shutdown, engine error); one
  // choice failing fails the request, and its other choices are cancelled.
  const std::optional<ApiError>& error() const { return error_; }

  // The whole response, once finished without an error.
  Json response() const;
  // Writes what has arrived as SSE chunks (the Responses API's events). True while there is more
  // to come; false once the stream has ended or the client has gone (the request is then
  // cancelled).
  bool stream(http::Sink& sink);
  const Usage& usage() const { return usage_; }

 private:
  struct Choice {
    Choice(const Tokenizer& tokenizer, std::vector<std::string> stop, KeptTokens kept)
        : text(tokenizer, std::move(stop), std::move(kept)) {}
    uint64_t id = 0;
    OutputText text;
    // A chat whose model reasons in markup, or with tools in a format the template defines: the
    // reasoning and the calls are taken out of the text.
    std::optional<ChatOutputParser> parser;
    std::vector<ToolCall> tool_calls;
    std::string all_text, all_reasoning;
    std::vector<ServingEvent> token_events;  // with logprobs: every token's event
    std::vector<size_t> text_offsets;
    // Tokens generated, and of them those up to the last that gave reasoning text.
    int64_t tokens = 0, reasoning_tokens = 0;
    bool submitted = false, cancelled = false, finished = false;
    std::string finish_reason;  // "stop", "length" or "tool_calls"; empty when it failed
  };

  void cancel(Choice& choice);
  void cancel_all();
  // Text that became final: through the output parser when there is one; `final` at the end.
  void add_text(Choice& c, Delta& d, const std::string& text, bool final);
  // The choices' text and parsers, as the request and the model's formats have them.
  void make_choices(bool think_open);
  void finish(size_t index, const ServingEvent& last);
  // The request failed for `why`: the first failure is the one answered; the other choices are
  // cancelled.
  void fail(const std::string& why, ApiError error);
  // What a stream opens with, then what one wait's progress adds to it: chat and completion
  // chunks, or the Responses API's events.
  std::string stream_start();
  std::string chunk_events(const Progress& p);
  std::string response_events(const Progress& p);

  Server& server_;
  const ApiRequest request_;
  const ResponseHead head_;
  const Clock::time_point arrival_, deadline_;
  std::shared_ptr<Job> job_;
  std::deque<Choice> choices_;  // a deque: OutputText stays where it was made
  size_t finished_choices_ = 0;
  Usage usage_;
  bool timed_out_ = false, started_stream_ = false;
  std::string failure_;  // why the request failed (a metrics reason), once it has
  std::optional<ApiError> error_;
  // A streamed Responses request's events and the response they build.
  std::optional<ResponseWriter> writer_;
};

class Server {
 public:
  // model_eos: the model's generation_config eos ids, which harmony's chats extend.
  Server(const ServeArgs& args, ServingEngine& engine, const Tokenizer& tokenizer,
         int64_t vocab_size, std::string api_key, std::vector<int64_t> model_eos)
      : args_(args),
        engine_(engine),
        tokenizer_(tokenizer),
        tool_format_(detect_tool_call_format(tokenizer)),
        tool_markers_(kept_tool_call_tokens(tool_format_, tokenizer)),
        reasoning_(detect_reasoning_format(tokenizer)),
        reasoning_markers_(kept_reasoning_tokens(reasoning_, tokenizer)),
        chat_eos_(reasoning_ == ReasoningFormat::kHarmony
                      ? harmony_eos_ids(tokenizer, std::move(model_eos))
                      : std::vector<int64_t>{}),
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
  size_t max_sockets() const { return http_.max_sockets(); }
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
  // A checkpoint served under --load-mode mmap that shrank reads as zeros from then on and every
  // generation fails, even once its bytes are back: the server must be restarted, which /health
  // says rather than 200.
  static void refuse_unless_weights_intact() {
    try {
      io::check_mapped_files();
    } catch (const IoError& e) {
      throw ApiError(503, std::string(e.what()) + "; restart the server", "", "model_unusable");
    }
  }
  // The served model as /v1/models lists it.
  Json model_json() const {
    return {{"id", model_name_},
            {"object", "model"},
            {"created", created_},
            {"owned_by", "tformers"},
            {"max_model_len", engine_.config().max_model_len}};
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
  const ToolCallFormat tool_format_;
  const KeptTokens tool_markers_;
  const ReasoningFormat reasoning_;
  const KeptTokens reasoning_markers_;
  // Harmony: the eos ids of a chat that leaves them unset (harmony_eos_ids); else empty.
  const std::vector<int64_t> chat_eos_;
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

Completion::Completion(Server& server, ApiRequest request, Clock::time_point arrival,
                       bool think_open)
    : server_(server),
      request_(std::move(request)),
      head_(new_response_head(request_.endpoint, server.model_name_)),
      arrival_(arrival),
      deadline_(arrival + seconds(server.args_.request_timeout)),
      job_(std::make_shared<Job>(request_.choices())) {
  if (request_.endpoint == Endpoint::kResponses && request_.stream)
    writer_.emplace(head_, request_.echo);
  make_choices(think_open);
  server_.enter();
}

void Completion::make_choices(bool think_open) {
  const bool chat = is_chat(request_.endpoint);
  // Forced calls are the whole output, whatever the template's format, and a constrained output
  // (forced calls or response_format) is a JSON value from its first token: no reasoning.
  const bool forced = request_.forced_calls.kind != ForcedCalls::kNone;
  const ReasoningFormat reasoning =
      chat && !request_.json_schema ? server_.reasoning_ : ReasoningFormat::kNone;
  // Harmony's calls are its own messages.
  const bool tools = !request_.tools.is_null() && server_.tool_format_ != ToolCallFormat::kNone &&
                     !forced && reasoning != ReasoningFormat::kHarmony;
  KeptTokens kept = tools ? server_.tool_markers_ : KeptTokens{};
  if (reasoning != ReasoningFormat::kNone)
    kept.insert(kept.end(), server_.reasoning_markers_.begin(), server_.reasoning_markers_.end());
  const bool parallel = request_.parallel_tool_calls;
  for (size_t i = 0; i < request_.choices(); ++i) {
    Choice& c = choices_.emplace_back(server_.tokenizer_, request_.stop, kept);
    if (forced)
      c.parser.emplace(ReasoningFormat::kNone, false, parallel,
                       ToolCallParser(server_.tool_format_, parallel, request_.forced_calls));
    else if (tools || reasoning != ReasoningFormat::kNone)
      c.parser.emplace(
          reasoning, think_open, parallel,
          tools ? std::optional(ToolCallParser(server_.tool_format_, parallel)) : std::nullopt);
  }
}

Completion::~Completion() {
  // A response that ended early (the client left, a write failed, the server stopped) must not
  // leave its sequences running.
  for (Choice& c : choices_)
    if (c.submitted && !c.finished) {
      server_.engine_.cancel(c.id);
      server_.metrics_.count_finish("disconnected");
    }
  server_.leave();
}

void Completion::submit(const std::vector<ServingRequest>& prompts) {
  // Each prompt counts once, however many choices continue it.
  for (const ServingRequest& p : prompts) usage_.prompt_tokens += int64_t(p.prompt.size());
  std::shared_ptr<Job> job = job_;
  const size_t n = size_t(request_.n);
  for (size_t i = 0; i < choices_.size(); ++i) {
    try {
      choices_[i].id = server_.engine_.submit(choice_request(prompts[i / n], int64_t(i % n)),
                                              [job, i](const ServingEvent& e) {
                                                std::lock_guard lock(job->mu);
                                                if (e.token >= 0) {
                                                  const Clock::time_point now = Clock::now();
                                                  Job::Timing& t = job->timing[i];
                                                  if (t.tokens++ == 0) t.first_token = now;
                                                  t.last_token = now;
                                                }
                                                job->events.emplace_back(i, e);
                                                job->cv.notify_one();
                                              });
    } catch (const InvalidArgumentError& e) {
      throw ApiError(400, e.what());
    } catch (const ResourceError& e) {
      throw ApiError(503, std::string("the server is not admitting requests: ") + e.what(), "",
                     "shutting_down");
    }
    choices_[i].submitted = true;
  }
}

void Completion::cancel(Choice& c) {
  if (c.cancelled || c.finished) return;
  c.cancelled = true;
  server_.engine_.cancel(c.id);  // the engine answers with an "abort" event
}

void Completion::cancel_all() {
  for (Choice& c : choices_) cancel(c);
}

Completion::Progress Completion::advance(Clock::duration wait) {
  std::deque<std::pair<size_t, ServingEvent>> events;
  {
    std::unique_lock lock(job_->mu);
    job_->cv.wait_until(lock, std::min(Clock::now() + wait, deadline_),
                        [&] { return !job_->events.empty(); });
    events.swap(job_->events);
  }
  if (!finished() && !timed_out_ && Clock::now() >= deadline_) {
    timed_out_ = true;
    cancel_all();
  }
  Progress p;
  p.arrived = !events.empty();
  p.choices.resize(choices_.size());
  std::vector<size_t> first_logprob;
  for (const Choice& c : choices_) first_logprob.push_back(c.token_events.size());
  for (const auto& [index, e] : events) {
    Choice& c = choices_[index];
    Delta& d = p.choices[index];
    if (e.token >= 0) {
      ++usage_.completion_tokens;
      ++c.tokens;
      // A prompt is shared by its choices; each prompt's first choice's lookup is counted.
      if (index % size_t(request_.n) == 0) usage_.cached_tokens += e.cached_tokens;
      if (request_.logprobs) {
        c.token_events.push_back(e);
        c.text_offsets.push_back(c.text.offset());
      }
      add_text(c, d, c.text.put(e.token), /*final=*/false);
      // This side saw a stop string before the engine did (it decodes the same tokens, but may
      // cut the text elsewhere): the choice ends here.
      if (c.text.stopped() && e.finish_reason.empty()) cancel(c);
    }
    if (!e.finish_reason.empty()) {
      add_text(c, d, c.text.finish(), /*final=*/true);
      finish(index, e);
      d.ended = !c.finish_reason.empty();
    }
  }
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    if (c.token_events.size() > first_logprob[i])
      p.choices[i].logprobs = logprobs_json(request_.endpoint, server_.tokenizer_,
                                            std::span(c.token_events).subspan(first_logprob[i]),
                                            std::span(c.text_offsets).subspan(first_logprob[i]));
    c.all_text += p.choices[i].text;
    c.all_reasoning += p.choices[i].reasoning;
  }
  return p;
}

void Completion::add_text(Choice& c, Delta& d, const std::string& text, bool final) {
  if (!c.parser) {
    d.text += text;
    return;
  }
  ParsedOutput out = c.parser->put(text);
  if (final) {
    ParsedOutput rest = c.parser->finish();
    out.reasoning += rest.reasoning;
    out.content += rest.content;
    for (ToolCall& call : rest.calls) out.calls.push_back(std::move(call));
  }
  d.text += out.content;
  if (!out.reasoning.empty()) c.reasoning_tokens = c.tokens;
  if (request_.include_reasoning) d.reasoning += out.reasoning;
  if (d.tool_calls.empty()) d.first_tool_call = c.tool_calls.size();
  for (ToolCall& call : out.calls) {
    c.tool_calls.push_back(call);
    d.tool_calls.push_back(std::move(call));
  }
}

void Completion::fail(const std::string& why, ApiError error) {
  if (!error_) {
    failure_ = why;
    error_ = std::move(error);
  }
  cancel_all();
}

void Completion::finish(size_t index, const ServingEvent& last) {
  Choice& c = choices_[index];
  c.finished = true;
  ++finished_choices_;
  usage_.reasoning_tokens += c.reasoning_tokens;
  std::string why;
  if (c.text.stopped()) {
    c.finish_reason = why = "stop";
  } else if (last.finish_reason == "stop" || last.finish_reason == "length") {
    c.finish_reason = why = last.finish_reason;
  } else if (last.finish_reason == "error") {
    fail(why = "error", ApiError(500, "generation failed: " + last.error));
  } else if (timed_out_) {
    fail(why = "timeout",
         ApiError(504,
                  "the request ran longer than the server's --request-timeout of " +
                      number_text(server_.args_.request_timeout) + " s and was cancelled",
                  "", "timeout"));
  } else if (error_) {
    why = failure_;  // cancelled because another choice failed
  } else {
    fail(why = "shutdown", ApiError(503, "the server is shutting down; the request was cancelled",
                                    "", "shutting_down"));
  }
  // The model ended its turn after calling tools: the client is to run them. A call forced by
  // naming its function ends with "stop", as OpenAI's does.
  if (c.finish_reason == "stop" && !c.tool_calls.empty() &&
      request_.forced_calls.kind != ForcedCalls::kArguments)
    c.finish_reason = "tool_calls";
  server_.metrics_.count_finish(why);
  // The callback wrote these before queueing the last event, which this thread has taken.
  std::lock_guard lock(job_->mu);
  const Job::Timing& t = job_->timing[index];
  if (t.tokens > 0)
    server_.metrics_.observe_time_to_first_token(seconds_between(arrival_, t.first_token));
  if (t.tokens > 1)
    server_.metrics_.observe_time_per_output_token(seconds_between(t.first_token, t.last_token) /
                                                   double(t.tokens - 1));
}

Json Completion::response() const {
  if (request_.endpoint == Endpoint::kResponses) {
    const Choice& c = choices_.front();
    ResponseWriter writer(head_, request_.echo);
    writer.put(c.all_reasoning, c.all_text, c.tool_calls);
    writer.end(c.finish_reason == "length", usage_);
    return writer.response();
  }
  std::vector<ChoiceOutput> out;
  for (const Choice& c : choices_)
    out.push_back({c.all_text, c.finish_reason,
                   request_.logprobs ? logprobs_json(request_.endpoint, server_.tokenizer_,
                                                     c.token_events, c.text_offsets)
                                     : Json(),
                   c.tool_calls, c.all_reasoning});
  return response_json(head_, out, usage_);
}

bool Completion::stream(http::Sink& sink) {
  std::string out = started_stream_ ? "" : stream_start();
  started_stream_ = true;
  const Progress p = advance(kPoll);
  if (!p.arrived && out.empty()) {
    // Nothing to send: only see whether the client is still there.
    if (sink.is_writable()) return true;
    cancel_all();
    return false;
  }
  out += writer_ ? response_events(p) : chunk_events(p);
  if (!out.empty() && !sink.write(out)) {
    cancel_all();
    return false;
  }
  return !finished();
}

// Chat's first chunk of each choice carries the role; the Responses API's first events say the
// response was created.
std::string Completion::stream_start() {
  if (writer_) return writer_->start();
  std::string out;
  if (request_.endpoint == Endpoint::kChatCompletions)
    for (size_t i = 0; i < choices_.size(); ++i)
      out += sse_event(chunk_json(
          head_, {.index = int64_t(i), .first = true, .usage_null = request_.include_usage}));
  return out;
}

std::string Completion::chunk_events(const Progress& p) {
  std::string out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Delta& d = p.choices[i];
    if (d.text.empty() && d.reasoning.empty() && d.logprobs.is_null() && !d.ended &&
        d.tool_calls.empty())
      continue;
    Chunk chunk{.index = int64_t(i),
                .text = d.text,
                .logprobs = d.logprobs,
                .usage_null = request_.include_usage,
                .tool_calls = d.tool_calls,
                .first_tool_call = d.first_tool_call,
                .reasoning = d.reasoning};
    if (d.ended) chunk.finish_reason = choices_[i].finish_reason;
    out += sse_event(chunk_json(head_, chunk));
  }
  if (finished()) {
    // An error mid-stream is sent as OpenAI does, as an event holding {"error": ...}.
    if (error_)
      out += "data: " + error_->body() + "\n\n";
    else if (request_.include_usage)
      out += sse_event(usage_chunk_json(head_, usage_));
    out += kSseDone;
  }
  return out;
}

// A Responses request has one choice. Its stream ends with response.completed (or .incomplete,
// or an error and response.failed), without chat's [DONE], as OpenAI's does.
std::string Completion::response_events(const Progress& p) {
  const Delta& d = p.choices.front();
  std::string out = writer_->put(d.reasoning, d.text, d.tool_calls);
  if (finished())
    out += error_ ? writer_->fail(*error_)
                  : writer_->end(choices_.front().finish_reason == "length", usage_);
  return out;
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
  if (request.model != model_name_) throw model_not_served(request.model, model_name_);
  std::vector<ServingRequest> prompts;
  for (size_t p = 0; p < std::max<size_t>(request.prompts.size(), 1); ++p)
    prompts.push_back(to_engine_request(request, tokenizer_, engine_.config().max_model_len,
                                        vocab_size_, max_prompt_bytes_, p));
  const bool chat = is_chat(endpoint);
  // A harmony chat ends where the model calls a tool, whatever its generation_config lists.
  for (ServingRequest& p : prompts)
    if (chat && !chat_eos_.empty() && !p.config.eos_token_id) p.config.eos_token_id = chat_eos_;
  const bool think_open = chat && reasoning_ == ReasoningFormat::kThink &&
                          prompt_opens_think(prompts.front().prompt, tokenizer_);
  const bool stream = request.stream;
  auto completion = std::make_shared<Completion>(*this, std::move(request), arrival, think_open);
  completion->submit(prompts);
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

// GET /v1/models/{id} retrieves one model.
constexpr std::string_view kModels = "/v1/models", kModelsPrefix = "/v1/models/";

// The routes, each with the one method it takes.
struct Route {
  const char* method;
  const char* path;
};
constexpr Route kRoutes[] = {{"POST", "/v1/chat/completions"},
                             {"POST", "/v1/completions"},
                             {"POST", "/v1/responses"},
                             {"GET", "/v1/models"},
                             {"POST", "/tokenize"},
                             {"POST", "/detokenize"},
                             {"GET", "/version"},
                             {"GET", "/health"},
                             {"GET", "/metrics"}};

// The methods of HTTP (RFC 9110 section 9 and RFC 5789's PATCH); methods are case-sensitive.
bool is_http_method(const std::string& method) {
  for (const char* known :
       {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})
    if (method == known) return true;
  return false;
}

// A request no route takes: 501 for a method this server does not implement, 405 with Allow
// for a path that takes another method, else 404.
http::Response no_route(const std::string& method, const std::string& path) {
  if (!is_http_method(method))
    return error_response(ApiError(501, "the method '" + method +
                                            "' is not implemented; this server answers GET and "
                                            "POST (methods are case-sensitive)"));
  for (const Route& r : kRoutes)
    if (path == r.path || (path.starts_with(kModelsPrefix) && r.path == kModels)) {
      http::Response res =
          error_response(ApiError(405, method + " is not allowed on " + path + "; use " + r.method,
                                  "", "method_not_allowed"));
      res.headers.emplace_back("Allow", r.method);
      return res;
    }
  return error_response(ApiError(404, "no route for " + method + " " + path));
}

http::Response Server::handle(const http::Request& req) {
  const std::string& method = req.head.method;
  const std::string& path = req.head.path;
  try {
    if (method == "POST" && path == "/v1/chat/completions")
      return complete(Endpoint::kChatCompletions, req);
    if (method == "POST" && path == "/v1/completions") return complete(Endpoint::kCompletions, req);
    if (method == "POST" && path == "/v1/responses") return complete(Endpoint::kResponses, req);
    http::Response res;
    if (method == "GET" && path == kModels) {
      res.body = dump({{"object", "list"}, {"data", Json::array({model_json()})}});
    } else if (method == "GET" && path.starts_with(kModelsPrefix)) {
      const std::optional<std::string> id =
          http::percent_decoded(std::string_view(path).substr(kModelsPrefix.size()));
      if (!id) throw ApiError(400, "the model id in " + path + " has a '%' without two hex digits");
      if (*id != model_name_)
        throw ApiError(
            404, "the model '" + *id + "' does not exist; this server serves '" + model_name_ + "'",
            "model", "model_not_found");
      res.body = dump(model_json());
    } else if (method == "POST" && path == "/tokenize") {
      res.body = dump(tokenize_json(req.body, model_name_, tokenizer_,
                                    engine_.config().max_model_len, max_prompt_bytes_));
    } else if (method == "POST" && path == "/detokenize") {
      res.body = dump(detokenize_json(req.body, model_name_, tokenizer_, vocab_size_));
    } else if (method == "GET" && path == "/version") {
      res.body = dump({{"version", TFORMERS_VERSION}});
    } else if (method == "GET" && path == "/health") {
      refuse_unless_ready();
      refuse_unless_weights_intact();
      res.body = dump({{"status", "ok"}});
    } else if (method == "GET" && path == "/metrics") {
      res.content_type = "text/plain; version=0.0.4";
      res.body = metrics_.render(engine_.stats());
    } else {
      return no_route(method, path);
    }
    return res;
  } catch (const ApiError& e) {
    return error_response(e);
  } catch (const std::exception& e) {
    return error_response(ApiError(500, std::string("internal error: ") + e.what()));
  }
}

// What the HTTP layer answers by itself: a malformed request, one over a limit, or a request
// over --max-connections; each with OpenAI's error body, and the flag to change where one
// applies.
http::Response Server::refused(int status, const std::string& message) const {
  if (status == 503) {
    http::Response res =
        error_response(ApiError(503,
                                "the server is serving " + std::to_string(args_.max_connections) +
                                    " requests, its limit (--max-connections); retry later",
                                "", "too_many_requests"));
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
       {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/tokenize",
        "/detokenize", "/version", "/health", "/metrics"})
    if (path == route) return route;
  if (path.starts_with(kModelsPrefix)) return std::string(kModels);
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
  l.max_buffered = size_t(args.max_buffered_bytes);
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
  // Set but empty asks for a key and gives none: refused, as --api-key "" is.
  if (args.api_key.empty() && env_key && !*env_key)
    throw InvalidArgumentError(
        "serve: TFORMERS_API_KEY is set but empty; give it a key, or unset it to need none");
  const std::string api_key = !args.api_key.empty() ? args.api_key : env_key ? env_key : "";
  install_stop_signals();
  // Under tformers launch: one server for one tensor-parallel group. Rank 0 takes the requests
  // and schedules; the others run its steps. Ranks that each held a whole model would each try
  // to take the port.
  const int world = distributed::world_size();
  if (world > 1 && args.tp != world)
    throw InvalidArgumentError("serve: started on " + std::to_string(world) + " ranks; give --tp " +
                               std::to_string(world) +
                               " to split the model over them (one server), or start one "
                               "process per server");

  CausalLM model = load_model(args);
  if (!distributed::is_main_process()) {
    // SIGTERM reaches every rank; the followers run on until rank 0 has drained its streams and
    // stopped them (the stop signals installed above only note it).
    ServingEngine::follow(model);
    return 0;
  }
  Tokenizer tokenizer = AutoTokenizer::from_pretrained(args.model.model, args.model.revision);
  if (!args.chat_template.empty())
    tokenizer.set_chat_template(chat_template_from(args.chat_template));
  ServingEngine engine(model,
                       {.max_num_seqs = args.max_num_seqs,
                        .max_model_len = args.max_model_len,
                        .enable_prefix_caching = args.enable_prefix_caching},
                       &tokenizer);
  Server server(args, engine, tokenizer, model.config().vocab_size, api_key,
                model.generation_config().eos_token_id.value_or(std::vector<int64_t>{}));
  const int port = server.bind();
  server.listen_in_background();
  std::fprintf(stderr,
               "tformers: serve: listening on http://%s:%d (warming up); holds up to %zu "
               "connections\n",
               args.host.c_str(), port, server.max_sockets());
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
