// Structured output end to end: `tformers serve` with the shipped tiny model, driven by the
// official openai client (tools/serve/structured_output.mjs: response_format json_schema and
// json_object, chat streamed and not, completions, sampled choices, a request cut by max_tokens,
// refused schemas), then every answer that ended with "stop" validated against its schema by the
// `jsonschema` Python package (tools/grammar/validate_outputs.py, through .venv/bin/python). The
// model writes KJV- and fortune-flavoured nonsense; only the constraint makes it valid JSON.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/error_of.h"
#include "serve/openai.h"
#include "serve/serve_process.h"

namespace tformers::serve::testing {
namespace {

namespace fs = std::filesystem;

TEST(StructuredOutput, OpenAiClientOutputsValidateAgainstTheirSchemas) {
  ServeProcess server;
  ASSERT_NE(server.port(), 0);
  expect_client_outputs_validate(server, "structured_output.mjs", "structured");
  // The masks changed no shape: every step ran on what warm-up compiled.
  EXPECT_EQ(metric(server, "tformers_compiles_since_ready_total"), 0) << server.log();
  EXPECT_EQ(server.stop(), 0) << server.log();
}

// A bad schema is refused before anything runs, with the keyword and its place in the message.
TEST(StructuredOutput, UnsupportedKeywordsAreA400) {
  const Json body = {
      {"model", "m"},
      {"messages", {{{"role", "user"}, {"content", "x"}}}},
      {"response_format",
       {{"type", "json_schema"},
        {"json_schema",
         {{"name", "n"},
          {"schema",
           {{"type", "object"},
            {"properties", {{"tags", {{"type", "array"}, {"uniqueItems", true}}}}}}}}}}}};
  try {
    parse_request(Endpoint::kChatCompletions, body.dump());
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "response_format");
    EXPECT_CONTAINS(e.what(),
                    "response_format: json_schema.schema: #/properties/tags/uniqueItems: "
                    "keyword \"uniqueItems\" is not supported");
  }
  // json_object is any object; text is no constraint; completions read it too.
  const ApiRequest json_object = parse_request(
      Endpoint::kCompletions,
      Json{{"model", "m"}, {"prompt", "x"}, {"response_format", {{"type", "json_object"}}}}.dump());
  ASSERT_TRUE(json_object.json_schema);
  EXPECT_EQ(*json_object.json_schema, (Json{{"type", "object"}}));
  const ApiRequest text = parse_request(Endpoint::kChatCompletions,
                                        Json{{"model", "m"},
                                             {"messages", {{{"role", "user"}, {"content", "x"}}}},
                                             {"response_format", {{"type", "text"}}}}
                                            .dump());
  EXPECT_FALSE(text.json_schema);
}

}  // namespace
}  // namespace tformers::serve::testing
