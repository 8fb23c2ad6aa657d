// tokenizer.json and tokenizer_config.json from a stranger: ids that would size tables by the
// billion, normalizers and pre-tokenizers that multiply text, nesting that would overflow the
// stack, files that are not files. Each must fail with the error class and a message naming the
// file and the field. The suite name matches the asan preset's BadInput filter.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/error_of.h"
#include "tformers/error.h"
#include "tformers/tokenizer.h"

namespace tformers {
namespace {

namespace fs = std::filesystem;

const char* kBase = R"({
  "added_tokens": [],
  "normalizer": NORMALIZER,
  "pre_tokenizer": PRE_TOKENIZER,
  "model": {"type": "BPE", "vocab": {"a": 0, "b": B_ID}, "merges": []}
})";

std::string tokenizer_json(const std::string& normalizer = "null",
                           const std::string& pre_tokenizer = "null",
                           const std::string& b_id = "1") {
  std::string s = kBase;
  s.replace(s.find("NORMALIZER"), 10, normalizer);
  s.replace(s.find("PRE_TOKENIZER"), 13, pre_tokenizer);
  s.replace(s.find("B_ID"), 4, b_id);
  return s;
}

using tformers::testing::error_of;

class TempFolder {
 public:
  TempFolder() {
    std::string tmpl = (fs::temp_directory_path() / "tformers_tok_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempFolder() { fs::remove_all(path_); }
  std::string file(const std::string& name, const std::string& text) const {
    std::string p = (path_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::string str() const { return path_.string(); }
  fs::path path_;
};

// chat_template.jinja beside tokenizer_config.json wins over the config's chat_template, as
// Transformers 5 reads a folder (tokenization_utils_base.py: "If independent chat template
// file(s) exist, they take priority over template entries in the tokenizer config"); it was
// ignored, and `chat` said the model had no template.
TEST(ChatTemplateFile, JinjaFileTakesPriorityOverTheConfig) {
  TempFolder dir;
  dir.file("tokenizer.json", tokenizer_json());
  dir.file("tokenizer_config.json", R"({"chat_template": "from the config"})");
  EXPECT_EQ(AutoTokenizer::from_pretrained(dir.str()).chat_template(), "from the config");
  dir.file("chat_template.jinja", "{{ messages[0]['content'] }}\n");
  const Tokenizer tok = AutoTokenizer::from_pretrained(dir.str());
  EXPECT_EQ(tok.chat_template(), "{{ messages[0]['content'] }}\n");
  nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "hi"}}};
  // Jinja2 (keep_trailing_newline=False, as Transformers renders) drops the file's last newline.
  EXPECT_EQ(tok.apply_chat_template(messages, false), "hi");
  // Without tokenizer_config.json the file is still read.
  fs::remove(dir.path_ / "tokenizer_config.json");
  EXPECT_EQ(AutoTokenizer::from_pretrained(dir.str()).chat_template(),
            "{{ messages[0]['content'] }}\n");
  // A FIFO there fails at once, naming it.
  fs::remove(dir.path_ / "chat_template.jinja");
  const std::string fifo = (dir.path_ / "chat_template.jinja").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_CONTAINS(error_of<IoError>([&] { AutoTokenizer::from_pretrained(dir.str()); }),
                  fifo + ": is a FIFO, expected a regular chat template file");
}

TEST(BadInputHostile, HugeVocabIdIsRejectedNotAllocated) {
  EXPECT_EQ(error_of<FormatError>([] {
              Tokenizer::from_json_string(tokenizer_json("null", "null", "1000000000"), "t.json");
            }),
            "t.json: model.vocab[\"b\"] = 1000000000 is far outside the vocabulary's 2 tokens; ids "
            "must be below the token count plus 1048576 (the vocabulary's ids should be dense, 0 "
            "to 1)");
  std::string added = tokenizer_json();
  added.replace(added.find("[]"), 2, R"([{"id": 2000000000, "content": "<x>"}])");
  EXPECT_CONTAINS(error_of<FormatError>([&] { Tokenizer::from_json_string(added, "t.json"); }),
                  "t.json: added_tokens[0].id = 2000000000 is far above the vocabulary's 2 ids");
}

TEST(BadInputHostile, ExpandingNormalizerRunsOutOfGrowthBudget) {
  std::string step =
      R"({"type": "Replace", "pattern": {"String": "a"}, "content": "aaaaaaaaaaaaaaaa"})";
  std::string seq = R"({"type": "Sequence", "normalizers": [)";
  for (int i = 0; i < 8; ++i) seq += (i ? "," : "") + step;
  seq += "]}";
  Tokenizer tok = Tokenizer::from_json_string(tokenizer_json(seq), "t.json");
  EXPECT_CONTAINS(error_of<FormatError>([&] { tok.encode("aaaa"); }),
                  "t.json: normalizer.normalizers[3]: output of 262144 bytes from an input of 4 "
                  "bytes exceeds the growth budget of 64 times the input plus 65536 bytes (65792 "
                  "bytes)");
  // One Replace whose content alone is over the budget is stopped before it builds anything.
  std::string big = R"({"type": "Replace", "pattern": {"String": "a"}, "content": ")" +
                    std::string(100000, 'b') + R"("})";
  Tokenizer one = Tokenizer::from_json_string(tokenizer_json(big), "t.json");
  EXPECT_CONTAINS(error_of<FormatError>([&] { one.encode("a"); }), "t.json: normalizer: output");
  // Ordinary growth is fine.
  EXPECT_EQ(Tokenizer::from_json_string(tokenizer_json(step), "t.json").encode("a").size(), 16u);
}

TEST(BadInputHostile, ExpandingPreTokenizerRunsOutOfGrowthBudget) {
  // ByteLevel maps every byte at or above 0x80 to two bytes: twenty in a row multiply by 2^20.
  std::string seq = R"({"type": "Sequence", "pretokenizers": [)";
  for (int i = 0; i < 20; ++i)
    seq += std::string(i ? "," : "") +
           R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": false})";
  seq += "]}";
  Tokenizer tok = Tokenizer::from_json_string(tokenizer_json("null", seq), "t.json");
  EXPECT_CONTAINS(error_of<FormatError>([&] { tok.encode(" "); }),
                  "t.json: pre_tokenizer: output of ");
  EXPECT_CONTAINS(error_of<FormatError>([&] { tok.encode(" "); }), "exceeds the growth budget");
}

TEST(BadInputHostile, DeeplyNestedTokenizerConfigIsAnError) {
  TempFolder dir;
  dir.file("tokenizer.json", tokenizer_json());
  std::string cfg = dir.file("tokenizer_config.json", "{\"x\": " + std::string(150000, '[') +
                                                          std::string(150000, ']') + "}");
  EXPECT_CONTAINS(error_of<FormatError>([&] { AutoTokenizer::from_pretrained(dir.str()); }),
                  cfg + ":1:518: JSON nests deeper than 512 levels");
  // tokenizer.json itself, through its own fast reader.
  std::string deep = tokenizer_json();
  deep.replace(deep.find("\"added_tokens\""), 0,
               "\"x\": " + std::string(150000, '[') + std::string(150000, ']') + ", ");
  EXPECT_CONTAINS(error_of<FormatError>([&] { Tokenizer::from_json_string(deep, "t.json"); }),
                  "nesting deeper than 512 levels");
}

TEST(BadInputHostile, FifoAndDeviceFilesFailWithoutBlocking) {
  TempFolder dir;
  std::string fifo = (dir.path_ / "tokenizer.json").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(error_of<IoError>([&] { AutoTokenizer::from_pretrained(dir.str()); }),
            fifo + ": is a FIFO, expected a regular tokenizer file");
  TempFolder dev;
  dev.file("tokenizer.json", tokenizer_json());
  fs::create_symlink("/dev/zero", dev.path_ / "tokenizer_config.json");
  EXPECT_CONTAINS(error_of<IoError>([&] { AutoTokenizer::from_pretrained(dev.str()); }),
                  "tokenizer_config.json: is a character device, expected a regular JSON file");
}

TEST(BadInputHostile, MissingTokenizerJsonStaysNotFound) {
  TempFolder dir;
  EXPECT_CONTAINS(error_of<NotFoundError>([&] { AutoTokenizer::from_pretrained(dir.str()); }),
                  "has no tokenizer.json");
}

}  // namespace
}  // namespace tformers
