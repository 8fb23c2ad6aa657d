// Continuous batching over a paged KV cache, the engine behind `tformers serve` (as vLLM's
// LLMEngine is behind `vllm serve`).
//
//   tformers::ServingEngine engine(model, {.max_num_seqs = 8, .max_model_len = 2048}, &tok);
//   engine.warm_up();  // compiles every shape of the plan
//   engine.start();    // the scheduler thread
//   engine.submit({.prompt = ids, .config = {.max_new_tokens = 64}},
//                 [](const tformers::ServingEvent& e) { ... });
//
// One scheduler thread owns the model. Each step it admits waiting requests (one prefill each,
// the prompt padded to a bucket) while KV blocks and rows are free, then advances every running
// sequence by one token in one batched decode step, the batch padded to a bucket size. The
// shapes are fixed by the config, so after warm_up() nothing compiles again. Keys and values live
// in fixed-size blocks of one pool; each sequence has a block table that grows as it does, and
// attention reads through it. A finished or cancelled sequence frees its blocks at once. Full
// blocks stay cached under the hash of their prefix, so a request that repeats a prefix prefills
// only what follows it. When a running sequence needs a block and the pool has none, the newest
// one is preempted and computed again later; a request is never truncated.
//
// A request's tokens do not depend on what else is batched with it, on a cached prefix or on a
// preemption: every row's numbers go through the same kernels in the same order whatever the
// batch (tested against the request run alone).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tformers/generation.h"

namespace tformers {

class CausalLM;
class Tokenizer;

struct ServingConfig {
  int64_t max_num_seqs = 8;   // sequences decoded together (the largest decode batch)
  int64_t max_model_len = 0;  // prompt + generated tokens of one sequence; 0: the smaller of
                              // max_position_embeddings and 4096
  int64_t block_size = 16;    // positions per KV block
  // KV blocks in the pool. 0: from kv_cache_bytes when set, else enough for max_num_seqs
  // sequences of max_model_len.
  int64_t num_blocks = 0;
  int64_t kv_cache_bytes = 0;
  // A prefill step's positions are padded to the smallest of these; default: 16, 24, 32, 48, 64,
  // ... (powers of two and their midpoints) up to the most positions a step takes:
  // max_prefill_tokens (block_size if that is more), and at most max_model_len for each
  // sequence the step holds (on the CPU a step packs up to max_num_seqs prompts; elsewhere it
  // runs one). Each is compiled and run once at warm-up.
  std::vector<int64_t> prefill_buckets;
  // A decode step's sequences are padded to the smallest of these; default: 1, 2, 3, 4, 6, 8,
  // 12, ... (the same series from 1) up to max_num_seqs.
  std::vector<int64_t> decode_buckets;
  // Prompt positions prefilled per step before the running sequences advance: a bound on how
  // long new requests stall the streams already running (vLLM's max_num_batched_tokens with
  // chunked prefill). A longer prompt is prefilled in chunks of whole KV blocks (at least one),
  // one chunk a step; its first token comes after its last chunk. On the CPU a step's prompts
  // and chunks run as one packed forward.
  int64_t max_prefill_tokens = 512;
  // Full KV blocks are kept under the hash of their prefix, and a request that begins with
  // cached blocks shares them and prefills only the rest (vLLM's enable_prefix_caching). With
  // linear-attention layers (Qwen3.5, Qwen3-Next) a hit ends where a recurrent state was kept:
  // the end of each prompt's last whole block, max_num_seqs states kept, least recently used
  // first out (generation/state_snapshots.h).
  bool enable_prefix_caching = true;
};

struct ServingRequest {
  std::vector<int32_t> prompt;
  // Layered over the model's generation_config.json, as generate() does. num_beams and
  // num_return_sequences must be 1.
  GenerationConfig config;
  bool logprobs = false;     // report each token's log-probability
  int64_t top_logprobs = 0;  // and this many most likely alternatives (0-20)
  // OpenAI's penalties (vLLM's semantics), each in [-2, 2]: a token generated c > 0 times so far
  // (the prompt does not count) has its logit lowered by frequency_penalty * c + presence_penalty,
  // after repetition_penalty and before the sampling warpers.
  double presence_penalty = 0, frequency_penalty = 0;
  // OpenAI's logit_bias: each bias, in [-100, 100], is added to its token's logit right after the
  // penalties, greedy decoding included.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Structured output (OpenAI's response_format): the output is one JSON value valid against
  // this JSON schema, in compact form ({"type": "object"} for any object). Every token that
  // cannot continue such a value is masked before sampling, an eos id is allowed only once the
  // value is whole, and the sequence ends ("stop") as soon as nothing but an eos id can follow.
  // The schema subset and the shape of what is generated: docs/serving.md, "Structured output".
  // submit() refuses a schema outside it with InvalidArgumentError naming the keyword and where
  // it is; it needs the engine to have the tokenizer.
  std::optional<nlohmann::ordered_json> json_schema;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

// One event per generated token; the last one has finish_reason set. A request that ends
// without a new token (cancelled while waiting, an error) gets one event with token -1.
// Log-probabilities are log_softmax of the model's logits, before any processor or warper (as
// vLLM's default).
struct ServingEvent {
  uint64_t request = 0;
  int32_t token = -1;
  float logprob = 0;                       // with logprobs
  std::vector<TokenLogprob> top_logprobs;  // with top_logprobs, most likely first
  // "" while running; "stop" (an eos id or a stop string), "length" (max_new_tokens or
  // max_model_len), "abort" (cancelled or shut down) or "error".
  std::string finish_reason;
  std::string error;  // with "error"
  // In a request's first token event: its prompt tokens whose keys and values came from the
  // prefix cache (vLLM's and OpenAI's cached_tokens).
  int64_t cached_tokens = 0;
};
// Called on the scheduler thread, in token order per request. It must return quickly and may
// call only cancel() on the engine.
using ServingCallback = std::function<void(const ServingEvent&)>;

struct ServingStats {
  int64_t running = 0, waiting = 0;
  int64_t kv_blocks_total = 0, kv_blocks_used = 0;
  int64_t kv_blocks_cached = 0;  // blocks kept under a prefix hash, held by a sequence or not
  uint64_t prompt_tokens = 0, generated_tokens = 0;  // since start
  // Tokens prefilled (not padding): prompts less their cached prefixes, and preempted sequences
  // computed again.
  uint64_t prefill_tokens = 0;
  // Tokens looked up in the prefix cache at admission (prompts, and the tokens of a preempted
  // sequence again) and those found there.
  uint64_t prefix_cache_queries = 0, prefix_cache_hits = 0;
  uint64_t preemptions = 0;  // running sequences that gave their blocks up, to be computed again
  // Rows and positions computed for padding (bucketed prompts, padded decode batches) and in all.
  uint64_t padded_tokens = 0, computed_tokens = 0;
  uint64_t steps = 0;
  uint64_t compiles = 0;              // compiles of the model's steps since load
  uint64_t compiles_since_ready = 0;  // since warm_up() finished: 0 while the plan holds
  double warm_up_seconds = 0;
};

class ServingEngine {
 public:
  // Allocates the KV pool for `model` (whose static cache it does not use). `tokenizer` is needed
  // for stop strings. InvalidArgumentError for an impossible config (a pool too small for one
  // sequence of max_model_len, sizes out of range), and for a model that another engine serves
  // (one pool per model: load the model twice for two engines).
  //
  // A tensor-parallel model is served from rank 0 of its group, which takes the requests and
  // schedules; every other rank calls follow(model) instead, which runs each step rank 0 runs,
  // in the same order, until rank 0's engine ends:
  //
  //   if (tformers::distributed::is_main_process()) { ServingEngine engine(model); ... }
  //   else ServingEngine::follow(model);
  ServingEngine(CausalLM& model, ServingConfig config = {}, const Tokenizer* tokenizer = nullptr);
  static void follow(CausalLM& model);
  ~ServingEngine();  // shutdown(0)
  ServingEngine(const ServingEngine&) = delete;
  ServingEngine& operator=(const ServingEngine&) = delete;

  const ServingConfig& config() const;  // with the defaults filled in
  // Compiles every prefill bucket and decode batch size; returns the seconds it took.
  double warm_up();
  void start();  // starts the scheduler thread
  // Queues a request and returns its id. Thread-safe. InvalidArgumentError, saying which field,
  // for a request that can never run: empty prompt, ids outside the vocabulary, prompt +
  // max_new_tokens over max_model_len, a bad generation config. max_new_tokens unset means up to
  // max_model_len.
  uint64_t submit(ServingRequest request, ServingCallback on_event);
  // Ends a waiting or running request with finish_reason "abort". Thread-safe; unknown or
  // finished ids are ignored.
  void cancel(uint64_t id);
  // Stops admitting requests (submit then throws ResourceError), lets running ones finish for up
  // to `grace`, aborts what is left and joins the scheduler.
  void shutdown(std::chrono::milliseconds grace);
  bool accepting() const;
  ServingStats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tformers
