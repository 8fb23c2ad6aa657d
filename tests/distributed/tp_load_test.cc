// What each rank reads from a checkpoint, for every style, without processes: a fake group
// stands for rank r of P, and the slices are checked element by element against the full tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "distributed/fake_group.h"
#include "distributed/tp_model.h"
#include "io/safetensors.h"
#include "tformers/error.h"

namespace tformers::distributed {
namespace {

class TpLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("tformers-tp-load-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    // w (10, 6) holds 100 * row + column, so every element says where it came from.
    Tensor w = Tensor::zeros({10, 6}, DType::f32), b = Tensor::zeros({10}, DType::f32);
    for (int64_t r = 0; r < 10; ++r) {
      b.data<float>()[r] = float(r);
      for (int64_t c = 0; c < 6; ++c) w.data<float>()[r * 6 + c] = float(100 * r + c);
    }
    io::save_safetensors((dir_ / "model.safetensors").string(), {{"m.weight", w}, {"m.bias", b}});
    ckpt_ = std::make_unique<io::Checkpoint>(io::Checkpoint::open(dir_.string()));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Rank r of P's copy of m.weight and m.bias under `style`.
  std::pair<Tensor, Tensor> load(const std::string& style, int r, int p) {
    TpModel tp(std::make_shared<FakeGroup>(r, p), {}, {{"m", style}},
               {{"m.weight", {10, 6}}, {"m.bias", {10}}});
    Tensor w = tp.load(*ckpt_, "m.weight", "m.weight", DType::f32);
    Tensor b = tp.load(*ckpt_, "m.bias", "m.bias", DType::f32);
    bytes_read_ = tp.bytes_read();
    return {w, b};
  }

  std::filesystem::path dir_;
  std::unique_ptr<io::Checkpoint> ckpt_;
  uint64_t bytes_read_ = 0;
};

TEST_F(TpLoad, ColwiseReadsItsRowsAndBiasPaddedToTheChunk) {
  // torch.chunk(10 rows, 4): 3, 3, 3, 1; every rank holds 3 rows, rank 3 two of zeros.
  for (int r = 0; r < 4; ++r) {
    auto [w, b] = load("colwise", r, 4);
    const int64_t first = 3 * r, rows = r < 3 ? 3 : 1;
    ASSERT_EQ(w.shape(), Shape({3, 6}));
    ASSERT_EQ(b.shape(), Shape({3}));
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(b.data<float>()[i], i < rows ? float(first + i) : 0.0f);
      for (int64_t c = 0; c < 6; ++c)
        EXPECT_EQ(w.data<float>()[i * 6 + c], i < rows ? float(100 * (first + i) + c) : 0.0f);
    }
    EXPECT_EQ(bytes_read_, uint64_t(rows * 6 + rows) * 4);
  }
}

TEST_F(TpLoad, RowwiseReadsItsColumnsAndTheWholeBias) {
  // torch.chunk(6 columns, 4) makes 2, 2, 2 and nothing for rank 3: every rank refuses the
  // plan alike (not only the empty one, which would leave the others waiting for it).
  for (int r = 0; r < 4; ++r) EXPECT_THROW(load("rowwise", r, 4), InvalidArgumentError);
  for (int r = 0; r < 3; ++r) {
    auto [w, b] = load("rowwise", r, 3);
    ASSERT_EQ(w.shape(), Shape({10, 2}));
    ASSERT_EQ(b.shape(), Shape({10}));  // added once, after the reduce
    for (int64_t i = 0; i < 10; ++i)
      for (int64_t c = 0; c < 2; ++c)
        EXPECT_EQ(w.data<float>()[i * 2 + c], float(100 * i + 2 * r + c));
    EXPECT_EQ(bytes_read_, uint64_t(10 * 2 + 10) * 4);
  }
  // 6 columns over 4 ranks in chunks of 2 leave rank 3 nothing (refused above); over 4 ranks of
  // a 10-column weight (m.weight's transpose) ranks hold 3, 3, 3 and 1 columns, padded to 3.
  Tensor t = Tensor::zeros({6, 10}, DType::f32);
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t c = 0; c < 10; ++c) t.data<float>()[r * 10 + c] = float(100 * c + r);
  io::save_safetensors((dir_ / "model.safetensors").string(), {{"t.weight", t}});
  const io::Checkpoint ckpt = io::Checkpoint::open(dir_.string());
  TpModel tp(std::make_shared<FakeGroup>(3, 4), {}, {{"t", "rowwise"}}, {{"t.weight", {6, 10}}});
  const Tensor w = tp.load(ckpt, "t.weight", "t.weight", DType::f32);
  ASSERT_EQ(w.shape(), Shape({6, 3}));
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(w.data<float>()[i * 3], float(900 + i));  // column 9
    EXPECT_EQ(w.data<float>()[i * 3 + 1], 0.0f);
    EXPECT_EQ(w.data<float>()[i * 3 + 2], 0.0f);
  }
  EXPECT_EQ(tp.bytes_read(), uint64_t(6 * 4));
}

TEST_F(TpLoad, PackedColwiseReadsItsPieceOfEachHalf) {
  // [gate (5 rows); up (5 rows)] over 2 ranks: chunks of 3 and 2 rows of each half, each
  // half's piece padded to 3 rows.
  auto [w, b] = load("packed_colwise", 1, 2);
  ASSERT_EQ(w.shape(), Shape({6, 6}));
  const int64_t rows[] = {3, 4, -1, 8, 9, -1};
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(w.data<float>()[i * 6], rows[i] < 0 ? 0.0f : float(100 * rows[i]));
    EXPECT_EQ(b.data<float>()[i], rows[i] < 0 ? 0.0f : float(rows[i]));
  }
}

TEST_F(TpLoad, ReplicateReadsEverything) {
  auto [w, b] = load("replicate", 1, 2);
  EXPECT_EQ(w.shape(), Shape({10, 6}));
  EXPECT_EQ(w.data<float>()[59], 905.0f);
  EXPECT_EQ(bytes_read_, uint64_t(70 * 4));
}

TEST_F(TpLoad, ColwiseSlicesAreViewsOfTheMapping) {
  auto [w, b] = load("colwise", 1, 2);
  Tensor whole = ckpt_->get("m.weight");
  EXPECT_EQ(w.raw(), static_cast<const char*>(whole.raw()) + 5 * 6 * 4);  // zero-copy
}

}  // namespace
}  // namespace tformers::distributed
