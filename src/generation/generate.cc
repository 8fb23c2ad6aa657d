// The host side of generation. Token ids, the attention mask and the output sequences stay on
// the host; each step sends the device only what forward consumes (the new ids, their
// positions, the cache mask and the cache slot) and brings back the last position's logits.
// The KV cache never leaves the device. Prompts are left-padded to a common, bucketed length,
// so one compiled prefill graph serves every prompt length in a bucket and one decode graph
// serves every step. Beam search (num_beams > 1) runs in beam_search.cc.
#include <algorithm>

#include "core/memory.h"
#include "generation/beam_search.h"
#include "generation/draft_model.h"
#include "generation/logits_process.h"
#include "generation/padding.h"
#include "generation/prompt_lookup.h"
#include "generation/sampling.h"
#include "generation/speculative.h"
#include "generation/stop_strings.h"
#include "models/causal_lm_impl.h"
#include "models/model_runner.h"
#include "tformers/distributed.h"
#include "tformers/error.h"
#include "tformers/tokenizer.h"

namespace tformers {

using generation::bucketed;

namespace {

// What a plan holds from its first step, checked before any of it is allocated: a million beams
// or return sequences otherwise grew the process past 8 GB before anything refused them. The
// sizes are multiplied as doubles, so absurd ones cannot wrap around: each row's KV cache and
// logits, the scores and logits kept per step when asked for, and beam search's candidates (an
// index per token of every beam of a prompt). The KV cache counts where it lives in host memory
// (the CPU backend, XLA's CPU plugin); an accelerator's allocation of it fails on its own.
void check_plan_memory(const models::ModelRunner& m, int64_t prompts,
                       const ResolvedGenerationConfig& rc, int64_t cache_len) {
  const bool kv_on_host = m.state_on_host();
  const bool beams = rc.num_beams > 1;
  const char* field = beams ? "num_beams" : "num_return_sequences";
  const int64_t per_prompt = beams ? rc.num_beams : rc.num_return_sequences;
  const double rows = double(prompts) * double(per_prompt), V = double(m.vocab_size());
  const double kv = kv_on_host ? rows * (double(cache_len) * double(m.kv_bytes_per_position()) +
                                         double(m.recurrent_bytes_per_sequence()))
                               : 0.0;
  const double kept_steps =
      double(int(rc.output_scores) + int(rc.output_logits)) * double(rc.max_new_tokens);
  const double logits = rows * V * sizeof(float) * (1 + kept_steps);
  const double candidates = beams ? double(rc.num_beams) * V * sizeof(int64_t) : 0;
  const uint64_t limit = memory_limit_bytes();
  if (kv + logits + candidates <= double(limit)) return;
  throw ResourceError(detail::str_cat(
      "generate: ", prompts, " prompt(s) x ", field, " ", per_prompt, " = ", planned_bytes(rows),
      " rows need ", planned_bytes(kv + logits + candidates), " bytes of host memory (",
      kv_on_host ? detail::str_cat("KV cache: ", planned_bytes(kv), " for ", cache_len,
                                   " positions of ", m.kv_bytes_per_position(), " bytes per row; ")
                 : std::string(),
      "logits", kept_steps > 0 ? " kept per step" : "", " over ", m.vocab_size(), " tokens: ",
      planned_bytes(logits), beams ? "; beam candidates: " + planned_bytes(candidates) : "",
      "), more than the ", limit, " bytes this process can have (memory, ulimit, cgroup); lower ",
      field, ", the number of prompts, max_new_tokens or max_cache_len"));
}

// What checking proposals needs (prompt lookup or an assistant's): one greedy sequence whose
// rejected tokens' cache entries can be taken back, and an assistant of the same vocabulary.
void check_drafts(const models::ModelRunner& m, const std::vector<std::vector<int32_t>>& prompts,
                  const ResolvedGenerationConfig& rc, const std::string& drafter,
                  CausalLM* assistant, const CausalLM& model) {
  if (assistant && rc.prompt_lookup_num_tokens > 0)
    throw InvalidArgumentError(
        "generate: assistant_model and prompt_lookup_num_tokens both propose tokens; use one");
  if (prompts.size() != 1 || rc.num_return_sequences != 1)
    throw InvalidArgumentError("generate: " + drafter +
                               " checks one sequence's proposals: pass one prompt with "
                               "num_return_sequences 1");
  if (rc.num_beams > 1)
    throw UnsupportedError("generate: " + drafter + " with beam search; set num_beams=1");
  if (rc.do_sample && !assistant)
    throw UnsupportedError("generate: " + drafter +
                           " checks its proposals against greedy search; set do_sample=false, "
                           "or sample with an assistant_model (speculative sampling)");
  const models::ModelRunner* other = nullptr;
  std::optional<models::ModelRunner> runner;
  if (assistant) {
    if (assistant == &model)
      throw InvalidArgumentError(
          "generate: assistant_model is the model itself; pass a smaller model of its vocabulary");
    runner.emplace(*assistant);
    other = &*runner;
    if (other->vocab_size() != m.vocab_size())
      throw UnsupportedError("generate: assistant_model has a vocabulary of " +
                             std::to_string(other->vocab_size()) + " tokens and the model " +
                             std::to_string(m.vocab_size()) +
                             "; an assistant must share the model's tokenizer");
    const int64_t need = int64_t(prompts[0].size()) + rc.max_new_tokens;
    if (need > other->config().max_position_embeddings)
      throw InvalidArgumentError(
          "generate: the prompt and max_new_tokens need " + std::to_string(need) +
          " positions, more than assistant_model's " +
          std::to_string(other->config().max_position_embeddings) +
          " (max_position_embeddings); lower max_new_tokens or use another assistant");
  }
  for (const models::ModelRunner* r : {&m, other})
    if (r && r->recurrent_bytes_per_sequence() > 0)
      throw UnsupportedError("generate: " + drafter +
                             " needs the cache of the tokens it rejects taken back, which a "
                             "linear-attention layer's recurrent state cannot be; " +
                             (r == &m ? "leave it off for this model" : "use another assistant"));
}

}  // namespace

std::vector<std::vector<int32_t>> CausalLM::generate(
    const std::vector<std::vector<int32_t>>& prompts, const GenerationConfig& call,
    const TokenCallback& on_token, const Tokenizer* tokenizer) {
  return tformers::generate(*this, prompts, call, on_token, tokenizer).sequences;
}

GenerateOutput generate(CausalLM& model, const std::vector<std::vector<int32_t>>& prompts,
                        const GenerationConfig& call, const TokenCallback& on_token,
                        const Tokenizer* tokenizer, const StepCallback& on_step, KeptCache* kept,
                        CausalLM* assistant) {
  const models::ExclusiveCall exclusive(models::state_of(model));
  models::ModelRunner m(model);
  const int64_t V = m.vocab_size();
  if (prompts.empty()) throw InvalidArgumentError("generate: input_ids has no rows");
  int64_t longest = 0;
  for (size_t r = 0; r < prompts.size(); ++r) {
    if (prompts[r].empty())
      throw InvalidArgumentError("generate: prompt " + std::to_string(r) +
                                 " is empty; give at least one token (a BOS token, for example)");
    for (int32_t id : prompts[r])
      if (id < 0 || id >= V)
        throw InvalidArgumentError("generate: prompt " + std::to_string(r) + " has token id " +
                                   std::to_string(id) + ", outside the vocabulary [0, " +
                                   std::to_string(V) + ")");
    longest = std::max(longest, int64_t(prompts[r].size()));
  }
  const GenerationConfig merged = m.generation_config().merged_with(call);
  ResolvedGenerationConfig rc = resolve(merged, longest, V, m.config().max_position_embeddings);
  rc.output_scores = call.output_scores.value_or(false);
  rc.output_logits = call.output_logits.value_or(false);
  // Tensor-parallel ranks sample with rank 0's seed, so an unset seed (drawn per process) still
  // gives every rank the same tokens.
  if (m.tensor_parallel()) rc.seed = distributed::agree_seed(rc.seed);
  if (kept && (prompts.size() != 1 || rc.num_return_sequences != 1 || rc.num_beams > 1))
    throw InvalidArgumentError(
        "generate: a KeptCache holds one row: pass one prompt, with num_return_sequences 1 and "
        "no beam search (num_beams 1)");
  const char* drafter = assistant                         ? "assistant_model"
                        : rc.prompt_lookup_num_tokens > 0 ? "prompt_lookup_num_tokens"
                                                          : nullptr;
  if (drafter) check_drafts(m, prompts, rc, drafter, assistant, model);
  std::optional<models::ExclusiveCall> assistant_exclusive;
  if (assistant) assistant_exclusive.emplace(models::state_of(*assistant));
  if (rc.num_beams > 1) {
    if (on_token)
      throw InvalidArgumentError(
          "generate: beam search (num_beams > 1) cannot stream tokens, because a beam's tokens "
          "are final only at the end; pass no on_token callback (Transformers refuses a streamer "
          "too)");
    if (!rc.stop_strings.empty())
      throw UnsupportedError(
          "generate: stop_strings with beam search (num_beams > 1) are not implemented; use "
          "eos_token_id, or num_beams=1");
    int64_t S = merged.max_cache_len
                    ? rc.max_cache_len
                    : bucketed(m.prompt_buckets(), longest + rc.max_new_tokens - 1);
    check_plan_memory(m, int64_t(prompts.size()), rc, S);
    return generation::beam_search(
        m, prompts, rc, S,
        [&](int64_t len) { return std::min(bucketed(m.prompt_buckets(), len), S); }, on_step);
  }

  // Prompt length padded to its bucket, unless the cache cannot hold the padding. The cache
  // length is rounded up to a bucket as well, so that calls with different max_new_tokens
  // share their compiled steps (on an accelerator a compile costs seconds). The unused slots cost
  // memory only: attention reads the slots written so far.
  int64_t P = bucketed(m.prompt_buckets(), longest);
  // A step that checks proposals writes K of them past the token chosen last: room for them to
  // the end (else the last steps decode one token each).
  const int64_t K = assistant ? rc.num_assistant_tokens : rc.prompt_lookup_num_tokens;
  int64_t S = merged.max_cache_len ? rc.max_cache_len
                                   : bucketed(m.prompt_buckets(), P + rc.max_new_tokens + K);
  // A bucket that overflows the cache falls back to the longest prompt the cache allows: still
  // one shape for every such prompt.
  if (P + rc.max_new_tokens > S) P = std::max(longest, S - rc.max_new_tokens);
  if (P + rc.max_new_tokens > S)
    throw InvalidArgumentError("generate: a prompt of " + std::to_string(longest) +
                               " tokens plus " + std::to_string(rc.max_new_tokens) +
                               " new tokens needs " + std::to_string(longest + rc.max_new_tokens) +
                               " cache positions, but max_cache_len is " + std::to_string(S) +
                               "; raise max_cache_len or lower max_new_tokens");
  check_plan_memory(m, int64_t(prompts.size()), rc, S);

  // Rows: each prompt num_return_sequences times, consecutively (as repeat_interleave).
  std::vector<const std::vector<int32_t>*> rows;
  for (const auto& p : prompts)
    for (int64_t k = 0; k < rc.num_return_sequences; ++k) rows.push_back(&p);
  const int64_t B = int64_t(rows.size()), new_tokens = rc.max_new_tokens;
  bool ragged = false;
  for (const auto* r : rows) ragged = ragged || int64_t(r->size()) != longest;
  // Transformers falls back to the first eos id as the pad id, and so do we.
  std::optional<int64_t> pad = rc.pad_token_id;
  if (!pad && !rc.eos_token_id.empty()) pad = rc.eos_token_id.front();
  if (!pad && (ragged || !rc.stop_strings.empty()))
    throw InvalidArgumentError(
        "generate: prompts of different lengths and rows stopped by stop_strings need a pad "
        "token, but the model has neither pad_token_id nor eos_token_id; set pad_token_id in the "
        "generation config");

  const bool keeps = kept && kept->cache_len == S && kept->cache_writes == m.cache_writes();
  m.reset_cache(B, S);

  // Host state: left-padded ids, the key mask over cache slots, per-row positions. With a kept
  // cache, the prompt's new tokens go after the slot of the last kept token it begins with.
  std::vector<int32_t> row_pos;
  for (const auto* r : rows) row_pos.push_back(int32_t(r->size()));
  const generation::KeptLayout layout =
      keeps ? generation::keep_prefix(*kept, *rows[0], new_tokens, S, m.prompt_buckets(),
                                      m.recurrent_bytes_per_sequence() > 0)
            : generation::KeptLayout{};
  generation::LeftPadded batch;
  if (layout.reused > 0) {
    P = layout.padded_len;
    batch = generation::continue_kept(*kept, *rows[0], layout, S, int32_t(pad.value_or(0)));
  } else {
    std::vector<std::span<const int32_t>> row_spans;
    for (const auto* r : rows) row_spans.emplace_back(*r);
    batch = generation::left_pad(row_spans, P, S, int32_t(pad.value_or(0)));
  }
  const int64_t first_slot = layout.first_slot;
  const Tensor &ids = batch.input_ids, &pos = batch.position_ids;
  m.set_attention_mask(batch.attention_mask);

  if (!rc.stop_strings.empty() && !tokenizer)
    throw InvalidArgumentError(
        "generate: stop_strings need the tokenizer to read the generated text; pass it to "
        "generate() (as tokenizer= in Transformers)");
  // Per row: the generated text so far, decoded incrementally, for stop strings.
  std::vector<generation::StopStrings> stops;
  if (!rc.stop_strings.empty())
    for (int64_t b = 0; b < B; ++b) stops.emplace_back(*tokenizer, rc.stop_strings);
  auto hits_stop_string = [&](int64_t b, int32_t id) { return !stops.empty() && stops[b].put(id); };

  generation::LogitsProcessorList processors(rc, V);
  generation::Sampler sampler(rc.seed);
  GenerateOutput out;
  out.cached_prompt_tokens = layout.reused;
  std::vector<std::vector<int32_t>>& seqs = out.sequences;
  for (const auto* r : rows) seqs.push_back(*r);
  out.finish_reasons.assign(size_t(B), "length");
  std::vector<bool> done(size_t(B), false);
  Tensor logits = Tensor::zeros({B, 1, V}, DType::f32);
  bool stop = false;
  // Chooses each unfinished row's next token from the logits just computed: by `pick` from its
  // processed scores when given, else greedily or by sampling.
  auto choose_with = [&](const std::function<int32_t(std::span<const float>)>& pick) {
    if (rc.output_logits)
      out.logits.emplace_back(logits.data<float>(), logits.data<float>() + B * V);
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      std::span<float> scores(logits.data<float>() + b * V, size_t(V));
      // A finished row's scores are reported too, computed over its padding as Transformers
      // computes them; only then are they worth processing.
      if (!done[b] || rc.output_scores)
        processors.process(seqs[b], int64_t(rows[b]->size()), scores);
      if (done[b]) {
        seqs[b].push_back(int32_t(*pad));
        continue;
      }
      const int32_t next = pick ? pick(scores) : sampler.next_token(scores, rc.do_sample);
      seqs[b].push_back(next);
      if (std::find(rc.eos_token_id.begin(), rc.eos_token_id.end(), next) !=
              rc.eos_token_id.end() ||
          hits_stop_string(b, next)) {
        done[b] = true;
        out.finish_reasons[b] = "stop";
      }
      if (on_token && !on_token(b, next)) stop = true;
      all_done = all_done && done[b];
    }
    if (rc.output_scores)
      out.scores.emplace_back(logits.data<float>(), logits.data<float>() + B * V);
    if (on_step && !on_step()) stop = true;
    if (stop)
      for (int64_t b = 0; b < B; ++b)
        if (!done[b]) out.finish_reasons[b] = "callback";
    return all_done || stop;
  };
  auto choose = [&] { return choose_with({}); };

  // What the cache holds when generation ends: the prompt and every chosen token but the last,
  // which no step has read.
  auto record = [&] {
    if (kept) generation::record_kept(*kept, layout, *rows[0], seqs[0], P, S, m.cache_writes());
  };
  const bool uncached = rc.disable_compile;
  m.run_static(m.prepare_static(P, 1, uncached), ids, pos, first_slot, logits);
  if (choose() || new_tokens == 1) {
    record();
    return out;
  }

  Tensor step_ids = Tensor::zeros({B, 1}, DType::i32), step_pos = Tensor::zeros({B, 1}, DType::i32);
  // One decode executable for every step; with disable_compile, a fresh compile each step.
  models::ModelRunner::Step* decode = uncached ? nullptr : &m.prepare_static(1, 1);
  // Prompt lookup or an assistant's proposals: a step of the token chosen last and K proposals
  // (one row), its logits at every position; each is chosen from in turn, as a decode step's
  // would be, while the choice is the proposal. A rejected proposal's keys and values lie past the
  // positions computed, where the next step writes over them before any query reads them.
  // The assistant's cache holds the sequence and its proposals, at most S positions (a proposal
  // is never past max_new_tokens).
  std::optional<generation::DraftModel> draft;
  if (assistant) draft.emplace(*assistant, S, rc.assistant_confidence_threshold);
  // Sampling: each proposal's processed scores, its q for speculative sampling.
  std::vector<std::vector<float>> drafted;
  const int64_t prompt_len = int64_t(rows[0]->size());
  auto pick_draft = [&](std::span<const int32_t> context, std::span<float> scores) {
    processors.process(context, prompt_len, scores);
    if (!rc.do_sample) return generation::Sampler::greedy(scores);
    drafted.emplace_back(scores.begin(), scores.end());
    return sampler.sample(scores);
  };
  auto propose = [&](int64_t count) {
    drafted.clear();
    return draft ? draft->propose(seqs[0], count, pick_draft)
                 : generation::prompt_lookup(seqs[0], count, rc.max_matching_ngram_size);
  };
  Tensor check_ids, check_pos, check_logits;  // allocated only when proposals are checked
  if (K > 0) {
    check_ids = Tensor::zeros({1, K + 1}, DType::i32);
    check_pos = Tensor::zeros({1, K + 1}, DType::i32);
    check_logits = Tensor::zeros({1, K + 1, V}, DType::f32);
  }
  for (int64_t i = 1; i < new_tokens;) {
    const int64_t slot = first_slot + P + i - 1;  // cache slot of the token chosen last
    const std::vector<int32_t> proposed = K > 0 && slot + K + 1 <= S && i + 1 < new_tokens
                                              ? propose(std::min(K, new_tokens - i - 1))
                                              : std::vector<int32_t>{};
    if (proposed.empty()) {
      for (int64_t b = 0; b < B; ++b) {
        step_ids.data<int32_t>()[b] = seqs[b].back();
        step_pos.data<int32_t>()[b] = row_pos[b]++;
      }
      m.run_static(decode ? *decode : m.prepare_static(1, 1, uncached), step_ids, step_pos, slot,
                   logits);
      ++i;
      if (choose()) break;
      continue;
    }
    for (int64_t t = 0; t <= K; ++t) {  // padded past the proposals: read by no kept choice
      check_ids.data<int32_t>()[t] = t == 0                          ? seqs[0].back()
                                     : t <= int64_t(proposed.size()) ? proposed[size_t(t - 1)]
                                                                     : proposed.back();
      check_pos.data<int32_t>()[t] = row_pos[0] + int32_t(t);
    }
    m.run_static(m.prepare_static(K + 1, K + 1, uncached), check_ids, check_pos, slot,
                 check_logits);
    bool ended = false;
    out.draft_tokens += int64_t(proposed.size());
    for (int64_t t = 0; t <= int64_t(proposed.size()); ++t) {
      std::copy_n(check_logits.data<float>() + t * V, V, logits.data<float>());
      ++row_pos[0];
      ++i;
      // Sampling keeps a proposal by speculative sampling, and after the last one draws a token
      // of the model's own.
      const bool speculative = rc.do_sample && t < int64_t(proposed.size());
      ended = choose_with(speculative ? [&](std::span<const float> p) {
        return generation::speculative_choice(p, drafted[size_t(t)], proposed[size_t(t)], sampler);
      } : std::function<int32_t(std::span<const float>)>{});
      if (ended || t == int64_t(proposed.size()) || seqs[0].back() != proposed[size_t(t)]) break;
      ++out.accepted_draft_tokens;
    }
    if (ended) break;
  }
  // Finished rows were filled with pad at every later step, so all rows have equal length.
  record();
  return out;
}

}  // namespace tformers
