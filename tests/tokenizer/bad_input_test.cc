// Malformed tokenizer.json: every error is a tformers::Error whose message names the JSON path
// (or line/column for broken JSON) and, for unknown components, the supported types. Run under
// the asan preset too: no crash, no leak, no hang on garbage.
#include <gtest/gtest.h>

#include <random>

#include "reference_util.h"
#include "tformers/error.h"
#include "tformers/tokenizer.h"

namespace tformers {
namespace {

using testing::decode_opts;

const char* kTiny = R"({
  "version": "1.0",
  "added_tokens": [{"id": 3, "content": "<s>", "special": true, "single_word": false,
                    "lstrip": false, "rstrip": false, "normalized": false}],
  "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}]},
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\s+|\\p{L}+"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
  "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [3], "tokens": ["<s>"]}}},
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 4}, "merges": ["a b"]}
})";

std::string replace(std::string s, const std::string& from, const std::string& to) {
  size_t p = s.find(from);
  EXPECT_NE(p, std::string::npos) << from;
  if (p != std::string::npos) s.replace(p, from.size(), to);
  return s;
}

template <typename E>
std::string error_of(const std::string& json) {
  try {
    Tokenizer::from_json_string(json, "tiny.json");
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

TEST(BadInput, TinyTokenizerWorks) {
  auto tok = Tokenizer::from_json_string(kTiny);
  EXPECT_EQ(tok.encode("ab a b"), (std::vector<int32_t>{3, 2, 4, 0, 4, 1}));
  EXPECT_EQ(tok.encode("ab<s>", false), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{3, 2, 4, 0}, decode_opts(true)), "ab a");
}

TEST(BadInput, MalformedJsonNamesLineAndColumn) {
  std::string bad = kTiny;
  bad.erase(bad.find("\"version\"") + 9, 1);  // drop the ':' after "version"
  std::string msg = error_of<FormatError>(bad);
  EXPECT_NE(msg.find("tiny.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 2, column"), std::string::npos) << msg;
  EXPECT_NE(error_of<FormatError>("").find("line 1"), std::string::npos);
  EXPECT_NE(error_of<FormatError>(std::string(kTiny).substr(0, 300)).find("malformed JSON"),
            std::string::npos);
  EXPECT_NE(error_of<FormatError>("[1, 2]").find("top level"), std::string::npos);
  EXPECT_NE(error_of<FormatError>("{\"a\": \"\\ud800\"}").find("surrogate"), std::string::npos);
}

TEST(BadInput, WrongTypesNameTheJsonPath) {
  std::string s = kTiny;
  std::string msg = error_of<FormatError>(replace(s, R"(["a b"])", R"(["a b", 5])"));
  EXPECT_NE(msg.find("model.merges[1]"), std::string::npos) << msg;
  msg = error_of<FormatError>(replace(s, R"("b": 1)", R"("b": "one")"));
  EXPECT_NE(msg.find("model.vocab[\"b\"]"), std::string::npos) << msg;
  msg = error_of<FormatError>(replace(s, R"(["a b"])", R"(["a c"])"));
  EXPECT_NE(msg.find("model.merges[0]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"c\""), std::string::npos) << msg;
  msg = error_of<FormatError>(replace(s, R"("behavior": "Isolated")", R"("behavior": 3)"));
  EXPECT_NE(msg.find("pre_tokenizer.pretokenizers[0].behavior"), std::string::npos) << msg;
  msg = error_of<FormatError>(replace(s, R"("content": "<s>")", R"("content": 7)"));
  EXPECT_NE(msg.find("added_tokens[0].content"), std::string::npos) << msg;
  msg = error_of<FormatError>(
      replace(s, R"({"Regex": "\\s+|\\p{L}+"})", R"({"Regex": "(unclosed"})"));
  EXPECT_NE(msg.find("pre_tokenizer.pretokenizers[0].pattern.Regex"), std::string::npos) << msg;
  msg = error_of<FormatError>(replace(s, R"("ids": [3])", R"("ids": ["x"])"));
  EXPECT_NE(msg.find("post_processor.single.special_tokens.<s>.ids"), std::string::npos) << msg;
  msg = error_of<FormatError>(replace(s, R"("model": {)", R"("modelx": {)"));
  EXPECT_NE(msg.find("model is missing"), std::string::npos) << msg;
}

TEST(BadInput, UnknownComponentsNameTypeAndSupported) {
  std::string s = kTiny;
  std::string msg =
      error_of<UnsupportedError>(replace(s, R"({"type": "ByteLevel", "add_prefix_space")",
                                         R"({"type": "Frobnicate", "add_prefix_space")"));
  EXPECT_NE(msg.find("pre_tokenizer.pretokenizers[1].type"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'Frobnicate'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Metaspace"), std::string::npos) << msg;  // the supported list
  msg = error_of<UnsupportedError>(replace(s, R"({"type": "NFC"})", R"({"type": "Precompiled"})"));
  EXPECT_NE(msg.find("normalizer.normalizers[0].type"), std::string::npos) << msg;
  EXPECT_NE(msg.find("NFKC"), std::string::npos) << msg;
  msg = error_of<UnsupportedError>(
      replace(s, R"("decoder": {"type": "ByteLevel"})", R"("decoder": {"type": "CTC"})"));
  EXPECT_NE(msg.find("decoder.type: unsupported decoder type 'CTC'"), std::string::npos) << msg;
  msg = error_of<UnsupportedError>(replace(s, R"("type": "BPE")", R"("type": "Unigram")"));
  EXPECT_NE(msg.find("model.type"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'Unigram'"), std::string::npos) << msg;
  msg = error_of<UnsupportedError>(
      replace(s, R"("type": "TemplateProcessing")", R"("type": "Weird")"));
  EXPECT_NE(msg.find("TemplateProcessing"), std::string::npos) << msg;
}

// An empty Metaspace replacement would match at every offset: refused at load, naming the path,
// rather than replacing forever at the first encode or decode.
TEST(BadInput, EmptyMetaspaceReplacementIsRefused) {
  const std::string pre =
      replace(kTiny, R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": false})",
              R"({"type": "Metaspace", "replacement": "", "prepend_scheme": "always"})");
  EXPECT_NE(error_of<FormatError>(pre).find("pre_tokenizer.pretokenizers[1].replacement must be "
                                            "one character"),
            std::string::npos)
      << error_of<FormatError>(pre);
  const std::string dec =
      replace(kTiny, R"("decoder": {"type": "ByteLevel"})",
              R"("decoder": {"type": "Metaspace", "replacement": "", "prepend_scheme": "always"})");
  EXPECT_NE(error_of<FormatError>(dec).find("decoder.replacement must be one character"),
            std::string::npos)
      << error_of<FormatError>(dec);
}

TEST(BadInput, MissingFilesAreNotFound) {
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), NotFoundError);
  EXPECT_THROW(AutoTokenizer::from_pretrained("/nonexistent-model-dir"), NotFoundError);
}

// Random byte mutations of a valid file: each either loads or throws a tformers::Error, and a
// tokenizer that loads can encode and decode.
TEST(BadInput, MutatedFilesNeverCrash) {
  std::mt19937 rng(1234);
  const std::string base = kTiny;
  const char kBytes[] = "{}[]\",:0123456789 abtruefalsenull\\\x80\xC3\xFF";
  int loaded = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s = base;
    int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      size_t pos = rng() % s.size();
      switch (rng() % 3) {
        case 0:
          s[pos] = kBytes[rng() % (sizeof(kBytes) - 1)];
          break;
        case 1:
          s.erase(pos, 1 + rng() % 8);
          break;
        default:
          s.insert(pos, 1, kBytes[rng() % (sizeof(kBytes) - 1)]);
          break;
      }
    }
    try {
      auto tok = Tokenizer::from_json_string(s, "mutated.json");
      auto ids = tok.encode("ab ba \xC3 <s> b", true);
      tok.decode(ids);
      tok.decode(std::vector<int32_t>{-1, 0, 99999, 3});
      ++loaded;
    } catch (const Error&) {
    }
  }
  EXPECT_GT(loaded, 0);
}

}  // namespace
}  // namespace tformers
