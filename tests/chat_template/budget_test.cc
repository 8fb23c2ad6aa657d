// Total budgets of a render: memory (all strings and lists built) and steps (evaluations). Each
// runaway template below stays inside the per-value limits, so only the totals stop it; each
// error names the budget that ran out.
#include <gtest/gtest.h>

#include <chrono>

#include "tformers/error.h"
#include "tokenizer/jinja.h"

namespace {

using nlohmann::json;
using tformers::jinja::Limits;
using tformers::jinja::Template;

std::string budget_error(const std::string& src, Limits limits = {}) {
  try {
    std::string out = Template(src, limits).render(json::object());
    ADD_FAILURE() << "expected an error from " << src << ", rendered " << out.size() << " bytes";
  } catch (const tformers::FormatError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

TEST(JinjaBudgets, DoublingAListThirtyTimesRunsOutOfMemoryBudget) {
  auto start = std::chrono::steady_clock::now();
  EXPECT_CONTAINS(budget_error("{% set ns = namespace(a=[1]) %}{% for i in range(30) %}"
                               "{% set ns.a = ns.a + ns.a %}{% endfor %}{{ ns.a | length }}"),
                  "template exceeds its memory budget (max_memory_bytes) of 268435456 bytes");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(JinjaBudgets, AppendingLongListsRunsOutOfMemoryBudget) {
  // range() stops at 100000 items (the sandbox's MAX_RANGE); appending such lists does not.
  EXPECT_CONTAINS(budget_error("{% set ns = namespace(a=[]) %}{% for i in range(100) %}"
                               "{% set ns.a = ns.a + range(100000) | list %}{% endfor %}"),
                  "memory budget (max_memory_bytes)");
  // One item at a time: every concatenation copies the list, quadratic without a total bound.
  EXPECT_CONTAINS(budget_error("{% set ns = namespace(a=[]) %}{% for i in range(1000) %}"
                               "{% for j in range(1000) %}{% set ns.a = ns.a + [i] %}{% endfor %}"
                               "{% endfor %}"),
                  "memory budget (max_memory_bytes)");
}

// A list that holds itself twice, thirty times over, is a few hundred bytes of memory but 2^30
// leaves once converted to text: every conversion (tojson, printing, string, ~, join) is bounded
// by the output and memory budgets, and fails fast instead of running for minutes.
TEST(JinjaBudgets, DoublingASharedListThroughTojsonFailsFast) {
  // Jinja2 scopes a `set` inside a loop to one iteration: only a namespace carries the value from
  // one iteration to the next (or a macro recursing).
  const std::string doubled_by_copy =
      "{% set ns = namespace(a=[1]) %}{% for i in range(30) %}{% set ns.a = ns.a + ns.a %}"
      "{% endfor %}{% set a = ns.a %}";
  const std::string doubled_by_reference =
      "{% set ns = namespace(a=[1]) %}{% for i in range(30) %}{% set ns.a = [ns.a, ns.a] %}"
      "{% endfor %}{% set a = ns.a %}";
  const std::string dict_by_reference =
      "{% set ns = namespace(a={'k': 1}) %}{% for i in range(30) %}"
      "{% set ns.a = {'l': ns.a, 'r': ns.a} %}{% endfor %}{% set a = ns.a %}";
  const std::string doubled_by_macro =
      "{% macro twice(x, n) %}{% if n == 0 %}{{ x | tojson }}{% else %}"
      "{{ twice([x, x], n - 1) }}{% endif %}{% endmacro %}{% set a = twice([1], 30) %}";
  auto expect_fast_budget_error = [](const std::string& src) {
    auto start = std::chrono::steady_clock::now();
    EXPECT_CONTAINS(budget_error(src), "budget") << src;
    // Seconds, not the minutes and gigabytes of an unbounded conversion (sanitizer builds on a
    // loaded machine are the slow case).
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60)) << src;
  };
  for (const std::string& build :
       {doubled_by_copy, doubled_by_reference, dict_by_reference, doubled_by_macro})
    expect_fast_budget_error(build + "{{ a | tojson }}");
  for (const char* use : {"{{ a }}", "{{ [a, a] | join(',') }}"})
    expect_fast_budget_error(doubled_by_reference + use);
  // Without a namespace the loop doubles a copy local to each iteration, as in Jinja2.
  EXPECT_EQ(Template("{% set a = [1] %}{% for i in range(30) %}{% set a = a + a %}{% endfor %}"
                     "{{ a | tojson }}")
                .render(json::object()),
            "[1]");
}

TEST(JinjaBudgets, ComparingASharedListIsBoundedByTheStepBudget) {
  Limits limits;
  limits.max_steps = 1000000;
  // a == b walks both trees: 2^30 leaves, unless the step budget stops it.
  EXPECT_CONTAINS(budget_error("{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(30) %}"
                               "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}"
                               "{% endfor %}{{ ns.a == ns.b }}",
                               limits),
                  "step budget (max_steps)");
}

TEST(JinjaBudgets, LongRunningTemplateRunsOutOfStepBudget) {
  Limits limits;
  limits.max_steps = 100000;
  EXPECT_CONTAINS(budget_error("{% for a in range(1000) %}{% for b in range(1000) %}{{ a + b }}"
                               "{% endfor %}{% endfor %}",
                               limits),
                  "template exceeds its step budget (max_steps) of 100000 evaluation steps");
}

TEST(JinjaBudgets, RealTemplatesStayFarInside) {
  // A long chat rendered the way chat templates do stays well within both default budgets.
  json messages = json::array();
  for (int i = 0; i < 2000; ++i)
    messages.push_back(
        {{"role", i % 2 ? "assistant" : "user"}, {"content", std::string(200, 'x')}});
  std::string out = Template(
                        "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}\n"
                        "{% endfor %}")
                        .render(json{{"messages", messages}});
  EXPECT_GT(out.size(), 2000u * 200u);
}

}  // namespace
