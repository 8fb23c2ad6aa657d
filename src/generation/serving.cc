// The continuous-batching engine (tformers/serving.h).
//
// Memory (generation/block_manager.h): a sequence holds the blocks of the positions it has
// computed and takes one more as it crosses a block's end, so a pool holds what sequences use,
// not what they might reach. When a running sequence needs a block and none is free (cached
// blocks without a reference are taken first), the newest running sequence is preempted, as
// vLLM does: its blocks are released and it goes back to the head of the queue, to be computed
// again when it is admitted. Its sampler, logits processors and stop strings keep their state,
// so it resumes where it stopped. A request is admitted (first come, first served) only when its
// blocks are free with a block to spare for each running sequence that crosses a block's end in
// the next step, so that an admission is not preempted at once. Full blocks are cached by the
// hash of their prefix: a request whose tokens begin with cached blocks shares them and prefills
// only the rest (always its last token, whose logits choose the next one).
//
// Computed again, a sequence must give the bits it would have given, and a prefill and a decode
// step may round differently (the CPU's attention takes another path for a prefill's many query
// rows than for a decode's few), while a prefill gives the same bits however its prompt is cut
// at block ends (on the CPU for models with 2 or more query heads per KV head; docs/serving.md
// has the case of one). So a preempted sequence is recomputed as it was first computed: what its
// cached blocks lack of its prompt by a prefill, then its generated tokens by decode steps beside
// the running sequences, one a step, their logits unused (vLLM recomputes the lot in one prefill,
// which is cheaper but not bit-exact here). Its own blocks of generated positions stay cached
// under its prompt length (block_manager.h), so it recomputes only what was evicted.
//
// Prefill is chunked: each step prefills at most max_prefill_tokens prompt positions before the
// running sequences' decode step, so a long prompt stalls the running streams for one chunk a
// step, not for its whole prefill. A prompt longer than what is left of that budget is prefilled
// in chunks of whole blocks, one a step, and is the only one in that state ("partial"); its
// blocks are all taken when it is admitted. Chunks end at block ends, where a prefill gives the
// same bits however its prompt is cut (below), so a request's output does not depend on how its
// prompt was split.
//
// Shapes: a step's prompt chunks run in one packed prefill forward where the backend runs
// packed steps (the CPU: ModelRunner::packs_sequences), their tokens in one row padded to a
// prefill bucket, each sequence with its own block table row and its last token's logits;
// elsewhere each chunk is a forward of its own, left-padded to a bucket. Decode runs every
// running sequence in one step, the batch padded to a bucket. A request's tokens must not depend
// on how many others share its step: on the CPU a decode step's linears take the GEMV at any
// batch size and a prefill's the GEMM, whose sums for a row do not depend on the other rows
// (kernels.h's LinearRows), and attention treats each sequence alone, on one path for every
// prefill (kernels_x86.h). Every row's numbers therefore go through the same kernels in the same
// order whatever the step; that also makes the keys and values of a cached block, or of a
// sequence computed again, the same bits as those it replaces.
#include "tformers/serving.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "core/memory.h"
#include "core/thread_pool.h"
#include "generation/block_manager.h"
#include "generation/json_grammar.h"
#include "generation/logits_process.h"
#include "generation/sampling.h"
#include "generation/state_snapshots.h"
#include "generation/stop_strings.h"
#include "generation/token_matcher.h"
#include "models/model_runner.h"
#include "tformers/error.h"
#include "tformers/tokenizer.h"

namespace tformers {

namespace {

using Clock = std::chrono::steady_clock;

// Bucket sizes from `first` to `last` (included): powers of two times `first` and the midpoints
// between them (first, 1.5 first, 2 first, 3 first, 4 first, ...), so that a step padded to its
// bucket computes at most a third of padding rather than a half, for about twice the shapes of
// powers of two alone.
std::vector<int64_t> bucket_series(int64_t first, int64_t last) {
  std::vector<int64_t> out;
  for (int64_t b = first; b < last; b *= 2) {
    out.push_back(b);
    if (b >= 2 && b + b / 2 < last) out.push_back(b + b / 2);
  }
  out.push_back(last);
  return out;
}

// The smallest bucket that holds n (buckets sorted, the last one holds every n that can occur).
int64_t bucket_for(const std::vector<int64_t>& buckets, int64_t n) {
  return *std::lower_bound(buckets.begin(), buckets.end(), n);
}

constexpr int64_t kMaxTopLogprobs = 20;

// The models engines serve. A second engine on one model would find its KV pool (allocate_pool
// keeps a pool of the same sizes) and write over the first one's blocks, cached prefixes
// included.
std::mutex served_mu;
std::set<const void*> served_models;

// log_softmax of the raw logits: the chosen token's and the k most likely ones.
void fill_logprobs(std::span<const float> logits, int32_t chosen, int64_t k, ServingEvent& e) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x - mx));
  const float log_z = mx + float(std::log(sum));
  e.logprob = logits[size_t(chosen)] - log_z;
  std::array<int32_t, kMaxTopLogprobs> top;
  const size_t n = generation::top_k_indices(logits, std::span(top).first(size_t(k)));
  for (size_t i = 0; i < n; ++i) e.top_logprobs.push_back({top[i], logits[size_t(top[i])] - log_z});
}

}  // namespace

struct ServingEngine::Impl {
  struct Sequence {
    uint64_t id = 0;
    ServingRequest request;
    ServingCallback on_event;
    ResolvedGenerationConfig rc;
    std::vector<int32_t> tokens;  // prompt, then generated
    int64_t computed = 0;         // positions whose keys and values are in the table
    int64_t prompt_len = 0, max_new = 0;
    int64_t cached = 0;  // prompt tokens found in the prefix cache when first admitted
    std::optional<generation::LogitsProcessorList> processors;
    std::optional<generation::Sampler> sampler;
    std::optional<generation::StopStrings> stops;
    // Structured output: follows the generated tokens (the processors' grammar stage masks with
    // it). Its state is a function of the tokens, so a preempted sequence resumes with it as is.
    std::shared_ptr<generation::TokenMatcher> matcher;
    generation::BlockManager::Table table;  // the positions computed so far
    // Its slot in the recurrent state pools while admitted (models with linear attention), and
    // a prefix cache's slot its next chunk reads its state from instead (pinned until then).
    int32_t state_slot = -1, read_slot = -1;
  };

  models::ModelRunner m;
  ServingConfig cfg;
  const Tokenizer* tokenizer;
  const void* model_state;  // the model's identity in served_models
  bool serving = false;     // registered there
  int64_t table_blocks = 0;

  // Shared with the request threads, under mu.
  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<std::unique_ptr<Sequence>> waiting;
  std::set<uint64_t> cancelled;
  uint64_t next_id = 1;
  bool accepting = true, stopping = false, abort_all = false;

  // The scheduler thread's own.
  std::vector<std::unique_ptr<Sequence>> running;
  std::unique_ptr<Sequence> partial;  // admitted, its prompt prefilled up to `computed`
  // This step's prompt chunks: each sequence and the end of the positions it prefills now.
  std::vector<std::pair<std::unique_ptr<Sequence>, int64_t>> prefilling;
  // Whether a prefill step packs several sequences' chunks into one row (ModelRunner's packed
  // steps, where the backend runs them); else each chunk is a forward of its own.
  bool packing = false;
  std::optional<generation::BlockManager> blocks;
  // A model with linear-attention layers keeps a recurrent state per sequence in a slot of its
  // pools, taken at admission and given back when the sequence ends or is preempted.
  bool recurrent = false;
  std::vector<int32_t> free_slots;
  // Their prefix cache: states at prompts' block ends (state_snapshots.h), with prefix caching.
  std::optional<generation::StateSnapshots> snapshots;
  // The block end whose state a sequence's prompt leaves in the prefix cache (0: none).
  int64_t snapshot_end(const Sequence& s) const {
    return snapshots ? (s.prompt_len - 1) / cfg.block_size * cfg.block_size : 0;
  }
  // A prefix hit of `hit` positions cut back to the longest whose state is kept; s then reads
  // its state from there.
  int64_t restore_state(Sequence& s, int64_t hit);
  // Takes back a sequence's own slot and any prefix cache slot it was to read.
  void release_state(Sequence& s);
  // Reused from step to step: the logits of each batch size, the logits of a step's prompt
  // chunks when each is a forward of its own, and each row's choice.
  std::map<int64_t, Tensor> logits_by_rows;
  std::vector<float> chunk_logits;
  std::vector<ServingEvent> chosen;
  std::thread thread;

  // The vocabulary's token bytes in a trie, for structured output: made by the first request
  // with a schema (a request thread), under vocab_mu.
  mutable std::mutex vocab_mu;
  mutable std::shared_ptr<const generation::TokenVocabulary> vocab;
  std::shared_ptr<const generation::TokenVocabulary> vocabulary() const {
    std::lock_guard<std::mutex> lock(vocab_mu);
    if (!vocab) vocab = std::make_shared<generation::TokenVocabulary>(*tokenizer, m.vocab_size());
    return vocab;
  }

  // Read by stats() from any thread.
  std::atomic<int64_t> n_running{0}, n_waiting{0}, blocks_used{0}, blocks_cached{0};
  std::atomic<uint64_t> prompt_tokens{0}, generated_tokens{0}, padded_tokens{0}, computed_tokens{0},
      prefill_tokens{0}, prefix_queries{0}, prefix_hits{0}, preemptions{0}, steps{0}, compiles{0},
      compiles_at_ready{0};
  std::atomic<bool> ready{false};
  double warm_up_seconds = 0;

  Impl(CausalLM& model, ServingConfig c, const Tokenizer* tok)
      : m(model), cfg(std::move(c)), tokenizer(tok), model_state(&models::state_of(model)) {}
  ~Impl() {
    std::lock_guard<std::mutex> lock(served_mu);
    if (serving) served_models.erase(model_state);
  }

  void configure();
  std::unique_ptr<Sequence> make_sequence(ServingRequest r, ServingCallback cb) const;
  void loop();
  void step();
  void cancel_requested();
  enum class Admit { kNoRoom, kPrefilling, kRunning, kDone };
  // Takes the sequence's blocks (cached ones first) and plans the first chunk of the prompt
  // tokens not cached (plan_chunk) beside the chunks before it in this step: kPrefilling, its
  // chunk ending at `end`, or kRunning when none is left to prefill. kNoRoom, its blocks given
  // back and `budget` untouched, when the pool lacks them or the chunk does not fit.
  Admit admit(Sequence& s, int64_t& budget, int64_t& end);
  // The end of s's next chunk of prompt positions: the rest of the prompt when `budget`
  // positions allow it, else as many whole blocks as it allows, taking them from `budget`. The
  // first chunk of a step takes at least one block; a later one that `budget` cannot hold
  // gives 0 (it waits for the next step).
  int64_t plan_chunk(const Sequence& s, int64_t& budget, bool first) const;
  // Prefills the planned chunks (`prefilling`): one packed forward for all of them when packing,
  // else a forward each, their tokens left-padded to a prefill bucket. Each sequence whose prompt
  // is then done chooses its first token; each goes where place() puts it.
  void prefill();
  // A packed prefill step's places (ModelRunner::kTokensPerPlace; at least 1, at most
  // max_num_seqs), and the bucket of a packed step with a place for each of `sequences`.
  static constexpr int64_t kTokensPerPlace = models::ModelRunner::kTokensPerPlace;
  int64_t packed_sequences(int64_t tokens) const {
    return std::clamp<int64_t>(tokens / kTokensPerPlace, 1, cfg.max_num_seqs);
  }
  int64_t packed_bucket(int64_t sequences, int64_t tokens) const {
    return bucket_for(cfg.prefill_buckets, std::min(cfg.prefill_buckets.back(),
                                                    std::max(tokens, sequences * kTokensPerPlace)));
  }
  // The blocks the running sequences, and those this step's chunks complete, take in the next
  // decode step.
  int64_t blocks_needed_by_decode() const;
  // A sequence that chooses its next token from a row of a step's logits, into chosen[slot].
  struct Pick {
    Sequence* s;
    float* logits;  // the processors change it in place
    size_t slot;
  };
  // Runs the picks on the pool's threads (between steps they sit idle): processing and sampling
  // a 150k-token vocabulary costs milliseconds a sequence.
  void pick_all(const std::vector<Pick>& picks);
  // Gives the newest running sequence's blocks back and puts it at the head of the queue.
  void preempt();
  void decode();
  // Chooses the next token from `logits` (V) into e (token, log-probabilities), or the reason
  // it cannot into e.error. Touches only s's own state and this thread's scratch, so the
  // sequences of a step pick on the pool's threads at once.
  static void pick(Sequence& s, std::span<float> logits, ServingEvent& e);
  // Appends e's token to s and reports it (or e.error); true when the sequence is done.
  bool report(Sequence& s, ServingEvent e);
  bool place(std::unique_ptr<Sequence> s, Admit a);
  void finish(Sequence& s, const std::string& reason, const std::string& error = {});
  void release(Sequence& s);
  void publish_blocks() {
    blocks_used = blocks->used_blocks();
    blocks_cached = blocks->cached_blocks();
  }
  // The sequence's tokens [from, to) as one chunk of a paged step.
  static models::SequenceChunk chunk(const Sequence& s, int64_t from, int64_t to) {
    return {.tokens = std::span(s.tokens).subspan(size_t(from), size_t(to - from)),
            .position = from,
            .blocks = s.table.blocks,
            .state_slot = s.state_slot,
            .read_slot = s.read_slot >= 0 ? s.read_slot : s.state_slot};
  }
  void note_compiles() { compiles = m.compiles(); }
  // The logits of a step of `rows` rows, (rows, 1, V), allocated at its first use.
  Tensor& logits_for(int64_t rows) {
    auto it = logits_by_rows.find(rows);
    if (it == logits_by_rows.end())
      it = logits_by_rows.emplace(rows, Tensor::zeros({rows, 1, m.vocab_size()}, DType::f32)).first;
    return it->second;
  }
};

void ServingEngine::Impl::configure() {
  if (m.tensor_parallel()) {
    if (m.tp_rank() != 0)
      throw InvalidArgumentError("ServingEngine: this is rank " + std::to_string(m.tp_rank()) +
                                 " of a tensor-parallel model, which rank 0's engine serves; "
                                 "call ServingEngine::follow(model) here");
    m.lead();
  }
  const int64_t max_pos = m.config().max_position_embeddings;
  if (cfg.max_model_len == 0) cfg.max_model_len = std::min<int64_t>(max_pos, 4096);
  auto check = [](bool ok, const std::string& what) {
    if (!ok) throw InvalidArgumentError("ServingEngine: " + what);
  };
  check(cfg.max_model_len >= 2 && cfg.max_model_len <= max_pos,
        "max_model_len " + std::to_string(cfg.max_model_len) + " must be in [2, " +
            std::to_string(max_pos) + "] (the model's max_position_embeddings)");
  check(cfg.max_num_seqs >= 1 && cfg.max_num_seqs <= 1024,
        "max_num_seqs " + std::to_string(cfg.max_num_seqs) + " must be in [1, 1024]");
  check(cfg.block_size >= 1 && cfg.block_size <= 1024,
        "block_size " + std::to_string(cfg.block_size) + " must be in [1, 1024]");
  check(cfg.num_blocks >= 0 && cfg.kv_cache_bytes >= 0,
        "num_blocks and kv_cache_bytes must not be negative");
  check(cfg.max_prefill_tokens >= 1, "max_prefill_tokens must be positive");
  table_blocks = (cfg.max_model_len + cfg.block_size - 1) / cfg.block_size;
  const int64_t block_bytes = m.kv_bytes_per_position() * cfg.block_size;
  if (cfg.num_blocks == 0)
    cfg.num_blocks =
        cfg.kv_cache_bytes > 0 ? cfg.kv_cache_bytes / block_bytes : cfg.max_num_seqs * table_blocks;
  check(cfg.num_blocks >= table_blocks,
        "a KV pool of " + std::to_string(cfg.num_blocks) + " blocks of " +
            std::to_string(cfg.block_size) + " positions (" + std::to_string(block_bytes) +
            " bytes each) cannot hold one sequence of max_model_len " +
            std::to_string(cfg.max_model_len) + "; raise the KV memory or lower max_model_len");
  check(cfg.num_blocks <= INT32_MAX, "num_blocks must fit int32");
  // Checked before the pool is allocated: kv_cache_bytes or num_blocks from a command line may
  // be absurd. On an accelerator the pool is device memory, whose allocation fails on its own.
  // Recurrent states: one per running sequence, and as many kept for the prefix cache.
  const int64_t state_slots = (cfg.enable_prefix_caching ? 2 : 1) * cfg.max_num_seqs;
  const double pool_bytes = double(cfg.num_blocks) * double(block_bytes) +
                            double(state_slots) * double(m.recurrent_bytes_per_sequence());
  const uint64_t limit = memory_limit_bytes();
  check(!m.state_on_host() || pool_bytes <= double(limit),
        "a KV pool of " + std::to_string(cfg.num_blocks) + " blocks of " +
            std::to_string(block_bytes) + " bytes needs " + planned_bytes(pool_bytes) +
            " bytes, more than the " + std::to_string(limit) +
            " bytes this process can have (memory, ulimit, cgroup); lower kv_cache_bytes or "
            "num_blocks");

  // A prefill step takes at most max_prefill_tokens prompt positions, or one block where that is
  // less (plan_chunk), and never more than a context each of the sequences it may hold (packed,
  // up to max_num_seqs; else one): no bucket above that is ever run.
  // A model with linear-attention layers runs a sequence per row (each with its state's slot).
  recurrent = m.recurrent_bytes_per_sequence() > 0;
  packing = m.packs_sequences() && !recurrent;
  const int64_t longest_chunk = std::min((packing ? cfg.max_num_seqs : 1) * cfg.max_model_len,
                                         std::max(cfg.max_prefill_tokens, cfg.block_size));
  // A context of at most 16 positions has no bucket below it, only that one.
  if (cfg.prefill_buckets.empty())
    cfg.prefill_buckets = bucket_series(std::min<int64_t>(16, longest_chunk), longest_chunk);
  auto sorted_unique = [](std::vector<int64_t>& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  };
  sorted_unique(cfg.prefill_buckets);
  check(cfg.prefill_buckets.front() >= 1 &&
            cfg.prefill_buckets.back() <= std::max(cfg.max_model_len, longest_chunk),
        "prefill_buckets must lie in [1, " +
            std::to_string(std::max(cfg.max_model_len, longest_chunk)) +
            "] (the most prompt positions a step prefills)");
  if (cfg.prefill_buckets.back() < longest_chunk) cfg.prefill_buckets.push_back(longest_chunk);
  // Decode batches from one row: the CPU's decode kernels give a row the same bits whatever the
  // batch (kernels.h's LinearRows), so a batch is padded only to its bucket.
  if (cfg.decode_buckets.empty()) cfg.decode_buckets = bucket_series(1, cfg.max_num_seqs);
  sorted_unique(cfg.decode_buckets);
  check(cfg.decode_buckets.front() >= 1, "decode_buckets must be at least 1 (got " +
                                             std::to_string(cfg.decode_buckets.front()) + ")");
  check(cfg.decode_buckets.back() <= cfg.max_num_seqs,
        "decode_buckets must not exceed max_num_seqs (" + std::to_string(cfg.max_num_seqs) +
            "): no step decodes more sequences, and each bucket is compiled and run at warm-up");
  if (cfg.decode_buckets.back() < cfg.max_num_seqs) cfg.decode_buckets.push_back(cfg.max_num_seqs);

  {
    std::lock_guard<std::mutex> lock(served_mu);
    check(served_models.insert(model_state).second,
          "this model already has an engine, which owns its KV pool; end that engine first, or "
          "load the model again for a second one");
    serving = true;
  }
  m.allocate_pool(cfg.num_blocks, cfg.block_size, table_blocks, state_slots);
  if (recurrent) {
    for (int32_t slot = int32_t(cfg.max_num_seqs) - 1; slot >= 0; --slot)
      free_slots.push_back(slot);
    if (cfg.enable_prefix_caching)
      snapshots.emplace(int32_t(cfg.max_num_seqs), int32_t(cfg.max_num_seqs));
  }
  blocks.emplace(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_caching);
}

std::unique_ptr<ServingEngine::Impl::Sequence> ServingEngine::Impl::make_sequence(
    ServingRequest r, ServingCallback cb) const {
  const int64_t V = m.vocab_size(), P = int64_t(r.prompt.size());
  auto bad = [](const std::string& what) { throw InvalidArgumentError(what); };
  if (P == 0) bad("prompt is empty; give at least one token");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= V)
      bad("prompt token " + std::to_string(i) + " is " + std::to_string(r.prompt[i]) +
          ", outside the vocabulary [0, " + std::to_string(V) + ")");
  if (P >= cfg.max_model_len)
    bad("the prompt has " + std::to_string(P) + " tokens, but max_model_len is " +
        std::to_string(cfg.max_model_len) + " (prompt and at least one new token); shorten it");
  if (r.top_logprobs < 0 || r.top_logprobs > kMaxTopLogprobs)
    bad("top_logprobs " + std::to_string(r.top_logprobs) + " must be in [0, 20]");
  GenerationConfig call = r.config;
  // Unset length: up to max_model_len, as an OpenAI server without max_tokens.
  if (!call.max_new_tokens && !call.max_length) call.max_new_tokens = cfg.max_model_len - P;
  auto s = std::make_unique<Sequence>();
  s->rc = resolve(m.generation_config().merged_with(call), P, V, cfg.max_model_len);
  if (s->rc.num_beams != 1 || s->rc.num_return_sequences != 1)
    bad("num_beams and num_return_sequences must be 1 when serving");
  using detail::str_cat;
  for (const auto& [name, penalty] : {std::pair{"presence_penalty", r.presence_penalty},
                                      {"frequency_penalty", r.frequency_penalty}})
    if (!(penalty >= -2 && penalty <= 2)) bad(str_cat(name, " ", penalty, " must be in [-2, 2]"));
  for (const auto& [id, bias] : r.logit_bias) {
    if (id < 0 || id >= V)
      bad(str_cat("logit_bias: token ", id, " is outside the vocabulary [0, ", V, ")"));
    if (!(bias >= -100 && bias <= 100))
      bad(str_cat("logit_bias: the bias of token ", id, ", ", bias, ", must be in [-100, 100]"));
  }
  s->rc.presence_penalty = r.presence_penalty;
  s->rc.frequency_penalty = r.frequency_penalty;
  s->rc.logit_bias = r.logit_bias;
  if (P + s->rc.max_new_tokens > cfg.max_model_len)
    bad("the prompt has " + std::to_string(P) + " tokens and max_new_tokens is " +
        std::to_string(s->rc.max_new_tokens) + ": " + std::to_string(P + s->rc.max_new_tokens) +
        " positions, over max_model_len " + std::to_string(cfg.max_model_len) +
        "; lower max_new_tokens");
  if (!s->rc.stop_strings.empty() && !tokenizer)
    bad("stop strings need the engine to have the tokenizer");
  s->prompt_len = P;
  s->max_new = s->rc.max_new_tokens;
  s->tokens = r.prompt;
  s->request = std::move(r);
  s->on_event = std::move(cb);
  if (s->request.json_schema) {
    if (!tokenizer) bad("json_schema (structured output) needs the engine to have the tokenizer");
    s->matcher = std::make_shared<generation::TokenMatcher>(
        generation::JsonGrammar::compile(*s->request.json_schema), vocabulary(),
        s->rc.eos_token_id);
  }
  s->processors.emplace(s->rc, V, s->matcher);
  s->sampler.emplace(s->rc.seed);
  if (!s->rc.stop_strings.empty()) s->stops.emplace(*tokenizer, s->rc.stop_strings);
  return s;
}

void ServingEngine::Impl::release(Sequence& s) {
  blocks->release(s.table);
  publish_blocks();
  release_state(s);
}

void ServingEngine::Impl::release_state(Sequence& s) {
  if (s.state_slot >= 0) free_slots.push_back(std::exchange(s.state_slot, -1));
  if (s.read_slot >= 0) snapshots->unpin(std::exchange(s.read_slot, -1));
}

int64_t ServingEngine::Impl::restore_state(Sequence& s, int64_t hit) {
  if (!recurrent || hit == 0) return hit;
  size_t kept = size_t(hit / cfg.block_size);
  int32_t slot = -1;
  while (kept > 0 && (slot = snapshots->find(s.table.keys[kept - 1])) < 0) --kept;
  blocks->truncate(s.table, kept);
  if (slot >= 0) {
    s.read_slot = slot;
    snapshots->pin(slot);
  }
  return int64_t(kept) * cfg.block_size;
}

void ServingEngine::Impl::finish(Sequence& s, const std::string& reason, const std::string& error) {
  release(s);
  ServingEvent e;
  e.request = s.id;
  e.finish_reason = reason;
  e.error = error;
  s.on_event(e);
}

void ServingEngine::Impl::pick(Sequence& s, std::span<float> logits, ServingEvent& e) {
  e = ServingEvent{};
  e.request = s.id;
  try {
    const bool want_logprobs = s.request.logprobs || s.request.top_logprobs > 0;
    // The processors change the logits in place; log-probabilities are of the raw ones.
    thread_local std::vector<float> raw;
    if (want_logprobs) raw.assign(logits.begin(), logits.end());
    s.processors->process(s.tokens, s.prompt_len, logits);
    e.token = s.sampler->next_token(logits, s.rc.do_sample);
    if (want_logprobs) fill_logprobs(raw, e.token, s.request.top_logprobs, e);
  } catch (const std::exception& x) {
    e.error = x.what();
  }
}

bool ServingEngine::Impl::report(Sequence& s, ServingEvent e) {
  if (!e.error.empty()) {  // this sequence alone ends; the others of its step go on
    finish(s, "error", e.error);
    return true;
  }
  const int32_t next = e.token;
  s.tokens.push_back(next);
  ++generated_tokens;
  const auto& eos = s.rc.eos_token_id;
  bool stop =
      std::find(eos.begin(), eos.end(), next) != eos.end() || (s.stops && s.stops->put(next));
  const int64_t generated = int64_t(s.tokens.size()) - s.prompt_len;
  if (generated == 1) e.cached_tokens = s.cached;
  if (s.matcher && !stop) {
    // A whole value that nothing but an eos id could follow ends here, without that step; one
    // that could go on ("12" may be "123") ends here only when there is no eos id to end it.
    s.matcher->sync(std::span(s.tokens).subspan(size_t(s.prompt_len)));
    stop = s.matcher->finished() || (s.matcher->accepting() && !s.matcher->has_stop_ids());
  }
  if (stop)
    e.finish_reason = "stop";
  else if (generated >= s.max_new)
    e.finish_reason = "length";
  if (!e.finish_reason.empty()) release(s);
  s.on_event(e);
  return !e.finish_reason.empty();
}

ServingEngine::Impl::Admit ServingEngine::Impl::admit(Sequence& s, int64_t& budget, int64_t& end) {
  const int64_t L = int64_t(s.tokens.size()), P = s.prompt_len;
  // The last token is computed whatever is cached: its logits choose the next one.
  const int64_t hit =
      restore_state(s, blocks->match_prefix(std::span(s.tokens).first(size_t(L - 1)), P, s.table));
  const int64_t done = std::max(hit, P);  // computed once admitted
  // Room for its next position too, so that the next decode does not preempt it straight away.
  const int64_t need = blocks->blocks_for(done + 1) - int64_t(s.table.blocks.size());
  s.computed = hit;
  // Its chunk fits what is left of the step's budget and, packed, the step's largest bucket has
  // a place for each sequence with it.
  const bool first = prefilling.empty();
  int64_t left = budget;
  end = hit == P ? P : plan_chunk(s, left, first);
  const bool placed =
      !packing || first ||
      (int64_t(prefilling.size()) + 1) * kTokensPerPlace <= cfg.prefill_buckets.back();
  const bool fits = hit == P || (end > 0 && placed);
  const bool slot = !recurrent || s.state_slot >= 0 || !free_slots.empty();
  if (!fits || !slot || blocks->free_blocks() - need < blocks_needed_by_decode() ||
      !blocks->grow(s.table, done)) {
    blocks->release(s.table);
    release_state(s);
    return Admit::kNoRoom;
  }
  publish_blocks();
  if (recurrent && s.state_slot < 0) {
    s.state_slot = free_slots.back();
    free_slots.pop_back();
  }
  budget = left;
  prefix_queries += uint64_t(L);
  prefix_hits += uint64_t(hit);
  if (L == P) {
    prompt_tokens += uint64_t(P);
    s.cached = hit;
  }
  return hit < P ? Admit::kPrefilling : Admit::kRunning;  // kRunning: its whole prompt cached
}

int64_t ServingEngine::Impl::plan_chunk(const Sequence& s, int64_t& budget, bool first) const {
  const int64_t rest = s.prompt_len - s.computed;
  const int64_t whole_blocks = budget / cfg.block_size * cfg.block_size;
  int64_t n = rest <= budget ? rest : std::min(rest, whole_blocks);
  if (n == 0 && first) n = std::min(rest, cfg.block_size);
  if (n == 0) return 0;
  // A chunk that would pass the block end whose state the prefix cache keeps stops there.
  const int64_t kept = snapshot_end(s);
  if (s.computed < kept && s.computed + n > kept) n = kept - s.computed;
  budget = std::max<int64_t>(0, budget - n);
  return s.computed + n;
}

void ServingEngine::Impl::prefill() {
  const int64_t V = m.vocab_size();
  std::vector<models::SequenceChunk> parts;
  int64_t total = 0;
  // A chunk that ends where its prompt's state is kept writes it to a prefix cache slot.
  std::vector<int32_t> kept_in(prefilling.size(), -1);
  for (size_t i = 0; i < prefilling.size(); ++i) {
    const auto& [s, end] = prefilling[i];
    parts.push_back(chunk(*s, s->computed, end));
    total += end - s->computed;
    if (end > 0 && end == snapshot_end(*s) && (kept_in[i] = snapshots->take()) >= 0)
      parts.back().state_slot = kept_in[i];
  }
  // Each chunk's logits: packed, row i of the one forward's; else a copy of its own forward's,
  // as the next forward of the same bucket reuses the tensor.
  std::vector<float*> row_of(parts.size());
  auto run = [&](size_t first, size_t count, int64_t tokens, int64_t T, int64_t packed) {
    Tensor& logits = logits_for(packed ? packed : 1);
    m.run_paged(m.prepare_paged(1, T, packed), std::span(parts).subspan(first, count), logits);
    note_compiles();
    ++steps;
    prefill_tokens += uint64_t(tokens);
    computed_tokens += uint64_t(T);
    padded_tokens += uint64_t(T - tokens);
    return logits.data<float>();
  };
  if (packing) {
    const int64_t T = packed_bucket(int64_t(parts.size()), total);
    float* logits = run(0, parts.size(), total, T, packed_sequences(T));
    for (size_t i = 0; i < parts.size(); ++i) row_of[i] = logits + int64_t(i) * V;
  } else {
    chunk_logits.resize(parts.size() * size_t(V));
    for (size_t i = 0; i < parts.size(); ++i) {
      const int64_t n = int64_t(parts[i].tokens.size());
      const float* logits = run(i, 1, n, bucket_for(cfg.prefill_buckets, n), 0);
      row_of[i] = std::copy_n(logits, V, chunk_logits.data() + i * size_t(V)) - V;
    }
  }
  // Sequences whose prompt is done choose their first token (a recomputed one goes on to its
  // generated tokens in decode steps).
  std::vector<Pick> picks;
  for (size_t i = 0; i < prefilling.size(); ++i) {
    Sequence& s = *prefilling[i].first;
    s.computed = prefilling[i].second;
    blocks->commit(s.table, s.tokens, s.computed, s.prompt_len);
    if (s.read_slot >= 0) snapshots->unpin(std::exchange(s.read_slot, -1));
    if (kept_in[i] >= 0) {  // its next chunk reads the state from there, pinned until then
      snapshots->keep(s.table.keys[size_t(s.computed / cfg.block_size) - 1], kept_in[i]);
      s.read_slot = kept_in[i];
    }
    if (s.computed == s.prompt_len && int64_t(s.tokens.size()) == s.prompt_len)
      picks.push_back({&s, row_of[i], i});
  }
  publish_blocks();
  chosen.assign(prefilling.size(), ServingEvent{});
  pick_all(picks);
  auto batch = std::move(prefilling);
  prefilling.clear();
  std::vector<bool> chose(batch.size(), false);
  for (const Pick& p : picks) chose[p.slot] = true;
  for (size_t i = 0; i < batch.size(); ++i) {
    std::unique_ptr<Sequence>& s = batch[i].first;
    try {
      Admit a = s->computed < s->prompt_len ? Admit::kPrefilling : Admit::kRunning;
      if (chose[i] && report(*s, std::move(chosen[i]))) a = Admit::kDone;
      place(std::move(s), a);
    } catch (const std::exception& e) {  // this sequence alone; the others of its step go on
      if (s) finish(*s, "error", e.what());
    }
  }
}

void ServingEngine::Impl::pick_all(const std::vector<Pick>& picks) {
  const int64_t V = m.vocab_size();
  ThreadPool::global().parallel_for(int64_t(picks.size()), [&](int64_t lo, int64_t hi, int) {
    for (int64_t i = lo; i < hi; ++i) {
      const Pick& p = picks[size_t(i)];
      pick(*p.s, {p.logits, size_t(V)}, chosen[p.slot]);
    }
  });
}

int64_t ServingEngine::Impl::blocks_needed_by_decode() const {
  int64_t n = 0;
  for (const auto& s : running)
    n += blocks->blocks_for(s->computed + 1) - int64_t(s->table.blocks.size());
  for (const auto& [s, end] : prefilling)
    if (end == s->prompt_len) n += blocks->blocks_for(end + 1) - int64_t(s->table.blocks.size());
  return n;
}

void ServingEngine::Impl::preempt() {
  std::unique_ptr<Sequence> s = std::move(running.back());
  running.pop_back();
  release(*s);
  ++preemptions;
  std::lock_guard<std::mutex> lock(mu);
  waiting.push_front(std::move(s));
}

void ServingEngine::Impl::decode() {
  // Each sequence's next position needs a place; the oldest get theirs first, and the newest give
  // theirs up (a sequence that is itself the newest preempts itself).
  for (size_t i = 0; i < running.size(); ++i)
    while (!blocks->grow(running[i]->table, running[i]->computed + 1)) {
      preempt();
      if (i == running.size()) break;
    }
  publish_blocks();
  if (running.empty()) return;
  const int64_t n = int64_t(running.size()), B = bucket_for(cfg.decode_buckets, n);
  const int64_t V = m.vocab_size();
  // Each sequence's first token not computed: its newest, or one it recomputes.
  std::vector<models::SequenceChunk> next;
  for (const auto& s : running) next.push_back(chunk(*s, s->computed, s->computed + 1));
  Tensor& logits = logits_for(B);
  m.run_paged(m.prepare_paged(B, 1), next, logits);
  note_compiles();
  ++steps;
  computed_tokens += uint64_t(B);
  padded_tokens += uint64_t(B - n);
  // The sequences whose newest token was computed choose their next one; reports follow in
  // batch order on this thread.
  std::vector<Pick> picks;
  for (int64_t b = 0; b < n; ++b) {
    Sequence& s = *running[size_t(b)];
    blocks->commit(s.table, s.tokens, ++s.computed, s.prompt_len);
    if (s.computed == int64_t(s.tokens.size()))
      picks.push_back({&s, logits.data<float>() + b * V, size_t(b)});
  }
  chosen.resize(size_t(n));
  pick_all(picks);
  std::vector<std::unique_ptr<Sequence>> still;
  for (size_t b = 0; b < size_t(n); ++b) {
    Sequence& s = *running[b];
    // A row chose when its newest token was computed; report() appends the choice.
    const bool chose = s.computed == int64_t(s.tokens.size());
    if (!chose || !report(s, std::move(chosen[b]))) still.push_back(std::move(running[b]));
  }
  publish_blocks();
  running = std::move(still);
}

void ServingEngine::Impl::cancel_requested() {
  std::set<uint64_t> ids;
  std::vector<std::unique_ptr<Sequence>> dropped;
  bool all = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    ids.swap(cancelled);
    all = abort_all;
    for (auto it = waiting.begin(); it != waiting.end();)
      if (all || ids.count((*it)->id)) {
        dropped.push_back(std::move(*it));
        it = waiting.erase(it);
      } else {
        ++it;
      }
  }
  for (auto& s : running)
    if (all || ids.count(s->id)) dropped.push_back(std::move(s));
  std::erase(running, nullptr);
  if (partial && (all || ids.count(partial->id))) dropped.push_back(std::move(partial));
  for (auto& s : dropped) finish(*s, "abort");
}

// Where a sequence goes after its admission or a prefill chunk; false when it waits for blocks.
bool ServingEngine::Impl::place(std::unique_ptr<Sequence> s, Admit a) {
  switch (a) {
    case Admit::kNoRoom: {  // waits at the head of the queue for blocks to free up
      std::lock_guard<std::mutex> lock(mu);
      waiting.push_front(std::move(s));
      return false;
    }
    case Admit::kPrefilling:
      partial = std::move(s);
      break;
    case Admit::kRunning:
      running.push_back(std::move(s));
      break;
    case Admit::kDone:
      break;
  }
  return true;
}

void ServingEngine::Impl::step() {
  cancel_requested();
  // A prompt prefilled over several steps first, then admissions while the budget lasts (and,
  // packing, while the step has a place for another sequence); then their chunks' prefill.
  // A packed step's tokens fit its largest bucket.
  int64_t budget = packing ? std::min(cfg.max_prefill_tokens, cfg.prefill_buckets.back())
                           : cfg.max_prefill_tokens;
  for (;;) {
    std::unique_ptr<Sequence> s = std::move(partial);
    int64_t end = 0;
    if (s) {
      end = plan_chunk(*s, budget, true);  // the partly prefilled prompt comes first
    } else {
      if (budget == 0 || int64_t(running.size() + prefilling.size()) >= cfg.max_num_seqs) break;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (waiting.empty()) break;
        s = std::move(waiting.front());
        waiting.pop_front();
      }
      Admit a = Admit::kNoRoom;
      try {
        a = admit(*s, budget, end);
      } catch (const std::exception& e) {
        finish(*s, "error", e.what());
        continue;
      }
      if (a != Admit::kPrefilling) {
        if (!place(std::move(s), a)) break;
        continue;
      }
    }
    const bool cut = end < s->prompt_len;
    prefilling.push_back({std::move(s), end});
    if (cut) break;  // its prompt goes on in the next steps; the budget is spent
  }
  if (!prefilling.empty()) {
    try {
      prefill();
    } catch (const std::exception& e) {
      for (auto& [s, end] : prefilling) finish(*s, "error", e.what());
      prefilling.clear();
    }
  }
  if (!running.empty()) {
    try {
      decode();
    } catch (const std::exception& e) {
      for (auto& s : running) finish(*s, "error", e.what());
      running.clear();
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  n_running = int64_t(running.size()) + (partial ? 1 : 0);
  n_waiting = int64_t(waiting.size());
}

void ServingEngine::Impl::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] {
        return stopping || abort_all || !waiting.empty() || !running.empty() || partial ||
               !cancelled.empty();
      });
      if (stopping && waiting.empty() && running.empty() && !partial) return;
    }
    step();
  }
}

ServingEngine::ServingEngine(CausalLM& model, ServingConfig config, const Tokenizer* tokenizer)
    : impl_(std::make_unique<Impl>(model, std::move(config), tokenizer)) {
  impl_->configure();
}

ServingEngine::~ServingEngine() { shutdown(std::chrono::milliseconds(0)); }

void ServingEngine::follow(CausalLM& model) { models::ModelRunner(model).follow(); }

const ServingConfig& ServingEngine::config() const { return impl_->cfg; }

double ServingEngine::warm_up() {
  Impl& e = *impl_;
  const auto t0 = Clock::now();
  // Each shape is compiled and run once on padding only (no cache writes, no keys), so that its
  // executable's working memory exists before the first request too.
  auto run_empty = [&](int64_t batch, int64_t tokens, int64_t packed) {
    e.m.run_paged(e.m.prepare_paged(batch, tokens, packed), {},
                  e.logits_for(packed ? packed : batch));
  };
  for (int64_t t : e.cfg.prefill_buckets) run_empty(1, t, e.packing ? e.packed_sequences(t) : 0);
  for (int64_t b : e.cfg.decode_buckets) run_empty(b, 1, 0);
  e.warm_up_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  e.note_compiles();
  e.compiles_at_ready = e.compiles.load();
  e.ready = true;
  return e.warm_up_seconds;
}

void ServingEngine::start() {
  Impl& e = *impl_;
  if (e.thread.joinable()) return;
  e.thread = std::thread([&e] { e.loop(); });
}

uint64_t ServingEngine::submit(ServingRequest request, ServingCallback on_event) {
  Impl& e = *impl_;
  if (!on_event) throw InvalidArgumentError("ServingEngine::submit: on_event is required");
  std::unique_ptr<Impl::Sequence> s = e.make_sequence(std::move(request), std::move(on_event));
  std::lock_guard<std::mutex> lock(e.mu);
  if (!e.accepting) throw ResourceError("the server is shutting down and takes no new requests");
  s->id = e.next_id++;
  const uint64_t id = s->id;
  e.waiting.push_back(std::move(s));
  e.n_waiting = int64_t(e.waiting.size());
  e.cv.notify_one();
  return id;
}

void ServingEngine::cancel(uint64_t id) {
  Impl& e = *impl_;
  std::lock_guard<std::mutex> lock(e.mu);
  e.cancelled.insert(id);
  e.cv.notify_one();
}

void ServingEngine::shutdown(std::chrono::milliseconds grace) {
  Impl& e = *impl_;
  {
    std::lock_guard<std::mutex> lock(e.mu);
    e.accepting = false;
    e.stopping = true;
    e.cv.notify_one();
  }
  if (!e.thread.joinable()) {
    // Never started: whatever waits is aborted here.
    e.abort_all = true;
    e.cancel_requested();
    return;
  }
  const auto deadline = Clock::now() + grace;
  while (Clock::now() < deadline && (e.n_running > 0 || e.n_waiting > 0))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  {
    std::lock_guard<std::mutex> lock(e.mu);
    e.abort_all = true;
    e.cv.notify_one();
  }
  e.thread.join();
}

bool ServingEngine::accepting() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->accepting;
}

ServingStats ServingEngine::stats() const {
  const Impl& e = *impl_;
  ServingStats s;
  s.running = e.n_running;
  s.waiting = e.n_waiting;
  s.kv_blocks_total = e.cfg.num_blocks;
  s.kv_blocks_used = e.blocks_used;
  s.kv_blocks_cached = e.blocks_cached;
  s.prefill_tokens = e.prefill_tokens;
  s.prefix_cache_queries = e.prefix_queries;
  s.prefix_cache_hits = e.prefix_hits;
  s.preemptions = e.preemptions;
  s.prompt_tokens = e.prompt_tokens;
  s.generated_tokens = e.generated_tokens;
  s.padded_tokens = e.padded_tokens;
  s.computed_tokens = e.computed_tokens;
  s.steps = e.steps;
  s.compiles = e.compiles;
  s.compiles_since_ready = e.ready ? e.compiles - e.compiles_at_ready : 0;
  s.warm_up_seconds = e.warm_up_seconds;
  return s;
}

}  // namespace tformers
