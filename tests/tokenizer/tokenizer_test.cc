// Behaviour beyond the corpus parity: config attributes, Transformers' post-processor rebuild,
// invalid UTF-8, streaming, batch padding/truncation against the Rust library, decode options.
#include <gtest/gtest.h>

#include <map>

#include "reference_util.h"
#include "tformers/error.h"
#include "tformers/tokenizer.h"
#include "tokenizer/unicode.h"

namespace tformers {
namespace {

using testing::decode_opts;

// The tokenizer files are enough for most tests; the batch test also runs the Python reference.
#define REQUIRE_TOKENIZER_FILES(name)                              \
  do {                                                             \
    std::string missing_ = testing::missing_tokenizer_files(name); \
    ASSERT_TRUE(missing_.empty()) << missing_;                     \
  } while (0)

TEST(Tokenizer, FrenchBreadLawQwen3) {
  REQUIRE_TOKENIZER_FILES("qwen3");
  // Ids from Hugging Face tokenizers for Qwen/Qwen3-0.6B (the project's reference prompt).
  auto tok = AutoTokenizer::from_pretrained(testing::tokenizer_dir("qwen3"));
  std::vector<int32_t> want = {785, 8585, 49041, 7506, 5302};
  EXPECT_EQ(tok.encode("The French Bread Law states"), want);
  EXPECT_EQ(tok.decode(want), "The French Bread Law states");
  std::vector<std::string> tokens = {"The", "ĠFrench", "ĠBread", "ĠLaw", "Ġstates"};
  EXPECT_EQ(tok.tokenize("The French Bread Law states"), tokens);
}

TEST(Tokenizer, ConfigAttributes) {
  REQUIRE_TOKENIZER_FILES("gemma3");
  auto qwen = AutoTokenizer::from_pretrained(testing::tokenizer_dir("qwen3"));
  EXPECT_EQ(qwen.eos_token(), "<|im_end|>");
  EXPECT_EQ(qwen.eos_token_id(), 151645);
  EXPECT_EQ(qwen.pad_token_id(), 151643);
  EXPECT_FALSE(qwen.bos_token_id().has_value());
  EXPECT_EQ(qwen.model_max_length(), 131072);
  EXPECT_EQ(qwen.padding_side(), "right");
  EXPECT_NE(qwen.chat_template().find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(qwen.token_to_id("<think>"), 151667);
  EXPECT_FALSE(qwen.is_special_id(151667));  // <think> is an added, non-special token
  EXPECT_TRUE(qwen.is_special_id(151645));
  auto gemma = AutoTokenizer::from_pretrained(testing::tokenizer_dir("gemma3"));
  EXPECT_EQ(gemma.padding_side(), "left");
  EXPECT_EQ(gemma.bos_token_id(), 2);
  EXPECT_EQ(gemma.pad_token_id(), 0);
  EXPECT_EQ(gemma.eos_token(), "<end_of_turn>");
}

TEST(Tokenizer, LlamaTokenizerFastAddsBosLikeTransformers) {
  REQUIRE_TOKENIZER_FILES("deepseek_v3");
  // tokenizer.json of DeepSeek-V3 has only a ByteLevel post-processor, but its config says
  // LlamaTokenizerFast with add_bos_token: Transformers rebuilds the template and prepends BOS.
  std::string dir = testing::tokenizer_dir("deepseek_v3");
  auto raw = Tokenizer::from_file(dir + "/tokenizer.json");
  auto tok = AutoTokenizer::from_pretrained(dir);
  auto plain = raw.encode("hello", true);
  auto with_bos = tok.encode("hello", true);
  ASSERT_EQ(with_bos.size(), plain.size() + 1);
  EXPECT_EQ(with_bos[0], 0);
  EXPECT_EQ(tok.decode(with_bos, decode_opts(true)), "hello");
  EXPECT_EQ(tok.num_special_tokens_to_add(), 1u);
  auto llama2 = AutoTokenizer::from_pretrained(testing::tokenizer_dir("llama2"));
  EXPECT_EQ(llama2.encode("hi", true).front(), 1);
  EXPECT_NE(llama2.encode("hi", false).front(), 1);
}

TEST(Tokenizer, InvalidUtf8IsReplacedLikeTextDecoder) {
  using tokenizer_detail::repair_utf8;
  // Maximal subparts (Unicode 15 ch. 3 / WHATWG), as Python's errors="replace" gives.
  EXPECT_EQ(repair_utf8("a\x80"
                        "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(repair_utf8("x\xE2\x82y"), "x\xEF\xBF\xBDy");                          // truncated: one
  EXPECT_EQ(repair_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(repair_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
  EXPECT_EQ(repair_utf8("\xF0\x9F\x98"), "\xEF\xBF\xBD");                          // cut emoji
  EXPECT_EQ(
      repair_utf8("\xF4\x90\x80\x80"),
      std::string(12, '\0').replace(0, 12, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"));
  EXPECT_EQ(repair_utf8("ok \xF0\x9F\x98\x80"), "ok \xF0\x9F\x98\x80");
  REQUIRE_TOKENIZER_FILES("qwen3");
  for (const char* name : {"qwen3", "llama2", "gemma3"}) {
    auto tok = Tokenizer::from_file(testing::tokenizer_dir(name) + "/tokenizer.json");
    EXPECT_EQ(tok.encode("caf\xC3 au lait\xFF", false),
              tok.encode("caf\xEF\xBF\xBD au lait\xEF\xBF\xBD", false))
        << name;
  }
}

TEST(Tokenizer, StreamingNeverSplitsCharacters) {
  REQUIRE_TOKENIZER_FILES("llama2");
  const std::string text =
      "Hello 世界! 👨‍👩‍👧‍👦 emoji, العربية, <|im_end|> <s> done. "
      "\xF0\x9F\x8D\x9E "
      "x";
  for (const char* name : {"qwen3", "llama3", "llama2", "gemma3", "deepseek_v3"}) {
    auto tok = AutoTokenizer::from_pretrained(testing::tokenizer_dir(name));
    auto ids = tok.encode(text, false);
    for (bool skip : {false, true}) {
      TokenStreamer streamer(tok, skip);
      std::string all;
      for (int32_t id : ids) {
        std::string piece = streamer.put(id);
        EXPECT_TRUE(tokenizer_detail::is_valid_utf8(piece)) << name;
        EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << name << " emitted U+FFFD";
        all += piece;
      }
      all += streamer.end();
      EXPECT_EQ(all, tok.decode(ids, decode_opts(skip))) << name << " skip=" << skip;
    }
  }
}

TEST(Tokenizer, BatchPaddingAndTruncationMatchRust) {
  std::string missing = testing::missing_references("gemma3");
  ASSERT_TRUE(missing.empty()) << missing;
  std::string out_path = (std::filesystem::temp_directory_path() /
                          ("tformers-batch-ref-" + std::to_string(getpid()) + ".json"))
                             .string();
  std::string cmd = "'" + testing::python() + "' '" + TFORMERS_SOURCE_DIR +
                    "/tools/tokenizer/reference_batch.py' '" + testing::npm_dir() + "' > '" +
                    out_path + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto ref = nlohmann::json::parse(testing::slurp(out_path));
  std::filesystem::remove(out_path);
  ASSERT_FALSE(ref.empty());
  std::map<std::string, Tokenizer> tokenizers;
  for (const auto& c : ref) {
    std::string name = c["tokenizer"];
    if (!tokenizers.count(name)) {
      tokenizers.emplace(name, AutoTokenizer::from_pretrained(testing::tokenizer_dir(name)));
    }
    const Tokenizer& tok = tokenizers.at(name);
    CallOptions opt;
    opt.add_special_tokens = c["add_special_tokens"];
    // Option names as Python tokenizers' enable_padding / enable_truncation take them.
    const auto& o = c["options"];
    if (o.contains("padding")) {
      const auto& p = o["padding"];
      opt.padding_side = p["direction"];
      if (p.contains("length")) {
        opt.padding = PaddingStrategy::kMaxLength;
        opt.max_length = p["length"].get<int64_t>();
      } else {
        opt.padding = PaddingStrategy::kLongest;
      }
      if (p.contains("pad_to_multiple_of"))
        opt.pad_to_multiple_of = p["pad_to_multiple_of"].get<int64_t>();
    }
    if (o.contains("truncation")) {
      opt.truncation = true;
      opt.max_length = o["truncation"]["max_length"].get<int64_t>();
      opt.truncation_side = o["truncation"]["direction"];
    }
    auto got = tok(c["texts"].get<std::vector<std::string>>(), opt);
    std::string where = c["tokenizer"].get<std::string>() + "/" + c["case"].get<std::string>();
    EXPECT_EQ(got.input_ids, c["input_ids"].get<std::vector<std::vector<int32_t>>>()) << where;
    EXPECT_EQ(got.attention_mask, c["attention_mask"].get<std::vector<std::vector<int32_t>>>())
        << where;
  }
}

TEST(Tokenizer, BatchErrors) {
  REQUIRE_TOKENIZER_FILES("llama2");
  auto llama2 = AutoTokenizer::from_pretrained(testing::tokenizer_dir("llama2"));
  CallOptions longest, truncate_1, bad_side;
  longest.padding = PaddingStrategy::kLongest;
  truncate_1.truncation = true;
  truncate_1.max_length = 1;
  bad_side.padding_side = "middle";
  // Llama 2 has no pad token: Transformers refuses to pad.
  EXPECT_THROW(llama2({"a", "b c"}, longest), InvalidArgumentError);
  llama2.set_pad_token("</s>");
  auto batch = llama2({"a", "b c d"}, longest);
  EXPECT_EQ(batch.input_ids[0].size(), batch.input_ids[1].size());
  EXPECT_THROW(llama2({"a"}, truncate_1), InvalidArgumentError);
  EXPECT_THROW(llama2({"a"}, bad_side), InvalidArgumentError);
  EXPECT_THROW(llama2.set_pad_token("<not a token>"), InvalidArgumentError);
}

TEST(Tokenizer, DecodeOptions) {
  REQUIRE_TOKENIZER_FILES("llama3");
  // Llama 3's config sets clean_up_tokenization_spaces: Transformers' decode applies it.
  auto tok = AutoTokenizer::from_pretrained(testing::tokenizer_dir("llama3"));
  auto ids = tok.encode("Hello , world . It 's", false);
  EXPECT_EQ(tok.decode(ids), "Hello, world. It's");
  EXPECT_EQ(tok.decode(ids, decode_opts(false)), "Hello , world . It 's");
  auto with_special = tok.encode("<|begin_of_text|>hi<|eot_id|>", false);
  EXPECT_EQ(tok.decode(with_special, decode_opts(true)), "hi");
  EXPECT_EQ(tok.decode(with_special), "<|begin_of_text|>hi<|eot_id|>");
  EXPECT_EQ(tok.vocab_size(), 128256u);
}

}  // namespace
}  // namespace tformers
