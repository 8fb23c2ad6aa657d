// Structured output in the engine (ServingRequest::json_schema): outputs are whole values of
// their schemas and end there; the same tokens alone and after preemption (the matcher follows
// the sequence's tokens, which a preempted sequence keeps); schemas refused at submit.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "collector.h"
#include "common/error_of.h"
#include "generation/json_grammar.h"
#include "tformers/model.h"
#include "tformers/serving.h"
#include "tformers/tokenizer.h"

namespace tformers {
namespace {

using tformers::testing::Collector;

using testing::error_of;
using J = nlohmann::ordered_json;

const std::string kShipped = std::string(TFORMERS_SOURCE_DIR) + "/models/kjv-fortunes-tiny";

std::string bytes_of(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += tok.token_bytes(id).value_or("<" + std::to_string(id) + ">");
  return out;
}

// Whether `text` is a whole value of `schema` that nothing can extend, by our own matcher.
bool whole_value(const J& schema, const std::string& text) {
  generation::JsonMatcher m(generation::JsonGrammar::compile(schema));
  return m.advance(text) && m.finished();
}

const J kList = J::parse(R"({"type":"array","items":{"type":"string","maxLength":6},
  "minItems":4,"maxItems":4})");
const J kPerson = J::parse(R"({"type":"object","properties":{"name":{"type":"string",
  "maxLength":10},"age":{"enum":[20,30]},"ok":{"type":"boolean"}},"required":["name","age","ok"],
  "additionalProperties":false})");

TEST(StructuredServing, OutputsAreWholeValuesAloneAndAfterPreemption) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(kShipped, {.device_map = "cpu"});
  const Tokenizer tok = AutoTokenizer::from_pretrained(kShipped);
  std::vector<ServingRequest> requests;
  for (int r = 0; r < 6; ++r) {
    ServingRequest q;
    q.prompt = tok.encode(std::string("And the LORD said unto them, ").substr(0, 8 + 3 * r));
    q.config.max_new_tokens = 40;
    q.config.do_sample = r % 2 == 1;
    q.config.seed = 100 + r;
    q.json_schema = r < 3 ? kList : kPerson;
    requests.push_back(q);
  }
  auto run = [&](ServingEngine& engine, bool together) {
    std::vector<Collector> c(requests.size());
    for (size_t r = 0; r < requests.size(); ++r) {
      engine.submit(requests[r], c[r].callback());
      if (!together) {
        EXPECT_NE(c[r].wait(), "error") << c[r].error();
      }
    }
    std::vector<std::pair<std::string, std::vector<int32_t>>> out;
    for (auto& x : c) {
      const std::string reason = x.wait();
      EXPECT_NE(reason, "error") << x.error();
      out.emplace_back(reason, x.tokens());
    }
    return out;
  };
  std::vector<std::pair<std::string, std::vector<int32_t>>> alone;
  {
    ServingEngine reference(model, {.max_num_seqs = 4, .max_model_len = 64, .block_size = 8}, &tok);
    reference.start();
    alone = run(reference, false);
  }
  int stopped = 0;
  for (size_t r = 0; r < alone.size(); ++r) {
    const std::string text = bytes_of(tok, alone[r].second);
    if (alone[r].first == "stop") {
      ++stopped;
      EXPECT_TRUE(whole_value(*requests[r].json_schema, text)) << text;
      EXPECT_TRUE(J::accept(text)) << text;
    } else {
      EXPECT_EQ(alone[r].first, "length");
      generation::JsonMatcher m(generation::JsonGrammar::compile(*requests[r].json_schema));
      EXPECT_TRUE(m.advance(text)) << text;  // a beginning of one
    }
  }
  EXPECT_GE(stopped, 4);
  // A pool of 8 blocks of 8 positions for 4 sequences of up to 50: preempted and recomputed,
  // the same tokens.
  ServingEngine engine(
      model, {.max_num_seqs = 4, .max_model_len = 64, .block_size = 8, .num_blocks = 8}, &tok);
  engine.warm_up();
  engine.start();
  EXPECT_EQ(run(engine, true), alone);
  EXPECT_GT(engine.stats().preemptions, 0u);
  EXPECT_EQ(engine.stats().compiles_since_ready, 0u);
}

TEST(StructuredServing, WithoutEosTheValueEndsTheSequence) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(kShipped, {.device_map = "cpu"});
  const Tokenizer tok = AutoTokenizer::from_pretrained(kShipped);
  ServingEngine engine(model, {.max_num_seqs = 2, .max_model_len = 64}, &tok);
  engine.start();
  for (const char* schema : {R"({"enum":["yes","no"]})", R"({"type":"integer"})"}) {
    ServingRequest r;
    r.prompt = tok.encode("The answer is ");
    r.config.max_new_tokens = 30;
    r.config.do_sample = false;
    r.config.eos_token_id = std::vector<int64_t>{};  // as ignore_eos
    r.json_schema = J::parse(schema);
    Collector c;
    engine.submit(r, c.callback());
    EXPECT_EQ(c.wait(), "stop") << schema;
    const std::string text = bytes_of(tok, c.tokens());
    generation::JsonMatcher m(generation::JsonGrammar::compile(*r.json_schema));
    EXPECT_TRUE(m.advance(text) && m.accepting()) << text;
    EXPECT_LT(c.tokens().size(), 30u) << text;
  }
}

TEST(StructuredServing, BadSchemasAreRefusedAtSubmit) {
  CausalLM model = AutoModelForCausalLM::from_pretrained(kShipped, {.device_map = "cpu"});
  const Tokenizer tok = AutoTokenizer::from_pretrained(kShipped);
  auto none = [](const ServingEvent&) {};
  ServingRequest r;
  r.prompt = {1, 2, 3};
  r.json_schema = J::parse(R"({"type":"string","format":"email"})");
  {
    ServingEngine engine(model, {.max_num_seqs = 2, .max_model_len = 64}, &tok);
    EXPECT_CONTAINS(error_of<InvalidArgumentError>([&] { engine.submit(r, none); }),
                    "#/format: keyword \"format\" is not supported");
  }
  ServingEngine without_tokenizer(model, {.max_num_seqs = 2, .max_model_len = 64});
  r.json_schema = J::parse(R"({"type":"string"})");
  EXPECT_CONTAINS(error_of<InvalidArgumentError>([&] { without_tokenizer.submit(r, none); }),
                  "needs the engine to have the tokenizer");
}

}  // namespace
}  // namespace tformers
