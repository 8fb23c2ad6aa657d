// The step API: what the loops that drive a model (generate, beam search, the serving engine,
// benchmarks) use of it, and all they use. A runner prepares a step shape (compiling it once per
// shape, or finding it in the compile cache), owns the model's state through the model (the
// static KV cache and its key mask, or the paged KV pools, laid out as the architecture and the
// backend say), runs a step from host inputs and hands back the logits. Per step only what the
// forward pass consumes crosses to the device (ids, positions, the cache slot or the block
// table) and only the kept logits come back; the caches and the static key mask stay there.
//
// Two kinds of state, as in Transformers and vLLM:
//  - The static cache (Transformers' StaticCache): `batch` rows of `cache_len` slots. A step
//    writes the T new tokens of every row at slots [start, start + T); rows of different lengths
//    are left-padded and masked. generate() and beam search run on it.
//  - The paged cache: pools of blocks shared by all sequences, each sequence owning a list of
//    blocks. A step takes a ragged batch: any number of sequences, each with its own number of
//    new tokens at its own position, so prefill chunks and decodes can share one step.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "models/causal_lm_impl.h"

namespace tformers::models {

// One sequence's part of a paged step.
struct SequenceChunk {
  std::span<const int32_t> tokens;  // the new tokens
  int64_t position = 0;             // the position of tokens[0]
  std::span<const int32_t> blocks;  // the pool blocks that hold positions [0, position + size)
  // For a model with linear-attention layers, the slot of the recurrent state pools this chunk
  // writes its state to ([0, state_slots)), and the one it reads it from (-1: the same).
  int32_t state_slot = -1, read_slot = -1;
};

class ModelRunner {
 public:
  explicit ModelRunner(CausalLM& model) : m_(state_of(model)) {}
  // A leading runner tells its followers to stop (see lead()).
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  const ArchConfig& config() const { return *m_.arch_config; }
  int64_t vocab_size() const { return m_.arch_config->vocab_size; }
  bool tensor_parallel() const { return m_.tp != nullptr; }
  int tp_rank() const { return m_.tp ? m_.tp->rank() : 0; }
  const GenerationConfig& generation_config() const { return m_.generation_config; }
  const std::vector<int64_t>& prompt_buckets() const { return m_.prompt_buckets; }
  int64_t kv_bytes_per_position() const { return m_.kv_bytes_per_position(); }
  int64_t recurrent_bytes_per_sequence() const { return m_.recurrent_bytes_per_sequence(); }
  bool state_on_host() const { return m_.state_on_host(); }
  uint64_t compiles() const { return m_.stats.compiles; }
  // The backend's transfers and, on PJRT devices, its executions and their time since load.
  backends::TransferStats transfer_stats() const { return m_.backend->transfer_stats(); }
  // The roofline's bandwidth: the device memory's streaming reads in GB/s over `bytes`.
  double read_bandwidth_gbs(size_t bytes) const { return m_.backend->read_bandwidth_gbs(bytes); }
  std::vector<CausalLM::Impl::WeightSpan> decode_weight_spans() const {
    return m_.decode_weight_spans();
  }
  // Device memory, for benchmarks: the weight buffers (each once), the state (static cache,
  // mask and paged pools), and the working memory of each compiled step now bound, by
  // executable (an executable is shared by every model that compiled the same graph).
  int64_t weight_bytes() const;
  int64_t state_bytes() const;
  std::map<const backends::Executable*, uint64_t> step_arena_bytes() const;
  // Under tensor parallelism, the checkpoint bytes this rank read and the whole checkpoint's.
  std::optional<std::pair<uint64_t, uint64_t>> tp_checkpoint_bytes() const;

  // The static cache: allocated (or kept, if the shape is the same) for batch x cache_len, with
  // every key masked until set_attention_mask.
  void reset_cache(int64_t batch, int64_t cache_len) { m_.reset_cache(batch, cache_len); }
  // Steps run and static caches allocated since load: unchanged between two points, the static
  // cache holds what it held.
  uint64_t cache_writes() const { return m_.cache_writes; }
  // The key mask over cache slots, int32 (batch, cache_len): 0 hides a slot from every query of
  // its row. It stays on the device for every later step until set again.
  void set_attention_mask(const Tensor& mask);
  // A compiled step, found or compiled by prepare_static or prepare_paged and valid until the
  // cache it runs on is reallocated.
  using Step = CausalLM::Impl::Step;
  // The step that runs `tokens` new tokens of every row of the static cache and keeps the
  // logits of the last `keep` positions (0: all), as logits_to_keep. `uncached` compiles it
  // afresh and keeps it only until the next uncached step (disable_compile).
  Step& prepare_static(int64_t tokens, int64_t keep, bool uncached = false);
  // Runs ids and positions, int32 (B,T) as the step's shape, with the first new token at cache
  // slot `start`; fills logits f32 (B, keep, V).
  void run_static(Step& step, const Tensor& ids, const Tensor& positions, int64_t start,
                  Tensor& logits);

  // The paged cache: `blocks` blocks of `block_size` positions in each layer's pool (kept if the
  // sizes match); steps take block tables of `table_blocks` entries per sequence.
  // `state_slots`: the sequences a step may hold, each with a recurrent state where the model
  // has linear-attention layers (ignored otherwise).
  void allocate_pool(int64_t blocks, int64_t block_size, int64_t table_blocks,
                     int64_t state_slots = 0);
  // The step for ragged batches of up to `rows` sequences of up to `tokens` new tokens each, or
  // with `sequences` > 0 a packed step: one row of `tokens` tokens from up to `sequences`
  // sequences (packs_sequences() says whether the backend runs them).
  Step& prepare_paged(int64_t rows, int64_t tokens, int64_t sequences = 0);
  // Whether the backend runs packed steps: its attention finds each token's own sequence (the
  // CPU's); else a step's rows hold a sequence each.
  bool packs_sequences() const;
  // Tokens per sequence place of a packed step as the serving engine sizes them: T tokens, T / 16
  // places. The lm_head runs for each place, taken or not, so on at most a sixteenth of the
  // step's rows; sequences with fewer tokens than that between them take a bucket that has their
  // places, padded, which computes no more rows than a 16-token step for each would.
  static constexpr int64_t kTokensPerPlace = 16;
  // Runs one step over a ragged batch. Without packing, sequence i is row i, its tokens
  // right-aligned (left padding has position -1: no cache write, no keys), rows past
  // seqs.size() are padding, and logits f32 (rows, 1, V) get each row's last token's logits. A
  // packed step takes up to `sequences` sequences whose tokens fit its row, and logits
  // (sequences, 1, V) get sequence i's last token's logits in row i. With no sequences the step
  // runs on padding only, so that its working memory exists before the first real step.
  void run_paged(Step& step, std::span<const SequenceChunk> seqs, Tensor& logits);

  // Tensor parallelism under a scheduler that runs on rank 0 alone (the serving engine, whose
  // requests arrive there). lead(), on rank 0, makes each paged call (allocate_pool,
  // prepare_paged, run_paged with the step's host inputs) go first to the other ranks, and the
  // runner's end send them a stop. There, follow() makes the same calls in the same order until
  // that stop, so every rank runs the same steps and meets the others in the same collectives.
  // A step whose inputs fail their checks fails alike on every rank, and the followers go on;
  // any other failure on a follower ends the job, whose ranks would wait for it forever.
  // InvalidArgumentError on the wrong rank or for a model in one process.
  void lead();
  void follow();

 private:
  enum class Call : int64_t { kStop, kAllocatePool, kPreparePaged, kRunPaged };
  // To the followers, when leading: a call and its numbers.
  void send(Call call, int64_t a, int64_t b, int64_t c, int64_t d = 0);
  // The step's host inputs: ids, positions and, packed, each token's sequence (rows, tokens);
  // block table (rows or sequences, table_blocks).
  void run_paged_inputs(Step& step, std::span<Tensor* const> inputs, Tensor& logits);

  CausalLM::Impl& m_;
  bool leading_ = false;
};

}  // namespace tformers::models
