#include "serve/openai.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdio>
#include <functional>
#include <limits>
#include <mutex>
#include <random>

#include "generation/json_grammar.h"
#include "io/json.h"
#include "tformers/error.h"

namespace tformers::serve {

ApiError::ApiError(int status, const std::string& message, std::string param, std::string code)
    : std::runtime_error(message),
      status_(status),
      param_(std::move(param)),
      code_(std::move(code)) {}

std::string ApiError::type() const {
  return status_ < 500 ? "invalid_request_error" : "server_error";
}

std::string ApiError::body() const {
  auto or_null = [](const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); };
  return dump({{"error",
                {{"message", what()},
                 {"type", type()},
                 {"param", or_null(param_)},
                 {"code", or_null(code_)}}}});
}

namespace {

// Clients nest a few levels (messages, content parts, tool schemas); deeper input is refused
// before anything recurses over it (the chat template, dump).
constexpr size_t kMaxJsonDepth = 64;
// OpenAI's limits: stop strings per request, and alternatives per token with logprobs.
constexpr size_t kMaxStop = 4;
constexpr int64_t kMaxTopLogprobs = 20;

// A value for an error message, cut short: the client sent it, and it may be large.
std::string shown(const Json& v) {
  std::string s = dump(v);
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

std::string number_text(double x) {
  char s[32];
  std::snprintf(s, sizeof s, "%g", x);
  return s;
}

ApiError bad_field(const std::string& field, const std::string& what) {
  return ApiError(400, field + ": " + what, field);
}

// The optional fields of one JSON object. A field set to null counts as absent, since OpenAI's
// clients send null for options left unset. `prefix` says where the object is in the request
// ("reasoning."), so that errors name the whole path.
class Fields {
 public:
  explicit Fields(const Json& object, std::string prefix = "")
      : object_(object), prefix_(std::move(prefix)) {}

  // The field's path in the request, for errors.
  std::string path(const std::string& name) const { return prefix_ + name; }

  const Json* get(const std::string& name) const {
    auto it = object_.find(name);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  std::optional<double> number(const std::string& name, double lo, double hi) const {
    const Json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw bad_field(path(name), "expected a number, got " + shown(*v));
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi))
      throw bad_field(path(name), shown(*v) + " is out of range; give " + number_text(lo) + " to " +
                                      number_text(hi));
    return x;
  }

  std::optional<int64_t> integer(const std::string& name, int64_t lo, int64_t hi) const {
    const Json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number_integer())
      throw bad_field(path(name), "expected an integer, got " + shown(*v));
    // Integers beyond int64 arrive unsigned; they are out of every range here.
    const bool fits = !(v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) &&
                      v->get<int64_t>() >= lo && v->get<int64_t>() <= hi;
    if (!fits)
      throw bad_field(path(name), shown(*v) + " is out of range; give " + std::to_string(lo) +
                                      " to " + std::to_string(hi));
    return v->get<int64_t>();
  }

  std::optional<bool> boolean(const std::string& name) const {
    const Json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw bad_field(path(name), "expected true or false, got " + shown(*v));
    return v->get<bool>();
  }

  std::optional<std::string> string(const std::string& name) const {
    const Json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw bad_field(path(name), "expected a string, got " + shown(*v));
    return v->get<std::string>();
  }

  // An object field, read with its path as prefix; nullopt when absent.
  std::optional<Fields> object(const std::string& name) const {
    const Json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_object()) throw bad_field(path(name), "expected an object, got " + shown(*v));
    return Fields(*v, path(name) + ".");
  }

 private:
  const Json& object_;
  std::string prefix_;
};

Json parse_body(std::string_view body) {
  Json j;
  try {
    j = io::parse_ordered_json(body, "the request body", kMaxJsonDepth);
  } catch (const FormatError& e) {  // a syntax error, too deep, or a number beyond a double
    throw ApiError(400, e.what());
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

// OpenAI's stop: one string or a list of up to 4.
std::vector<std::string> parse_stop(const Fields& f) {
  const Json* v = f.get("stop");
  if (!v) return {};
  std::vector<std::string> stop;
  if (v->is_string()) {
    stop.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > kMaxStop)
      throw bad_field("stop", "at most " + std::to_string(kMaxStop) + " stop strings, got " +
                                  std::to_string(v->size()));
    for (const Json& s : *v) {
      if (!s.is_string()) throw bad_field("stop", "expected strings, got " + shown(s));
      stop.push_back(s.get<std::string>());
    }
  } else {
    throw bad_field("stop", "expected a string or a list of strings, got " + shown(*v));
  }
  for (const std::string& s : stop)
    if (s.empty()) throw bad_field("stop", "stop strings must not be empty");
  return stop;
}

// Options tformers does not implement are refused unless set to what they do by default, so a
// client never gets output it did not ask for.
void refuse_unless_default(const Fields& f) {
  // Constrained decoding other than response_format (vLLM's fields and llama.cpp's grammar) is
  // not implemented: output that ignored the constraint would look like success.
  for (const char* constraint :
       {"guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
        "structured_outputs", "grammar", "json_schema"})
    if (const Json* v = f.get(constraint); v && !v->is_null())
      throw bad_field(constraint,
                      "not supported by tformers serve; use response_format with a json_schema");
  // OpenAI's options that would change what is done with the request.
  if (f.boolean("store").value_or(false))
    throw bad_field("store", "tformers serve stores no completions; leave it false");
  if (const Json* m = f.get("metadata"); m && !(m->is_object() && m->empty()))
    throw bad_field("metadata", "is kept only with store, which tformers serve does not do");
  for (const char* output : {"audio", "prediction", "web_search_options"})
    if (f.get(output)) throw bad_field(output, "not supported by tformers serve");
  if (const Json* m = f.get("modalities"); m && *m != Json::array({"text"}))
    throw bad_field("modalities",
                    "tformers serve answers text only: give [\"text\"] or leave it out");
}

// What a structured-output format asks for: nothing for {"type": "text"}, any JSON object for
// {"type": "json_object"}, and for {"type": "json_schema", ...} its schema, compiled here so that
// one outside the supported subset is a 400 naming the keyword and where it is in the schema,
// before anything is tokenized. Chat nests json_schema's fields ({"type": "json_schema",
// "json_schema": {"name", "schema", "strict", "description"}}); the Responses API's text.format
// has them beside the type (`flat`). `field` names the format in errors.
std::optional<Json> format_schema(const Json& format, const std::string& field, bool flat) {
  auto bad = [&](const std::string& what) { return bad_field(field, what); };
  if (!format.is_object())
    throw bad("expected an object such as {\"type\": \"json_object\"}, got " + shown(format));
  const Json* type = Fields(format).get("type");
  if (!type || !type->is_string())
    throw bad("type is required: \"text\", \"json_object\" or \"json_schema\"");
  if (*type == "text") return std::nullopt;
  if (*type == "json_object") return Json{{"type", "object"}};
  if (*type != "json_schema")
    throw bad("type " + shown(*type) +
              " is not supported; give \"text\", \"json_object\" or \"json_schema\"");
  const Json* spec = flat ? &format : Fields(format).get("json_schema");
  if (!spec || !spec->is_object())
    throw bad("json_schema is required with type \"json_schema\": {\"name\", \"schema\"}");
  const std::string at = flat ? "" : "json_schema.";
  const Fields spec_fields(*spec);
  if (const Json* name = spec_fields.get("name"); name && !name->is_string())
    throw bad(at + "name: expected a string");
  if (const Json* strict = spec_fields.get("strict"); strict && !strict->is_boolean())
    throw bad(at + "strict: expected true or false");
  const Json* schema = spec_fields.get("schema");
  if (!schema) throw bad(at + "schema is required");
  try {
    generation::JsonGrammar::compile(*schema);
  } catch (const generation::SchemaError& e) {
    throw bad(at + "schema: " + e.what());
  }
  return *schema;
}

// OpenAI's response_format on chat and completions.
std::optional<Json> parse_response_format(const Fields& f) {
  const Json* format = f.get("response_format");
  if (!format) return std::nullopt;
  return format_schema(*format, "response_format", /*flat=*/false);
}

// OpenAI's logit_bias: {"token id": bias}, the id a decimal string as JSON keys are. The ids are
// checked against the vocabulary by to_engine_request, which knows it.
std::vector<std::pair<int32_t, float>> parse_logit_bias(const Fields& f) {
  const Json* v = f.get("logit_bias");
  if (!v) return {};
  if (!v->is_object())
    throw bad_field(
        "logit_bias",
        "expected an object of token ids and biases, such as {\"42\": -100}, got " + shown(*v));
  if (v->size() > kMaxLogitBias)
    throw bad_field("logit_bias", "at most " + std::to_string(kMaxLogitBias) +
                                      " tokens can be biased, got " + std::to_string(v->size()));
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, bias] : v->items()) {
    int32_t id = -1;
    const char* end = key.data() + key.size();
    const auto [stop, ec] = std::from_chars(key.data(), end, id);
    if (key.empty() || !std::isdigit(static_cast<unsigned char>(key[0])) || ec != std::errc() ||
        stop != end)
      throw bad_field("logit_bias", "key " + shown(Json(key)) +
                                        " is not a token id; keys are token ids written as "
                                        "decimal strings, such as \"42\"");
    if (!bias.is_number())
      throw bad_field("logit_bias",
                      "the bias of token " + key + " must be a number, got " + shown(bias));
    const double b = bias.get<double>();
    if (!(b >= -100 && b <= 100))
      throw bad_field("logit_bias", "the bias of token " + key + ", " + shown(bias) +
                                        ", is out of range; give -100 to 100");
    out.emplace_back(id, float(b));
  }
  // "7" and "007" are one token; which bias was meant is unclear.
  std::vector<int32_t> ids;
  for (const auto& entry : out) ids.push_back(entry.first);
  std::sort(ids.begin(), ids.end());
  if (const auto twice = std::adjacent_find(ids.begin(), ids.end()); twice != ids.end())
    throw bad_field("logit_bias", "token " + std::to_string(*twice) +
                                      " is given twice (as two spellings of its id); give it once");
  return out;
}

// OpenAI's sampling fields and vLLM's extra ones, over GenerationConfig. temperature 0 means
// greedy decoding; a temperature above 0, or top_p, turns sampling on. Whatever the client leaves
// out comes from the model's generation_config.json (as vLLM's default --generation-config auto
// does) rather than from OpenAI's defaults (temperature 1): a model's own settings are what it
// was tuned for.
void parse_sampling(const Fields& f, ApiRequest& r) {
  GenerationConfig& c = r.config;
  const std::optional<double> temperature = f.number("temperature", 0, 2);
  const std::optional<double> top_p = f.number("top_p", 0, 1);
  if (top_p && *top_p == 0) throw bad_field("top_p", "must be above 0");
  // The engine scales float32 scores: a factor below float's smallest normal value would become
  // 0 there, so it is refused here with the range rather than failing inside the engine.
  const double kSmallest = double(std::numeric_limits<float>::min());
  if (temperature && *temperature > 0 && *temperature < kSmallest)
    throw bad_field("temperature", shown(*f.get("temperature")) +
                                       " is out of range; give 0 (greedy) or " +
                                       number_text(kSmallest) + " to 2");
  if (temperature == 0.0) {
    c.do_sample = false;
  } else if (temperature || top_p) {
    c.do_sample = true;
    c.temperature = temperature;
  }
  c.top_p = top_p;
  if (auto top_k = f.integer("top_k", -1, INT32_MAX)) c.top_k = std::max<int64_t>(*top_k, 0);
  c.min_p = f.number("min_p", 0, 1);
  // OpenAI's penalties, applied after repetition_penalty (ServingRequest has the formula).
  r.presence_penalty = f.number("presence_penalty", -2, 2).value_or(0);
  r.frequency_penalty = f.number("frequency_penalty", -2, 2).value_or(0);
  r.logit_bias = parse_logit_bias(f);
  if (auto penalty = f.number("repetition_penalty", 0, 2)) {
    if (*penalty < kSmallest)
      throw bad_field("repetition_penalty", "must be at least " + number_text(kSmallest) +
                                                " (give " + number_text(kSmallest) + " to 2)");
    c.repetition_penalty = penalty;
  }
  if (auto seed = f.integer("seed", INT64_MIN, INT64_MAX)) c.seed = uint64_t(*seed);
  if (f.boolean("ignore_eos").value_or(false)) c.eos_token_id = std::vector<int64_t>{};
  r.stop = parse_stop(f);
  if (!r.stop.empty()) c.stop_strings = r.stop;
}

// One chat message as the template takes it: content parts joined into one string (with "\n",
// as vLLM does), OpenAI's "developer" role read as "system", which templates know, and an
// assistant message without content (the openai SDK sends back a tool call's as null) given an
// empty one, as vLLM and llama.cpp's server do: templates such as Qwen3's and DeepSeek-V3's read
// message.content on every message, and fail on the missing key (Transformers drops null keys).
Json parse_message(const Json& m, const std::string& where) {
  if (!m.is_object()) throw bad_field(where, "expected a message object, got " + shown(m));
  Fields f(m);
  const std::optional<std::string> role = f.string("role");
  static const std::vector<std::string> kRoles = {"system", "developer", "user", "assistant",
                                                  "tool"};
  if (!role) throw bad_field(where + ".role", "required");
  if (std::find(kRoles.begin(), kRoles.end(), *role) == kRoles.end())
    throw bad_field(where + ".role",
                    "expected system, developer, user, assistant or tool, got " + shown(*role));
  Json out = m;
  if (*role == "developer") out["role"] = "system";
  const Json* content = f.get("content");
  if (!content) {
    // An assistant message that only calls tools has no content.
    if (*role != "assistant") throw bad_field(where + ".content", "required");
    out["content"] = "";
  } else if (content->is_array()) {
    std::string text;
    for (size_t i = 0; i < content->size(); ++i) {
      const Json& part = (*content)[i];
      const std::string at = where + ".content[" + std::to_string(i) + "]";
      if (!part.is_object() || part.value("type", Json()) != "text")
        throw bad_field(at, "only text parts ({\"type\": \"text\", \"text\": ...}) are supported");
      const std::optional<std::string> part_text = Fields(part).string("text");
      if (!part_text) throw bad_field(at + ".text", "required");
      text += (i ? "\n" : "") + *part_text;
    }
    out["content"] = text;
  } else if (!content->is_string()) {
    throw bad_field(where + ".content",
                    "expected a string or a list of text parts, got " + shown(*content));
  }
  return out;
}

// OpenAI's two ways of writing a function tool: chat nests the function ({"type": "function",
// "function": {"name", ...}}, and {"type": "function", "function": {"name"}} as tool_choice),
// the Responses API does not ({"type": "function", "name", ...}).
enum class ToolShape { kNested, kFlat };

// A function's name as OpenAI allows it (letters, digits, '_' and '-', up to 64), so that a
// call's name can be matched and sent back.
void check_function_name(const Json* name, const std::string& at) {
  if (!name || !name->is_string() || name->get_ref<const std::string&>().empty())
    throw bad_field(at, "required: a non-empty string");
  const std::string& n = name->get_ref<const std::string&>();
  const bool allowed = n.size() <= 64 && std::all_of(n.begin(), n.end(), [](unsigned char c) {
                         return std::isalnum(c) || c == '_' || c == '-';
                       });
  if (!allowed)
    throw bad_field(
        at, shown(*name) + " is not a function name: use up to 64 letters, digits, '_' and '-'");
}

// The fields of a function beside its name; `at` ends with the '.' before them.
void check_function_fields(const Fields& fn, const std::string& at) {
  if (const Json* d = fn.get("description"); d && !d->is_string())
    throw bad_field(at + "description", "expected a string, got " + shown(*d));
  if (const Json* p = fn.get("parameters"); p && !p->is_object())
    throw bad_field(at + "parameters",
                    "expected a JSON Schema object such as {\"type\": \"object\", "
                    "\"properties\": {...}}, got " +
                        shown(*p));
  if (const Json* s = fn.get("strict"); s && !s->is_boolean())
    throw bad_field(at + "strict", "expected true or false, got " + shown(*s));
}

// OpenAI's function tools, checked, in chat's nested shape (which chat templates read). Names are
// distinct, so that a call names one tool.
Json parse_tools(const Json& tools, ToolShape shape) {
  if (!tools.is_array()) throw bad_field("tools", "expected a list of tools, got " + shown(tools));
  if (tools.size() > kMaxTools)
    throw bad_field("tools", "at most " + std::to_string(kMaxTools) + " tools, got " +
                                 std::to_string(tools.size()));
  const bool flat = shape == ToolShape::kFlat;
  Json out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    const Json& tool = tools[i];
    if (!tool.is_object()) throw bad_field(at, "expected a tool object, got " + shown(tool));
    const Fields t(tool);
    if (const Json* type = t.get("type"); !type || *type != "function")
      throw bad_field(at + ".type",
                      "only function tools are supported: set \"type\": \"function\"");
    const Json* function = flat ? &tool : t.get("function");
    if (!function || !function->is_object())
      throw bad_field(at + ".function",
                      "expected an object such as {\"name\": \"get_weather\", \"parameters\": "
                      "{...}}");
    const std::string fn_at = flat ? at + "." : at + ".function.";
    const Fields fn(*function);
    check_function_name(fn.get("name"), fn_at + "name");
    for (size_t j = 0; j < i; ++j)
      if (out[j]["function"]["name"] == *fn.get("name"))
        throw bad_field(fn_at + "name",
                        shown(*fn.get("name")) + " names tools[" + std::to_string(j) + "] as well");
    check_function_fields(fn, fn_at);
    if (!flat) {
      out.push_back(tool);
      continue;
    }
    Json nested = tool;
    nested.erase("type");
    out.push_back({{"type", "function"}, {"function", std::move(nested)}});
  }
  return out;
}

// OpenAI's tool_choice: "none", "auto" (the default with tools), "required", or a function
// naming one of the tools.
struct ToolChoice {
  enum Mode { kNone, kAuto, kRequired, kFunction } mode = kAuto;
  std::string name;  // kFunction's
};

ToolChoice parse_tool_choice(const Fields& f, const Json& tools, ToolShape shape) {
  const Json* v = f.get("tool_choice");
  if (!v) return {};
  const bool flat = shape == ToolShape::kFlat;
  if (v->is_string()) {
    if (*v == "none") return {ToolChoice::kNone};
    if (*v == "auto") return {};
    if (*v == "required") {
      if (tools.is_null())
        throw bad_field("tool_choice", "\"required\" needs tools: give the tools to choose from");
      return {ToolChoice::kRequired};
    }
  } else if (v->is_object()) {
    const Fields c(*v);
    const Json* function = flat ? v : c.get("function");
    const Json* name = function && function->is_object() ? Fields(*function).get("name") : nullptr;
    if (const Json* type = c.get("type");
        !type || *type != "function" || !name || !name->is_string())
      throw bad_field("tool_choice",
                      std::string("expected ") +
                          (flat ? "{\"type\": \"function\", \"name\": ...}"
                                : "{\"type\": \"function\", \"function\": {\"name\": ...}}") +
                          ", got " + shown(*v));
    const bool known = tools.is_array() &&
                       std::any_of(tools.begin(), tools.end(),
                                   [&](const Json& t) { return t["function"]["name"] == *name; });
    if (!known)
      throw bad_field("tool_choice", "the function " + shown(*name) +
                                         " is not among the request's tools; name one of them");
    return {ToolChoice::kFunction, name->get<std::string>()};
  }
  throw bad_field("tool_choice",
                  "expected \"none\", \"auto\", \"required\" or a function, got " + shown(*v));
}

// A call the model must make: its output is constrained to the tools' schemas, as vLLM does (a
// list of calls for "required", the function's arguments for a named one). `format` names the
// request's structured-output field, which cannot be given as well.
void force_calls(const ToolChoice& choice, const std::string& format, ApiRequest& r) {
  if (r.json_schema)
    throw bad_field("tool_choice", "a required or named tool call cannot be combined with a JSON " +
                                       format + ": give one of them");
  r.forced_calls = {
      choice.mode == ToolChoice::kRequired ? ForcedCalls::kList : ForcedCalls::kArguments,
      choice.name};
  const Json schema = forced_calls_schema(r.forced_calls, r.tools, r.parallel_tool_calls);
  try {
    generation::JsonGrammar::compile(schema);
  } catch (const generation::SchemaError& e) {
    throw bad_field("tools", std::string("tool_choice constrains the output to the functions' "
                                         "parameters, which JSON Schema must be: ") +
                                 e.what());
  }
  r.json_schema = schema;
}

// tools, tool_choice and parallel_tool_calls. "none" hides the tools from the template.
void parse_tool_fields(const Fields& f, ToolShape shape, ApiRequest& r) {
  if (const Json* tools = f.get("tools")) r.tools = parse_tools(*tools, shape);
  const ToolChoice choice = parse_tool_choice(f, r.tools, shape);
  if (choice.mode == ToolChoice::kNone) r.tools = nullptr;
  r.parallel_tool_calls = f.boolean("parallel_tool_calls").value_or(true);
  if (choice.mode == ToolChoice::kRequired || choice.mode == ToolChoice::kFunction)
    force_calls(choice, shape == ToolShape::kFlat ? "text.format" : "response_format", r);
}

// OpenAI's reasoning effort ("reasoning_effort" on chat, "reasoning.effort" on the Responses
// API), one of its values; what it does is the chat template's.
std::optional<std::string> parse_reasoning_effort(const Fields& f, const std::string& name) {
  std::optional<std::string> effort = f.string(name);
  static const std::vector<std::string> kEfforts = {"none",   "minimal", "low",
                                                    "medium", "high",    "xhigh"};
  if (effort && std::find(kEfforts.begin(), kEfforts.end(), *effort) == kEfforts.end())
    throw bad_field(f.path(name),
                    "expected none, minimal, low, medium, high or xhigh, got " + shown(*effort));
  return effort;
}

void parse_chat(const Fields& f, ApiRequest& r) {
  const Json* messages = f.get("messages");
  if (!messages) throw bad_field("messages", "required");
  if (!messages->is_array() || messages->empty())
    throw bad_field("messages", "expected a non-empty list of messages");
  r.messages = Json::array();
  for (size_t i = 0; i < messages->size(); ++i)
    r.messages.push_back(parse_message((*messages)[i], "messages[" + std::to_string(i) + "]"));

  parse_tool_fields(f, ToolShape::kNested, r);
  if (const Json* kwargs = f.get("chat_template_kwargs")) {
    if (!kwargs->is_object()) throw bad_field("chat_template_kwargs", "expected an object");
    r.template_kwargs = *kwargs;
  }
  r.reasoning_effort = parse_reasoning_effort(f, "reasoning_effort");
  r.include_reasoning = f.boolean("include_reasoning").value_or(true);

  r.logprobs = f.boolean("logprobs").value_or(false);
  if (auto top = f.integer("top_logprobs", 0, kMaxTopLogprobs)) {
    if (!r.logprobs) throw bad_field("top_logprobs", "needs logprobs set to true");
    r.top_logprobs = *top;
  }
  // max_completion_tokens replaced max_tokens in OpenAI's chat API; either is read.
  r.max_tokens = f.integer("max_completion_tokens", 1, INT32_MAX);
  if (!r.max_tokens) r.max_tokens = f.integer("max_tokens", 1, INT32_MAX);
}

// A token id list as a completion prompt.
std::vector<int32_t> parse_ids(const Json& list, const std::string& where) {
  std::vector<int32_t> ids;
  for (const Json& id : list) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      throw bad_field(where, "expected token ids (integers from 0), got " + shown(id));
    ids.push_back(int32_t(id.get<int64_t>()));
  }
  return ids;
}

// One prompt: a text or a list of token ids.
ApiRequest::Prompt parse_prompt(const Json& v, const std::string& where) {
  ApiRequest::Prompt p;
  if (v.is_string()) {
    p.text = v.get<std::string>();
  } else if (v.is_array()) {
    p.ids = parse_ids(v, where);
    p.is_ids = true;
  } else {
    throw bad_field(where, "expected a string or a list of token ids, got " + shown(v));
  }
  return p;
}

void parse_completion(const Fields& f, ApiRequest& r) {
  const Json* prompt = f.get("prompt");
  if (!prompt) throw bad_field("prompt", "required");
  // OpenAI's batch forms: ["text", ...] or [[ids], ...], each prompt with its n choices.
  if (prompt->is_array() && !prompt->empty() && !(*prompt)[0].is_number()) {
    for (size_t i = 0; i < prompt->size(); ++i)
      r.prompts.push_back(parse_prompt((*prompt)[i], "prompt"));
  } else {
    r.prompts.push_back(parse_prompt(*prompt, "prompt"));
  }
  if (auto n = f.integer("logprobs", 0, kMaxTopLogprobs)) {
    r.logprobs = true;
    r.top_logprobs = *n;
  }
  if (f.boolean("echo").value_or(false)) throw bad_field("echo", "not supported");
  if (f.get("reasoning_effort"))
    throw bad_field(
        "reasoning_effort",
        "applies to chat completions, through the model's chat template; a completion's "
        "prompt is the model's input as it is");
  if (auto suffix = f.string("suffix"); suffix && !suffix->empty())
    throw bad_field("suffix", "not supported");
  if (auto best_of = f.integer("best_of", 1, 128); best_of && *best_of != 1)
    throw bad_field("best_of", "only best_of = 1 is supported");
  r.max_tokens = f.integer("max_tokens", 1, INT32_MAX);
}

// What chat completions and completions share beside sampling: the options refused, the format,
// n, and the stream's usage chunk.
void parse_chat_or_completion(const Fields& f, ApiRequest& r) {
  refuse_unless_default(f);
  r.json_schema = parse_response_format(f);
  r.n = f.integer("n", 1, kMaxChoices).value_or(1);
  if (r.endpoint == Endpoint::kChatCompletions)
    parse_chat(f, r);
  else
    parse_completion(f, r);
  if (r.choices() > kMaxSequences)
    throw bad_field(r.prompts.size() > 1 ? "prompt" : "n",
                    std::to_string(r.prompts.size()) + " prompts of n = " + std::to_string(r.n) +
                        " choices are " + std::to_string(r.choices()) +
                        " sequences, more than the " + std::to_string(kMaxSequences) +
                        " one request may run; split the batch");
  if (std::optional<Fields> options = f.object("stream_options"))
    r.include_usage = options->boolean("include_usage").value_or(false);
}

// The Responses API's fields that tformers serve reads, vLLM's sampling fields among them as on
// chat. Any other is refused by name: that API has many options (stored conversations, background
// runs, built-in tools, prompt templates) that would change what is done with the request.
constexpr std::string_view kResponsesFields[] = {
    // What the model is given and what it is to write,
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
    "reasoning", "max_output_tokens", "stream", "stream_options", "metadata", "user",
    // how it samples (vLLM's fields among them, as on chat),
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "logit_bias", "seed", "stop", "ignore_eos",
    // and options taken at their defaults only, or read and not needed.
    "store", "previous_response_id", "background", "include", "truncation", "service_tier",
    "safety_identifier", "prompt_cache_key", "max_tool_calls", "top_logprobs"};

// Chat's names for what the Responses API names otherwise: a client moving over is told.
std::string renamed_in_responses(const std::string& field) {
  static const std::pair<std::string_view, std::string_view> kRenamed[] = {
      {"messages", "input"},
      {"max_tokens", "max_output_tokens"},
      {"max_completion_tokens", "max_output_tokens"},
      {"response_format", "text.format"},
      {"reasoning_effort", "reasoning.effort"}};
  for (const auto& [chat, responses] : kRenamed)
    if (field == chat) return "; the Responses API calls it " + std::string(responses);
  return "";
}

void refuse_unknown_fields(const Json& body) {
  for (const auto& [key, value] : body.items())
    if (!value.is_null() && std::find(std::begin(kResponsesFields), std::end(kResponsesFields),
                                      key) == std::end(kResponsesFields))
      throw bad_field(key, "not a field that tformers serve takes on /v1/responses" +
                               renamed_in_responses(key));
}

// What only a service that stores responses, runs them in the background or adds to them does:
// refused unless set to what it does by default. store is taken either way and nothing is
// stored, as vLLM does by default: OpenAI's default is true, so clients send it without asking
// for anything.
void refuse_responses_options(const Fields& f) {
  if (f.get("previous_response_id"))
    throw bad_field("previous_response_id",
                    "tformers serve stores no responses, so none can be continued; send the "
                    "conversation so far as input items");
  f.boolean("store");
  if (f.boolean("background").value_or(false))
    throw bad_field("background",
                    "tformers serve runs no response in the background: that needs a stored "
                    "response, and nothing is stored");
  if (const Json* include = f.get("include")) {
    if (!include->is_array()) throw bad_field("include", "expected a list");
    if (!include->empty())
      throw bad_field(
          "include",
          shown((*include)[0]) + " is not supported: tformers serve adds nothing to a response");
  }
  if (auto truncation = f.string("truncation"); truncation && *truncation != "disabled")
    throw bad_field("truncation",
                    "only \"disabled\" is supported: an input longer than the context is a 400, "
                    "never cut");
  if (auto tier = f.string("service_tier"); tier && *tier != "auto" && *tier != "default")
    throw bad_field("service_tier", "tformers serve has one tier: give \"auto\" or \"default\"");
  if (f.integer("top_logprobs", 0, kMaxTopLogprobs).value_or(0) != 0)
    throw bad_field("top_logprobs", "log-probabilities are not returned on /v1/responses");
  // Read for their types only: max_tool_calls bounds calls of built-in tools, of which there are
  // none, and the rest are hints and labels.
  f.integer("max_tool_calls", 0, INT64_MAX);
  for (const char* label : {"user", "safety_identifier", "prompt_cache_key"}) f.string(label);
  f.object("stream_options");
}

size_t code_points(const std::string& s) {
  return size_t(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// metadata: up to 16 strings of up to 512 characters under keys of up to 64, as OpenAI takes
// it; the response repeats it.
Json parse_metadata(const Fields& f) {
  const Json* m = f.get("metadata");
  if (!m) return Json::object();
  if (!m->is_object()) throw bad_field("metadata", "expected an object of strings");
  if (m->size() > 16)
    throw bad_field("metadata", "at most 16 keys, got " + std::to_string(m->size()));
  for (const auto& [key, value] : m->items()) {
    if (code_points(key) > 64)
      throw bad_field("metadata", "the key " + shown(Json(key)) + " is over 64 characters");
    if (!value.is_string() || code_points(value.get<std::string>()) > 512)
      throw bad_field("metadata", "the value of " + shown(Json(key)) +
                                      " must be a string of up to 512 characters");
  }
  return *m;
}

// The text of content parts of the given types ({"type": "input_text", "text": ...}), joined
// with "\n" as chat's parts are.
std::string parts_text(const Json& parts, const std::vector<std::string>& types,
                       const std::string& at) {
  if (!parts.is_array())
    throw bad_field(at, "expected a list of content parts, got " + shown(parts));
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string part_at = at + "[" + std::to_string(i) + "]";
    if (!parts[i].is_object())
      throw bad_field(part_at, "expected a content part, got " + shown(parts[i]));
    const Fields part(parts[i], part_at + ".");
    const std::optional<std::string> type = part.string("type");
    if (!type || std::find(types.begin(), types.end(), *type) == types.end()) {
      std::string expected;
      for (const std::string& t : types) expected += (expected.empty() ? "" : " or ") + t;
      throw bad_field(part.path("type"), (type ? shown(*type) : std::string("none")) +
                                             " is not supported; give " + expected + " parts");
    }
    const std::optional<std::string> part_text = part.string("text");
    if (!part_text) throw bad_field(part.path("text"), "required");
    text += (i ? "\n" : "") + *part_text;
  }
  return text;
}

// A message's or a tool output's content: a string, or text parts.
std::string content_text(const Json& content, const std::vector<std::string>& types,
                         const std::string& at) {
  return content.is_string() ? content.get<std::string>() : parts_text(content, types, at);
}

std::string required_string(const Fields& item, const std::string& name) {
  std::optional<std::string> v = item.string(name);
  if (!v) throw bad_field(item.path(name), "required");
  return *v;
}

// A message item ({"type": "message", "role", "content"}, the type optional) as a chat message,
// "developer" read as "system", which templates know.
Json input_message(const Fields& item) {
  const std::string role = required_string(item, "role");
  static const std::vector<std::string> kRoles = {"user", "system", "developer", "assistant"};
  if (std::find(kRoles.begin(), kRoles.end(), role) == kRoles.end())
    throw bad_field(item.path("role"),
                    "expected user, system, developer or assistant, got " + shown(role));
  const Json* content = item.get("content");
  if (!content) throw bad_field(item.path("content"), "required");
  return {{"role", role == "developer" ? "system" : role},
          {"content", content_text(*content, {"input_text", "output_text"}, item.path("content"))}};
}

// A function_call item as one of chat's tool_calls; its call_id is the id the output answers.
Json input_call(const Fields& item) {
  return {{"id", required_string(item, "call_id")},
          {"type", "function"},
          {"function",
           {{"name", required_string(item, "name")},
            {"arguments", required_string(item, "arguments")}}}};
}

// A reasoning item's text: its reasoning_text content, else its summary, as vLLM reads it.
std::string input_reasoning(const Fields& item) {
  if (item.get("encrypted_content"))
    throw bad_field(item.path("encrypted_content"),
                    "not supported: tformers serve encrypts no reasoning; send its content");
  const Json* content = item.get("content");
  if (content && !(content->is_array() && content->empty()))
    return parts_text(*content, {"reasoning_text"}, item.path("content"));
  const Json* summary = item.get("summary");
  return summary ? parts_text(*summary, {"summary_text"}, item.path("summary")) : "";
}

// One input item added to the chat. An assistant's items (reasoning, its message, its
// function_calls) make one assistant message, each filling what the one before it left empty, as
// vLLM joins them, so that the template renders the turn as the model wrote it.
void add_input_item(Json& messages, const Json& v, const std::string& at) {
  if (!v.is_object()) throw bad_field(at, "expected an input item, got " + shown(v));
  const Fields item(v, at + ".");
  const std::string type = item.string("type").value_or("message");
  Json* assistant =
      !messages.empty() && messages.back()["role"] == "assistant" ? &messages.back() : nullptr;
  if (type == "message") {
    Json message = input_message(item);
    if (assistant && message["role"] == "assistant" && !assistant->contains("content"))
      (*assistant)["content"] = std::move(message["content"]);
    else
      messages.push_back(std::move(message));
  } else if (type == "function_call") {
    if (assistant)
      (*assistant)["tool_calls"].push_back(input_call(item));
    else
      messages.push_back({{"role", "assistant"}, {"tool_calls", Json::array({input_call(item)})}});
  } else if (type == "function_call_output") {
    const Json* output = item.get("output");
    if (!output) throw bad_field(item.path("output"), "required");
    messages.push_back({{"role", "tool"},
                        {"tool_call_id", required_string(item, "call_id")},
                        {"content", content_text(*output, {"input_text"}, item.path("output"))}});
  } else if (type == "reasoning") {
    std::string text = input_reasoning(item);
    if (assistant && !assistant->contains("reasoning"))
      (*assistant)["reasoning"] = std::move(text);
    else
      messages.push_back({{"role", "assistant"}, {"reasoning", std::move(text)}});
  } else {
    throw bad_field(item.path("type"),
                    shown(type) +
                        " items are not supported; give message, "
                        "function_call, function_call_output or reasoning items");
  }
}

// instructions and input as the chat template's messages. An assistant message given without
// content gets an empty one, as chat's do.
Json responses_messages(const Fields& f) {
  Json messages = Json::array();
  if (auto instructions = f.string("instructions"))
    messages.push_back({{"role", "system"}, {"content", *instructions}});
  const Json* input = f.get("input");
  if (!input) throw bad_field("input", "required");
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
  } else if (input->is_array() && !input->empty()) {
    for (size_t i = 0; i < input->size(); ++i)
      add_input_item(messages, (*input)[i], "input[" + std::to_string(i) + "]");
  } else {
    throw bad_field("input",
                    "expected a string or a non-empty list of input items, got " + shown(*input));
  }
  for (Json& m : messages)
    if (m["role"] == "assistant" && !m.contains("content")) m["content"] = "";
  return messages;
}

// text: {"format", "verbosity"}; the format is structured output as chat's response_format,
// written flat. Returns what the response repeats.
Json parse_text(const Fields& f, ApiRequest& r) {
  Json format = {{"type", "text"}};
  if (std::optional<Fields> text = f.object("text")) {
    if (auto verbosity = text->string("verbosity"); verbosity && *verbosity != "medium")
      throw bad_field(text->path("verbosity"),
                      "only \"medium\", the default, is supported: the model is told no verbosity");
    if (const Json* given = text->get("format")) {
      r.json_schema = format_schema(*given, "text.format", /*flat=*/true);
      format = *given;
    }
  }
  return {{"format", format}};
}

// reasoning: {"effort", "summary"}, the effort as chat's reasoning_effort. No summary is written
// (the reasoning comes whole, as the reasoning item's content), so a summary may only be left to
// the model ("auto"). Returns what the response repeats.
Json parse_reasoning(const Fields& f, ApiRequest& r) {
  Json echo = {{"effort", nullptr}, {"summary", nullptr}};
  std::optional<Fields> reasoning = f.object("reasoning");
  if (!reasoning) return echo;
  r.reasoning_effort = parse_reasoning_effort(*reasoning, "effort");
  if (r.reasoning_effort) echo["effort"] = *r.reasoning_effort;
  for (const char* name : {"summary", "generate_summary"})
    if (auto summary = reasoning->string(name)) {
      if (*summary != "auto")
        throw bad_field(reasoning->path(name),
                        "tformers serve writes no reasoning summary: give \"auto\" or leave it "
                        "out, and read the reasoning item's content");
      echo["summary"] = *summary;
    }
  return echo;
}

Json value_or_null(const Json* v) { return v ? *v : Json(nullptr); }

void parse_responses(const Json& body, const Fields& f, ApiRequest& r) {
  refuse_unknown_fields(body);
  refuse_responses_options(f);
  Json metadata = parse_metadata(f);
  r.messages = responses_messages(f);
  // The format first: a forced call cannot be combined with it.
  Json text = parse_text(f, r);
  parse_tool_fields(f, ToolShape::kFlat, r);
  Json reasoning = parse_reasoning(f, r);
  r.max_tokens = f.integer("max_output_tokens", 1, INT32_MAX);
  r.echo = {{"instructions", value_or_null(f.get("instructions"))},
            {"max_output_tokens", value_or_null(f.get("max_output_tokens"))},
            {"metadata", std::move(metadata)},
            {"parallel_tool_calls", r.parallel_tool_calls},
            {"reasoning", std::move(reasoning)},
            {"temperature", value_or_null(f.get("temperature"))},
            {"text", std::move(text)},
            {"tool_choice", f.get("tool_choice") ? *f.get("tool_choice") : Json("auto")},
            {"tools", f.get("tools") ? *f.get("tools") : Json::array()},
            {"top_p", value_or_null(f.get("top_p"))},
            {"user", value_or_null(f.get("user"))}};
}

}  // namespace

ApiRequest parse_request(Endpoint endpoint, std::string_view body) {
  const Json j = parse_body(body);
  const Fields f(j);
  ApiRequest r;
  r.endpoint = endpoint;
  const std::optional<std::string> model = f.string("model");
  if (!model) throw bad_field("model", "required");
  r.model = *model;
  if (endpoint == Endpoint::kResponses)
    parse_responses(j, f, r);
  else
    parse_chat_or_completion(f, r);
  parse_sampling(f, r);
  r.stream = f.boolean("stream").value_or(false);
  return r;
}

size_t max_prompt_bytes(const Tokenizer& tokenizer, int64_t max_model_len) {
  // A token's string (byte-level BPE's "Ġthe", SentencePiece's "▁the" or "<0xE2>") is never
  // shorter than the bytes it stands for.
  size_t longest = 1;
  for (size_t id = 0; id < tokenizer.vocab_size(); ++id)
    if (const auto token = tokenizer.id_to_token(int32_t(id)))
      longest = std::max(longest, token->size());
  const size_t tokens = size_t(std::max<int64_t>(max_model_len, 1));
  if (tokens > SIZE_MAX / 4 / longest) return SIZE_MAX;
  return 4 * tokens * longest;
}

namespace {

// Refuses a prompt by its size in bytes alone, so that one that cannot fit costs no template
// rendering and no tokenizing.
void check_prompt_bytes(size_t bytes, size_t limit, const char* field, int64_t max_model_len) {
  if (bytes <= limit) return;
  throw ApiError(400,
                 std::string(field) + ": the prompt is " + std::to_string(bytes) +
                     " bytes, more than a prompt of this model's maximum context length of " +
                     std::to_string(max_model_len) + " tokens can hold (" + std::to_string(limit) +
                     " bytes)",
                 field, "context_length_exceeded");
}

// The bytes of text in chat messages: each content string, and each string in a content list.
size_t message_bytes(const Json& messages) {
  size_t bytes = 0;
  const std::function<void(const Json&)> add = [&](const Json& v) {
    if (v.is_string()) {
      bytes += v.get_ref<const std::string&>().size();
    } else if (v.is_array() || v.is_object()) {
      for (const Json& item : v) add(item);
    }
  };
  add(messages);
  return bytes;
}

// What each endpoint calls the fields that every endpoint has, for errors.
struct FieldNames {
  const char *prompt, *max_tokens, *effort;
};

FieldNames field_names(Endpoint endpoint) {
  switch (endpoint) {
    case Endpoint::kChatCompletions:
      return {"messages", "max_tokens", "reasoning_effort"};
    case Endpoint::kCompletions:
      return {"prompt", "max_tokens", "reasoning_effort"};
    case Endpoint::kResponses:
      break;
  }
  return {"input", "max_output_tokens", "reasoning.effort"};
}

// The template's variables beyond the messages and tools: chat_template_kwargs, and the request's
// reasoning effort under the names the template reads. The template's text is searched for them,
// as vLLM keeps only the variables a template declares.
Json chat_template_kwargs(const ApiRequest& r, const std::string& chat_template) {
  Json kwargs = r.template_kwargs;
  if (!r.reasoning_effort) return kwargs;
  const bool effort = chat_template.find("reasoning_effort") != std::string::npos;
  const bool thinking = chat_template.find("enable_thinking") != std::string::npos;
  const std::string field = field_names(r.endpoint).effort;
  if (!effort && !thinking)
    throw ApiError(400,
                   field +
                       ": this model's chat template reads neither reasoning_effort nor "
                       "enable_thinking, so it cannot be told the effort; leave the field out",
                   field);
  if (effort) kwargs["reasoning_effort"] = *r.reasoning_effort;
  if (thinking && !kwargs.contains("enable_thinking"))
    kwargs["enable_thinking"] = *r.reasoning_effort != "none";
  return kwargs;
}

// A chat's prompt: the template rendered over the messages and tools, its bytes checked before
// and after.
std::vector<int32_t> chat_prompt(const ApiRequest& r, const Tokenizer& tokenizer,
                                 int64_t max_model_len, size_t max_prompt_bytes) {
  const char* field = field_names(r.endpoint).prompt;
  check_prompt_bytes(message_bytes(r.messages), max_prompt_bytes, field, max_model_len);
  std::string text;
  try {
    text = tokenizer.apply_chat_template(r.messages, /*add_generation_prompt=*/true, r.tools,
                                         chat_template_kwargs(r, tokenizer.chat_template()));
  } catch (const tformers::Error& e) {
    throw ApiError(
        400, std::string("the model's chat template failed on these messages: ") + e.what(), field);
  }
  check_prompt_bytes(text.size(), max_prompt_bytes, field, max_model_len);
  // The rendered template already holds its special tokens.
  return tokenizer.encode(text, /*add_special_tokens=*/false);
}

}  // namespace

ServingRequest to_engine_request(const ApiRequest& r, const Tokenizer& tokenizer,
                                 int64_t max_model_len, int64_t vocab_size, size_t max_prompt_bytes,
                                 size_t prompt) {
  const bool chat = is_chat(r.endpoint);
  const FieldNames names = field_names(r.endpoint);
  const char* prompt_field = names.prompt;
  ServingRequest out;
  if (chat) {
    out.prompt = chat_prompt(r, tokenizer, max_model_len, max_prompt_bytes);
  } else if (const ApiRequest::Prompt& p = r.prompts.at(prompt); p.is_ids) {
    for (size_t i = 0; i < p.ids.size(); ++i)
      if (p.ids[i] >= vocab_size)
        throw ApiError(400,
                       "prompt: token " + std::to_string(i) + " is " + std::to_string(p.ids[i]) +
                           ", outside the vocabulary [0, " + std::to_string(vocab_size) + ")",
                       prompt_field);
    out.prompt = p.ids;
  } else {
    check_prompt_bytes(p.text.size(), max_prompt_bytes, prompt_field, max_model_len);
    out.prompt = tokenizer.encode(p.text);
  }
  const int64_t prompt_len = int64_t(out.prompt.size());
  if (prompt_len == 0) throw ApiError(400, std::string(prompt_field) + ": empty", prompt_field);
  const std::string context =
      "this model's maximum context length is " + std::to_string(max_model_len) + " tokens";
  if (prompt_len >= max_model_len)
    throw ApiError(400,
                   std::string(prompt_field) + ": the prompt is " + std::to_string(prompt_len) +
                       " tokens, and " + context + ", prompt and completion together",
                   prompt_field, "context_length_exceeded");
  const int64_t room = max_model_len - prompt_len;
  int64_t max_tokens = room;
  if (r.max_tokens) {
    if (*r.max_tokens > room)
      throw ApiError(400,
                     std::string(names.max_tokens) + ": " + std::to_string(*r.max_tokens) +
                         " tokens were asked for, but the prompt is " + std::to_string(prompt_len) +
                         " tokens and " + context + ": at most " + std::to_string(room) +
                         " can be generated",
                     names.max_tokens, "context_length_exceeded");
    max_tokens = *r.max_tokens;
  } else if (!chat) {
    max_tokens = std::min<int64_t>(16, room);
  }
  for (const auto& [id, bias] : r.logit_bias)
    if (id >= vocab_size)
      throw ApiError(400,
                     "logit_bias: token " + std::to_string(id) + " is outside the vocabulary [0, " +
                         std::to_string(vocab_size) + "); keys are token ids of this model",
                     "logit_bias");
  out.config = r.config;
  out.config.max_new_tokens = max_tokens;
  out.logprobs = r.logprobs;
  out.top_logprobs = r.top_logprobs;
  out.presence_penalty = r.presence_penalty;
  out.frequency_penalty = r.frequency_penalty;
  out.logit_bias = r.logit_bias;
  out.json_schema = r.json_schema;
  return out;
}

ApiError model_not_served(const std::string& asked, const std::string& served) {
  return ApiError(404,
                  "model: '" + asked + "' is not served here; this server serves '" + served +
                      "' (GET /v1/models)",
                  "model", "model_not_found");
}

namespace {

// The request's object, its "model" (optional) checked against the one served.
Json parse_tokenizer_body(std::string_view body, const std::string& model) {
  Json j = parse_body(body);
  if (auto asked = Fields(j).string("model"); asked && *asked != model)
    throw model_not_served(*asked, model);
  return j;
}

// The text /tokenize encodes: the prompt, or the messages through the chat template.
std::string tokenize_text(const Fields& f, const Tokenizer& tokenizer, int64_t max_model_len,
                          size_t max_prompt_bytes) {
  const Json* messages = f.get("messages");
  const Json* prompt = f.get("prompt");
  if ((messages != nullptr) == (prompt != nullptr))
    throw ApiError(400, "give either prompt (a text) or messages (a chat)",
                   messages ? "messages" : "prompt");
  if (prompt) {
    if (!prompt->is_string()) throw bad_field("prompt", "expected a string, got " + shown(*prompt));
    check_prompt_bytes(prompt->get_ref<const std::string&>().size(), max_prompt_bytes, "prompt",
                       max_model_len);
    return prompt->get<std::string>();
  }
  if (!messages->is_array() || messages->empty())
    throw bad_field("messages", "expected a non-empty list of messages");
  Json chat = Json::array();
  for (size_t i = 0; i < messages->size(); ++i)
    chat.push_back(parse_message((*messages)[i], "messages[" + std::to_string(i) + "]"));
  check_prompt_bytes(message_bytes(chat), max_prompt_bytes, "messages", max_model_len);
  const Json tools =
      f.get("tools") ? parse_tools(*f.get("tools"), ToolShape::kNested) : Json(nullptr);
  Json kwargs = Json::object();
  if (const Json* k = f.get("chat_template_kwargs")) {
    if (!k->is_object()) throw bad_field("chat_template_kwargs", "expected an object");
    kwargs = *k;
  }
  try {
    return tokenizer.apply_chat_template(chat, f.boolean("add_generation_prompt").value_or(true),
                                         tools, kwargs);
  } catch (const tformers::Error& e) {
    throw ApiError(400,
                   std::string("the model's chat template failed on these messages: ") + e.what(),
                   "messages");
  }
}

}  // namespace

Json tokenize_json(std::string_view body, const std::string& model, const Tokenizer& tokenizer,
                   int64_t max_model_len, size_t max_prompt_bytes) {
  const Json j = parse_tokenizer_body(body, model);
  const Fields f(j);
  const std::string text = tokenize_text(f, tokenizer, max_model_len, max_prompt_bytes);
  // A rendered chat template holds its special tokens already (vLLM's defaults likewise).
  const bool special = f.boolean("add_special_tokens").value_or(!f.get("messages"));
  const std::vector<int32_t> ids = tokenizer.encode(text, special);
  Json out = {{"count", ids.size()},
              {"max_model_len", max_model_len},
              {"tokens", ids},
              {"token_strs", nullptr}};
  if (f.boolean("return_token_strs").value_or(false))
    out["token_strs"] = tokenizer.convert_ids_to_tokens(ids);
  return out;
}

Json detokenize_json(std::string_view body, const std::string& model, const Tokenizer& tokenizer,
                     int64_t vocab_size) {
  const Json j = parse_tokenizer_body(body, model);
  const Json* tokens = Fields(j).get("tokens");
  if (!tokens) throw bad_field("tokens", "required");
  if (!tokens->is_array()) throw bad_field("tokens", "expected a list of token ids");
  const std::vector<int32_t> ids = parse_ids(*tokens, "tokens");
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= vocab_size)
      throw bad_field("tokens", "token " + std::to_string(i) + " is " + std::to_string(ids[i]) +
                                    ", outside the vocabulary [0, " + std::to_string(vocab_size) +
                                    ")");
  return {{"prompt", tokenizer.decode(ids)}};
}

ServingRequest choice_request(ServingRequest request, int64_t index) {
  if (request.config.seed) *request.config.seed += uint64_t(index);
  return request;
}

OutputText::OutputText(const Tokenizer& tokenizer, std::vector<std::string> stop, KeptTokens kept)
    : streamer_(tokenizer, /*skip_special_tokens=*/true),
      stop_(std::move(stop)),
      kept_(std::move(kept)) {}

std::string OutputText::put(int32_t token) {
  if (stopped_) return "";
  const auto kept =
      std::find_if(kept_.begin(), kept_.end(), [&](const auto& k) { return k.first == token; });
  if (kept != kept_.end())
    held_ += streamer_.end() + kept->second;  // the text before it, then its own
  else
    held_ += streamer_.put(token);
  return release(/*final=*/false);
}

std::string OutputText::finish() {
  if (stopped_) return "";
  held_ += streamer_.end();
  return release(/*final=*/true);
}

// Sent text never holds the start of a stop string (that part is held back), so a stop string
// can only begin in held_.
std::string OutputText::release(bool final) {
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) cut = std::min(cut, held_.find(s));
  size_t keep = 0;
  if (cut != std::string::npos) {
    stopped_ = true;
    held_.resize(cut);
  } else if (!final) {
    // Hold back the longest end of the text that begins some stop string.
    for (const std::string& s : stop_)
      for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
        if (std::string_view(held_).ends_with(std::string_view(s).substr(0, k))) {
          keep = k;
          break;
        }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, out.size());
  sent_ += out.size();
  return out;
}

Json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {

std::string token_text(const Tokenizer& tok, int32_t id) {
  return tok.decode(std::span<const int32_t>(&id, 1));
}

// A token as chat's logprobs write it; `bytes` because a token may be part of a character.
Json chat_token(const Tokenizer& tok, int32_t id, float logprob) {
  const std::string text = token_text(tok, id);
  Json bytes = Json::array();
  for (unsigned char c : text) bytes.push_back(int(c));
  return {{"token", text}, {"logprob", logprob}, {"bytes", bytes}};
}

}  // namespace

Json logprobs_json(Endpoint endpoint, const Tokenizer& tok, std::span<const ServingEvent> events,
                   std::span<const size_t> text_offsets) {
  if (endpoint == Endpoint::kChatCompletions) {
    Json content = Json::array();
    for (const ServingEvent& e : events) {
      Json entry = chat_token(tok, e.token, e.logprob);
      entry["top_logprobs"] = Json::array();
      for (const TokenLogprob& alt : e.top_logprobs)
        entry["top_logprobs"].push_back(chat_token(tok, alt.token, alt.logprob));
      content.push_back(std::move(entry));
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  Json tokens = Json::array(), logprobs = Json::array(), top = Json::array();
  for (const ServingEvent& e : events) {
    tokens.push_back(token_text(tok, e.token));
    logprobs.push_back(e.logprob);
    Json alts = Json::object();
    for (const TokenLogprob& alt : e.top_logprobs) alts[token_text(tok, alt.token)] = alt.logprob;
    top.push_back(std::move(alts));
  }
  return {{"tokens", tokens},
          {"token_logprobs", logprobs},
          {"top_logprobs", top},
          {"text_offset", Json(std::vector<size_t>(text_offsets.begin(), text_offsets.end()))}};
}

std::string new_id(std::string_view prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  char hex[25];
  {
    std::lock_guard lock(mu);
    std::snprintf(hex, sizeof hex, "%016llx%08llx", (unsigned long long)rng(),
                  (unsigned long long)(rng() & 0xffffffff));
  }
  return std::string(prefix) + hex;
}

ResponseHead new_response_head(Endpoint endpoint, const std::string& model) {
  const char* prefix = endpoint == Endpoint::kChatCompletions ? "chatcmpl-"
                       : endpoint == Endpoint::kCompletions   ? "cmpl-"
                                                              : "resp_";
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return {endpoint, new_id(prefix), std::chrono::duration_cast<std::chrono::seconds>(now).count(),
          model};
}

namespace {

Json head_json(const ResponseHead& h, bool chunk) {
  const bool chat = h.endpoint == Endpoint::kChatCompletions;
  return {
      {"id", h.id},
      {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
      {"created", h.created},
      {"model", h.model}};
}

}  // namespace

namespace {

Json tool_call_json(const ToolCall& call) {
  return {{"id", call.id},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

// Reasoning under both names clients read it by (see ChoiceOutput).
void add_reasoning(Json& j, const std::string& reasoning) {
  if (reasoning.empty()) return;
  j["reasoning_content"] = reasoning;
  j["reasoning"] = reasoning;
}

Json message_json(const ChoiceOutput& c) {
  Json message = {{"role", "assistant"}, {"content", c.text}};
  add_reasoning(message, c.reasoning);
  if (c.tool_calls.empty()) return message;
  if (c.text.empty()) message["content"] = nullptr;
  message["tool_calls"] = Json::array();
  for (const ToolCall& call : c.tool_calls) message["tool_calls"].push_back(tool_call_json(call));
  return message;
}

}  // namespace

Json response_json(const ResponseHead& head, std::span<const ChoiceOutput> choices,
                   const Usage& usage) {
  Json list = Json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    Json choice = {{"index", i}};
    if (head.endpoint == Endpoint::kChatCompletions)
      choice["message"] = message_json(choices[i]);
    else
      choice["text"] = choices[i].text;
    choice["logprobs"] = choices[i].logprobs;
    choice["finish_reason"] = choices[i].finish_reason;
    list.push_back(std::move(choice));
  }
  Json j = head_json(head, /*chunk=*/false);
  j["choices"] = std::move(list);
  j["usage"] = usage_json(usage);
  return j;
}

Json chunk_json(const ResponseHead& head, const Chunk& c) {
  Json choice = {{"index", c.index}};
  if (head.endpoint == Endpoint::kChatCompletions) {
    Json delta = Json::object();
    if (c.first) delta["role"] = "assistant";
    if (c.first || !c.text.empty()) delta["content"] = c.text;
    add_reasoning(delta, c.reasoning);
    for (size_t k = 0; k < c.tool_calls.size(); ++k) {
      Json call = {{"index", c.first_tool_call + k}};
      call.update(tool_call_json(c.tool_calls[k]));
      delta["tool_calls"].push_back(std::move(call));
    }
    choice["delta"] = delta;
  } else {
    choice["text"] = c.text;
  }
  choice["logprobs"] = c.logprobs;
  choice["finish_reason"] = c.finish_reason ? Json(*c.finish_reason) : Json(nullptr);
  Json j = head_json(head, /*chunk=*/true);
  j["choices"] = Json::array({choice});
  if (c.usage_null) j["usage"] = nullptr;
  return j;
}

Json usage_chunk_json(const ResponseHead& head, const Usage& usage) {
  Json j = head_json(head, /*chunk=*/true);
  j["choices"] = Json::array();
  j["usage"] = usage_json(usage);
  return j;
}

std::string dump(const Json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

std::string sse_event(const Json& j) { return "data: " + dump(j) + "\n\n"; }

}  // namespace tformers::serve
