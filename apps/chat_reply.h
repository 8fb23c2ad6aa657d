// How `tformers chat` shows one reply of a reasoning model and keeps it in the history. The
// decoded output, its reasoning markup kept (harmony's channels, <think>), goes through the
// server's parser (serve/reasoning.h): the reasoning is shown between a "Thinking..." line and a
// "...done thinking." line, as Ollama's chat shows it, dimmed on a terminal, or not at all; the
// answer follows as written; harmony's markup is never shown. A model without a reasoning format
// has its output shown and kept as it comes.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "serve/reasoning.h"

namespace tformers::cli {

enum class ReasoningShown {
  kDimmed,  // between SGR 2 (faint) and SGR 22 (normal intensity): stdout is a terminal
  kPlain,   // the labels alone tell it from the answer: stdout is a pipe or a file, or NO_COLOR
  kHidden,  // --hide-reasoning
};

class ChatReply {
 public:
  // `write` gets the text to show, in pieces that leave the terminal at normal intensity, so that
  // whatever is written between them (held diagnostics, an error) is never dimmed. A piece ends
  // with the newline of the text it shows when there is one, so the writer can tell where lines
  // end. think_open: the prompt left a <think> block open (serve::prompt_opens_think).
  ChatReply(serve::ReasoningFormat format, bool think_open, ReasoningShown shown,
            std::function<void(std::string_view)> write);
  // Decoded output, markup kept (serve::OutputText).
  void put(std::string_view text);
  // Generation has ended (or was stopped): what the parser held is shown and the reasoning closed.
  void finish();
  // The assistant message for the history: the answer as `content`, and the reasoning, when there
  // is some, as `reasoning_content`, the name DeepSeek's API and vLLM return and clients send back
  // (the chat template sees it as `thinking` too, which gpt-oss's template reads).
  nlohmann::ordered_json message() const;
  // Reasoning came, and no answer after it.
  bool only_reasoning() const { return content_.empty() && !reasoning_.empty(); }

 private:
  void show(const serve::ParsedOutput& parsed);
  void show_reasoning(std::string_view text);
  void show_answer(std::string_view text);
  void close_reasoning(std::string_view after);
  // Writes `text`, dimmed when it is reasoning shown dimmed.
  void emit(std::string_view text, bool reasoning);

  serve::ChatOutputParser parser_;
  ReasoningShown shown_;
  std::function<void(std::string_view)> write_;
  std::string reasoning_, content_;
  bool in_reasoning_ = false;  // the "Thinking..." line is out and its end is not
  bool mid_line_ = false;      // the last character shown was not a newline
};

}  // namespace tformers::cli
