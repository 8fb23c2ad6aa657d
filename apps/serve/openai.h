// OpenAI's API as `tformers serve` speaks it: request bodies of /v1/chat/completions,
// /v1/completions and /v1/responses read and checked field by field, the engine request built
// from them, and the response objects and stream chunks written back (the Responses API's in
// serve/responses.h). Nothing here does I/O, so all of it is tested without a server
// (tests/serve/).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/tool_calls.h"
#include "tformers/generation.h"
#include "tformers/serving.h"
#include "tformers/tokenizer.h"

namespace tformers::serve {

using Json = nlohmann::ordered_json;

// A request answered with an HTTP error, written as OpenAI writes errors:
// {"error": {"message", "type", "param", "code"}}. `param` names the request field at fault.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = "", std::string code = "");
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  // "invalid_request_error" for 4xx, "server_error" for 5xx.
  std::string type() const;
  std::string body() const;

 private:
  int status_;
  std::string param_, code_;
};

// kResponses is OpenAI's Responses API, run as a chat completion: its input items become chat
// messages for the same template, parsers and engine.
enum class Endpoint { kChatCompletions, kCompletions, kResponses };
// Whether the endpoint's prompt is the chat template rendered over messages.
inline bool is_chat(Endpoint endpoint) { return endpoint != Endpoint::kCompletions; }

// A request body, checked. Fields the client left out (or set to null) stay unset, so the
// model's generation_config.json supplies them.
struct ApiRequest {
  Endpoint endpoint = Endpoint::kChatCompletions;
  std::string model;
  // Chat: the messages as the chat template takes them (content parts joined), the tools (null
  // when none) and chat_template_kwargs (vLLM's, e.g. {"enable_thinking": false}).
  Json messages, tools, template_kwargs = Json::object();
  // parallel_tool_calls: false keeps only the model's first call.
  bool parallel_tool_calls = true;
  // tool_choice "required" or a named function: what json_schema then forces the output to be.
  ForcedCalls forced_calls;
  // OpenAI's reasoning_effort ("none" to "xhigh"), for the chat template (to_engine_request), and
  // vLLM's include_reasoning: false drops the reasoning from the answer.
  std::optional<std::string> reasoning_effort;
  bool include_reasoning = true;
  // Completions: each prompt of the request (OpenAI's batch form gives several), a text or token
  // ids; each gets n choices, numbered prompt by prompt.
  struct Prompt {
    std::string text;
    std::vector<int32_t> ids;
    bool is_ids = false;
  };
  std::vector<Prompt> prompts;
  // Prompts, each with its n choices: the sequences the request runs.
  size_t choices() const { return std::max<size_t>(prompts.size(), 1) * size_t(n); }
  // Sampling, stop strings and the seed; max_new_tokens is set by to_engine_request.
  GenerationConfig config;
  std::optional<int64_t> max_tokens;
  std::vector<std::string> stop;
  bool stream = false, include_usage = false;
  bool logprobs = false;
  int64_t top_logprobs = 0;
  // Choices asked for (1 to kMaxChoices), each its own sequence from the same prompt.
  int64_t n = 1;
  // OpenAI's penalties and logit_bias (ServingRequest's fields, which GenerationConfig lacks).
  double presence_penalty = 0, frequency_penalty = 0;
  std::vector<std::pair<int32_t, float>> logit_bias;
  // What the output must be: response_format's schema ({"type": "object"} for json_object), or
  // the calls tool_choice forces (forced_calls_schema); unset for free text.
  std::optional<Json> json_schema;
  // Responses: the request's settings that its response object repeats (instructions, metadata,
  // the tools as given, ...), in their order there.
  Json echo = Json::object();
};

// The most choices one request may ask for (n), the most sequences (prompts times n), and the most
// logit_bias entries: bounds on the work one request can make.
inline constexpr int64_t kMaxChoices = 16;
inline constexpr size_t kMaxSequences = 64;
inline constexpr size_t kMaxLogitBias = 1024;
// OpenAI's limit on tools per request.
inline constexpr size_t kMaxTools = 128;

// Reads a request body. ApiError 400 naming the field for malformed JSON, a field of the wrong
// type or out of range, and for what tformers does not do (echo, best_of, ...). A Responses
// request's input items become chat messages (instructions first, as a system message; a
// function_call joins the assistant message before it as one of its tool_calls, a reasoning item
// as its reasoning, as vLLM builds them) and its flat function tools chat's nested ones; a field
// that API has and tformers does not read is refused by name.
ApiRequest parse_request(Endpoint endpoint, std::string_view body);

// The most bytes a prompt of max_model_len tokens can hold, with room for normalizers that shrink
// text (NFC composition takes up to 3 bytes into 1): 4 x max_model_len x the longest token's
// bytes in this vocabulary. A longer prompt is refused before it is tokenized.
size_t max_prompt_bytes(const Tokenizer& tokenizer, int64_t max_model_len);

// The engine request: the chat template rendered and encoded (or the prompt encoded, or its ids
// checked against the model's vocabulary), its length and max_tokens checked against
// max_model_len (ApiError 400 "context_length_exceeded"; a Responses request's errors name its
// input and max_output_tokens). A prompt (or the messages' text, and then the rendered template)
// over max_prompt_bytes is refused by its size alone, before the template is rendered or the text
// tokenized. A completion with no max_tokens gets 16, as OpenAI's; a chat completion (and a
// Responses request) gets whatever room the context has left. logit_bias's token ids are
// checked against the vocabulary here. A chat's reasoning_effort reaches the template as the
// variable `reasoning_effort` (gpt-oss's) and as `enable_thinking`, false for "none" (Qwen3's),
// each where the template's text names it and chat_template_kwargs does not set enable_thinking,
// as vLLM passes it; a template that names neither is a 400.
// `prompt` picks one of a completion's prompts.
ServingRequest to_engine_request(const ApiRequest& request, const Tokenizer& tokenizer,
                                 int64_t max_model_len, int64_t vocab_size,
                                 size_t max_prompt_bytes = SIZE_MAX, size_t prompt = 0);

// 404 model_not_found for a request naming another model than the one served.
ApiError model_not_served(const std::string& asked, const std::string& served);

// vLLM's POST /tokenize: {"prompt": text, "add_special_tokens": true} or {"messages": [...],
// "add_generation_prompt": true, "add_special_tokens": false, "tools", "chat_template_kwargs"}
// (the chat template rendered as a chat completion renders it), either with "return_token_strs";
// "model", optional as in vLLM, must name `model` when given. Answers {"count", "max_model_len",
// "tokens", "token_strs"}, the ids a completion of that prompt would prefill.
Json tokenize_json(std::string_view body, const std::string& model, const Tokenizer& tokenizer,
                   int64_t max_model_len, size_t max_prompt_bytes);
// vLLM's POST /detokenize: {"tokens": [ids]} -> {"prompt": text}, special tokens kept; ids
// outside [0, vocab_size) are refused naming their position.
Json detokenize_json(std::string_view body, const std::string& model, const Tokenizer& tokenizer,
                     int64_t vocab_size);

// The engine request of choice `index` (0 to n - 1): `request` with the seed, when one is given,
// moved to seed + index (mod 2^64), so that each choice is reproducible on its own and no two
// draw the same numbers. Without a seed every choice gets a fresh random one.
ServingRequest choice_request(ServingRequest request, int64_t index);

// The text a client is sent: generated tokens detokenized incrementally (special tokens
// skipped) and cut before the first stop string, as OpenAI does. Text that could still turn out
// to be the start of a stop string is held back until a later token settles it. `kept`, special
// tokens with their text, are kept where decoding would skip them (the markup of tool calls and
// of harmony's messages).
class OutputText {
 public:
  OutputText(const Tokenizer& tokenizer, std::vector<std::string> stop, KeptTokens kept = {});
  // The text that became final with this token (often empty).
  std::string put(int32_t token);
  // Whatever is left once generation has ended.
  std::string finish();
  // A stop string appeared: the text ended before it, and nothing more is returned.
  bool stopped() const { return stopped_; }
  // Bytes decoded so far (sent and held back), where the next token's text starts.
  size_t offset() const { return sent_ + held_.size(); }

 private:
  std::string release(bool final);

  TokenStreamer streamer_;
  std::vector<std::string> stop_;
  KeptTokens kept_;
  std::string held_;
  size_t sent_ = 0;
  bool stopped_ = false;
};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t cached_tokens = 0;  // of the prompt's, found in the prefix cache
  // Of the completion's, those up to the last that gave reasoning text (the Responses API's
  // output_tokens_details.reasoning_tokens).
  int64_t reasoning_tokens = 0;
};
Json usage_json(const Usage& usage);

// The log-probabilities of generated tokens (events with a token) in the endpoint's shape: chat's
// {"content": [{"token", "logprob", "bytes", "top_logprobs"}], "refusal": null}, or completions'
// {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. `text_offsets` holds each token's
// OutputText::offset() before it was put.
Json logprobs_json(Endpoint endpoint, const Tokenizer& tokenizer,
                   std::span<const ServingEvent> events, std::span<const size_t> text_offsets);

// What identifies one response, repeated in each of its chunks.
struct ResponseHead {
  Endpoint endpoint = Endpoint::kChatCompletions;
  std::string id;  // "chatcmpl-...", "cmpl-..." or "resp_..."
  int64_t created = 0;
  std::string model;
};
// A fresh head: a random id with the endpoint's prefix ("resp_" for the Responses API), created
// now.
ResponseHead new_response_head(Endpoint endpoint, const std::string& model);
// `prefix` and 24 random hex digits: an id that no other response or item of this server has.
std::string new_id(std::string_view prefix);

// One choice of a whole response. `logprobs` is null when not asked for. With tool calls, chat's
// message has them and its content is the text before them, or null when there is none. Chat's
// reasoning, when there is some, is the message's reasoning_content and reasoning (both, as vLLM
// wrote them from late 2025 until it dropped reasoning_content in 2026: clients read either).
struct ChoiceOutput {
  std::string text, finish_reason;
  Json logprobs;
  std::vector<ToolCall> tool_calls;
  std::string reasoning;
};
// A whole (non-streamed) response; choice i gets index i.
Json response_json(const ResponseHead& head, std::span<const ChoiceOutput> choices,
                   const Usage& usage);

// One streamed chunk with one choice; `index` says which.
struct Chunk {
  int64_t index = 0;
  bool first = false;  // chat: the delta carries the role
  std::string text;
  std::optional<std::string> finish_reason;
  Json logprobs;            // null when none
  bool usage_null = false;  // stream_options.include_usage: every chunk carries "usage": null
  // Chat: whole calls, the first of them the choice's call number `first_tool_call` (their
  // delta.tool_calls[].index), each with its id, type, name and arguments in this one delta.
  std::vector<ToolCall> tool_calls;
  size_t first_tool_call = 0;
  // Chat: reasoning, as delta.reasoning_content and delta.reasoning when not empty.
  std::string reasoning;
};
Json chunk_json(const ResponseHead& head, const Chunk& chunk);
// The last chunk with include_usage: no choices, the request's usage.
Json usage_chunk_json(const ResponseHead& head, const Usage& usage);

// JSON text of a response; invalid UTF-8 in model output becomes U+FFFD rather than an error.
std::string dump(const Json& j);
// One server-sent event: "data: {...}\n\n".
std::string sse_event(const Json& j);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace tformers::serve
