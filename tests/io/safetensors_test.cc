// safetensors reading, writing and validation. Bad files are written byte by byte so each test
// controls exactly which field is wrong; every error must name the file and the tensor or offset.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>

#include "common/random_floats.h"
#include "io/io_test_util.h"
#include "io/json.h"

namespace tformers::io {
namespace {

using testing::error_of;
using testing::raw_safetensors;
using testing::TempDir;
using testing::write_bytes;
using tformers::testing::random_floats;

Tensor random_tensor(Shape shape, DType dtype, uint32_t seed) {
  std::vector<float> v = random_floats(size_t(shape_numel(shape)), seed, 3.0f);
  Tensor f = Tensor::from_vector(shape, DType::f32, v);
  return f.to(dtype);
}

// Bytes of a tensor, for exact comparisons.
std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw()), t.nbytes());
}

std::string floats_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// ---- round trips -----------------------------------------------------------------------------

TEST(Safetensors, RoundTripF32Bf16F16) {
  TempDir dir;
  std::vector<std::pair<std::string, Tensor>> ts = {
      {"model.embed_tokens.weight", random_tensor({7, 5}, DType::bf16, 1)},
      {"model.norm.weight", random_tensor({5}, DType::f32, 2)},
      {"lm_head.weight", random_tensor({3, 5}, DType::f16, 3)},
      {"positions", Tensor::from_vector<int64_t>({3}, DType::i64, {4, -1, 1LL << 40})},
      {"scalar", Tensor::from_vector<float>({}, DType::f32, {2.5f})},
      {"empty", Tensor::zeros({0, 4}, DType::bf16)},
  };
  std::string path = dir.file("model.safetensors");
  save_safetensors(path, ts, {{"format", "pt"}});

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  ASSERT_EQ(f->tensors().size(), ts.size());
  for (const auto& [name, t] : ts) {
    SCOPED_TRACE(name);
    const TensorInfo* info = f->find(name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, t.dtype());
    EXPECT_EQ(info->shape, t.shape());
    EXPECT_EQ(info->nbytes, t.nbytes());
    EXPECT_EQ(info->file, path);
    Tensor got = f->get(name);
    EXPECT_EQ(got.shape(), t.shape());
    EXPECT_EQ(got.dtype(), t.dtype());
    EXPECT_EQ(bytes_of(got), bytes_of(t));
    // Written files keep every tensor aligned to its element size, so these are views.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got.raw()) % dtype_size(t.dtype()), 0u);
  }
  // Larger elements are stored first, so no tensor needs padding.
  EXPECT_EQ(f->tensors().front().dtype, DType::i64);
  EXPECT_EQ(f->tensors().back().name, "empty");
}

TEST(Safetensors, WrittenHeaderFollowsTheFormat) {
  // Parse the written file with nothing but the format's definition: 8-byte little-endian
  // length, JSON header, data. This checks the writer independently of our reader.
  TempDir dir;
  std::vector<float> w = {1, 2, 3, 4, 5, 6};
  std::string path = dir.file("x.safetensors");
  save_safetensors(path, {{"w", Tensor::from_vector({2, 3}, DType::f32, w)}});
  std::string bytes = testing::read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u);
  Json h = Json::parse(bytes.substr(8, n));
  EXPECT_EQ(h["w"]["dtype"], "F32");
  EXPECT_EQ(h["w"]["shape"], Json::array({2, 3}));
  EXPECT_EQ(h["w"]["data_offsets"], Json::array({0, 24}));
  EXPECT_EQ(bytes.substr(8 + n), floats_bytes(w));
  EXPECT_FALSE(h.contains("__metadata__"));
}

TEST(Safetensors, TensorsOutliveTheFileObject) {
  TempDir dir;
  std::string path = dir.file("model.safetensors");
  Tensor t = random_tensor({64, 16}, DType::f32, 4);
  save_safetensors(path, {{"w", t}});
  Tensor got;
  {
    Checkpoint c = Checkpoint::open(dir.path().string());
    got = c.get("w");
  }  // the mapping must stay alive through `got`
  EXPECT_EQ(bytes_of(got), bytes_of(t));
}

// A file cut short after it was opened (and its header read): the bytes past the new end used
// to raise SIGBUS on first touch and end the process without a word. They now read as zeros
// and check_mapped_files() names the file.
TEST(Safetensors, AFileThatShrinksAfterOpenIsAnErrorNotASignal) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  Tensor t = random_tensor({256, 1024}, DType::f32, 5);  // 1 MiB: many pages past the cut
  save_safetensors(path, {{"w", t}});
  std::shared_ptr<SafetensorsFile> f = SafetensorsFile::open(path);
  EXPECT_NO_THROW(check_mapped_files());
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  Tensor w = f->get("w");
  const float* data = w.data<float>();
  float sum = 0;
  for (int64_t i = w.numel() / 2; i < w.numel(); ++i) sum += data[i];
  EXPECT_EQ(sum, 0.0f);  // the part past the cut, replaced by zero pages
  const std::string message = error_of<IoError>([] { check_mapped_files(); });
  EXPECT_NE(message.find(path + ": the file shrank while tformers was reading it (it is 4096 "
                                "bytes now"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("renaming it over the old one"), std::string::npos) << message;
  w = Tensor();
  f.reset();
  // The mapping is gone, and with it the mark: other files are not blamed.
  EXPECT_NO_THROW(check_mapped_files());
}

TEST(Safetensors, MisalignedTensorsAreCopiedAligned) {
  // A 1-byte U8 tensor first makes the F32 one start at an odd address; valid per the format.
  TempDir dir;
  std::vector<float> w = {1.5f, -2.f, 3.25f};
  std::string header = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("w":{"dtype":"F32","shape":[3],"data_offsets":[1,13]}})";
  header.append((8 - (8 + header.size()) % 8) % 8, ' ');
  std::string path = dir.file("model.safetensors");
  write_bytes(path, raw_safetensors(header, std::string(1, '\x7f') + floats_bytes(w)));
  auto f = SafetensorsFile::open(path);
  Tensor got = f->get("w");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(got.raw()) % 4, 0u);
  EXPECT_EQ(got.to_f32_vector(), w);
  Tensor row = f->get_rows("w", 1, 3);
  EXPECT_EQ(row.to_f32_vector(), std::vector<float>({-2.f, 3.25f}));
  EXPECT_EQ(f->get("a").data<uint8_t>()[0], 0x7f);
}

TEST(Safetensors, GetRows) {
  TempDir dir;
  Tensor t = random_tensor({6, 4}, DType::bf16, 5);
  save_safetensors(dir.file("model.safetensors"),
                   {{"emb", t}, {"s", Tensor::zeros({}, DType::f32)}});
  Checkpoint c = Checkpoint::open(dir.path().string());
  Tensor rows = c.get_rows("emb", 2, 5);
  EXPECT_EQ(rows.shape(), Shape({3, 4}));
  EXPECT_EQ(bytes_of(rows), bytes_of(t).substr(2 * 4 * 2, 3 * 4 * 2));
  EXPECT_EQ(c.get_rows("emb", 0, 6).nbytes(), t.nbytes());
  EXPECT_EQ(c.get_rows("emb", 6, 6).shape(), Shape({0, 4}));

  for (std::pair<int64_t, int64_t> range : {std::pair<int64_t, int64_t>{-1, 2}, {3, 2}, {0, 7}}) {
    const int64_t b = range.first, e = range.second;
    std::string msg = error_of<InvalidArgumentError>([&] { c.get_rows("emb", b, e); });
    EXPECT_HAS(msg, "'emb'");
    EXPECT_HAS(msg, "[6, 4]");
  }
  EXPECT_HAS(error_of<InvalidArgumentError>([&] { c.get_rows("s", 0, 1); }), "scalar");
  EXPECT_HAS(error_of<NotFoundError>([&] { c.get_rows("nope", 0, 1); }), "'nope'");
}

// A header listing 200,000 tensors (a few MB) opens in time linear in its size, in header order
// (written here from the last name down, so neither sorted order nor insertion into a sorted map
// gives it), and so does writing that many.
TEST(Safetensors, HeadersOfVeryManyTensorsOpenInLinearTime) {
  constexpr int kTensors = 200'000;
  TempDir dir;
  std::string header = "{", data;
  for (int i = kTensors - 1; i >= 0; --i) {
    const uint64_t at = data.size();
    header += detail::str_cat(i + 1 < kTensors ? "," : "", "\"t", i, "\":{\"dtype\":\"U8\",",
                              "\"shape\":[1],\"data_offsets\":[", at, ",", at + 1, "]}");
    data += char(i & 0x7f);
  }
  header += "}";
  const std::string path = dir.file("many.safetensors");
  write_bytes(path, raw_safetensors(header, data));

  const auto start = std::chrono::steady_clock::now();
  auto f = SafetensorsFile::open(path);
  const double open_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(f->tensors().size(), size_t(kTensors));
  EXPECT_EQ(f->tensors().front().name, detail::str_cat("t", kTensors - 1));
  EXPECT_EQ(f->tensors()[1].name, detail::str_cat("t", kTensors - 2));
  EXPECT_EQ(f->tensors().back().name, "t0");
  EXPECT_EQ(f->get("t5").data<uint8_t>()[0], 5);
  // Linear parsing takes under a second in a release build (a few under AddressSanitizer, or on
  // a loaded machine); the quadratic parser took over a minute. The bound leaves room for both.
  EXPECT_LT(open_s, 30.0) << "opening a header of " << kTensors << " tensors";

  std::vector<std::pair<std::string, Tensor>> ts;
  for (const auto& info : f->tensors()) ts.emplace_back(info.name, f->get(info.name));
  const auto save_start = std::chrono::steady_clock::now();
  save_safetensors(dir.file("copy.safetensors"), ts);
  const double save_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - save_start).count();
  EXPECT_LT(save_s, 30.0) << "writing " << kTensors << " tensors";
  EXPECT_EQ(SafetensorsFile::open(dir.file("copy.safetensors"))->tensors().front().name,
            f->tensors().front().name);
}

TEST(Checkpoint, NamesHasInfoAndTotalBytes) {
  TempDir dir;
  save_safetensors(dir.file("model.safetensors"), {{"b", random_tensor({2, 2}, DType::f32, 1)},
                                                   {"a", random_tensor({3}, DType::bf16, 2)}});
  Checkpoint c = Checkpoint::open(dir.path().string());
  EXPECT_EQ(c.names(), std::vector<std::string>({"a", "b"}));
  EXPECT_TRUE(c.has("a"));
  EXPECT_FALSE(c.has("c"));
  EXPECT_EQ(c.info("a").shape, Shape({3}));
  EXPECT_EQ(c.total_bytes(), 16u + 6u);
  std::string msg = error_of<NotFoundError>([&] { c.info("missing.weight"); });
  EXPECT_HAS(msg, "'missing.weight'");
  EXPECT_HAS(msg, dir.path().string());
  // A single file can be opened directly too.
  EXPECT_EQ(Checkpoint::open(dir.file("model.safetensors")).names().size(), 2u);
}

// ---- bad files: one test per case ---------------------------------------------------------

class BadFile : public ::testing::Test {
 protected:
  // Writes the raw bytes and returns the FormatError message of opening them.
  std::string open_error(const std::string& bytes) {
    write_bytes(path_, bytes);
    std::string msg = error_of<FormatError>([&] { SafetensorsFile::open(path_); });
    EXPECT_HAS(msg, path_);  // every message names the file
    // A checkpoint folder reports the same error.
    std::string msg2 = error_of<FormatError>([&] { Checkpoint::open(dir_.path().string()); });
    EXPECT_EQ(msg, msg2);
    return msg;
  }
  std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                    uint64_t b, uint64_t e) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
           ",\"data_offsets\":[" + std::to_string(b) + "," + std::to_string(e) + "]}";
  }
  TempDir dir_;
  std::string path_ = dir_.file("model.safetensors");
};

TEST_F(BadFile, ShorterThanTheLengthField) {
  std::string msg = open_error(std::string("\x10\0\0\0", 4));
  EXPECT_HAS(msg, "4 bytes");
  EXPECT_HAS(msg, "truncated");
}

TEST_F(BadFile, TruncatedData) {
  // A valid file cut in the middle of its data: the tensor now runs past the end.
  std::vector<float> w(8, 1.f);
  save_safetensors(path_, {{"layer.weight", Tensor::from_vector({2, 4}, DType::f32, w)}});
  std::string bytes = testing::read_bytes(path_);
  std::string msg = open_error(bytes.substr(0, bytes.size() - 5));
  EXPECT_HAS(msg, "'layer.weight'");
  EXPECT_HAS(msg, "[0, 32]");
  EXPECT_HAS(msg, "27 bytes");
}

TEST_F(BadFile, HeaderLengthPastTheEnd) {
  std::string header = "{" + entry("w", "F32", "[1]", 0, 4) + "}";
  std::string msg = open_error(raw_safetensors(header, "abcd", 1000));
  EXPECT_HAS(msg, "header length 1000");
  EXPECT_HAS(msg, "past the end");
  // The largest possible value must not overflow the bounds arithmetic.
  msg = open_error(raw_safetensors(header, "abcd", INT64_MAX) + "");
  EXPECT_HAS(msg, "past the end");
  write_bytes(path_, testing::le64(UINT64_MAX) + header);
  EXPECT_HAS(error_of<FormatError>([&] { SafetensorsFile::open(path_); }), "past the end");
}

TEST_F(BadFile, OffsetsOutOfRange) {
  std::string header = "{" + entry("w", "F32", "[16]", 0, 64) + "}";
  std::string msg = open_error(raw_safetensors(header, std::string(32, '\0')));
  EXPECT_HAS(msg, "'w'");
  EXPECT_HAS(msg, "[0, 64]");
  EXPECT_HAS(msg, "32 bytes");
}

TEST_F(BadFile, BeginAfterEnd) {
  std::string header = "{" + entry("w", "F32", "[1]", 8, 4) + "}";
  std::string msg = open_error(raw_safetensors(header, std::string(8, '\0')));
  EXPECT_HAS(msg, "'w'");
  EXPECT_HAS(msg, "[8, 4]");
}

TEST_F(BadFile, OverlappingOffsets) {
  std::string header =
      "{" + entry("a", "F32", "[4]", 0, 16) + "," + entry("b", "F32", "[4]", 8, 24) + "}";
  std::string msg = open_error(raw_safetensors(header, std::string(24, '\0')));
  EXPECT_HAS(msg, "'a'");
  EXPECT_HAS(msg, "'b'");
  EXPECT_HAS(msg, "[0, 16]");
  EXPECT_HAS(msg, "[8, 24]");
  EXPECT_HAS(msg, "overlap");
}

TEST_F(BadFile, SameOffsetsTwice) {
  std::string header =
      "{" + entry("a", "F32", "[4]", 0, 16) + "," + entry("b", "F32", "[4]", 0, 16) + "}";
  EXPECT_HAS(open_error(raw_safetensors(header, std::string(16, '\0'))), "overlap");
}

TEST_F(BadFile, HoleBetweenTensors) {
  std::string header =
      "{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("b", "F32", "[1]", 8, 12) + "}";
  std::string msg = open_error(raw_safetensors(header, std::string(12, '\0')));
  EXPECT_HAS(msg, "[4, 8)");
  EXPECT_HAS(msg, "'b'");
}

TEST_F(BadFile, TrailingBytes) {
  std::string header = "{" + entry("a", "F32", "[1]", 0, 4) + "}";
  std::string msg = open_error(raw_safetensors(header, std::string(10, '\0')));
  EXPECT_HAS(msg, "end at 4");
  EXPECT_HAS(msg, "10 bytes");
}

TEST_F(BadFile, UnknownDtype) {
  std::string header = "{" + entry("model.w", "Q7", "[1]", 0, 4) + "}";
  std::string msg = open_error(raw_safetensors(header, std::string(4, '\0')));
  EXPECT_HAS(msg, "'model.w'");
  EXPECT_HAS(msg, "unknown dtype 'Q7'");
  EXPECT_HAS(msg, "F32, BF16, F16");
}

TEST_F(BadFile, UnsupportedDtype) {
  for (const char* dt : {"F64", "F8_E4M3"}) {
    std::string header = "{";
    header += entry("w", dt, "[1]", 0, 8);
    header += "}";
    std::string msg = open_error(raw_safetensors(header, std::string(8, '\0')));
    EXPECT_HAS(msg, std::string("'") + dt + "' is not supported");
    EXPECT_HAS(msg, "'w'");
  }
}

TEST_F(BadFile, DataSizeDoesNotMatchShape) {
  std::string header = "{" + entry("proj.weight", "BF16", "[2,3]", 0, 10) + "}";
  std::string msg = open_error(raw_safetensors(header, std::string(10, '\0')));
  EXPECT_HAS(msg, "'proj.weight'");
  EXPECT_HAS(msg, "[0, 10]");
  EXPECT_HAS(msg, "needs 6 x 2 = 12 bytes");
}

TEST_F(BadFile, ElementCountOverflows) {
  std::string header = "{" + entry("w", "F32", "[4294967296,4294967296]", 0, 0) + "}";
  std::string msg = open_error(raw_safetensors(header, ""));
  EXPECT_HAS(msg, "'w'");
  EXPECT_HAS(msg, "64 bits");
  header = "{" + entry("w", "F32", "[4611686018427387904]", 0, 0) + "}";  // 2^62 x 4 bytes
  EXPECT_HAS(open_error(raw_safetensors(header, "")), "2^64 bytes");
}

TEST_F(BadFile, MalformedJsonHeader) {
  std::string msg = open_error(raw_safetensors(R"({"w": {"dtype": "F32",)", ""));
  EXPECT_HAS(msg, "malformed");
  EXPECT_HAS(msg, "malformed at file byte 30");  // the end of the 22-byte header
  msg = open_error(raw_safetensors(std::string("{\"\xff\": 1}"), ""));  // invalid UTF-8
  EXPECT_HAS(msg, "malformed");
}

TEST_F(BadFile, HeaderIsNotAnObject) {
  EXPECT_HAS(open_error(raw_safetensors("[1, 2]", "")), "must be an object");
}

TEST_F(BadFile, EntryFieldsMissingOrMistyped) {
  struct Case {
    std::string entry, expect;
  };
  std::vector<Case> cases = {
      {R"("w": 3)", "'w': entry must be an object"},
      {R"("w": {"shape":[1],"data_offsets":[0,4]})", "'w': field 'dtype' is missing"},
      {R"("w": {"dtype":"F32","data_offsets":[0,4]})", "'w': field 'shape' is missing"},
      {R"("w": {"dtype":"F32","shape":[1]})", "'w': field 'data_offsets' is missing"},
      {R"("w": {"dtype":1,"shape":[1],"data_offsets":[0,4]})", "'dtype' must be a string"},
      {R"("w": {"dtype":"F32","shape":"1","data_offsets":[0,4]})", "'shape' must be an array"},
      {R"("w": {"dtype":"F32","shape":[-1],"data_offsets":[0,4]})", "shape[0] = -1 is negative"},
      {R"("w": {"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})", "shape[0] must be"},
      {R"("w": {"dtype":"F32","shape":[1],"data_offsets":[0]})", "'data_offsets' must be"},
      {R"("w": {"dtype":"F32","shape":[1],"data_offsets":[0,4,8]})", "'data_offsets' must be"},
      {R"("w": {"dtype":"F32","shape":[1],"data_offsets":[-4,4]})", "data_offsets[0] must be"},
      {R"("w": {"dtype":"F32","shape":[1],"data_offsets":[0,"4"]})", "data_offsets[1] must be"},
      {R"("__metadata__": {"format": 1})", "'__metadata__' field 'format' must be a string"},
      {R"("__metadata__": [])", "'__metadata__' must be an object"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.entry);
    EXPECT_HAS(open_error(raw_safetensors("{" + c.entry + "}", std::string(4, '\0'))), c.expect);
  }
}

TEST_F(BadFile, DuplicateTensorName) {
  std::string header =
      "{" + entry("w", "F32", "[1]", 0, 4) + "," + entry("w", "F32", "[1]", 4, 8) + "}";
  std::string msg = open_error(raw_safetensors(header, std::string(8, '\0')));
  EXPECT_HAS(msg, "'w' appears twice");
}

TEST(Safetensors, MissingFileIsNotFound) {
  TempDir dir;
  std::string p = dir.file("nope.safetensors");
  EXPECT_HAS(error_of<NotFoundError>([&] { SafetensorsFile::open(p); }), p);
}

TEST(Safetensors, EmptyHeaderObjectIsAValidEmptyFile) {
  TempDir dir;
  write_bytes(dir.file("model.safetensors"), raw_safetensors("{}      ", ""));
  Checkpoint c = Checkpoint::open(dir.path().string());
  EXPECT_TRUE(c.names().empty());
  EXPECT_EQ(c.total_bytes(), 0u);
}

// ---- folders and shards ---------------------------------------------------------------------

class Sharded : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = random_tensor({4, 3}, DType::bf16, 11);
    b_ = random_tensor({3}, DType::f32, 12);
    c_ = random_tensor({2, 2}, DType::bf16, 13);
    save_safetensors(dir_.file("model-00001-of-00002.safetensors"), {{"a", a_}, {"b", b_}});
    save_safetensors(dir_.file("model-00002-of-00002.safetensors"), {{"c", c_}});
  }
  void write_index(const Json& weight_map) {
    Json idx = {{"metadata", {{"total_size", 24 + 12 + 8}}}, {"weight_map", weight_map}};
    write_bytes(index_, idx.dump(2));
  }
  Json good_map() {
    return {{"a", "model-00001-of-00002.safetensors"},
            {"b", "model-00001-of-00002.safetensors"},
            {"c", "model-00002-of-00002.safetensors"}};
  }
  TempDir dir_;
  std::string index_ = dir_.file("model.safetensors.index.json");
  Tensor a_, b_, c_;
};

TEST_F(Sharded, Loads) {
  write_index(good_map());
  Checkpoint ck = Checkpoint::open(dir_.path().string());
  EXPECT_EQ(ck.names(), std::vector<std::string>({"a", "b", "c"}));
  EXPECT_EQ(bytes_of(ck.get("a")), bytes_of(a_));
  EXPECT_EQ(bytes_of(ck.get("b")), bytes_of(b_));
  EXPECT_EQ(bytes_of(ck.get("c")), bytes_of(c_));
  EXPECT_EQ(bytes_of(ck.get_rows("a", 1, 2)), bytes_of(a_).substr(6, 6));
  EXPECT_EQ(ck.info("c").file, dir_.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(ck.total_bytes(), 24u + 12u + 8u);
}

TEST_F(Sharded, MissingShard) {
  Json m = good_map();
  m["c"] = "model-00003-of-00002.safetensors";
  write_index(m);
  std::string msg = error_of<NotFoundError>([&] { Checkpoint::open(dir_.path().string()); });
  EXPECT_HAS(msg, index_);
  EXPECT_HAS(msg, "model-00003-of-00002.safetensors");
  EXPECT_HAS(msg, "'c'");
}

TEST_F(Sharded, IndexPointsAtTensorAbsentFromItsShard) {
  Json m = good_map();
  m["d"] = "model-00002-of-00002.safetensors";
  write_index(m);
  std::string msg = error_of<FormatError>([&] { Checkpoint::open(dir_.path().string()); });
  EXPECT_HAS(msg, index_);
  EXPECT_HAS(msg, "'d'");
  EXPECT_HAS(msg, "model-00002-of-00002.safetensors");
}

TEST_F(Sharded, IndexMapsTensorToTheWrongShard) {
  Json m = good_map();
  m["c"] = "model-00001-of-00002.safetensors";
  m["x"] = "model-00002-of-00002.safetensors";
  save_safetensors(dir_.file("model-00002-of-00002.safetensors"), {{"x", c_}});
  write_index(m);
  std::string msg = error_of<FormatError>([&] { Checkpoint::open(dir_.path().string()); });
  EXPECT_HAS(msg, "'c'");
}

TEST_F(Sharded, TensorInTwoShards) {
  save_safetensors(dir_.file("model-00002-of-00002.safetensors"), {{"c", c_}, {"a", a_}});
  write_index(good_map());
  std::string msg = error_of<FormatError>([&] { Checkpoint::open(dir_.path().string()); });
  EXPECT_HAS(msg, "'a'");
  EXPECT_HAS(msg, "model-00001-of-00002.safetensors");
  EXPECT_HAS(msg, "model-00002-of-00002.safetensors");
}

TEST_F(Sharded, BadShardInsideAShardedCheckpoint) {
  write_index(good_map());
  write_bytes(dir_.file("model-00002-of-00002.safetensors"), "\x01\x02");
  std::string msg = error_of<FormatError>([&] { Checkpoint::open(dir_.path().string()); });
  EXPECT_HAS(msg, "model-00002-of-00002.safetensors");
}

TEST_F(Sharded, MalformedIndex) {
  write_bytes(index_, "{\n  \"weight_map\": {\n    \"a\": \"x\",,\n  }\n}\n");
  std::string msg = error_of<FormatError>([&] { Checkpoint::open(dir_.path().string()); });
  EXPECT_HAS(msg, index_ + ":3:");
  write_bytes(index_, R"({"metadata": {}})");
  EXPECT_HAS(error_of<FormatError>([&] { Checkpoint::open(dir_.path().string()); }),
             "'weight_map' is missing");
  write_bytes(index_, R"({"weight_map": {"a": 3}})");
  EXPECT_HAS(error_of<FormatError>([&] { Checkpoint::open(dir_.path().string()); }),
             "weight_map[\"a\"]");
}

TEST_F(Sharded, ShardNamesMayNotLeaveTheFolder) {
  for (const char* bad : {"../model-00001-of-00002.safetensors", "/etc/passwd", ""}) {
    Json m = good_map();
    m["a"] = bad;
    write_index(m);
    std::string msg = error_of<FormatError>([&] { Checkpoint::open(dir_.path().string()); });
    EXPECT_HAS(msg, index_);
  }
}

TEST_F(Sharded, SingleFileWinsOverIndex) {
  write_index(good_map());
  save_safetensors(dir_.file("model.safetensors"), {{"only", b_}});
  EXPECT_EQ(Checkpoint::open(dir_.path().string()).names(), std::vector<std::string>({"only"}));
}

TEST(Checkpoint, NoWeightsListsWhatWasLookedFor) {
  TempDir dir;
  write_bytes(dir.file("pytorch_model.bin"), "x");
  std::string msg = error_of<NotFoundError>([&] { Checkpoint::open(dir.path().string()); });
  EXPECT_HAS(msg, dir.file("model.safetensors"));
  EXPECT_HAS(msg, dir.file("model.safetensors.index.json"));
  EXPECT_HAS(msg, "pytorch_model.bin");
  std::string missing = dir.file("no_such_folder");
  EXPECT_HAS(error_of<NotFoundError>([&] { Checkpoint::open(missing); }), missing);
}

TEST(Safetensors, SaveRejectsBadInput) {
  TempDir dir;
  Tensor t = Tensor::zeros({2}, DType::f32);
  EXPECT_HAS(error_of<InvalidArgumentError>([&] {
               save_safetensors(dir.file("x.safetensors"), {{"a", t}, {"a", t}});
             }),
             "'a' given twice");
  EXPECT_HAS(error_of<InvalidArgumentError>([&] {
               save_safetensors(dir.file("x.safetensors"), {{"__metadata__", t}});
             }),
             "invalid tensor name");
  EXPECT_THROW(save_safetensors(dir.file("no/such/dir/x.safetensors"), {{"a", t}}), Error);
}

}  // namespace
}  // namespace tformers::io
