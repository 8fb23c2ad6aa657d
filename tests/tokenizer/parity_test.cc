// Token ids and decoded text identical to Hugging Face tokenizers (the Rust library, through its
// official Python package: tools/tokenizer/reference.py) on the generated >= 1 MB corpus
// (tools/tokenizer/make_corpus.py), for the five reference tokenizers and three tokenizer.json
// variants. Stops at the first mismatch.
#include <gtest/gtest.h>

#include <sstream>

#include "reference_util.h"
#include "tformers/tokenizer.h"

namespace tformers {
namespace {

using testing::decode_opts;

using testing::base64_decode;

std::string show(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string describe_ids(const Tokenizer& tok, const std::vector<int32_t>& ids, size_t at) {
  std::ostringstream os;
  size_t b = at >= 6 ? at - 6 : 0, e = std::min(ids.size(), at + 6);
  for (size_t k = b; k < e; ++k) {
    os << (k == at ? ">>" : "") << ids[k] << ":'" << show(tok.id_to_token(ids[k]).value_or("?"))
       << "'" << (k == at ? "<<" : "") << " ";
  }
  return os.str();
}

std::string first_id_mismatch(const Tokenizer& tok, const std::vector<int32_t>& want,
                              const std::vector<int32_t>& got) {
  size_t k = 0;
  while (k < want.size() && k < got.size() && want[k] == got[k]) ++k;
  if (k == want.size() && k == got.size()) return "";
  std::vector<int32_t> prefix(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(k));
  std::string before = tok.decode(prefix, decode_opts(false));
  if (before.size() > 60) before = before.substr(before.size() - 60);
  std::ostringstream os;
  os << "first difference at token " << k << " (expected " << want.size() << " ids, got "
     << got.size() << ")\n  text before it: \"" << show(before)
     << "\"\n  expected: " << describe_ids(tok, want, k)
     << "\n  got:      " << describe_ids(tok, got, k);
  return os.str();
}

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, EncodeAndDecodeMatchRustTokenizers) {
  const std::string name = GetParam();
  std::string missing = testing::missing_references(name.substr(0, name.find('-')));
  ASSERT_TRUE(missing.empty()) << missing;
  std::string error;
  std::string dir = testing::reference_dir(name, error);
  ASSERT_TRUE(error.empty()) << error;

  auto corpus = nlohmann::json::parse(testing::slurp(dir + "/corpus.json"));
  auto ref = nlohmann::json::parse(testing::slurp(dir + "/" + name + ".json"));
  // The library's view: tokenizer.json alone, as reference.py loads it.
  bool variant = name.find('-') != std::string::npos;
  Tokenizer tok = Tokenizer::from_file(variant ? dir + "/" + name + ".tokenizer.json"
                                               : testing::tokenizer_dir(name) + "/tokenizer.json");
  ASSERT_EQ(corpus.size(), ref["ids"].size());
  size_t bytes = 0;
  for (size_t d = 0; d < corpus.size(); ++d) {
    if (ref["ids"][d].is_null()) continue;  // variants use every third document
    std::string doc = base64_decode(corpus[d].get<std::string>());
    bytes += doc.size();
    auto want = ref["ids"][d].get<std::vector<int32_t>>();
    auto got = tok.encode(doc, /*add_special_tokens=*/false);
    std::string diff = first_id_mismatch(tok, want, got);
    ASSERT_TRUE(diff.empty()) << name << ": document " << d << " encode: " << diff;
    std::string want_text = ref["decoded"][d].get<std::string>();
    std::string got_text = tok.decode(want, decode_opts(false));
    if (want_text != got_text) {
      size_t k = 0;
      while (k < want_text.size() && k < got_text.size() && want_text[k] == got_text[k]) ++k;
      size_t b = k >= 40 ? k - 40 : 0;
      FAIL() << name << ": document " << d << " decode differs at byte " << k << "\n  expected: \""
             << show(want_text.substr(b, 80)) << "\"\n  got:      \""
             << show(got_text.substr(b, 80)) << "\"";
    }
    if (d < ref["ids_special"].size()) {
      auto want_s = ref["ids_special"][d].get<std::vector<int32_t>>();
      auto got_s = tok.encode(doc, /*add_special_tokens=*/true);
      diff = first_id_mismatch(tok, want_s, got_s);
      ASSERT_TRUE(diff.empty()) << name << ": document " << d
                                << " encode with special tokens: " << diff;
      std::string want_skip = ref["decoded_skip"][d].get<std::string>();
      ASSERT_EQ(want_skip, tok.decode(want_s, decode_opts(true)))
          << name << ": document " << d << " decode(skip_special_tokens=true)";
    }
  }
  if (!variant) {
    EXPECT_GE(bytes, 1u << 20) << "the corpus must hold at least 1 MB";
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Parity,
                         ::testing::Values("qwen3", "llama3", "llama2", "gemma3", "deepseek_v3",
                                           // tokenizer.json variants (tools/tokenizer/reference.py)
                                           "qwen3-components", "qwen3-whitespace",
                                           "llama2-metaspace"));

}  // namespace
}  // namespace tformers
