// The step API (models/model_runner.h): per-step transfers of the static and the paged cache,
// ragged paged batches against one sequence at a time, and bad chunks.
#include "models/model_runner.h"

#include <gtest/gtest.h>

#include "golden_util.h"
#include "tformers/error.h"

namespace tformers {
namespace {

using models::ModelRunner;
using models::SequenceChunk;
using testing::model_dir;

CausalLM load() {
  return AutoModelForCausalLM::from_pretrained(model_dir("tiny-qwen3"), {.dtype = float32});
}

struct Moved {
  uint64_t up = 0, down = 0;
};
// The bytes that crossed between host and device while `f` ran.
template <class F>
Moved moved(const CausalLM& lm, F f) {
  const uint64_t up = lm.host_to_device_bytes(), down = lm.device_to_host_bytes();
  f();
  return {lm.host_to_device_bytes() - up, lm.device_to_host_bytes() - down};
}

TEST(ModelRunner, StaticDecodeStepMovesIdsPositionsAndSlotInAndLogitsOut) {
  CausalLM lm = load();
  ModelRunner m(lm);
  const int64_t B = 3, S = 32, V = m.vocab_size();
  m.reset_cache(B, S);
  Tensor mask = Tensor::zeros({B, S}, DType::i32);
  std::fill_n(mask.data<int32_t>(), mask.numel(), 1);
  m.set_attention_mask(mask);
  Tensor ids = Tensor::zeros({B, 1}, DType::i32), pos = Tensor::zeros({B, 1}, DType::i32);
  Tensor logits = Tensor::zeros({B, 1, V}, DType::f32);
  ModelRunner::Step& step = m.prepare_static(1, 1);
  m.run_static(step, ids, pos, 0, logits);  // the first run allocates the working memory
  for (int64_t slot = 1; slot < 4; ++slot) {
    const Moved d = moved(lm, [&] { m.run_static(step, ids, pos, slot, logits); });
    // ids and positions (B int32 each) and the cache slot (one int32) up; B x V f32 down.
    EXPECT_EQ(d.up, uint64_t(4 * (B + B + 1))) << "slot " << slot;
    EXPECT_EQ(d.down, uint64_t(4 * B * V)) << "slot " << slot;
  }
}

TEST(ModelRunner, PagedDecodeStepMovesIdsPositionsAndTablesInAndLogitsOut) {
  CausalLM lm = load();
  ModelRunner m(lm);
  const int64_t blocks = 16, block_size = 4, table = 4, V = m.vocab_size();
  m.allocate_pool(blocks, block_size, table);
  const std::vector<int32_t> a = {5, 77, 300, 2}, b = {9, 8}, a_blocks = {0, 1}, b_blocks = {2};
  const SequenceChunk seqs[] = {
      {.tokens = std::span(a).last(1), .position = 3, .blocks = a_blocks},
      {.tokens = std::span(b).last(1), .position = 1, .blocks = b_blocks}};
  const int64_t rows = 4;  // two sequences and two padding rows
  ModelRunner::Step& step = m.prepare_paged(rows, 1);
  Tensor logits = Tensor::zeros({rows, 1, V}, DType::f32);
  m.run_paged(step, seqs, logits);
  const Moved d = moved(lm, [&] { m.run_paged(step, seqs, logits); });
  // ids and positions (rows int32 each) and the block tables (rows x table int32) up; the
  // logits of each row's last token down. The pools never cross.
  EXPECT_EQ(d.up, uint64_t(4 * (rows + rows + rows * table)));
  EXPECT_EQ(d.down, uint64_t(4 * rows * V));
}

// Logits (V) of the last token of `tokens` fed to a fresh pool in one paged step.
std::vector<float> alone(ModelRunner& m, const std::vector<int32_t>& tokens,
                         const std::vector<int32_t>& blocks) {
  const SequenceChunk c{.tokens = tokens, .position = 0, .blocks = blocks};
  Tensor logits = Tensor::zeros({1, 1, m.vocab_size()}, DType::f32);
  m.run_paged(m.prepare_paged(1, 16), {&c, 1}, logits);
  return {logits.data<float>(), logits.data<float>() + logits.numel()};
}

TEST(ModelRunner, RaggedPagedStepMixesPrefillAndDecodeRows) {
  CausalLM lm = load();
  ModelRunner m(lm);
  const int64_t V = m.vocab_size();
  m.allocate_pool(16, 4, 4);
  const std::vector<int32_t> a = {5, 77, 300, 2, 41, 7}, b = {9, 8, 123};
  const std::vector<int32_t> a_blocks = {0, 1}, b_blocks = {2};
  // Each sequence alone, whole, for reference (into blocks the mixed step overwrites).
  const std::vector<float> ref_a = alone(m, a, a_blocks), ref_b = alone(m, b, b_blocks);
  // Sequence a's first 5 tokens into the cache, then one step holding a's last token (a decode)
  // beside b's whole prompt (a prefill).
  const std::vector<int32_t> a_head(a.begin(), a.end() - 1);
  alone(m, a_head, a_blocks);
  const SequenceChunk mixed[] = {
      {.tokens = std::span(a).last(1), .position = int64_t(a.size()) - 1, .blocks = a_blocks},
      {.tokens = b, .position = 0, .blocks = b_blocks}};
  Tensor logits = Tensor::zeros({4, 1, V}, DType::f32);
  m.run_paged(m.prepare_paged(4, 4), mixed, logits);
  const float* got = logits.data<float>();
  for (int64_t v = 0; v < V; ++v) {
    EXPECT_NEAR(got[v], ref_a[size_t(v)], 1e-4f) << "decode row, logit " << v;
    EXPECT_NEAR(got[V + v], ref_b[size_t(v)], 1e-4f) << "prefill row, logit " << v;
  }
}

// A packed step: three sequences' new tokens in one row (a decode after a cached prefix and two
// prompts), each with its own block table row, and each sequence's last token's logits in its
// row of the output. Against each sequence alone (near: a prompt of fewer than 4 tokens runs the
// GEMV alone and the GEMM packed), and bit for bit against each alone in a packed step of
// another length, its place among the others changed.
TEST(ModelRunner, PackedStepGivesEachSequenceItsOwnLogits) {
  CausalLM lm = load();
  ModelRunner m(lm);
  if (!m.packs_sequences()) GTEST_SKIP() << "this backend runs a sequence per row";
  const int64_t V = m.vocab_size();
  m.allocate_pool(24, 4, 4);
  const std::vector<int32_t> a = {5, 77, 300, 2, 41, 7}, b = {9, 8, 123}, c = {4, 3, 2, 1, 6};
  const std::vector<int32_t> a_blocks = {0, 1}, b_blocks = {2}, c_blocks = {3, 4};
  const std::vector<float> ref_a = alone(m, a, a_blocks), ref_b = alone(m, b, b_blocks),
                           ref_c = alone(m, c, c_blocks);
  const std::vector<int32_t> a_head(a.begin(), a.end() - 1);
  alone(m, a_head, a_blocks);
  const SequenceChunk chunks[] = {
      {.tokens = std::span(a).last(1), .position = int64_t(a.size()) - 1, .blocks = a_blocks},
      {.tokens = b, .position = 0, .blocks = b_blocks},
      {.tokens = c, .position = 0, .blocks = c_blocks}};
  Tensor logits = Tensor::zeros({4, 1, V}, DType::f32);
  m.run_paged(m.prepare_paged(1, 16, 4), chunks, logits);
  const float* got = logits.data<float>();
  for (int64_t v = 0; v < V; ++v) {
    EXPECT_NEAR(got[v], ref_a[size_t(v)], 1e-4f) << "decode, logit " << v;
    EXPECT_NEAR(got[V + v], ref_b[size_t(v)], 1e-4f) << "3-token prompt, logit " << v;
    EXPECT_NEAR(got[2 * V + v], ref_c[size_t(v)], 1e-4f) << "5-token prompt, logit " << v;
  }
  for (size_t i = 0; i < std::size(chunks); ++i) {
    Tensor one = Tensor::zeros({2, 1, V}, DType::f32);
    m.run_paged(m.prepare_paged(1, 12, 2), {&chunks[i], 1}, one);
    for (int64_t v = 0; v < V; ++v)
      ASSERT_EQ(one.data<float>()[v], got[int64_t(i) * V + v])
          << "sequence " << i << " logit " << v;
  }
  // A step of several rows does not pack, and a packed step holds what its row holds.
  EXPECT_THROW(m.prepare_paged(2, 8, 2), InvalidArgumentError);
  EXPECT_THROW(m.prepare_paged(1, 2, 3), InvalidArgumentError);
  const SequenceChunk four[] = {chunks[0], chunks[1], chunks[2], chunks[1]};
  EXPECT_THROW(m.run_paged(m.prepare_paged(1, 8, 3), four, logits), InvalidArgumentError);
  EXPECT_THROW(m.run_paged(m.prepare_paged(1, 8, 4), four, logits), InvalidArgumentError);
}

TEST(ModelRunner, ChunksThatDoNotFitTheStepAreRefused) {
  CausalLM lm = load();
  ModelRunner m(lm);
  m.allocate_pool(16, 4, 2);
  const std::vector<int32_t> tokens = {1, 2, 3}, blocks = {0, 1, 2};
  Tensor logits = Tensor::zeros({1, 1, m.vocab_size()}, DType::f32);
  ModelRunner::Step& step = m.prepare_paged(1, 2);
  const SequenceChunk too_long{
      .tokens = tokens, .position = 0, .blocks = std::span(blocks).first(1)};
  try {
    m.run_paged(step, {&too_long, 1}, logits);
    FAIL() << "no error";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 0 has 3 new tokens"), std::string::npos)
        << e.what();
  }
  const SequenceChunk too_many_blocks{
      .tokens = std::span(tokens).first(1), .position = 0, .blocks = blocks};
  EXPECT_THROW(m.run_paged(step, {&too_many_blocks, 1}, logits), InvalidArgumentError);
  const SequenceChunk two[] = {too_many_blocks, too_many_blocks};
  EXPECT_THROW(m.run_paged(step, two, logits), InvalidArgumentError);
}

TEST(ModelRunner, AttentionMaskOfTheWrongShapeIsRefused) {
  CausalLM lm = load();
  ModelRunner m(lm);
  m.reset_cache(2, 16);
  try {
    m.set_attention_mask(Tensor::zeros({2, 15}, DType::i32));
    FAIL() << "no error";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("attention_mask must be int32[2, 16]"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tformers
