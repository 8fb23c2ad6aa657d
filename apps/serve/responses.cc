#include "serve/responses.h"

#include <utility>

namespace tformers::serve {

Json response_usage_json(const Usage& u) {
  return {{"input_tokens", u.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"output_tokens", u.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

namespace {

// The one content part of a reasoning item or of a message.
Json text_part(bool reasoning, const std::string& text) {
  if (reasoning) return {{"type", "reasoning_text"}, {"text", text}};
  return {{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}};
}

Json text_item(bool reasoning, const std::string& id, Json content, const char* status) {
  if (reasoning)
    return {{"id", id},
            {"type", "reasoning"},
            {"summary", Json::array()},
            {"content", std::move(content)},
            {"status", status}};
  return {{"id", id},
          {"type", "message"},
          {"role", "assistant"},
          {"status", status},
          {"content", std::move(content)}};
}

}  // namespace

ResponseWriter::ResponseWriter(const ResponseHead& head, const Json& echo)
    : response_({{"id", head.id},
                 {"object", "response"},
                 {"created_at", head.created},
                 {"status", "in_progress"},
                 {"background", false},
                 {"error", nullptr},
                 {"incomplete_details", nullptr},
                 {"model", head.model},
                 {"output", Json::array()}}) {
  response_.update(echo);
  // Nothing is stored, so no response continues another, and no input is ever cut.
  response_.update({{"previous_response_id", nullptr},
                    {"store", false},
                    {"truncation", "disabled"},
                    {"usage", nullptr}});
}

std::string ResponseWriter::event(const std::string& type, Json fields) {
  Json e = {{"type", type}, {"sequence_number", sequence_++}};
  e.update(fields);
  return "event: " + type + "\ndata: " + dump(e) + "\n\n";
}

std::string ResponseWriter::start() {
  std::string out = event("response.created", {{"response", response_}});
  return out + event("response.in_progress", {{"response", response_}});
}

std::string ResponseWriter::put(std::string_view reasoning, std::string_view text,
                                std::span<const ToolCall> calls) {
  std::string out = add_text(Kind::kReasoning, reasoning);
  out += add_text(Kind::kMessage, text);
  for (const ToolCall& call : calls) out += add_call(call);
  return out;
}

Json ResponseWriter::part_fields() const {
  return {
      {"item_id", item_id_}, {"output_index", response_["output"].size()}, {"content_index", 0}};
}

std::string ResponseWriter::add_text(Kind kind, std::string_view delta) {
  if (delta.empty()) return "";
  std::string out;
  if (open_ != kind) {
    out = close("completed");
    out += open(kind);
  }
  item_text_ += delta;
  Json fields = part_fields();
  fields["delta"] = std::string(delta);
  if (kind == Kind::kReasoning) return out + event("response.reasoning_text.delta", fields);
  fields["logprobs"] = Json::array();
  return out + event("response.output_text.delta", fields);
}

std::string ResponseWriter::open(Kind kind) {
  const bool reasoning = kind == Kind::kReasoning;
  item_id_ = new_id(reasoning ? "rs_" : "msg_");
  open_ = kind;
  Json part = part_fields();
  part["part"] = text_part(reasoning, "");
  std::string out = event("response.output_item.added",
                          {{"output_index", response_["output"].size()},
                           {"item", text_item(reasoning, item_id_, Json::array(), "in_progress")}});
  return out + event("response.content_part.added", part);
}

std::string ResponseWriter::close(const char* status) {
  if (open_ == Kind::kNone) return "";
  const bool reasoning = open_ == Kind::kReasoning;
  const Json part = text_part(reasoning, item_text_);
  Json done = part_fields();
  done["text"] = item_text_;
  if (!reasoning) done["logprobs"] = Json::array();
  Json part_done = part_fields();
  part_done["part"] = part;
  Json item = text_item(reasoning, item_id_, Json::array({part}), status);
  // Each event numbers itself, so they are made one after another.
  std::string out =
      event(reasoning ? "response.reasoning_text.done" : "response.output_text.done", done);
  out += event("response.content_part.done", part_done);
  out += event("response.output_item.done",
               {{"output_index", response_["output"].size()}, {"item", item}});
  response_["output"].push_back(std::move(item));
  open_ = Kind::kNone;
  item_text_.clear();
  return out;
}

// A call comes whole from the parsers, so its arguments are one delta.
std::string ResponseWriter::add_call(const ToolCall& call) {
  std::string out = close("completed");
  const size_t index = response_["output"].size();
  const std::string id = new_id("fc_");
  Json item = {{"id", id},           {"type", "function_call"}, {"status", "in_progress"},
               {"call_id", call.id}, {"name", call.name},       {"arguments", ""}};
  out += event("response.output_item.added", {{"output_index", index}, {"item", item}});
  out += event("response.function_call_arguments.delta",
               {{"item_id", id}, {"output_index", index}, {"delta", call.arguments}});
  out += event("response.function_call_arguments.done", {{"item_id", id},
                                                         {"output_index", index},
                                                         {"name", call.name},
                                                         {"arguments", call.arguments}});
  item["status"] = "completed";
  item["arguments"] = call.arguments;
  out += event("response.output_item.done", {{"output_index", index}, {"item", item}});
  response_["output"].push_back(std::move(item));
  return out;
}

std::string ResponseWriter::end(bool cut, const Usage& usage) {
  std::string out;
  if (open_ == Kind::kNone && response_["output"].empty()) out = open(Kind::kMessage);
  out += close(cut ? "incomplete" : "completed");
  response_["status"] = cut ? "incomplete" : "completed";
  if (cut) response_["incomplete_details"] = {{"reason", "max_output_tokens"}};
  response_["usage"] = response_usage_json(usage);
  return out + event(cut ? "response.incomplete" : "response.completed", {{"response", response_}});
}

std::string ResponseWriter::fail(const ApiError& error) {
  auto or_null = [](const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); };
  response_["status"] = "failed";
  response_["error"] = {{"code", "server_error"}, {"message", error.what()}};
  std::string out = event("error", {{"code", or_null(error.code())},
                                    {"message", error.what()},
                                    {"param", or_null(error.param())}});
  return out + event("response.failed", {{"response", response_}});
}

}  // namespace tformers::serve
