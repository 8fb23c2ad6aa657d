// JSON files and typed field access: messages name the file, the position and the field.
#include "io/json.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include "io/io_test_util.h"

namespace tformers::io {
namespace {

using testing::error_of;
using testing::TempDir;
using testing::write_bytes;

TEST(Json, LoadsAFile) {
  TempDir dir;
  write_bytes(dir.file("config.json"), R"({"hidden_size": 64, "architectures": ["X"]})");
  Json j = load_json_file(dir.file("config.json"));
  EXPECT_EQ(j["hidden_size"], 64);
}

TEST(Json, MissingFileIsNotFound) {
  TempDir dir;
  std::string p = dir.file("config.json");
  EXPECT_HAS(error_of<NotFoundError>([&] { load_json_file(p); }), p);
}

TEST(Json, MalformedFileGivesLineAndColumn) {
  TempDir dir;
  std::string p = dir.file("config.json");
  // Line 3 has a stray ']' at column 8.
  write_bytes(p, "{\n  \"a\": 1,\n  \"b\": ]\n}\n");
  std::string msg = error_of<FormatError>([&] { load_json_file(p); });
  EXPECT_HAS(msg, p + ":3:8:");
  // nlohmann computes its own position; ours must agree with it.
  try {
    Json j = Json::parse(testing::read_bytes(p));
    ADD_FAILURE() << "nlohmann accepted " << j.dump();
  } catch (const Json::parse_error& e) {
    EXPECT_HAS(std::string(e.what()), "line 3, column 8");
  }
  write_bytes(p, "");
  EXPECT_HAS(error_of<FormatError>([&] { load_json_file(p); }), p + ":1:1:");
  write_bytes(p, "{\"a\": tru}");
  EXPECT_HAS(error_of<FormatError>([&] { load_json_file(p); }), p + ":1:");
}

TEST(Json, RequiredFieldMissing) {
  Json c = {{"vocab_size", 10}};
  EXPECT_EQ(
      error_of<NotFoundError>([&] { get_required<int64_t>(c, "hidden_size", "config.json"); }),
      "config.json: required field 'hidden_size' is missing");
  Json n = {{"hidden_size", nullptr}};
  EXPECT_HAS(error_of<NotFoundError>([&] { get_required<int>(n, "hidden_size", "config.json"); }),
             "'hidden_size' is null");
  EXPECT_TRUE(get_required<Json>(n, "hidden_size", "config.json").is_null());
}

TEST(Json, WrongTypeNamesFieldAndExpectedType) {
  Json c = {{"hidden_size", "64"}, {"tie", 1}, {"act", 3}, {"eps", "x"}, {"ids", {1, "2"}}};
  std::string msg =
      error_of<FormatError>([&] { get_required<int64_t>(c, "hidden_size", "config.json"); });
  EXPECT_HAS(msg, "config.json: field 'hidden_size' must be an integer");
  EXPECT_HAS(msg, "string \"64\"");
  EXPECT_HAS(error_of<FormatError>([&] { get_required<bool>(c, "tie", "config.json"); }),
             "'tie' must be a boolean");
  EXPECT_HAS(error_of<FormatError>([&] { get_required<std::string>(c, "act", "config.json"); }),
             "'act' must be a string");
  EXPECT_HAS(error_of<FormatError>([&] { get_or<double>(c, "eps", 1e-6, "config.json"); }),
             "'eps' must be a number");
  EXPECT_HAS(error_of<FormatError>([&] { get_required<std::vector<int64_t>>(c, "ids", "g.json"); }),
             "g.json: field 'ids[1]' must be an integer");
  EXPECT_HAS(error_of<FormatError>([&] { get_required<int>(Json::array(), "x", "config.json"); }),
             "config.json: expected a JSON object");
}

TEST(Json, IntegerRangesAndIntegralFloats) {
  Json c = {{"big", 1LL << 40}, {"neg", -5}, {"f", 4096.0}, {"frac", 1.5}, {"u", UINT64_MAX}};
  EXPECT_EQ(get_required<int64_t>(c, "big", "c"), 1LL << 40);
  EXPECT_HAS(error_of<FormatError>([&] { get_required<int>(c, "big", "c"); }), "out of range");
  EXPECT_EQ(get_required<int>(c, "neg", "c"), -5);
  EXPECT_EQ(get_required<int>(c, "f", "c"), 4096);
  EXPECT_HAS(error_of<FormatError>([&] { get_required<int>(c, "frac", "c"); }), "an integer");
  EXPECT_HAS(error_of<FormatError>([&] { get_required<int64_t>(c, "u", "c"); }), "out of range");
  EXPECT_DOUBLE_EQ(get_required<double>(c, "neg", "c"), -5.0);
  EXPECT_FLOAT_EQ(get_required<float>(c, "frac", "c"), 1.5f);
}

TEST(Json, OptionalAndDefaults) {
  Json c = {{"rope_scaling", nullptr}, {"eos_token_id", 2}, {"eos_list", {1, 2}}, {"name", "q"}};
  EXPECT_FALSE(get_optional<Json>(c, "rope_scaling", "c").has_value());
  EXPECT_FALSE(get_optional<int>(c, "absent", "c").has_value());
  EXPECT_EQ(get_or<double>(c, "rope_theta", 10000.0, "c"), 10000.0);
  EXPECT_EQ(get_or<bool>(c, "rope_scaling", true, "c"), true);
  EXPECT_EQ(get_or<std::string>(c, "name", "x", "c"), "q");
  EXPECT_EQ(get_required<std::vector<int64_t>>(c, "eos_token_id", "c"), std::vector<int64_t>({2}));
  EXPECT_EQ(get_optional<std::vector<int64_t>>(c, "eos_list", "c"), std::vector<int64_t>({1, 2}));
}

TEST(Json, RangeCheckedIntegers) {
  Json c = {{"head_dim", int64_t(1) << 62}, {"layers", 4}, {"f", 64.0},      {"big", 1e30},
            {"u", uint64_t(1) << 63},       {"s", "4"},    {"null", nullptr}};
  EXPECT_EQ(get_int_in(c, "layers", 1, 1024, "config.json"), 4);
  EXPECT_EQ(get_int_in(c, "f", 1, 1024, "config.json"), 64);
  EXPECT_EQ(error_of<FormatError>([&] { get_int_in(c, "head_dim", 1, 65536, "config.json"); }),
            "config.json: field 'head_dim' = 4611686018427387904 is out of range; allowed [1, "
            "65536]");
  EXPECT_HAS(error_of<FormatError>([&] { get_int_in(c, "layers", 5, 10, "config.json"); }),
             "'layers' = 4 is out of range; allowed [5, 10]");
  EXPECT_HAS(error_of<FormatError>([&] { get_int_in(c, "big", 1, 10, "config.json"); }),
             "'big' = floating-point number 1e+30 is out of range");
  EXPECT_HAS(error_of<FormatError>([&] { get_int_in(c, "u", 1, 10, "config.json"); }),
             "'u' = 9223372036854775808 is out of range");
  EXPECT_HAS(error_of<FormatError>([&] { get_int_in(c, "s", 1, 10, "config.json"); }),
             "'s' must be an integer");
  EXPECT_HAS(error_of<NotFoundError>([&] { get_int_in(c, "absent", 1, 10, "config.json"); }),
             "config.json: required field 'absent' is missing");
  EXPECT_HAS(error_of<NotFoundError>([&] { get_int_in(c, "null", 1, 10, "config.json"); }),
             "'null' is missing");
  EXPECT_EQ(get_int_in_or(c, "absent", 7, 1, 10, "c"), 7);
  EXPECT_EQ(get_int_in_or(c, "null", 7, 1, 10, "c"), 7);
  EXPECT_HAS(error_of<FormatError>([&] { get_int_in_or(c, "layers", 7, 5, 10, "c"); }),
             "allowed [5, 10]");
  EXPECT_FALSE(get_int_in_optional(c, "absent", 1, 10, "c").has_value());
  EXPECT_EQ(get_int_in_optional(c, "layers", 1, 10, "c"), 4);
  EXPECT_HAS(error_of<FormatError>([&] { get_int_in_optional(c, "layers", 5, 10, "c"); }),
             "allowed [5, 10]");
}

TEST(Json, PositiveFiniteAndRangedDoubles) {
  Json c = Json::parse(R"({"theta": 1e6, "zero": 0, "neg": -1e-6, "int": 3, "s": "1",
                           "half": 0.5})");
  EXPECT_EQ(get_positive_finite(c, "theta", "config.json"), 1e6);
  EXPECT_EQ(get_positive_finite(c, "int", "config.json"), 3.0);
  EXPECT_EQ(error_of<FormatError>([&] { get_positive_finite(c, "zero", "config.json"); }),
            "config.json: field 'zero' = 0 must be a finite number > 0");
  EXPECT_HAS(error_of<FormatError>([&] { get_positive_finite(c, "neg", "config.json"); }),
             "'neg' = -1e-06 must be a finite number > 0");
  EXPECT_HAS(error_of<FormatError>([&] { get_positive_finite(c, "s", "config.json"); }),
             "'s' must be a number");
  EXPECT_HAS(error_of<NotFoundError>([&] { get_positive_finite(c, "x", "config.json"); }),
             "'x' is missing");
  EXPECT_EQ(get_positive_finite_or(c, "x", 1e-6, "c"), 1e-6);
  EXPECT_HAS(error_of<FormatError>([&] { get_positive_finite_or(c, "neg", 1.0, "c"); }),
             "must be a finite number > 0");
  EXPECT_EQ(get_double_in(c, "half", 0.0, 1.0, "c"), 0.5);
  EXPECT_EQ(get_double_in(c, "zero", 0.0, 1.0, "c"), 0.0);
  EXPECT_HAS(error_of<FormatError>([&] { get_double_in(c, "theta", 0.0, 1.0, "c"); }),
             "c: field 'theta' = 1000000.0 is out of range; allowed [0, 1]");
  EXPECT_EQ(get_double_in_or(c, "x", 0.25, 0.0, 1.0, "c"), 0.25);
}

TEST(Json, DeepNestingIsAnErrorNotAStackOverflow) {
  TempDir dir;
  std::string p = dir.file("tokenizer_config.json");
  // 150k levels crashed a recursive copy; the depth check rejects it before parsing.
  write_bytes(p, "{\"a\":" + std::string(150000, '[') + std::string(150000, ']') + "}");
  EXPECT_HAS(error_of<FormatError>([&] { load_json_file(p); }),
             p + ":1:517: JSON nests deeper than 512 levels (byte 516)");
  // Brackets inside strings, escaped quotes included, do not count.
  std::string ok = "{\"a\": \"\\\"" + std::string(1000, '[') + "\"}";
  EXPECT_EQ(parse_json(ok, "x").at("a").get<std::string>().size(), 1001u);
  std::string at_limit = std::string(512, '[') + std::string(512, ']');
  EXPECT_NO_THROW(parse_json(at_limit, "x"));
  EXPECT_HAS(error_of<FormatError>([&] { parse_json("[" + at_limit + "]", "x"); }),
             "deeper than 512");
}

TEST(Json, NonRegularAndOversizedFilesAreRejectedWithoutReading) {
  TempDir dir;
  std::string fifo = dir.file("config.json");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // Without O_NONBLOCK this open waits for a writer forever.
  EXPECT_EQ(error_of<IoError>([&] { load_json_file(fifo); }),
            fifo + ": is a FIFO, expected a regular JSON file");
  std::string zero = dir.file("zero/config.json");
  std::filesystem::create_directories(dir.path() / "zero");
  std::filesystem::create_symlink("/dev/zero", zero);
  EXPECT_HAS(error_of<IoError>([&] { load_json_file(zero); }), zero + ": is a character device");
  EXPECT_HAS(error_of<IoError>([&] { load_json_file(dir.path().string()); }), "is a directory");
  std::string big = dir.file("big.json");
  write_bytes(big, "[" + std::string(100, ' ') + "]");
  EXPECT_EQ(error_of<FormatError>([&] { load_json_file(big, 64); }),
            big + ": JSON file is 102 bytes, over the limit of 64 bytes for this kind of file");
}

TEST(Json, UnreadableFileIsAnIoError) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads files regardless of permissions";
  TempDir dir;
  std::string p = dir.file("config.json");
  write_bytes(p, "{}");
  std::filesystem::permissions(p, std::filesystem::perms::none);
  EXPECT_HAS(error_of<IoError>([&] { load_json_file(p); }),
             p + ": cannot open JSON file for reading: Permission denied");
}

}  // namespace
}  // namespace tformers::io
