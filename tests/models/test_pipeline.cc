// pipeline("text-generation"): text in, prompt plus continuation out, equal to running the
// tokenizer and generate() by hand.
#include <gtest/gtest.h>

#include "golden_util.h"
#include "tformers/error.h"
#include "tformers/pipeline.h"

namespace tformers {
namespace {

TEST(Pipeline, TextGenerationMatchesTokenizerPlusGenerate) {
  const std::string dir = testing::model_dir("tiny-qwen3");
  auto pipe = pipeline("text-generation", dir, {.dtype = float32, .device_map = "cpu"});
  GenerationConfig gc{.max_new_tokens = 10};
  std::string text = pipe("The theory of", gc);

  Tokenizer tok = AutoTokenizer::from_pretrained(dir);
  CausalLM lm = AutoModelForCausalLM::from_pretrained(dir, {.dtype = float32});
  auto ids = tok.encode("The theory of");
  auto out = lm.generate({ids}, gc);
  std::vector<int32_t> gen(out[0].begin() + ids.size(), out[0].end());
  EXPECT_EQ(text, "The theory of" + tok.decode(gen, {.skip_special_tokens = true}));
  EXPECT_EQ(pipe("The theory of", gc, /*return_full_text=*/false),
            tok.decode(gen, {.skip_special_tokens = true}));
}

TEST(Pipeline, ChatUsesTheTemplate) {
  const std::string dir = testing::model_dir("tiny-qwen3");
  auto pipe = pipeline("text-generation", dir, {.dtype = float32});
  nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "hello"}}};
  GenerationConfig gc{.max_new_tokens = 5};
  std::string reply = pipe.chat(messages, gc);

  Tokenizer tok = AutoTokenizer::from_pretrained(dir);
  std::string rendered = tok.apply_chat_template(messages, true);
  EXPECT_EQ(rendered, "user: hello<|im_end|>\nassistant:");
  auto ids = tok.encode(rendered, false);
  auto out = pipe.model().generate({ids}, gc);
  EXPECT_EQ(reply, tok.decode(std::vector<int32_t>(out[0].begin() + ids.size(), out[0].end()),
                              {.skip_special_tokens = true}));
}

TEST(Pipeline, UnknownTaskIsAnError) {
  EXPECT_THROW(pipeline("summarization", testing::model_dir("tiny-qwen3")), InvalidArgumentError);
}

}  // namespace
}  // namespace tformers
