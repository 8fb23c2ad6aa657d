// Tool calls in model output: which syntax a model's chat template teaches it, and a parser that
// takes the generated text piece by piece and separates the calls from the content. Like stop
// strings, text that may still turn out to be the start of a call is held back until it is
// decided, so a client never sees call markup as content.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tformers/tokenizer.h"

namespace tformers::serve {

enum class ToolCallFormat {
  kNone,     // the template shows no call syntax that is parsed: output stays content
  kHermes,   // Qwen2.5/Qwen3: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
  kLlama,    // Llama 3.1/3.2: the whole output is {"name": ..., "parameters": {...}}
  kMistral,  // Mistral v0.3: [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]
};

// The format a chat template teaches, told by the markers its text writes for an assistant's
// tool_calls, confirmed by the vocabulary when the marker is a token of its own:
//   "<tool_call>" in the template and in the vocabulary: kHermes;
//   "[TOOL_CALLS]" in the template and in the vocabulary: kMistral;
//   "<|python_tag|>" or "<|start_header_id|>" with '"parameters": ' in the template: kLlama;
//   else kNone. `in_vocab` says whether a string is one token of the vocabulary. Hermes's and
// Mistral's markers are checked first: their templates never write Llama's header tokens.
ToolCallFormat detect_tool_call_format(std::string_view chat_template,
                                       const std::function<bool(std::string_view)>& in_vocab);
// The format of the tokenizer's own chat template and vocabulary.
ToolCallFormat detect_tool_call_format(const Tokenizer& tokenizer);
const char* format_name(ToolCallFormat format);

// Special tokens that the output text keeps where decoding would drop them, each with its text.
using KeptTokens = std::vector<std::pair<int32_t, std::string>>;
// The token that opens a call where decoding would drop it as a special token (Mistral's
// [TOOL_CALLS]): the output text must keep it for the parser to see the call.
KeptTokens kept_tool_call_tokens(ToolCallFormat format, const Tokenizer& tokenizer);

// One call as the API returns it; `arguments` is JSON text of an object.
struct ToolCall {
  std::string id, name, arguments;
};

// `text` as a call's arguments: a JSON object, written compactly, or nullopt when it is not one
// (or nests deeper than a call may).
std::optional<std::string> call_arguments(std::string_view text);

// The length of the longest end of `text` that is a proper beginning of `marker`: what a parser
// holds back, since the next piece may complete the marker.
size_t partial_marker(std::string_view text, std::string_view marker);

// A fresh call id: 9 letters and digits for Mistral, whose template refuses any other id when a
// client sends the call back as history; else "call_" and 24 of them.
std::string new_tool_call_id(ToolCallFormat format);

// What tool_choice makes the output (constrained decoding enforces it, forced_calls_schema):
// free text with calls in the template's format ("auto"), a JSON list of calls
// [{"name": ..., "arguments": {...}}, ...] ("required"), or the arguments object of one named
// function, as vLLM generates them.
struct ForcedCalls {
  enum Kind { kNone, kList, kArguments } kind = kNone;
  std::string name;  // kArguments' function
};

// The JSON Schema of the output `forced` asks for, over the request's validated `tools`; with
// parallel = false a list holds one call.
nlohmann::ordered_json forced_calls_schema(const ForcedCalls& forced,
                                           const nlohmann::ordered_json& tools, bool parallel);

class ToolCallParser {
 public:
  // parallel = false keeps only the first call (OpenAI's parallel_tool_calls). With `forced`,
  // the whole output is held and read as what it forces; one cut short by max_tokens gives its
  // calls as far as they were written, their JSON closed where it was cut (text that holds no
  // call is content).
  explicit ToolCallParser(ToolCallFormat format, bool parallel = true, ForcedCalls forced = {});

  struct Output {
    std::string content;
    std::vector<ToolCall> calls;  // each whole, with a fresh id
  };
  // The content that became final with this text, and the calls it completed.
  Output put(std::string_view text);
  // What is left once generation has ended: a call whose JSON does not parse is content.
  Output finish();
  // Calls returned so far (the first `parallel = false` one included, later ones not).
  size_t calls() const { return calls_; }

 private:
  void scan(Output& out, bool final);
  void scan_llama(Output& out, bool final);
  // A forced output ended: its calls (those of a cut one, closed), or the text as content.
  void end_forced(Output& out);
  // A call's markup ended (or the output did): its calls, else the markup as content.
  void end_call(Output& out, std::string_view body, std::string_view markup);
  void add_content(Output& out, std::string_view text);
  // Gives `calls` fresh ids and returns them, as many as parallel_ allows.
  void take_calls(Output& out, std::vector<ToolCall> calls);

  ToolCallFormat format_;
  bool parallel_;
  ForcedCalls forced_;
  std::string open_, close_;  // the markers around a call; close_ empty: it runs to the end
  bool in_call_ = false;      // buf_ holds a call's body, after its opening marker
  bool decided_ = false;      // kLlama: whether the output is a call is known
  bool after_call_ = false;   // whitespace that follows a call is dropped
  std::string buf_;           // text not yet decided
  std::string pending_ws_;    // content's trailing whitespace: dropped if a call follows
  std::string call_ws_;       // the whitespace before the call in buf_, if it turns out malformed
  size_t calls_ = 0;
};

}  // namespace tformers::serve
