// OpenAI's Responses API (POST /v1/responses) written back: the response object, its output
// items (a reasoning item, an assistant message, function calls) and the server-sent events that
// stream them, as the openai client's types (resources/responses) have them. The request is read
// by parse_request (serve/openai.h) and runs as a chat completion; this writes what came of it.
// Nothing here does I/O.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "serve/openai.h"
#include "serve/tool_calls.h"

namespace tformers::serve {

// The Responses API's usage: {"input_tokens", "input_tokens_details": {"cached_tokens"},
// "output_tokens", "output_tokens_details": {"reasoning_tokens"}, "total_tokens"}.
Json response_usage_json(const Usage& usage);

// Builds one response from its output as it comes, and the events that stream it. Output comes
// as pieces of reasoning, text and whole calls; each kind opens an item of its own when the item
// before it was of another kind, so reasoning then an answer then calls (the order reasoning
// models write them in) give a reasoning item, a message and a function_call item per call. A
// non-streamed response is the same writer given its whole output at once, so both have the same
// shape. Events are "event: TYPE\ndata: {...}\n\n", numbered by sequence_number from 0.
class ResponseWriter {
 public:
  // `echo`: the request's settings that the response repeats (ApiRequest::echo).
  ResponseWriter(const ResponseHead& head, const Json& echo);

  // response.created and response.in_progress, with no output yet.
  std::string start();
  // The events of more output: items added, deltas of their text, calls whole.
  std::string put(std::string_view reasoning, std::string_view text,
                  std::span<const ToolCall> calls);
  // The end of the output: the open item done ("incomplete" when `cut` by max_output_tokens),
  // then response.completed, or response.incomplete with incomplete_details when cut. A response
  // with no output at all gets an empty message, so that output is never empty.
  std::string end(bool cut, const Usage& usage);
  // A failure once streaming began: OpenAI's error event, then response.failed.
  std::string fail(const ApiError& error);

  // The response object as it stands (whole once end() was called).
  const Json& response() const { return response_; }

 private:
  enum class Kind { kNone, kReasoning, kMessage };

  std::string event(const std::string& type, Json fields);
  // Events of text for an item of `kind`, opening it first when another kind is open.
  std::string add_text(Kind kind, std::string_view delta);
  std::string open(Kind kind);
  std::string close(const char* status);
  std::string add_call(const ToolCall& call);
  // Fields every event about the open item's content carries.
  Json part_fields() const;

  Json response_;
  int64_t sequence_ = 0;
  Kind open_ = Kind::kNone;  // the item being written, at index output.size()
  std::string item_id_, item_text_;
};

}  // namespace tformers::serve
