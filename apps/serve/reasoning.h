// Reasoning in model output: which markup a model's chat template has it think in, and parsers
// that take a chat completion's text piece by piece and split the reasoning from the answer.
// gpt-oss writes OpenAI's harmony messages, whose channels also carry its tool calls; Qwen3 and
// DeepSeek-R1 think inside <think>...</think> before answering. As with tool calls, text that may
// still be markup is held back until it is decided.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "serve/tool_calls.h"
#include "tformers/tokenizer.h"

namespace tformers::serve {

enum class ReasoningFormat {
  kNone,     // no reasoning markup: the output is the answer
  kThink,    // Qwen3, DeepSeek-R1: <think>reasoning</think> answer
  kHarmony,  // gpt-oss: <|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>...
};

// The format a chat template teaches, told by the markers it writes, each of which must also be one
// token of the vocabulary (`in_vocab`): "<|channel|>" and "<|message|>" are kHarmony; "<think>"
// and "</think>" are kThink; else kNone.
ReasoningFormat detect_reasoning_format(std::string_view chat_template,
                                        const std::function<bool(std::string_view)>& in_vocab);
// The format of the tokenizer's own chat template and vocabulary.
ReasoningFormat detect_reasoning_format(const Tokenizer& tokenizer);
const char* format_name(ReasoningFormat format);

// The format's markers that decoding would drop as special tokens (all of harmony's), which the
// output text must keep for the parser to see the structure.
KeptTokens kept_reasoning_tokens(ReasoningFormat format, const Tokenizer& tokenizer);

// Where a harmony chat completion ends: the model's own eos ids and harmony's two stop tokens,
// <|return|> (the answer is done) and <|call|> (a tool is to be run), as vLLM stops gpt-oss. A
// generation_config.json that lists only <|return|> would otherwise run past a call.
std::vector<int64_t> harmony_eos_ids(const Tokenizer& tokenizer, std::vector<int64_t> model_eos);

// Whether a prompt ends inside a <think> block, as templates that open it in the generation
// prompt leave it (Qwen3's thinking-2507 models, DeepSeek-R1-0528): the output then starts in the
// reasoning.
bool prompt_opens_think(std::span<const int32_t> prompt, const Tokenizer& tokenizer);

// What a piece of output became: reasoning, the answer's content, and whole tool calls.
struct ParsedOutput {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};

// Harmony messages, the assistant's header already begun by the prompt's "<|start|>assistant".
// Each message's channel and recipient decide what its body is, as vLLM reads gpt-oss:
//   addressed to=functions.NAME (on any channel): a call of NAME, its body the arguments;
//   the analysis channel: reasoning (also a built-in tool's call, such as to=python);
//   final, commentary without a recipient (a preamble shown to the user), or no channel: content;
//   commentary to another recipient (a built-in tool): dropped.
// Messages of one kind are joined with "\n". A call whose body is not a JSON object is content,
// its markup and all, as malformed calls of the other formats are.
class HarmonyParser {
 public:
  // parallel = false keeps only the first call.
  explicit HarmonyParser(bool parallel = true) : parallel_(parallel) {}
  ParsedOutput put(std::string_view text);
  // What is left once generation has ended (a body cut short is ended there).
  ParsedOutput finish();

 private:
  enum class Kind { kReasoning, kContent, kCall, kDropped };
  enum class State { kHeader, kBody, kBetween };
  void scan(ParsedOutput& out, bool final);
  bool scan_header(ParsedOutput& out, bool final);
  bool scan_body(ParsedOutput& out, bool final);
  bool scan_between(ParsedOutput& out, bool final);
  void begin_message(std::string_view header);
  void emit(ParsedOutput& out, std::string_view text);
  void end_call(ParsedOutput& out, std::string_view terminator);

  bool parallel_;
  State state_ = State::kHeader;
  bool first_ = true;  // the first header continues the prompt's "<|start|>assistant"
  Kind kind_ = Kind::kContent;
  bool fresh_ = true;      // the current message has given no text yet
  std::string name_;       // kCall's function
  std::string markup_;     // kCall's header as written, should its body not be a call
  std::string buf_;        // text not yet decided
  std::string arguments_;  // kCall's body so far
  bool said_reasoning_ = false, said_content_ = false;
  size_t calls_ = 0;
};

// <think>...</think>: the reasoning, then the rest of the output, which the caller reads as the
// answer (and its tool calls). The reasoning's surrounding whitespace and the whitespace after
// </think> are dropped. An output that does not start with <think> (after whitespace) is all
// answer, unless the prompt opened the block; one cut short inside it is all reasoning.
class ThinkParser {
 public:
  explicit ThinkParser(bool open) : state_(open ? State::kReasoning : State::kStart) {}
  struct Split {
    std::string reasoning, rest;
  };
  Split put(std::string_view text);
  Split finish();

 private:
  enum class State { kStart, kReasoning, kAnswer };
  void scan(Split& out, bool final);

  State state_;
  bool reasoning_begun_ = false;  // whitespace before the reasoning's first character is dropped
  bool answer_begun_ = false;     // and so is whitespace before the answer's
  std::string buf_;
};

// One chat choice's output: the reasoning split off in the model's format, then the tool calls
// (harmony's own, or those of `tools`, the request's tool-call parser, when given).
class ChatOutputParser {
 public:
  ChatOutputParser(ReasoningFormat format, bool think_open, bool parallel,
                   std::optional<ToolCallParser> tools);
  ParsedOutput put(std::string_view text);
  ParsedOutput finish();

 private:
  ParsedOutput answer(ThinkParser::Split split, bool final);

  std::optional<HarmonyParser> harmony_;
  std::optional<ThinkParser> think_;
  std::optional<ToolCallParser> tools_;
};

}  // namespace tformers::serve
