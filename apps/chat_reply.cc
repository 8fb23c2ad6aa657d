#include "chat_reply.h"

#include <algorithm>
#include <optional>
#include <utility>

namespace tformers::cli {

namespace {

constexpr std::string_view kDim = "\x1b[2m", kUndim = "\x1b[22m";
constexpr std::string_view kThinking = "Thinking...\n", kDoneThinking = "...done thinking.\n";

// A block shown after a label starts on a line of its own already; harmony's "\n" that joins
// two messages of one kind would add a blank one.
std::string_view skip_newlines(std::string_view text) {
  return text.substr(std::min(text.find_first_not_of('\n'), text.size()));
}

}  // namespace

ChatReply::ChatReply(serve::ReasoningFormat format, bool think_open, ReasoningShown shown,
                     std::function<void(std::string_view)> write)
    : parser_(format, think_open, /*parallel=*/true, std::nullopt),
      shown_(shown),
      write_(std::move(write)) {}

void ChatReply::put(std::string_view text) { show(parser_.put(text)); }

void ChatReply::finish() {
  show(parser_.finish());
  if (in_reasoning_) close_reasoning("");
}

nlohmann::ordered_json ChatReply::message() const {
  nlohmann::ordered_json m = {{"role", "assistant"}, {"content", content_}};
  if (!reasoning_.empty()) m["reasoning_content"] = reasoning_;
  return m;
}

// One piece of output is one token's text, so it rarely holds both; when it does, the reasoning
// came first (harmony's answer is its last message, and <think> comes before the answer).
void ChatReply::show(const serve::ParsedOutput& parsed) {
  show_reasoning(parsed.reasoning);
  show_answer(parsed.content);
}

void ChatReply::show_reasoning(std::string_view text) {
  if (text.empty()) return;
  reasoning_ += text;
  if (shown_ == ReasoningShown::kHidden) return;
  if (!in_reasoning_) {
    // Harmony may reason again after some answer (a preamble to a tool call).
    if (mid_line_) emit("\n", false);
    emit(kThinking, true);
    in_reasoning_ = true;
    text = skip_newlines(text);
  }
  emit(text, true);
}

void ChatReply::show_answer(std::string_view text) {
  if (text.empty()) return;
  content_ += text;
  if (in_reasoning_) {
    close_reasoning("\n");
    text = skip_newlines(text);
  }
  emit(text, false);
}

// The closing label gets a line of its own; `after` is what separates it from an answer.
void ChatReply::close_reasoning(std::string_view after) {
  if (mid_line_) emit("\n", true);
  emit(std::string(kDoneThinking) + std::string(after), true);
  in_reasoning_ = false;
}

void ChatReply::emit(std::string_view text, bool reasoning) {
  if (text.empty()) return;
  mid_line_ = text.back() != '\n';
  if (!reasoning || shown_ != ReasoningShown::kDimmed) {
    write_(text);
    return;
  }
  // Trailing newlines go after the SGR 22, so that a piece that ends a line still ends with it.
  const size_t body = text.find_last_not_of('\n') + 1;  // 0 when all of it is newlines
  std::string piece;
  if (body > 0) piece = std::string(kDim) + std::string(text.substr(0, body)) + std::string(kUndim);
  piece += text.substr(body);
  write_(piece);
}

}  // namespace tformers::cli
