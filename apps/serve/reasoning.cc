#include "serve/reasoning.h"

#include <algorithm>
#include <initializer_list>

namespace tformers::serve {

namespace {

constexpr std::string_view kStart = "<|start|>", kEnd = "<|end|>", kMessage = "<|message|>",
                           kChannel = "<|channel|>", kConstrain = "<|constrain|>",
                           kReturn = "<|return|>", kCall = "<|call|>";
constexpr std::string_view kFunctions = "functions.";
constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim_front(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  return s;
}

// The longest end of `text` that may still become one of `markers`.
size_t held_back(std::string_view text, std::initializer_list<std::string_view> markers) {
  size_t hold = 0;
  for (std::string_view m : markers) hold = std::max(hold, partial_marker(text, m));
  return hold;
}

// The first of `markers` in `text`: where it is and which, or npos.
std::pair<size_t, std::string_view> find_first(std::string_view text,
                                               std::initializer_list<std::string_view> markers) {
  std::pair<size_t, std::string_view> first{std::string_view::npos, {}};
  for (std::string_view m : markers)
    if (const size_t at = text.find(m); at < first.first) first = {at, m};
  return first;
}

// A header's channel and recipient. Its words are split at whitespace and at <|channel|> and
// <|constrain|>; the word after <|channel|> is the channel, a word "to=X" the recipient (which
// may come before or after the channel), and the role and content type ("json") are skipped.
struct Header {
  std::string channel, recipient;
};

Header parse_header(std::string_view header) {
  Header h;
  bool channel_next = false;
  while (!header.empty()) {
    if (is_space(header.front())) {
      header.remove_prefix(1);
      continue;
    }
    if (header.starts_with(kChannel) || header.starts_with(kConstrain)) {
      channel_next = header.starts_with(kChannel);
      header.remove_prefix(channel_next ? kChannel.size() : kConstrain.size());
      continue;
    }
    size_t end = 0;
    while (end < header.size() && !is_space(header[end]) && !header.substr(end).starts_with("<|"))
      ++end;
    // A lone "<|" that begins no marker is a character of its word.
    end = std::max<size_t>(end, 1);
    const std::string_view word = header.substr(0, end);
    if (channel_next)
      h.channel = word;
    else if (word.starts_with("to="))
      h.recipient = word.substr(3);
    channel_next = false;
    header.remove_prefix(end);
  }
  return h;
}

bool one_token(const Tokenizer& tokenizer, std::string_view text) {
  return tokenizer.token_to_id(text).has_value();
}

}  // namespace

ReasoningFormat detect_reasoning_format(std::string_view chat_template,
                                        const std::function<bool(std::string_view)>& in_vocab) {
  const auto marker = [&](std::string_view s) {
    return chat_template.find(s) != std::string_view::npos && in_vocab(s);
  };
  if (marker(kChannel) && marker(kMessage)) return ReasoningFormat::kHarmony;
  if (marker(kThinkOpen) && marker(kThinkClose)) return ReasoningFormat::kThink;
  return ReasoningFormat::kNone;
}

ReasoningFormat detect_reasoning_format(const Tokenizer& tokenizer) {
  return detect_reasoning_format(tokenizer.chat_template(), [&](std::string_view token) {
    return one_token(tokenizer, token);
  });
}

const char* format_name(ReasoningFormat format) {
  switch (format) {
    case ReasoningFormat::kThink:
      return "think";
    case ReasoningFormat::kHarmony:
      return "harmony";
    case ReasoningFormat::kNone:
      break;
  }
  return "none";
}

KeptTokens kept_reasoning_tokens(ReasoningFormat format, const Tokenizer& tokenizer) {
  std::vector<std::string_view> markers;
  if (format == ReasoningFormat::kHarmony)
    markers = {kStart, kEnd, kMessage, kChannel, kConstrain, kReturn, kCall};
  else if (format == ReasoningFormat::kThink)
    markers = {kThinkOpen, kThinkClose};
  KeptTokens kept;
  for (std::string_view m : markers)
    if (const std::optional<int32_t> id = tokenizer.token_to_id(m);
        id && tokenizer.is_special_id(*id))
      kept.emplace_back(*id, std::string(m));
  return kept;
}

std::vector<int64_t> harmony_eos_ids(const Tokenizer& tokenizer, std::vector<int64_t> model_eos) {
  for (std::string_view stop : {kReturn, kCall})
    if (const std::optional<int32_t> id = tokenizer.token_to_id(stop);
        id && std::find(model_eos.begin(), model_eos.end(), *id) == model_eos.end())
      model_eos.push_back(*id);
  return model_eos;
}

bool prompt_opens_think(std::span<const int32_t> prompt, const Tokenizer& tokenizer) {
  const std::optional<int32_t> open = tokenizer.token_to_id(kThinkOpen);
  const std::optional<int32_t> close = tokenizer.token_to_id(kThinkClose);
  if (!open || !close) return false;
  for (auto it = prompt.rbegin(); it != prompt.rend(); ++it) {
    if (*it == *close) return false;
    if (*it == *open) return true;
  }
  return false;
}

ParsedOutput HarmonyParser::put(std::string_view text) {
  ParsedOutput out;
  buf_ += text;
  scan(out, /*final=*/false);
  return out;
}

ParsedOutput HarmonyParser::finish() {
  ParsedOutput out;
  scan(out, /*final=*/true);
  return out;
}

void HarmonyParser::scan(ParsedOutput& out, bool final) {
  bool progress = true;
  while (progress) {
    switch (state_) {
      case State::kHeader:
        progress = scan_header(out, final);
        break;
      case State::kBody:
        progress = scan_body(out, final);
        break;
      case State::kBetween:
        progress = scan_between(out, final);
        break;
    }
  }
}

// A header is held whole until its <|message|>. An output that ends inside its first header and
// holds no marker at all was never harmony (a model that ignored the format): it is content. A
// header cut short otherwise says nothing.
bool HarmonyParser::scan_header(ParsedOutput& out, bool final) {
  const size_t at = buf_.find(kMessage);
  if (at == std::string::npos) {
    if (final && first_ && buf_.find("<|") == std::string::npos) {
      kind_ = Kind::kContent;
      emit(out, buf_);
    }
    if (final) buf_.clear();
    return false;
  }
  begin_message(std::string_view(buf_).substr(0, at));
  markup_ = (first_ ? "" : std::string(kStart)) + buf_.substr(0, at + kMessage.size());
  buf_.erase(0, at + kMessage.size());
  first_ = false;
  state_ = State::kBody;
  return true;
}

void HarmonyParser::begin_message(std::string_view header) {
  const Header h = parse_header(header);
  fresh_ = true;
  arguments_.clear();
  if (std::string_view(h.recipient).starts_with(kFunctions)) {
    kind_ = Kind::kCall;
    name_ = h.recipient.substr(kFunctions.size());
  } else if (h.channel == "analysis") {
    kind_ = Kind::kReasoning;
  } else {
    kind_ = h.recipient.empty() ? Kind::kContent : Kind::kDropped;
  }
}

// A body runs to <|end|>, <|call|> or <|return|> (or the end of the output). Reasoning and
// content are released as they come, less what may be the start of a marker; a call's arguments
// are held until the call ends.
bool HarmonyParser::scan_body(ParsedOutput& out, bool final) {
  const auto [at, terminator] = find_first(buf_, {kEnd, kCall, kReturn});
  if (at == std::string::npos) {
    const size_t hold = final ? 0 : held_back(buf_, {kEnd, kCall, kReturn});
    emit(out, std::string_view(buf_).substr(0, buf_.size() - hold));
    buf_.erase(0, buf_.size() - hold);
    if (final && kind_ == Kind::kCall) end_call(out, "");
    return false;
  }
  emit(out, std::string_view(buf_).substr(0, at));
  if (kind_ == Kind::kCall) end_call(out, terminator);
  buf_.erase(0, at + terminator.size());
  state_ = State::kBetween;
  return true;
}

// Between messages the model writes <|start|> and the next header. Whitespace there is dropped;
// any other text outside a message is content.
bool HarmonyParser::scan_between(ParsedOutput& out, bool final) {
  const std::string_view rest = trim_front(buf_);
  if (rest.starts_with(kStart)) {
    buf_.erase(0, buf_.size() - rest.size() + kStart.size());
    state_ = State::kHeader;
    return true;
  }
  if (!final && kStart.starts_with(rest)) return false;
  size_t end = rest.find(kStart);
  const bool found = end != std::string_view::npos;
  if (!found) end = rest.size() - (final ? 0 : held_back(rest, {kStart}));
  kind_ = Kind::kContent;
  emit(out, rest.substr(0, end));
  buf_.erase(0, buf_.size() - rest.size() + end);
  return found;
}

void HarmonyParser::emit(ParsedOutput& out, std::string_view text) {
  if (text.empty() || kind_ == Kind::kDropped) return;
  if (kind_ == Kind::kCall) {
    arguments_ += text;
    return;
  }
  const bool reasoning = kind_ == Kind::kReasoning;
  bool& said = reasoning ? said_reasoning_ : said_content_;
  std::string& to = reasoning ? out.reasoning : out.content;
  // A second message of the same kind starts on a line of its own, as vLLM joins them.
  if (fresh_ && said) to += '\n';
  to += text;
  fresh_ = false;
  said = true;
}

void HarmonyParser::end_call(ParsedOutput& out, std::string_view terminator) {
  const std::optional<std::string> arguments = call_arguments(arguments_);
  if (!arguments || name_.empty()) {
    // Not a call after all: the message as it came.
    kind_ = Kind::kContent;
    emit(out, markup_ + arguments_ + std::string(terminator));
  } else if (parallel_ || calls_ == 0) {
    out.calls.push_back(
        {.id = new_tool_call_id(ToolCallFormat::kNone), .name = name_, .arguments = *arguments});
    ++calls_;
  }
  arguments_.clear();
}

ThinkParser::Split ThinkParser::put(std::string_view text) {
  Split out;
  buf_ += text;
  scan(out, /*final=*/false);
  return out;
}

ThinkParser::Split ThinkParser::finish() {
  Split out;
  scan(out, /*final=*/true);
  return out;
}

void ThinkParser::scan(Split& out, bool final) {
  if (state_ == State::kStart) {
    const std::string_view start = trim_front(buf_);
    if (start.starts_with(kThinkOpen)) {
      buf_.erase(0, buf_.size() - start.size() + kThinkOpen.size());
      state_ = State::kReasoning;
    } else if (!final && kThinkOpen.starts_with(start)) {
      return;
    } else {
      state_ = State::kAnswer;
      answer_begun_ = true;  // an answer without reasoning keeps its whitespace
    }
  }
  if (state_ == State::kReasoning) {
    const size_t at = buf_.find(kThinkClose);
    const bool closed = at != std::string::npos;
    size_t end = closed ? at : buf_.size() - (final ? 0 : partial_marker(buf_, kThinkClose));
    // The reasoning's trailing whitespace is held: it is dropped if the reasoning ends there.
    while (end > 0 && is_space(buf_[end - 1])) --end;
    std::string_view reasoning = std::string_view(buf_).substr(0, end);
    if (!reasoning_begun_) reasoning = trim_front(reasoning);
    reasoning_begun_ = reasoning_begun_ || !reasoning.empty();
    out.reasoning += reasoning;
    if (!closed) {
      buf_.erase(0, final ? buf_.size() : end);
      return;
    }
    buf_.erase(0, at + kThinkClose.size());
    state_ = State::kAnswer;
  }
  std::string_view answer = buf_;
  if (!answer_begun_) answer = trim_front(answer);
  answer_begun_ = answer_begun_ || !answer.empty();
  out.rest += answer;
  buf_.clear();
}

ChatOutputParser::ChatOutputParser(ReasoningFormat format, bool think_open, bool parallel,
                                   std::optional<ToolCallParser> tools)
    : tools_(std::move(tools)) {
  if (format == ReasoningFormat::kHarmony) harmony_.emplace(parallel);
  if (format == ReasoningFormat::kThink) think_.emplace(think_open);
}

ParsedOutput ChatOutputParser::put(std::string_view text) {
  if (harmony_) return harmony_->put(text);
  return answer(think_ ? think_->put(text) : ThinkParser::Split{"", std::string(text)}, false);
}

ParsedOutput ChatOutputParser::finish() {
  if (harmony_) return harmony_->finish();
  return answer(think_ ? think_->finish() : ThinkParser::Split{}, true);
}

// The answer's part of the text: through the tool-call parser when there is one.
ParsedOutput ChatOutputParser::answer(ThinkParser::Split split, bool final) {
  ParsedOutput out{.reasoning = std::move(split.reasoning)};
  if (!tools_) {
    out.content = std::move(split.rest);
    return out;
  }
  ToolCallParser::Output o = tools_->put(split.rest);
  if (final) {
    ToolCallParser::Output rest = tools_->finish();
    o.content += rest.content;
    o.calls.insert(o.calls.end(), rest.calls.begin(), rest.calls.end());
  }
  out.content = std::move(o.content);
  out.calls = std::move(o.calls);
  return out;
}

}  // namespace tformers::serve
