// The prompt's size checked before tokenizing: the byte bound never refuses a prompt that fits
// in the context, and a prompt over it is refused without the tokenizer; and the constraint
// fields tformers does not implement are refused naming the field.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "common/error_of.h"
#include "serve/openai.h"

namespace tformers::serve {
namespace {

const Tokenizer& kjv() {
  static const Tokenizer tok =
      AutoTokenizer::from_pretrained(TFORMERS_SOURCE_DIR "/models/kjv-fortunes-tiny");
  return tok;
}

ApiError refusal(const ApiRequest& r, int64_t max_model_len, size_t max_bytes) {
  try {
    to_engine_request(r, kjv(), max_model_len, 4096, max_bytes);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(200, "accepted");
}

TEST(PromptBytes, TheBoundHoldsEveryPromptThatFits) {
  const Tokenizer& tok = kjv();
  constexpr int64_t kContext = 256;
  const size_t limit = max_prompt_bytes(tok, kContext);
  // The token whose text is longest, repeated to fill the context less one: the most bytes a
  // prompt that fits can hold (before normalization). It must pass the byte check, and be
  // refused or accepted by its tokens only.
  std::string longest;
  for (size_t id = 0; id < tok.vocab_size(); ++id)
    if (auto text = tok.id_to_token(int32_t(id)); text && text->size() > longest.size())
      longest = *text;
  const std::vector<int32_t> one = {tok.token_to_id(longest).value()};
  const std::string decoded = tok.decode(one);
  std::string fits;
  for (int64_t i = 0; i < kContext - 1; ++i) fits += decoded;
  ApiRequest r;
  r.endpoint = Endpoint::kCompletions;
  r.prompts = {{.text = fits}};
  ASSERT_LE(fits.size(), limit);
  EXPECT_EQ(std::string(refusal(r, kContext, limit).what()).find("bytes, more than"),
            std::string::npos);
  // One byte over the bound is refused by its size.
  r.prompts = {{.text = std::string(limit + 1, 'a')}};
  const ApiError e = refusal(r, kContext, limit);
  EXPECT_EQ(e.status(), 400);
  EXPECT_EQ(e.param(), "prompt");
  EXPECT_EQ(e.code(), "context_length_exceeded");
  EXPECT_CONTAINS(e.what(), std::to_string(limit + 1) + " bytes, more than a prompt");
}

TEST(PromptBytes, ChatMessagesAreCountedBeforeTheTemplate) {
  ApiRequest r =
      parse_request(Endpoint::kChatCompletions,
                    Json{{"model", "m"},
                         {"messages",
                          {{{"role", "user"},
                            {"content", {{{"type", "text"}, {"text", std::string(5000, 'a')}}}}}}}}
                        .dump());
  const ApiError e = refusal(r, 256, 4000);
  EXPECT_EQ(e.param(), "messages");
  EXPECT_CONTAINS(e.what(), "bytes, more than a prompt");
}

TEST(PromptBytes, ConstraintFieldsAreRefused) {
  for (const char* field : {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                            "structured_outputs", "grammar", "json_schema"}) {
    for (Endpoint endpoint : {Endpoint::kChatCompletions, Endpoint::kCompletions}) {
      Json body = {
          {"model", "m"}, {"prompt", "x"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}};
      body[field] = {{"type", "object"}};
      try {
        parse_request(endpoint, body.dump());
        ADD_FAILURE() << field << " was accepted";
      } catch (const ApiError& e) {
        EXPECT_EQ(e.status(), 400);
        EXPECT_EQ(e.param(), field);
        EXPECT_CONTAINS(e.what(), "not supported");
      }
    }
  }
  // null is the same as leaving it out.
  EXPECT_NO_THROW(
      parse_request(Endpoint::kCompletions,
                    Json{{"model", "m"}, {"prompt", "x"}, {"guided_json", nullptr}}.dump()));
}

// OpenAI's options that change what is done with a request were accepted and ignored; now each
// is a 400 naming it, and their defaults still pass.
TEST(PromptBytes, OptionsThatWouldBeIgnoredAreRefused) {
  const Json chat = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}};
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, Json>>{{"store", true},
                                                 {"metadata", {{"user", "a"}}},
                                                 {"audio", {{"voice", "alloy"}}},
                                                 {"prediction", {{"type", "content"}}},
                                                 {"web_search_options", Json::object()},
                                                 {"modalities", {"text", "audio"}}}) {
    Json body = chat;
    body[field] = value;
    try {
      parse_request(Endpoint::kChatCompletions, body.dump());
      ADD_FAILURE() << field << " was accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << field;
      EXPECT_EQ(e.param(), field);
    }
  }
  Json defaults = chat;
  defaults["store"] = false;
  defaults["metadata"] = Json::object();
  defaults["modalities"] = {"text"};
  EXPECT_NO_THROW(parse_request(Endpoint::kChatCompletions, defaults.dump()));
}

}  // namespace
}  // namespace tformers::serve
