// JSON files and typed field access: messages name the file, the position and the field.
#include "io/json.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace tformers::io
