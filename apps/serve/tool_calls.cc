#include "serve/tool_calls.h"

#include <cctype>
#include <mutex>
#include <random>

#include <nlohmann/json.hpp>

namespace tformers::serve {

namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kPythonTag = "<|python_tag|>";
// Arguments nested deeper are not a call: they would be dumped back by recursion.
constexpr int kMaxArgumentDepth = 64;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::optional<Json> parse_json(std::string_view text) {
  try {
    return Json::parse(text, [](int depth, Json::parse_event_t, Json&) {
      if (depth > kMaxArgumentDepth) throw std::out_of_range("too deep");
      return true;
    });
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// Where a JSON text's strings are, read one character at a time: what a scanner keeps to tell
// brackets and markers from the same characters inside a string.
struct JsonStrings {
  bool in_string = false, escaped = false;
  // Takes the next character; true when it belongs to a string (its quotes included).
  bool take(char c) {
    if (!in_string) {
      in_string = c == '"';
      return in_string;
    }
    if (escaped)
      escaped = false;
    else if (c == '\\')
      escaped = true;
    else if (c == '"')
      in_string = false;
    return true;
  }
};

// JSON text cut short (a forced call that reached max_tokens), closed where it was cut: an open
// value string is ended there, a value that does not parse cut (with the key or comma before
// it), and the open objects and arrays closed. nullopt when no beginning of it parses.
std::optional<Json> parse_cut_json(std::string_view text) {
  std::string closers;  // what closes the containers open at each point, innermost first
  std::vector<std::pair<size_t, std::string>> cuts;  // (length, closers) where a value may end
  JsonStrings strings;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const bool was_in_string = strings.in_string;
    if (strings.take(c)) {
      if (was_in_string && !strings.in_string) cuts.emplace_back(i + 1, closers);
      continue;
    }
    if (c == '{' || c == '[') closers.insert(closers.begin(), c == '{' ? '}' : ']');
    if ((c == '}' || c == ']') && !closers.empty()) closers.erase(closers.begin());
    if (c == '{' || c == '[' || c == '}' || c == ']' || std::isalnum(static_cast<unsigned char>(c)))
      cuts.emplace_back(i + 1, closers);
  }
  std::vector<std::string> tries;
  // Cut inside a string: end it there, less an escape sequence begun.
  if (strings.in_string) {
    std::string_view head = text;
    if (strings.escaped) head.remove_suffix(1);
    if (const size_t u = head.rfind("\\u"); u != std::string_view::npos && head.size() - u < 6)
      head = head.substr(0, u);
    tries.push_back(std::string(head) + "\"" + closers);
  }
  constexpr size_t kMaxTries = 32;  // each a parse of the text; the answer is a few cuts back
  for (auto it = cuts.rbegin(); it != cuts.rend() && tries.size() < kMaxTries; ++it) {
    std::string_view head = text.substr(0, it->first);
    while (!head.empty() && (is_space(head.back()) || head.back() == ',')) head.remove_suffix(1);
    tries.push_back(std::string(head) + it->second);
  }
  for (const std::string& t : tries)
    if (std::optional<Json> j = parse_json(t)) return j;
  return std::nullopt;
}

// {"name": "...", <args_key>: {...}}: the call, else nullopt. The arguments may also come as JSON
// text of an object (as the API writes them), and may be left out when there are none.
std::optional<ToolCall> one_call(const Json& j, const char* args_key) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty())
    return std::nullopt;
  Json args = Json::object();
  if (auto a = j.find(args_key); a != j.end()) {
    args = *a;
    if (args.is_string())
      if (std::optional<Json> parsed = parse_json(args.get_ref<const std::string&>()))
        args = *parsed;
    if (!args.is_object()) return std::nullopt;
  }
  return ToolCall{.name = name->get<std::string>(),
                  .arguments = args.dump(-1, ' ', false, Json::error_handler_t::replace)};
}

// The calls written in one call's body, or nullopt when it is not valid markup.
std::optional<std::vector<ToolCall>> parse_body(ToolCallFormat format, std::string_view body) {
  body = trim(body);
  if (format == ToolCallFormat::kLlama && body.starts_with(kPythonTag))
    body = trim(body.substr(kPythonTag.size()));
  const std::optional<Json> j = parse_json(body);
  if (!j) return std::nullopt;
  std::vector<ToolCall> calls;
  const char* args_key = format == ToolCallFormat::kLlama ? "parameters" : "arguments";
  // Mistral writes a list of calls; one object alone is taken too.
  const Json list = format == ToolCallFormat::kMistral && j->is_array() ? *j : Json::array({*j});
  if (list.empty()) return std::nullopt;
  for (const Json& item : list) {
    // Llama's template says "parameters"; models trained on other data write "arguments".
    std::optional<ToolCall> call = one_call(item, args_key);
    if (!call && format == ToolCallFormat::kLlama) call = one_call(item, "arguments");
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
  }
  return calls;
}

// Where `marker` first occurs outside the JSON strings of `body` (an argument's value may hold the
// closing marker's text), or npos.
size_t find_outside_strings(std::string_view body, std::string_view marker) {
  JsonStrings strings;
  for (size_t i = 0; i < body.size(); ++i)
    if (!strings.take(body[i]) && body.substr(i).starts_with(marker)) return i;
  return std::string_view::npos;
}

}  // namespace

ToolCallFormat detect_tool_call_format(std::string_view chat_template,
                                       const std::function<bool(std::string_view)>& in_vocab) {
  const auto has = [&](std::string_view s) { return chat_template.find(s) != std::string::npos; };
  if (has("<tool_call>") && in_vocab("<tool_call>")) return ToolCallFormat::kHermes;
  if (has("[TOOL_CALLS]") && in_vocab("[TOOL_CALLS]")) return ToolCallFormat::kMistral;
  if ((has(kPythonTag) || has("<|start_header_id|>")) && has("\"parameters\": "))
    return ToolCallFormat::kLlama;
  return ToolCallFormat::kNone;
}

ToolCallFormat detect_tool_call_format(const Tokenizer& tokenizer) {
  return detect_tool_call_format(tokenizer.chat_template(), [&](std::string_view token) {
    return tokenizer.token_to_id(token).has_value();
  });
}

const char* format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama:
      return "llama";
    case ToolCallFormat::kMistral:
      return "mistral";
    case ToolCallFormat::kNone:
      break;
  }
  return "none";
}

KeptTokens kept_tool_call_tokens(ToolCallFormat format, const Tokenizer& tokenizer) {
  if (format != ToolCallFormat::kMistral) return {};
  const std::string marker = "[TOOL_CALLS]";
  const std::optional<int32_t> id = tokenizer.token_to_id(marker);
  if (!id || !tokenizer.is_special_id(*id)) return {};
  return {{*id, marker}};
}

std::optional<std::string> call_arguments(std::string_view text) {
  const std::optional<Json> j = parse_json(text);
  if (!j || !j->is_object()) return std::nullopt;
  return j->dump(-1, ' ', false, Json::error_handler_t::replace);
}

size_t partial_marker(std::string_view text, std::string_view marker) {
  for (size_t k = std::min(marker.size() - 1, text.size()); k > 0; --k)
    if (text.ends_with(marker.substr(0, k))) return k;
  return 0;
}

std::string new_tool_call_id(ToolCallFormat format) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  static constexpr std::string_view kAlnum =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const bool mistral = format == ToolCallFormat::kMistral;
  std::string id = mistral ? "" : "call_";
  std::lock_guard lock(mu);
  for (int i = 0; i < (mistral ? 9 : 24); ++i) id += kAlnum[rng() % kAlnum.size()];
  return id;
}

Json forced_calls_schema(const ForcedCalls& forced, const Json& tools, bool parallel) {
  auto parameters = [](const Json& tool) {
    const Json& fn = tool["function"];
    return fn.contains("parameters") ? fn["parameters"] : Json{{"type", "object"}};
  };
  if (forced.kind == ForcedCalls::kArguments) {
    for (const Json& tool : tools)
      if (tool["function"]["name"] == forced.name) return parameters(tool);
    throw std::invalid_argument("forced_calls_schema: no tool is named " + forced.name);
  }
  Json calls = Json::array();
  for (const Json& tool : tools)
    calls.push_back(
        {{"type", "object"},
         {"properties",
          {{"name", {{"const", tool["function"]["name"]}}}, {"arguments", parameters(tool)}}},
         {"required", {"name", "arguments"}},
         {"additionalProperties", false}});
  Json list = {{"type", "array"}, {"items", {{"anyOf", calls}}}, {"minItems", 1}};
  if (!parallel) list["maxItems"] = 1;
  return list;
}

ToolCallParser::ToolCallParser(ToolCallFormat format, bool parallel, ForcedCalls forced)
    : format_(format), parallel_(parallel), forced_(std::move(forced)) {
  if (format == ToolCallFormat::kHermes) {
    open_ = "<tool_call>";
    close_ = "</tool_call>";
  } else if (format == ToolCallFormat::kMistral) {
    open_ = "[TOOL_CALLS]";
  }
}

ToolCallParser::Output ToolCallParser::put(std::string_view text) {
  Output out;
  buf_ += text;
  scan(out, /*final=*/false);
  return out;
}

ToolCallParser::Output ToolCallParser::finish() {
  Output out;
  scan(out, /*final=*/true);
  // Trailing whitespace is content only in an answer without calls.
  if (calls_ == 0) out.content += pending_ws_;
  pending_ws_.clear();
  return out;
}

void ToolCallParser::add_content(Output& out, std::string_view text) {
  if (after_call_) {
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    if (text.empty()) return;
    after_call_ = false;
  }
  size_t end = text.size();
  while (end > 0 && is_space(text[end - 1])) --end;
  if (end == 0) {
    pending_ws_ += text;
    return;
  }
  out.content += pending_ws_;
  out.content += text.substr(0, end);
  pending_ws_ = std::string(text.substr(end));
}

void ToolCallParser::end_call(Output& out, std::string_view body, std::string_view markup) {
  std::optional<std::vector<ToolCall>> calls = parse_body(format_, body);
  if (!calls) {
    // Not a call after all: the text as it came, with the whitespace before it.
    add_content(out, call_ws_ + std::string(markup));
  } else {
    take_calls(out, std::move(*calls));
    after_call_ = true;
  }
  call_ws_.clear();
}

void ToolCallParser::take_calls(Output& out, std::vector<ToolCall> calls) {
  for (ToolCall& call : calls) {
    if (!parallel_ && calls_ > 0) break;
    call.id = new_tool_call_id(format_);
    out.calls.push_back(std::move(call));
    ++calls_;
  }
}

void ToolCallParser::end_forced(Output& out) {
  std::optional<Json> j = parse_json(buf_);
  // Cut short (max_tokens, finish_reason "length"): the calls as far as they were written.
  if (!j) j = parse_cut_json(buf_);
  std::vector<ToolCall> calls;
  if (j && forced_.kind == ForcedCalls::kArguments) {
    if (std::optional<ToolCall> call =
            one_call(Json{{"name", forced_.name}, {"arguments", *j}}, "arguments"))
      calls.push_back(std::move(*call));
  } else if (j && j->is_array()) {
    // A call cut before its name is not one.
    for (const Json& item : *j)
      if (std::optional<ToolCall> call = one_call(item, "arguments")) calls.push_back(*call);
  }
  if (!calls.empty())
    take_calls(out, std::move(calls));
  else
    add_content(out, buf_);
}

void ToolCallParser::scan(Output& out, bool final) {
  if (forced_.kind != ForcedCalls::kNone) {
    if (!final) return;
    end_forced(out);
    buf_.clear();
    return;
  }
  if (format_ == ToolCallFormat::kNone) {
    add_content(out, buf_);
    buf_.clear();
    return;
  }
  if (format_ == ToolCallFormat::kLlama) return scan_llama(out, final);
  while (true) {
    if (!in_call_) {
      const size_t at = buf_.find(open_);
      if (at == std::string::npos) {
        const size_t hold = final ? 0 : partial_marker(buf_, open_);
        add_content(out, std::string_view(buf_).substr(0, buf_.size() - hold));
        buf_.erase(0, buf_.size() - hold);
        return;
      }
      // The content before the call, less the whitespace that separates them.
      std::string_view before = std::string_view(buf_).substr(0, at);
      size_t end = before.size();
      while (end > 0 && is_space(before[end - 1])) --end;
      add_content(out, before.substr(0, end));
      call_ws_ = pending_ws_ + std::string(before.substr(end));
      pending_ws_.clear();
      buf_.erase(0, at + open_.size());
      in_call_ = true;
      continue;
    }
    const size_t close = close_.empty() ? std::string::npos : find_outside_strings(buf_, close_);
    if (close == std::string::npos) {
      // The body runs on: to its closing marker, or (Mistral, or a call cut short) to the end.
      if (final) {
        end_call(out, buf_, open_ + buf_);
        buf_.clear();
        in_call_ = false;
      }
      return;
    }
    end_call(out, std::string_view(buf_).substr(0, close),
             open_ + buf_.substr(0, close + close_.size()));
    buf_.erase(0, close + close_.size());
    in_call_ = false;
  }
}

// Llama's call is the whole answer: an answer that starts with "{" (or the python tag) is held
// to its end and parsed then; any other is content from its first character on.
void ToolCallParser::scan_llama(Output& out, bool final) {
  if (!decided_) {
    const std::string_view start = trim(buf_);
    if (start.starts_with("{") || start.starts_with(kPythonTag)) {
      decided_ = in_call_ = true;
    } else if (!final && (start.empty() || kPythonTag.starts_with(start))) {
      return;
    } else {
      decided_ = true;
    }
  }
  if (in_call_) {
    if (!final) return;
    end_call(out, buf_, buf_);
    in_call_ = false;
  } else {
    add_content(out, buf_);
  }
  buf_.clear();
}

}  // namespace tformers::serve
