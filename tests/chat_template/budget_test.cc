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

TEST(JinjaBudgets, AppendingTenMillionItemListsRunsOutOfMemoryBudget) {
  EXPECT_CONTAINS(budget_error("{% set ns = namespace(a=[]) %}{% for i in range(10) %}"
                               "{% set ns.a = ns.a + range(10000000) | list %}{% endfor %}"),
                  "memory budget (max_memory_bytes)");
  // One item at a time: every concatenation copies the list, quadratic without a total bound.
  EXPECT_CONTAINS(budget_error("{% set ns = namespace(a=[]) %}{% for i in range(1000000) %}"
                               "{% set ns.a = ns.a + [i] %}{% endfor %}"),
                  "memory budget (max_memory_bytes)");
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
