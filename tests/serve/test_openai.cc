// tformers serve's OpenAI layer without a server: every bad field of a request is a 400 naming
// it, sampling fields map onto GenerationConfig, prompts are checked against the context, stop
// strings cut the text as OpenAI cuts it, and responses and stream chunks have OpenAI's shape.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/error_of.h"
#include "io/json.h"
#include "serve/openai.h"
#include "tformers/tokenizer.h"

namespace tformers::serve {
namespace {

const std::string kModel = TFORMERS_SOURCE_DIR "/models/kjv-fortunes-tiny";

const Tokenizer& kjv() {
  static const Tokenizer tok = AutoTokenizer::from_pretrained(kModel);
  return tok;
}

// A chat body with `extra` fields merged in.
std::string chat(const Json& extra = Json::object()) {
  Json j = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "Hello"}}}}};
  j.update(extra);
  return j.dump();
}

std::string completion(const Json& extra = Json::object()) {
  Json j = {{"model", "m"}, {"prompt", "And the LORD said"}};
  j.update(extra);
  return j.dump();
}

ApiError error_of(Endpoint endpoint, const std::string& body) {
  try {
    parse_request(endpoint, body);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << body;
  return ApiError(0, "");
}

const Json WEATHER = {{"type", "function"},
                      {"function",
                       {{"name", "get_weather"},
                        {"parameters", {{"type", "object"}, {"properties", Json::object()}}}}}};

struct BadField {
  Endpoint endpoint;
  std::string body;
  std::string param;  // the field the 400 must name
};

TEST(OpenAiRequest, EveryBadFieldIsA400NamingIt) {
  const Endpoint c = Endpoint::kChatCompletions, p = Endpoint::kCompletions;
  const std::vector<BadField> cases = {
      {c, R"({"messages": [{"role": "user", "content": "x"}]})", "model"},
      {c, R"({"model": 3, "messages": []})", "model"},
      {c, R"({"model": "m"})", "messages"},
      {c, R"({"model": "m", "messages": []})", "messages"},
      {c, R"({"model": "m", "messages": "hi"})", "messages"},
      {c, R"({"model": "m", "messages": [3]})", "messages[0]"},
      {c, R"({"model": "m", "messages": [{"content": "x"}]})", "messages[0].role"},
      {c, R"({"model": "m", "messages": [{"role": "king", "content": "x"}]})", "messages[0].role"},
      {c, R"({"model": "m", "messages": [{"role": "user"}]})", "messages[0].content"},
      {c, R"({"model": "m", "messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {c,
       R"({"model": "m", "messages": [{"role": "user", "content": "a"},
           {"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       "messages[1].content[0]"},
      {c, R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}]}]})",
       "messages[0].content[0].text"},
      {c, chat({{"tools", "f"}}), "tools"},
      {c, chat({{"tools", {1}}}), "tools[0]"},
      {c, chat({{"tool_choice", "required"}}), "tool_choice"},
      {c, chat({{"tools", {{{"type", "retrieval"}}}}}), "tools[0].type"},
      {c, chat({{"tools", {{{"function", {{"name", "f"}}}}}}}), "tools[0].type"},
      {c, chat({{"tools", {{{"type", "function"}}}}}), "tools[0].function"},
      {c, chat({{"tools", {{{"type", "function"}, {"function", {{"name", ""}}}}}}}),
       "tools[0].function.name"},
      {c, chat({{"tools", {{{"type", "function"}, {"function", {{"name", 5}}}}}}}),
       "tools[0].function.name"},
      {c, chat({{"tools", {{{"type", "function"}, {"function", {{"name", "a b"}}}}}}}),
       "tools[0].function.name"},
      {c,
       chat({{"tools", {{{"type", "function"}, {"function", {{"name", std::string(65, 'a')}}}}}}}),
       "tools[0].function.name"},
      {c, chat({{"tools", {WEATHER, WEATHER}}}), "tools[1].function.name"},
      {c,
       chat({{"tools",
              {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", "{}"}}}}}}}),
       "tools[0].function.parameters"},
      {c,
       chat({{"tools",
              {{{"type", "function"}, {"function", {{"name", "f"}, {"description", 1}}}}}}}),
       "tools[0].function.description"},
      {c, chat({{"tools", Json(std::vector<Json>(129, WEATHER))}}), "tools"},
      {c,
       chat({{"tools", {WEATHER}},
             {"tool_choice", "required"},
             {"response_format", {{"type", "json_object"}}}}),
       "tool_choice"},
      {c,
       chat({{"tools",
              {{{"type", "function"},
                {"function",
                 {{"name", "f"}, {"parameters", {{"type", "string"}, {"format", "date"}}}}}}}},
             {"tool_choice", "required"}}),
       "tools"},
      {c, chat({{"tools", {WEATHER}}, {"tool_choice", "any"}}), "tool_choice"},
      {c, chat({{"tools", {WEATHER}}, {"tool_choice", 3}}), "tool_choice"},
      {c, chat({{"tools", {WEATHER}}, {"tool_choice", {{"type", "function"}}}}), "tool_choice"},
      {c,
       chat({{"tools", {WEATHER}},
             {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}),
       "tool_choice"},
      {c, chat({{"tools", {WEATHER}}, {"parallel_tool_calls", "no"}}), "parallel_tool_calls"},
      {c, chat({{"chat_template_kwargs", 1}}), "chat_template_kwargs"},
      {c, chat({{"logprobs", "yes"}}), "logprobs"},
      {c, chat({{"top_logprobs", 2}}), "top_logprobs"},
      {c, chat({{"logprobs", true}, {"top_logprobs", 21}}), "top_logprobs"},
      {c, chat({{"max_completion_tokens", 0}}), "max_completion_tokens"},
      {c, chat({{"max_tokens", 1.5}}), "max_tokens"},
      {c, chat({{"max_tokens", -3}}), "max_tokens"},
      {c, chat({{"max_tokens", 18446744073709551615ull}}), "max_tokens"},
      {c, chat({{"temperature", "hot"}}), "temperature"},
      {c, chat({{"temperature", 2.5}}), "temperature"},
      {c, chat({{"temperature", -1}}), "temperature"},
      {c, chat({{"top_p", 0}}), "top_p"},
      {c, chat({{"top_p", 1.5}}), "top_p"},
      {c, chat({{"top_k", -2}}), "top_k"},
      {c, chat({{"min_p", 2}}), "min_p"},
      {c, chat({{"repetition_penalty", 0}}), "repetition_penalty"},
      // Accepted once, then 0 as a float and an internal error (HTTP 500) in the engine.
      {c, chat({{"temperature", 1e-300}}), "temperature"},
      {c, chat({{"repetition_penalty", 1e-300}}), "repetition_penalty"},
      {c, chat({{"seed", "1"}}), "seed"},
      {c, chat({{"seed", 1.5}}), "seed"},
      {c, chat({{"ignore_eos", 1}}), "ignore_eos"},
      {c, chat({{"stop", 3}}), "stop"},
      {c, chat({{"stop", {"a", 3}}}), "stop"},
      {c, chat({{"stop", ""}}), "stop"},
      {c, chat({{"stop", {"a", "b", "c", "d", "e"}}}), "stop"},
      {c, chat({{"n", 0}}), "n"},
      {c, chat({{"n", 17}}), "n"},
      {c, chat({{"n", "1"}}), "n"},
      {p, completion({{"n", 1.5}}), "n"},
      {c, chat({{"frequency_penalty", 2.5}}), "frequency_penalty"},
      {c, chat({{"frequency_penalty", "1"}}), "frequency_penalty"},
      {c, chat({{"presence_penalty", -2.01}}), "presence_penalty"},
      {p, completion({{"presence_penalty", 3}}), "presence_penalty"},
      {c, chat({{"logit_bias", {1, 2}}}), "logit_bias"},
      {c, chat({{"logit_bias", {{"the", 10}}}}), "logit_bias"},
      {c, chat({{"logit_bias", {{"-1", 10}}}}), "logit_bias"},
      {c, chat({{"logit_bias", {{"1.5", 10}}}}), "logit_bias"},
      {c, chat({{"logit_bias", {{"", 10}}}}), "logit_bias"},
      {c, chat({{"logit_bias", {{"4294967296", 10}}}}), "logit_bias"},
      {c, chat({{"logit_bias", {{"42", "10"}}}}), "logit_bias"},
      {c, chat({{"logit_bias", {{"42", 100.5}}}}), "logit_bias"},
      {p, completion({{"logit_bias", {{"42", -101}}}}), "logit_bias"},
      {p, completion({{"logit_bias", {{"7", 1}, {"007", 2}}}}), "logit_bias"},
      {c, chat({{"response_format", {{"type", "json"}}}}), "response_format"},
      {c, chat({{"response_format", {{"type", 5}}}}), "response_format"},
      {c, chat({{"response_format", "text"}}), "response_format"},
      {c, chat({{"response_format", {{"type", "json_schema"}}}}), "response_format"},
      {p,
       completion(
           {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}}),
       "response_format"},
      {c,
       chat({{"response_format",
              {{"type", "json_schema"},
               {"json_schema", {{"name", 5}, {"schema", Json::object()}}}}}}),
       "response_format"},
      {c,
       chat({{"response_format",
              {{"type", "json_schema"},
               {"json_schema",
                {{"name", "x"}, {"schema", {{"type", "string"}, {"pattern", "a"}}}}}}}}),
       "response_format"},
      {c, chat({{"stream", "true"}}), "stream"},
      {c, chat({{"stream_options", true}}), "stream_options"},
      {c, chat({{"stream", true}, {"stream_options", {{"include_usage", 1}}}}),
       "stream_options.include_usage"},
      {p, R"({"model": "m"})", "prompt"},
      {p, completion({{"prompt", 3}}), "prompt"},
      {p, completion({{"prompt", {"a", 3}}}), "prompt"},
      {p, completion({{"prompt", {1, -2}}}), "prompt"},
      {p, completion({{"prompt", {1, 2.5}}}), "prompt"},
      {p, completion({{"prompt", {1, 4294967296ll}}}), "prompt"},
      {p, completion({{"logprobs", true}}), "logprobs"},
      {p, completion({{"logprobs", 21}}), "logprobs"},
      {p, completion({{"echo", true}}), "echo"},
      {p, completion({{"suffix", "end"}}), "suffix"},
      {p, completion({{"best_of", 2}}), "best_of"},
      {p, completion({{"max_tokens", 0}}), "max_tokens"},
  };
  for (const BadField& bad : cases) {
    const ApiError e = error_of(bad.endpoint, bad.body);
    EXPECT_EQ(e.status(), 400) << bad.body;
    EXPECT_EQ(e.param(), bad.param) << bad.body << ": " << e.what();
    EXPECT_EQ(std::string(e.what()).rfind(bad.param + ": ", 0), 0u) << e.what();
  }
}

TEST(OpenAiRequest, ToolsAreTakenAndForcedCallsConstrainTheOutput) {
  ApiRequest r = parse_request(Endpoint::kChatCompletions,
                               chat({{"tools", {WEATHER}}, {"parallel_tool_calls", false}}));
  EXPECT_EQ(r.tools, Json::array({WEATHER}));
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_EQ(r.forced_calls.kind, ForcedCalls::kNone);
  EXPECT_FALSE(r.json_schema);
  r = parse_request(Endpoint::kChatCompletions,
                    chat({{"tools", {WEATHER}}, {"tool_choice", "auto"}}));
  EXPECT_TRUE(r.parallel_tool_calls);
  EXPECT_EQ(r.tools.size(), 1u);
  // "none": the template is not shown the tools.
  r = parse_request(Endpoint::kChatCompletions,
                    chat({{"tools", {WEATHER}}, {"tool_choice", "none"}}));
  EXPECT_TRUE(r.tools.is_null());
  // A named function: the output is its arguments, as its parameters describe them.
  r = parse_request(
      Endpoint::kChatCompletions,
      chat({{"tools", {WEATHER}},
            {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}));
  EXPECT_EQ(r.forced_calls.kind, ForcedCalls::kArguments);
  EXPECT_EQ(r.forced_calls.name, "get_weather");
  ASSERT_TRUE(r.json_schema);
  EXPECT_EQ(*r.json_schema, WEATHER["function"]["parameters"]);
  EXPECT_EQ(r.tools, Json::array({WEATHER}));  // still shown to the template
  // "required": a list of calls, one of them without parallel_tool_calls; a function without
  // parameters takes any object.
  const Json bare = {{"type", "function"}, {"function", {{"name", "now"}}}};
  r = parse_request(Endpoint::kChatCompletions, chat({{"tools", {WEATHER, bare}},
                                                      {"tool_choice", "required"},
                                                      {"parallel_tool_calls", false}}));
  EXPECT_EQ(r.forced_calls.kind, ForcedCalls::kList);
  ASSERT_TRUE(r.json_schema);
  const Json& list = *r.json_schema;
  EXPECT_EQ(list["type"], "array");
  EXPECT_EQ(list["minItems"], 1);
  EXPECT_EQ(list["maxItems"], 1);
  ASSERT_EQ(list["items"]["anyOf"].size(), 2u);
  const Json& first = list["items"]["anyOf"][0];
  EXPECT_EQ(first["properties"]["name"], Json({{"const", "get_weather"}}));
  EXPECT_EQ(first["properties"]["arguments"], WEATHER["function"]["parameters"]);
  EXPECT_EQ(first["required"], Json::array({"name", "arguments"}));
  EXPECT_EQ(list["items"]["anyOf"][1]["properties"]["arguments"], Json({{"type", "object"}}));
  const ApiError unknown =
      error_of(Endpoint::kChatCompletions,
               chat({{"tools", {WEATHER}},
                     {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}));
  EXPECT_NE(std::string(unknown.what()).find("\"nope\" is not among"), std::string::npos)
      << unknown.what();
  const ApiError bad_parameters =
      error_of(Endpoint::kChatCompletions,
               chat({{"tools",
                      {{{"type", "function"},
                        {"function",
                         {{"name", "f"}, {"parameters", {{"type", "integer"}, {"minimum", 0}}}}}}}},
                     {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}}));
  EXPECT_CONTAINS(bad_parameters.what(), "\"minimum\" is not supported");
}

TEST(OpenAiRequest, MalformedBodiesAre400s) {
  for (const std::string body :
       {"", "{", "[1]", "\"text\"", "{\"model\": }", "{\"model\": \"m\", \"seed\": 1e99999}"}) {
    const ApiError e = error_of(Endpoint::kCompletions, body);
    EXPECT_EQ(e.status(), 400) << body;
    EXPECT_EQ(e.type(), "invalid_request_error");
  }
  // Deep nesting is refused before anything recurses over it.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_CONTAINS(
      error_of(Endpoint::kChatCompletions, chat().insert(1, "\"x\": " + deep + ", ")).what(),
      "nests deeper");
}

// A completion body with `keys` top-level fields beyond its own ("k0": 0, ...).
std::string body_with_keys(size_t keys) {
  std::string body = completion();
  body.pop_back();
  for (size_t i = 0; i < keys; ++i) body += ",\"k" + std::to_string(i) + "\":" + std::to_string(i);
  return body + "}";
}

// The best of `runs` parses of a body, in seconds.
double parse_seconds(const std::string& body, int runs) {
  double best = 1e9;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    parse_request(Endpoint::kCompletions, body);
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

TEST(OpenAiRequest, BodiesParseInTimeLinearInTheirKeys) {
  // ordered_json's own parser scanned an object's keys for each new one: 80,000 keys took 17 s,
  // 4.1 s for 40,000. Four times the keys must take about four times as long, not sixteen: under
  // ten times, since the larger object outgrows the caches (6 times was seen on a loaded machine;
  // the best of three runs of each, so that its pauses count less).
  const double small = parse_seconds(body_with_keys(20000), 3);
  const double large = parse_seconds(body_with_keys(80000), 3);
  std::printf("20,000 keys: %.4f s; 80,000 keys: %.4f s\n", small, large);
  EXPECT_LT(large, 10 * std::max(small, 1e-3)) << small << " s, then " << large << " s";
  // The 3.5 MB body of 300,000 keys that held a worker for minutes: 0.24 s in a release build
  // (2026-12-07), and up to 6 s under AddressSanitizer on a loaded machine; the bound is for
  // those minutes.
  EXPECT_LT(parse_seconds(body_with_keys(300000), 1), 60);
}

TEST(OpenAiRequest, KeysKeepTheirOrderAndARepeatedKeyItsLastValue) {
  // As ordered_json's own parser reads them: document order; a key given twice keeps its first
  // place and its last value; in small objects and in those past the index's threshold alike.
  std::string many = "{";
  for (int i = 0; i < 40; ++i)
    many += "\"k" + std::to_string(i % 30) + "\":" + std::to_string(i) + ",";
  many += "\"nested\":{\"b\":[1,{\"z\":1,\"a\":2,\"z\":3}],\"a\":null}}";
  for (const std::string& text :
       {many, std::string(R"({"b": 1, "a": 2, "b": 3})"), std::string(R"([{"x": {}}, [], "s"])")}) {
    const Json got = io::parse_ordered_json(text, "body");
    EXPECT_EQ(got.dump(), Json::parse(text).dump()) << text;
  }
  EXPECT_CONTAINS(error_of(Endpoint::kCompletions, R"({"model": "m", "a": })").what(),
                  "the request body:1:21: malformed JSON");
}

TEST(OpenAiRequest, ErrorBodyHasOpenAisShape) {
  const Json j = Json::parse(ApiError(400, "top_p: bad", "top_p").body());
  EXPECT_EQ(j["error"]["message"], "top_p: bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "top_p");
  EXPECT_TRUE(j["error"]["code"].is_null());
  const Json server = Json::parse(ApiError(503, "busy", "", "server_busy").body());
  EXPECT_EQ(server["error"]["type"], "server_error");
  EXPECT_TRUE(server["error"]["param"].is_null());
  EXPECT_EQ(server["error"]["code"], "server_busy");
}

TEST(OpenAiRequest, SamplingFieldsMapOntoGenerationConfig) {
  // Nothing given: every sampling field comes from generation_config.json.
  ApiRequest r = parse_request(Endpoint::kChatCompletions, chat());
  EXPECT_FALSE(r.config.do_sample);
  EXPECT_FALSE(r.config.temperature);
  EXPECT_FALSE(r.config.top_p);
  EXPECT_FALSE(r.config.seed);
  // temperature 0: greedy.
  r = parse_request(Endpoint::kChatCompletions, chat({{"temperature", 0}}));
  EXPECT_EQ(r.config.do_sample, false);
  EXPECT_FALSE(r.config.temperature);
  // A temperature, or top_p alone, samples.
  r = parse_request(Endpoint::kChatCompletions, chat({{"temperature", 0.7}, {"seed", 5}}));
  EXPECT_EQ(r.config.do_sample, true);
  EXPECT_EQ(r.config.temperature, 0.7);
  EXPECT_EQ(r.config.seed, 5u);
  r = parse_request(Endpoint::kChatCompletions, chat({{"top_p", 0.9}}));
  EXPECT_EQ(r.config.do_sample, true);
  EXPECT_EQ(r.config.top_p, 0.9);
  // temperature 0 wins over top_p.
  r = parse_request(Endpoint::kChatCompletions, chat({{"temperature", 0}, {"top_p", 0.9}}));
  EXPECT_EQ(r.config.do_sample, false);
  // vLLM's extras; top_k -1 means all, as 0 does in GenerationConfig.
  r = parse_request(Endpoint::kCompletions, completion({{"top_k", -1},
                                                        {"min_p", 0.05},
                                                        {"repetition_penalty", 1.1},
                                                        {"ignore_eos", true},
                                                        {"seed", -1}}));
  EXPECT_EQ(r.config.top_k, 0);
  EXPECT_EQ(r.config.min_p, 0.05);
  EXPECT_EQ(r.config.repetition_penalty, 1.1);
  EXPECT_EQ(r.config.eos_token_id, std::vector<int64_t>{});
  EXPECT_EQ(r.config.seed, uint64_t(-1));
  // OpenAI's penalties, logit_bias and n.
  r = parse_request(Endpoint::kChatCompletions, chat({{"presence_penalty", -2},
                                                      {"frequency_penalty", 1.5},
                                                      {"logit_bias", {{"42", 100}, {"7", -0.5}}},
                                                      {"n", 16}}));
  EXPECT_EQ(r.presence_penalty, -2);
  EXPECT_EQ(r.frequency_penalty, 1.5);
  EXPECT_EQ(r.logit_bias, (std::vector<std::pair<int32_t, float>>{{42, 100.0f}, {7, -0.5f}}));
  EXPECT_EQ(r.n, 16);
  // Null is absent; defaults are accepted.
  r = parse_request(Endpoint::kChatCompletions, chat({{"temperature", nullptr},
                                                      {"n", 1},
                                                      {"presence_penalty", nullptr},
                                                      {"logit_bias", Json::object()},
                                                      {"response_format", {{"type", "text"}}},
                                                      {"user", "someone"}}));
  EXPECT_FALSE(r.config.do_sample);
  EXPECT_EQ(r.n, 1);
  EXPECT_EQ(r.presence_penalty, 0);
  EXPECT_TRUE(r.logit_bias.empty());
}

TEST(OpenAiRequest, LogitBiasIsBoundedInEntriesAndIds) {
  Json bias = Json::object();
  for (size_t id = 0; id < kMaxLogitBias; ++id) bias[std::to_string(id)] = 1;
  EXPECT_EQ(
      parse_request(Endpoint::kCompletions, completion({{"logit_bias", bias}})).logit_bias.size(),
      kMaxLogitBias);
  bias[std::to_string(kMaxLogitBias)] = 1;
  const ApiError e = error_of(Endpoint::kCompletions, completion({{"logit_bias", bias}}));
  EXPECT_EQ(e.param(), "logit_bias");
  EXPECT_CONTAINS(e.what(), "at most 1024 tokens can be biased, got 1025");
  // The message says what a key must be.
  EXPECT_CONTAINS(
      error_of(Endpoint::kCompletions, completion({{"logit_bias", {{"the", 1}}}})).what(),
      "logit_bias: key \"the\" is not a token id; keys are token ids written as decimal strings");
  // Ids are checked against the model's vocabulary once it is known.
  const ApiRequest r =
      parse_request(Endpoint::kCompletions, completion({{"logit_bias", {{"4096", 1}}}}));
  try {
    to_engine_request(r, kjv(), 256, 4096);
    ADD_FAILURE() << "a token outside the vocabulary was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "logit_bias");
    EXPECT_EQ(std::string(e.what()),
              "logit_bias: token 4096 is outside the vocabulary [0, 4096); keys are token ids of "
              "this model");
  }
  const ServingRequest s = to_engine_request(
      parse_request(Endpoint::kCompletions, completion({{"logit_bias", {{"4095", -100}}},
                                                        {"presence_penalty", 0.5},
                                                        {"frequency_penalty", -0.5}})),
      kjv(), 256, 4096);
  EXPECT_EQ(s.logit_bias, (std::vector<std::pair<int32_t, float>>{{4095, -100.0f}}));
  EXPECT_EQ(s.presence_penalty, 0.5);
  EXPECT_EQ(s.frequency_penalty, -0.5);
}

// A tool round trip as the openai SDK sends it back: the assistant's message has content null
// (or none) beside its tool_calls. The shipped model's template reads message['content'] on every
// message; it renders the call's turn as empty rather than failing with a 400.
TEST(OpenAiRequest, ToolRoundTripWithNullContentRenders) {
  for (const char* content : {R"("content": null, )", ""}) {
    const ApiRequest r = parse_request(
        Endpoint::kChatCompletions,
        std::string(R"({"model": "m", "tools": [{"type": "function", "function": {"name": "f"}}],
          "messages": [{"role": "user", "content": "Weather?"},
            {"role": "assistant", )") +
            content + R"("tool_calls": [{"id": "call_1", "type": "function",
              "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]})");
    const ServingRequest s = to_engine_request(r, kjv(), 256, 4096);
    EXPECT_CONTAINS(kjv().decode(s.prompt), "<|im_start|>assistant\n<|im_end|>");
    EXPECT_CONTAINS(kjv().decode(s.prompt), "sunny");
  }
}

TEST(OpenAiRequest, EachChoiceGetsItsOwnSeed) {
  ServingRequest r;
  r.prompt = {1, 2};
  r.config.seed = 10;
  EXPECT_EQ(choice_request(r, 0).config.seed, 10u);
  EXPECT_EQ(choice_request(r, 3).config.seed, 13u);
  EXPECT_EQ(choice_request(r, 3).prompt, r.prompt);
  r.config.seed = UINT64_MAX;
  EXPECT_EQ(choice_request(r, 2).config.seed, 1u);  // modulo 2^64
  // Without a seed each choice draws a fresh one in the engine.
  r.config.seed.reset();
  EXPECT_FALSE(choice_request(r, 1).config.seed);
}

TEST(OpenAiRequest, StopStreamAndLogprobFields) {
  ApiRequest r = parse_request(Endpoint::kChatCompletions, chat({{"stop", "\n"}}));
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(r.config.stop_strings, r.stop);
  r = parse_request(Endpoint::kChatCompletions, chat({{"stop", {"a", "b"}},
                                                      {"stream", true},
                                                      {"stream_options", {{"include_usage", true}}},
                                                      {"logprobs", true},
                                                      {"top_logprobs", 3}}));
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  r = parse_request(Endpoint::kCompletions, completion({{"logprobs", 2}}));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 2);
  r = parse_request(Endpoint::kCompletions, completion({{"logprobs", 0}}));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 0);
}

TEST(OpenAiRequest, MessagesAreReadAsTheTemplateTakesThem) {
  const ApiRequest r = parse_request(Endpoint::kChatCompletions,
                                     R"({"model": "m", "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "tool_calls": []}],
          "tools": [{"type": "function", "function": {"name": "f"}}],
          "chat_template_kwargs": {"enable_thinking": false}, "max_tokens": 7})");
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "a\nb");
  EXPECT_EQ(r.messages[2]["content"], "");
  EXPECT_TRUE(r.messages[2].contains("tool_calls"));
  EXPECT_EQ(r.tools[0]["function"]["name"], "f");
  EXPECT_EQ(r.template_kwargs["enable_thinking"], false);
  EXPECT_EQ(r.max_tokens, 7);
  // tool_choice "none" renders without the tools.
  EXPECT_TRUE(parse_request(Endpoint::kChatCompletions,
                            chat({{"tools", {WEATHER}}, {"tool_choice", "none"}}))
                  .tools.is_null());
}

TEST(OpenAiRequest, CompletionPromptForms) {
  ApiRequest r = parse_request(Endpoint::kCompletions, completion());
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "And the LORD said");
  EXPECT_FALSE(r.prompts[0].is_ids);
  r = parse_request(Endpoint::kCompletions, completion({{"prompt", {1, 2, 3}}}));
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(r.prompts[0].is_ids);
  r = parse_request(Endpoint::kCompletions, completion({{"prompt", {"one"}}}));
  EXPECT_EQ(r.prompts[0].text, "one");
  r = parse_request(Endpoint::kCompletions, completion({{"prompt", {{4, 5}}}}));
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{4, 5}));
  // OpenAI's batch forms: several prompts, each with its n choices.
  r = parse_request(Endpoint::kCompletions, completion({{"prompt", {"a", "b", "c"}}, {"n", 2}}));
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(r.prompts[2].text, "c");
  EXPECT_EQ(r.choices(), 6u);
  r = parse_request(Endpoint::kCompletions, completion({{"prompt", {{4, 5}, {6}}}}));
  EXPECT_EQ(r.prompts[1].ids, (std::vector<int32_t>{6}));
  // More sequences than one request may run is refused naming the batch.
  const ApiError e =
      error_of(Endpoint::kCompletions,
               completion({{"prompt", std::vector<std::string>(5, "x")}, {"n", 16}}));
  EXPECT_EQ(e.param(), "prompt");
  EXPECT_CONTAINS(e.what(), "80 sequences, more than the 64");
}

TEST(OpenAiRequest, EngineRequestRendersTheTemplateAndChecksTheContext) {
  const Tokenizer& tok = kjv();
  ApiRequest chat_request = parse_request(Endpoint::kChatCompletions, chat());
  ServingRequest s = to_engine_request(chat_request, tok, 256, 4096);
  const std::string rendered = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(s.prompt, tok.encode(rendered, false));
  // A chat completion without max_tokens may fill the context.
  EXPECT_EQ(s.config.max_new_tokens, 256 - int64_t(s.prompt.size()));

  ApiRequest text = parse_request(Endpoint::kCompletions, completion({{"temperature", 0}}));
  s = to_engine_request(text, tok, 256, 4096);
  EXPECT_EQ(s.prompt, tok.encode("And the LORD said"));
  EXPECT_EQ(s.config.max_new_tokens, 16);  // OpenAI's default for completions
  EXPECT_EQ(s.config.do_sample, false);
  const int64_t prompt_len = int64_t(s.prompt.size());
  // ... but never more than the context has room for.
  EXPECT_EQ(to_engine_request(text, tok, prompt_len + 3, 4096).config.max_new_tokens, 3);

  text.max_tokens = 10;
  EXPECT_EQ(to_engine_request(text, tok, prompt_len + 10, 4096).config.max_new_tokens, 10);
  try {
    to_engine_request(text, tok, prompt_len + 9, 4096);
    ADD_FAILURE() << "max_tokens over the context was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "max_tokens");
    EXPECT_EQ(e.code(), "context_length_exceeded");
    EXPECT_CONTAINS(e.what(), "at most 9 can be generated");
  }
  for (int64_t context : {prompt_len, prompt_len - 1}) {
    try {
      to_engine_request(text, tok, context, 4096);
      ADD_FAILURE() << "a prompt that fills the context was accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param(), "prompt");
      EXPECT_EQ(e.code(), "context_length_exceeded");
    }
  }
  ApiRequest empty = parse_request(Endpoint::kCompletions, completion({{"prompt", ""}}));
  EXPECT_EQ(testing::error_of<ApiError>([&] { to_engine_request(empty, tok, 256, 4096); }),
            "prompt: empty");
  ApiRequest ids = parse_request(Endpoint::kCompletions, completion({{"prompt", {7, 8}}}));
  EXPECT_EQ(to_engine_request(ids, tok, 256, 4096).prompt, (std::vector<int32_t>{7, 8}));
  ids = parse_request(Endpoint::kCompletions, completion({{"prompt", {7, 4096}}}));
  EXPECT_EQ(testing::error_of<ApiError>([&] { to_engine_request(ids, tok, 256, 4096); }),
            "prompt: token 1 is 4096, outside the vocabulary [0, 4096)");
}

// Feeds the tokens of `text` through OutputText and returns what a client would have been sent,
// piece by piece.
std::vector<std::string> pieces(const std::string& text, std::vector<std::string> stop,
                                bool* stopped = nullptr) {
  OutputText out(kjv(), std::move(stop));
  std::vector<std::string> sent;
  for (int32_t id : kjv().encode(text, false)) sent.push_back(out.put(id));
  sent.push_back(out.finish());
  if (stopped) *stopped = out.stopped();
  return sent;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& p : v) s += p;
  return s;
}

TEST(OpenAiOutput, TextIsCutBeforeTheFirstStopString) {
  bool stopped = false;
  EXPECT_EQ(joined(pieces("And the LORD said unto Moses", {"LORD"}, &stopped)), "And the ");
  EXPECT_TRUE(stopped);
  // The earliest of several, wherever it falls within a token.
  EXPECT_EQ(joined(pieces("And the LORD said unto Moses", {"Moses", "ai"}, &stopped)),
            "And the LORD s");
  EXPECT_EQ(joined(pieces("And the LORD said", {"xyz"}, &stopped)), "And the LORD said");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(joined(pieces("And the LORD said", {}, &stopped)), "And the LORD said");
}

TEST(OpenAiOutput, TextThatMayStartAStopStringIsHeldBack) {
  // " the" could be the start of "the LOST": it is held until " LORD" settles it.
  const std::vector<std::string> sent = pieces("And the LORD said", {"the LOST"});
  EXPECT_EQ(joined(sent), "And the LORD said");
  std::string so_far;
  for (const std::string& p : sent) {
    so_far += p;
    EXPECT_FALSE(so_far.ends_with("the")) << "sent the start of a stop string: " << so_far;
  }
  // At the end, held text is released.
  EXPECT_EQ(joined(pieces("And the", {"the LORD"})), "And the");
}

TEST(OpenAiOutput, SpecialTokensAreSkippedAndOffsetsCount) {
  OutputText out(kjv(), {});
  const std::vector<int32_t> ids = kjv().encode("Amen", false);
  std::string text;
  for (int32_t id : ids) text += out.put(id);
  const size_t before_eos = out.offset();
  text += out.put(*kjv().token_to_id("<|im_end|>"));
  text += out.finish();
  EXPECT_EQ(text, "Amen");
  EXPECT_EQ(before_eos, 4u);
  EXPECT_EQ(out.offset(), 4u);
}

ServingEvent token_event(int32_t id, float logprob, std::vector<TokenLogprob> top = {}) {
  ServingEvent e;
  e.token = id;
  e.logprob = logprob;
  e.top_logprobs = std::move(top);
  return e;
}

TEST(OpenAiResponse, ChatResponseAndChunks) {
  ResponseHead head = new_response_head(Endpoint::kChatCompletions, "kjv");
  EXPECT_EQ(head.id.rfind("chatcmpl-", 0), 0u);
  EXPECT_NE(head.id, new_response_head(Endpoint::kChatCompletions, "kjv").id);
  head.created = 1700000000;
  const std::vector<ChoiceOutput> one = {{"Amen", "stop", nullptr}};
  const Json r = response_json(head, one, {.prompt_tokens = 5, .completion_tokens = 2});
  EXPECT_EQ(
      dump(r),
      R"({"id":")" + head.id +
          R"(","object":"chat.completion","created":1700000000,"model":"kjv","choices":[{"index":0,"message":{"role":"assistant","content":"Amen"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":0}}})");

  const Json first = chunk_json(head, {.first = true});
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], (Json{{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(first.contains("usage"));
  const Json piece = chunk_json(head, {.text = " unto", .usage_null = true});
  EXPECT_EQ(piece["choices"][0]["delta"], (Json{{"content", " unto"}}));
  EXPECT_TRUE(piece.contains("usage") && piece["usage"].is_null());
  const Json last = chunk_json(head, {.finish_reason = "length"});
  EXPECT_EQ(last["choices"][0]["delta"], Json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  // With n > 1 each chunk says which choice it continues.
  EXPECT_EQ(chunk_json(head, {.index = 2, .text = "x"})["choices"][0]["index"], 2);
  const Json usage = usage_chunk_json(head, {.prompt_tokens = 3, .completion_tokens = 4});
  EXPECT_EQ(usage["choices"], Json::array());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);

  EXPECT_EQ(sse_event(Json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST(OpenAiResponse, CompletionResponseAndChunks) {
  ResponseHead head = new_response_head(Endpoint::kCompletions, "kjv");
  EXPECT_EQ(head.id.rfind("cmpl-", 0), 0u);
  const std::vector<ChoiceOutput> two = {{" unto Moses", "length", nullptr},
                                         {" unto Aaron", "stop", nullptr}};
  const Json r = response_json(head, two, {4, 2});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], " unto Moses");
  EXPECT_EQ(r["choices"][1]["index"], 1);
  EXPECT_EQ(r["choices"][1]["text"], " unto Aaron");
  EXPECT_EQ(r["choices"][1]["finish_reason"], "stop");
  EXPECT_FALSE(r["choices"][0].contains("message"));
  const Json chunk = chunk_json(head, {.text = " unto"});
  EXPECT_EQ(chunk["object"], "text_completion");
  EXPECT_EQ(chunk["choices"][0]["text"], " unto");
  EXPECT_FALSE(chunk["choices"][0].contains("delta"));
}

TEST(OpenAiResponse, InvalidUtf8BecomesReplacementCharacters) {
  EXPECT_EQ(dump(Json("a\xff")), "\"a\xEF\xBF\xBD\"");
}

TEST(OpenAiResponse, LogprobsInEachEndpointsShape) {
  const Tokenizer& tok = kjv();
  const int32_t the = tok.encode(" the", false).at(0), and_ = tok.encode(" and", false).at(0);
  const std::vector<ServingEvent> events = {token_event(the, -0.5f, {{the, -0.5f}, {and_, -1.25f}}),
                                            token_event(and_, -2.0f)};
  const std::vector<size_t> offsets = {0, 4};
  const Json chat = logprobs_json(Endpoint::kChatCompletions, tok, events, offsets);
  EXPECT_TRUE(chat["refusal"].is_null());
  ASSERT_EQ(chat["content"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["token"], " the");
  EXPECT_EQ(chat["content"][0]["logprob"], -0.5);
  EXPECT_EQ(chat["content"][0]["bytes"], (Json{32, 116, 104, 101}));
  EXPECT_EQ(chat["content"][0]["top_logprobs"][1]["token"], " and");
  EXPECT_EQ(chat["content"][0]["top_logprobs"][1]["logprob"], -1.25);
  EXPECT_EQ(chat["content"][1]["top_logprobs"], Json::array());

  const Json text = logprobs_json(Endpoint::kCompletions, tok, events, offsets);
  EXPECT_EQ(text["tokens"], (Json{" the", " and"}));
  EXPECT_EQ(text["token_logprobs"], (Json{-0.5, -2.0}));
  EXPECT_EQ(text["top_logprobs"][0], (Json{{" the", -0.5}, {" and", -1.25}}));
  EXPECT_EQ(text["text_offset"], (Json{0, 4}));
}

}  // namespace
}  // namespace tformers::serve
