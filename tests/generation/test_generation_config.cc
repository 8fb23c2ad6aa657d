// GenerationConfig: generation_config.json reading, layering, resolve()'s defaults and
// precedence, and a test per bad input.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "tformers/error.h"
#include "tformers/generation.h"

namespace tformers {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 512, kPositions = 512;

class ConfigFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tformers_gen_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& text) {
    std::string path = (dir_ / "generation_config.json").string();
    std::ofstream(path) << text;
    return path;
  }
  fs::path dir_;
};

TEST_F(ConfigFile, ReadsTransformersFieldsAndIgnoresUnknownOnes) {
  auto c = GenerationConfig::from_file(write(R"({
    "_from_model_config": true, "transformers_version": "4.51.0", "some_future_field": [1, {}],
    "bos_token_id": 1, "eos_token_id": [2, 7], "pad_token_id": null, "do_sample": true,
    "temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0, "max_new_tokens": 100,
    "repetition_penalty": 1.1, "bad_words_ids": [[5], [7, 8]], "suppress_tokens": [3],
    "stop_strings": "END", "seed": 9, "cache_implementation": "static", "max_cache_len": 256,
    "disable_compile": true, "num_return_sequences": 2, "no_repeat_ngram_size": 3,
    "typical_p": 0.9, "min_new_tokens": 4, "min_length": 5, "max_length": 50
  })"));
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, (std::vector<int64_t>{2, 7}));
  EXPECT_FALSE(c.pad_token_id.has_value());  // null means unset
  EXPECT_EQ(c.do_sample, true);
  EXPECT_EQ(c.temperature, 0.6);
  EXPECT_EQ(c.top_k, 20);
  EXPECT_EQ(c.top_p, 0.95);
  EXPECT_EQ(c.min_p, 0.0);
  EXPECT_EQ(c.max_new_tokens, 100);
  EXPECT_EQ(c.repetition_penalty, 1.1);
  EXPECT_EQ(c.bad_words_ids, (std::vector<std::vector<int64_t>>{{5}, {7, 8}}));
  EXPECT_EQ(c.suppress_tokens, (std::vector<int64_t>{3}));
  EXPECT_EQ(c.stop_strings, (std::vector<std::string>{"END"}));
  EXPECT_EQ(c.seed, 9u);
  EXPECT_EQ(c.cache_implementation, "static");
  EXPECT_EQ(c.max_cache_len, 256);
  EXPECT_EQ(c.disable_compile, true);
  EXPECT_EQ(c.num_return_sequences, 2);
  EXPECT_EQ(c.no_repeat_ngram_size, 3);
  EXPECT_EQ(c.typical_p, 0.9);
  EXPECT_EQ(c.min_new_tokens, 4);
  EXPECT_EQ(c.min_length, 5);
  EXPECT_EQ(c.max_length, 50);
}

TEST_F(ConfigFile, EosMayBeOneIdAndAbsentFieldsStayUnset) {
  auto c = GenerationConfig::from_file(write(R"({"eos_token_id": 2})"));
  EXPECT_EQ(c.eos_token_id, (std::vector<int64_t>{2}));
  EXPECT_FALSE(c.max_new_tokens || c.do_sample || c.temperature || c.top_k || c.seed);
}

TEST_F(ConfigFile, ReadsTheTinyModelsFile) {
  auto c = GenerationConfig::from_file(std::string(TFORMERS_TEST_DATA) +
                                       "/models/tiny-llama/generation_config.json");
  EXPECT_EQ(c.eos_token_id, (std::vector<int64_t>{2}));
  EXPECT_EQ(c.bos_token_id, 1);
}

TEST_F(ConfigFile, WrongTypesAreFormatErrorsNamingTheField) {
  auto expect_format = [&](const std::string& text, const std::string& field) {
    try {
      GenerationConfig::from_file(write(text));
      ADD_FAILURE() << "no error for " << text;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("generation_config.json"), std::string::npos)
          << e.what();
    }
  };
  expect_format(R"({"top_k": "many"})", "top_k");
  expect_format(R"({"do_sample": 1})", "do_sample");
  expect_format(R"({"eos_token_id": "2"})", "eos_token_id");
  expect_format(R"({"bad_words_ids": [1, 2]})", "bad_words_ids[0]");
  expect_format(R"({"bad_words_ids": [[1, "x"]]})", "bad_words_ids[0][1]");
  expect_format(R"({"stop_strings": [1]})", "stop_strings[0]");
  expect_format(R"({"seed": -1})", "seed");
  expect_format(R"([1, 2])", "object");
  EXPECT_THROW(GenerationConfig::from_file(write("{\"top_k\": ")), FormatError);
  EXPECT_THROW(GenerationConfig::from_file((dir_ / "missing.json").string()), NotFoundError);
}

TEST_F(ConfigFile, ReadsBeamSearchFields) {
  auto c = GenerationConfig::from_file(
      write(R"({"num_beams": 4, "length_penalty": 0.5, "early_stopping": "never"})"));
  EXPECT_EQ(c.num_beams, 4);
  EXPECT_EQ(c.length_penalty, 0.5);
  EXPECT_EQ(c.early_stopping, EarlyStopping::kNever);
  EXPECT_EQ(GenerationConfig::from_file(write(R"({"early_stopping": true})")).early_stopping,
            EarlyStopping::kTrue);
  EXPECT_EQ(GenerationConfig::from_file(write(R"({"early_stopping": false})")).early_stopping,
            EarlyStopping::kFalse);
  EXPECT_THROW(GenerationConfig::from_file(write(R"({"early_stopping": "sometimes"})")),
               FormatError);
}

// JSON text (the Python package's generate() keyword arguments) reads as a file does, and errors
// name the source given.
TEST_F(ConfigFile, FromJsonStringReadsFieldsAndRefusesUnknownKeys) {
  auto c = GenerationConfig::from_json_string(
      R"({"max_new_tokens": 50, "do_sample": true, "eos_token_id": 2})", "generate() arguments");
  EXPECT_EQ(c.max_new_tokens, 50);
  EXPECT_EQ(c.do_sample, true);
  EXPECT_EQ(c.eos_token_id, std::vector<int64_t>{2});
  EXPECT_FALSE(c.temperature);
  try {
    GenerationConfig::from_json_string(R"({"max_new_tokens": "ten"})", "generate() arguments");
    ADD_FAILURE() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("generate() arguments"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("max_new_tokens"), std::string::npos) << e.what();
  }
  EXPECT_THROW(GenerationConfig::from_json_string("{", "generate() arguments"), FormatError);
  // A key that is no field is refused, naming it; Transformers' unimplemented fields and its
  // bookkeeping are not.
  try {
    GenerationConfig::from_json_string(R"({"max_new_token": 5})", "generate() arguments");
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("'max_new_token' is not a generation setting"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(GenerationConfig::from_json_string(
      R"({"transformers_version": "5.23.0", "use_cache": true, "output_scores": false,
          "temperature": null})",
      "generate() arguments"));
  // A file keeps Transformers' leniency: unknown keys are ignored.
  EXPECT_NO_THROW(GenerationConfig::from_file(write(R"({"max_new_token": 5})")));
}

// Transformers fields tformers does not implement are named on stderr when set to anything but
// their default, never ignored silently.
TEST_F(ConfigFile, UnimplementedFieldsAreNamedInAWarning) {
  ::testing::internal::CaptureStderr();
  GenerationConfig::from_file(write(R"({"num_beam_groups": 2, "diversity_penalty": 0.5,
    "constraints": [1], "penalty_alpha": 0.6, "assistant_lookbehind": 4,
    "prompt_lookup_num_tokens": 10, "num_assistant_tokens": 20, "renormalize_logits": false,
    "top_k": 5})"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  for (const char* name : {"num_beam_groups = 2", "diversity_penalty = 0.5", "constraints",
                           "penalty_alpha", "assistant_lookbehind"})
    EXPECT_NE(err.find(name), std::string::npos) << name << " missing from:\n" << err;
  // Defaults (as Transformers writes them) and implemented fields are not warned about.
  EXPECT_EQ(err.find("prompt_lookup_num_tokens"), std::string::npos) << err;
  EXPECT_EQ(err.find("num_assistant_tokens"), std::string::npos) << err;
  EXPECT_EQ(err.find("renormalize_logits"), std::string::npos) << err;
  EXPECT_EQ(err.find("top_k"), std::string::npos) << err;
}

TEST(MergedWith, SetFieldsOverrideUnsetOnesKeep) {
  GenerationConfig base;
  base.eos_token_id = std::vector<int64_t>{2};
  base.temperature = 0.6;
  base.max_new_tokens = 100;
  GenerationConfig call;
  call.max_new_tokens = 5;
  call.do_sample = true;
  GenerationConfig m = base.merged_with(call);
  EXPECT_EQ(m.max_new_tokens, 5);
  EXPECT_EQ(m.do_sample, true);
  EXPECT_EQ(m.temperature, 0.6);
  EXPECT_EQ(m.eos_token_id, (std::vector<int64_t>{2}));
  // Layering is ordered: the later layer wins.
  GenerationConfig over;
  over.max_new_tokens = 7;
  EXPECT_EQ(m.merged_with(over).max_new_tokens, 7);
  EXPECT_EQ(over.merged_with(m).max_new_tokens, 5);
}

TEST(Resolve, TransformersDefaults) {
  auto r = resolve({}, 4, kVocab, kPositions);
  EXPECT_EQ(r.max_new_tokens, 16);  // max_length 20 in total
  EXPECT_EQ(r.max_cache_len, 20);
  EXPECT_EQ(r.min_new_tokens, 0);
  EXPECT_FALSE(r.do_sample);
  EXPECT_EQ(r.num_return_sequences, 1);
  EXPECT_EQ(r.temperature, 1.0);
  EXPECT_EQ(r.top_k, 50);
  EXPECT_EQ(r.top_p, 1.0);
  EXPECT_FALSE(r.min_p);
  EXPECT_EQ(r.typical_p, 1.0);
  EXPECT_EQ(r.repetition_penalty, 1.0);
  EXPECT_TRUE(r.eos_token_id.empty());
  EXPECT_FALSE(r.pad_token_id);
  EXPECT_FALSE(r.disable_compile);
  GenerationConfig s;
  s.do_sample = true;
  EXPECT_EQ(resolve(s, 4, kVocab, kPositions).top_k, 50);
}

TEST(Resolve, MaxNewTokensWinsOverMaxLength) {
  GenerationConfig c;
  c.max_length = 10;
  EXPECT_EQ(resolve(c, 4, kVocab, kPositions).max_new_tokens, 6);
  c.max_new_tokens = 3;
  auto r = resolve(c, 4, kVocab, kPositions);
  EXPECT_EQ(r.max_new_tokens, 3);
  EXPECT_EQ(r.max_cache_len, 7);  // prompt + max_new_tokens
}

TEST(Resolve, MinNewTokensWinsOverMinLength) {
  GenerationConfig c;
  c.min_length = 10;
  EXPECT_EQ(resolve(c, 4, kVocab, kPositions).min_new_tokens, 6);
  EXPECT_EQ(resolve(c, 12, kVocab, kPositions).min_new_tokens, 0);
  c.min_new_tokens = 2;
  EXPECT_EQ(resolve(c, 4, kVocab, kPositions).min_new_tokens, 2);
}

TEST(Resolve, ExplicitMaxCacheLen) {
  GenerationConfig c;
  c.max_new_tokens = 4;
  c.max_cache_len = 64;
  EXPECT_EQ(resolve(c, 4, kVocab, kPositions).max_cache_len, 64);
}

TEST(Resolve, SamplingFieldsAreIgnoredWithoutSampling) {
  GenerationConfig c;
  c.temperature = 0.0;
  c.top_p = 5.0;
  c.top_k = -3;
  c.typical_p = 0.0;
  c.min_p = 2.0;
  auto r = resolve(c, 4, kVocab, kPositions);
  EXPECT_EQ(r.temperature, 1.0);
  EXPECT_EQ(r.top_p, 1.0);
  EXPECT_FALSE(r.min_p);
}

TEST(Resolve, SamplingFieldsAreKeptWithSampling) {
  GenerationConfig c;
  c.do_sample = true;
  c.temperature = 0.6;
  c.top_k = 0;
  c.top_p = 0.95;
  c.min_p = 0.0;
  c.typical_p = 0.5;
  c.num_return_sequences = 3;
  auto r = resolve(c, 4, kVocab, kPositions);
  EXPECT_EQ(r.temperature, 0.6);
  EXPECT_EQ(r.top_k, 0);
  EXPECT_EQ(r.top_p, 0.95);
  EXPECT_EQ(r.min_p, 0.0);
  EXPECT_EQ(r.typical_p, 0.5);
  EXPECT_EQ(r.num_return_sequences, 3);
}

TEST(Resolve, PadFallsBackToTheFirstEos) {
  GenerationConfig c;
  c.eos_token_id = std::vector<int64_t>{7, 2};
  EXPECT_EQ(resolve(c, 4, kVocab, kPositions).pad_token_id, 7);
  c.pad_token_id = 0;
  EXPECT_EQ(resolve(c, 4, kVocab, kPositions).pad_token_id, 0);
}

TEST(Resolve, SeedIsKeptOrDrawn) {
  GenerationConfig c;
  c.seed = 123;
  EXPECT_EQ(resolve(c, 4, kVocab, kPositions).seed, 123u);
  // Two unset seeds colliding has probability 2^-64.
  EXPECT_NE(resolve({}, 4, kVocab, kPositions).seed, resolve({}, 4, kVocab, kPositions).seed);
}

// Expects InvalidArgumentError whose message holds every one of `parts`.
void expect_invalid(const GenerationConfig& c, std::vector<std::string> parts,
                    int64_t prompt_len = 4, int64_t positions = kPositions) {
  try {
    resolve(c, prompt_len, kVocab, positions);
    ADD_FAILURE() << "no error, expected one mentioning " << parts[0];
  } catch (const InvalidArgumentError& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\n  lacks " << p;
  }
}

GenerationConfig sampling() {
  GenerationConfig c;
  c.do_sample = true;
  return c;
}

TEST(ResolveErrors, MaxNewTokensNotPositive) {
  GenerationConfig c;
  c.max_new_tokens = 0;
  expect_invalid(c, {"max_new_tokens", "greater than 0", "got 0"});
  c.max_new_tokens = -5;
  expect_invalid(c, {"max_new_tokens", "-5"});
}

// The largest int64 must not wrap around when added to the prompt length (it used to pass the
// length check and fail later).
TEST(ResolveErrors, MaxNewTokensNearInt64MaxDoesNotOverflow) {
  GenerationConfig c;
  c.max_new_tokens = INT64_MAX;
  expect_invalid(
      c, {"9223372036854775807", "9223372036854775811 positions", "max_new_tokens to at most 508"});
}

TEST(ResolveErrors, BeamSearch) {
  GenerationConfig c;
  c.num_beams = 0;
  expect_invalid(c, {"num_beams", ">= 1"});
  c.num_beams = 2;
  c.num_return_sequences = 3;
  expect_invalid(c, {"num_return_sequences (3)", "at most num_beams (2)"});
  c.num_return_sequences = 2;
  EXPECT_EQ(resolve(c, 4, kVocab, kPositions).num_return_sequences, 2);
  c.do_sample = true;
  EXPECT_THROW(resolve(c, 4, kVocab, kPositions), UnsupportedError);
}

TEST(ResolveErrors, MaxLengthLeavesNoRoom) {
  GenerationConfig c;
  c.max_length = 4;
  expect_invalid(c, {"max_length = 4", "max_new_tokens"});
  expect_invalid({}, {"max_length = 20", "default", "max_new_tokens"}, 25);
}

TEST(ResolveErrors, TopPOutsideZeroOne) {
  for (double p : {0.0, -0.1, 1.5}) {
    GenerationConfig c = sampling();
    c.top_p = p;
    expect_invalid(c, {"top_p", "(0, 1]"});
  }
}

TEST(ResolveErrors, TemperatureNotPositiveWithSampling) {
  for (double t : {0.0, -1.0}) {
    GenerationConfig c = sampling();
    c.temperature = t;
    expect_invalid(c, {"temperature", "strictly positive", "do_sample=false"});
  }
}

// A double that float cannot hold once the processors scale float32 scores by it: 1e-300 became
// 0 (and an internal error at the first token), 1e300 infinity (and nan scores). Both are now
// refused here, naming the range; the extremes of the range are accepted.
TEST(ResolveErrors, FactorsOutsideFloatAreRefusedWithTheRange) {
  for (double v : {1e-300, 1e-39, 1e39, 1e300, std::numeric_limits<double>::quiet_NaN(),
                   std::numeric_limits<double>::infinity()}) {
    GenerationConfig c = sampling();
    c.temperature = v;
    expect_invalid(c, {"temperature", "[1.17549e-38, 3.40282e+38]"});
    c = {};
    c.repetition_penalty = v;
    expect_invalid(c, {"repetition_penalty", "[1.17549e-38, 3.40282e+38]"});
  }
  for (double v :
       {double(std::numeric_limits<float>::min()), double(std::numeric_limits<float>::max())}) {
    GenerationConfig c = sampling();
    c.temperature = v;
    c.repetition_penalty = v;
    const ResolvedGenerationConfig r = resolve(c, 4, kVocab, kPositions);
    EXPECT_EQ(r.temperature, v);
    EXPECT_EQ(r.repetition_penalty, v);
  }
}

// A cache past the model's positions can never be filled, and 2^62 of them overflowed the size
// of the cache mask (a write past its end, SIGSEGV, in left_pad).
TEST(ResolveErrors, MaxCacheLenBeyondThePositionsIsRefused) {
  GenerationConfig c;
  c.max_new_tokens = 4;
  for (int64_t len :
       {int64_t(kPositions) + 1, int64_t(1) << 62, std::numeric_limits<int64_t>::max()}) {
    c.max_cache_len = len;
    expect_invalid(c, {"max_cache_len = " + std::to_string(len), "512 positions", "give 8 to 512"});
  }
  c.max_cache_len = kPositions;
  EXPECT_EQ(resolve(c, 4, kVocab, kPositions).max_cache_len, kPositions);
}

TEST(ResolveErrors, OtherSamplingRanges) {
  GenerationConfig c = sampling();
  c.top_k = -1;
  expect_invalid(c, {"top_k", "non-negative"});
  c = sampling();
  c.typical_p = 0.0;
  expect_invalid(c, {"typical_p", "(0, 1]"});
  c.typical_p = 1.1;
  expect_invalid(c, {"typical_p", "(0, 1]"});
  c = sampling();
  c.min_p = -0.1;
  expect_invalid(c, {"min_p", "[0, 1]"});
  c.min_p = 1.1;
  expect_invalid(c, {"min_p", "[0, 1]"});
}

TEST(ResolveErrors, ProcessorRanges) {
  GenerationConfig c;
  c.repetition_penalty = 0.0;
  expect_invalid(c, {"repetition_penalty", "strictly positive"});
  c.repetition_penalty = -1.0;
  expect_invalid(c, {"repetition_penalty"});
  c = {};
  c.no_repeat_ngram_size = -1;
  expect_invalid(c, {"no_repeat_ngram_size", ">= 0"});
  c = {};
  c.min_new_tokens = -1;
  expect_invalid(c, {"min_new_tokens", ">= 0"});
  c = {};
  c.min_length = -1;
  expect_invalid(c, {"min_length", ">= 0"});
}

TEST(ResolveErrors, TokenIdsOutsideTheVocabulary) {
  GenerationConfig c;
  c.eos_token_id = std::vector<int64_t>{2, 512};
  expect_invalid(c, {"eos_token_id[1] = 512", "[0, 512)"});
  c = {};
  c.eos_token_id = std::vector<int64_t>{-1};
  expect_invalid(c, {"eos_token_id[0] = -1"});
  c = {};
  c.bad_words_ids = std::vector<std::vector<int64_t>>{{5}, {6, 600}};
  expect_invalid(c, {"bad_words_ids[1][1] = 600", "[0, 512)"});
  c.bad_words_ids = std::vector<std::vector<int64_t>>{{5}, {}};
  expect_invalid(c, {"bad_words_ids[1]", "empty"});
  c = {};
  c.suppress_tokens = std::vector<int64_t>{1000};
  expect_invalid(c, {"suppress_tokens[0] = 1000", "[0, 512)"});
  // 2**32 became pad id 0 on its way to int32, and other ids read past the embedding.
  c = {};
  c.pad_token_id = int64_t(1) << 32;
  expect_invalid(c, {"pad_token_id[0] = 4294967296", "[0, 512)"});
  c.pad_token_id = 512;
  expect_invalid(c, {"pad_token_id[0] = 512"});
}

TEST(ResolveErrors, PromptTooLongForTheModel) {
  GenerationConfig c;
  c.max_new_tokens = 10;
  // 505 + 10 > 512: says how many new tokens fit.
  expect_invalid(c, {"515 positions", "512", "max_new_tokens to at most 7"}, 505);
  expect_invalid(c, {"600 tokens", "512 positions", "shorten the prompt"}, 600);
  expect_invalid(c, {"empty"}, 0);
  c.max_new_tokens = 8;  // exactly fits
  EXPECT_EQ(resolve(c, 504, kVocab, kPositions).max_cache_len, 512);
}

TEST(ResolveErrors, NumReturnSequences) {
  GenerationConfig c;
  c.num_return_sequences = 2;
  expect_invalid(c, {"num_return_sequences", "do_sample=true"});
  c.num_return_sequences = 0;
  c.do_sample = true;
  expect_invalid(c, {"num_return_sequences", ">= 1"});
}

TEST(ResolveErrors, CacheAndStopStrings) {
  GenerationConfig c;
  c.max_new_tokens = 10;
  c.max_cache_len = 12;
  expect_invalid(c, {"max_cache_len = 12", "at least 14"});
  c = {};
  c.cache_implementation = "offloaded";
  EXPECT_THROW(resolve(c, 4, kVocab, kPositions), UnsupportedError);
  c = {};
  c.stop_strings = std::vector<std::string>{"ok", ""};
  expect_invalid(c, {"stop_strings[1]", "empty"});
}

}  // namespace
}  // namespace tformers
