#include "generation/beam_search.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>

#include "generation/logits_process.h"
#include "generation/padding.h"
#include "models/model_runner.h"
#include "tformers/error.h"

namespace tformers::generation {

namespace {

// Transformers' "impossible" beam score. It is added, never assigned, so penalized scores keep
// their order among themselves, exactly as float32 arithmetic there leaves them.
constexpr float kImpossible = -1.0e9f;

struct Hypothesis {
  std::vector<int32_t> tokens;  // generated tokens only
  float score = 0;
  bool finished = false;  // a finished slot that holds a real hypothesis
};

// Indices of the k largest values, largest first, equal values in index order.
std::vector<int64_t> top_k(std::span<const float> v, int64_t k) {
  std::vector<int64_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int64_t a, int64_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  idx.resize(size_t(k));
  return idx;
}

// torch.log_softmax of float32 logits: x - max - log(sum(exp(x - max))).
void log_softmax(std::span<float> x) {
  const float m = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (float v : x) sum += std::exp(double(v) - m);
  const float log_sum = float(std::log(sum));
  for (float& v : x) v = (v - m) - log_sum;
}

}  // namespace

GenerateOutput beam_search(models::ModelRunner& m, const std::vector<std::vector<int32_t>>& prompts,
                           const ResolvedGenerationConfig& rc, int64_t cache_len,
                           const std::function<int64_t(int64_t)>& padded_len,
                           const StepCallback& on_step) {
  const int64_t V = m.vocab_size(), K = rc.num_beams, N = rc.max_new_tokens;
  const int64_t B = int64_t(prompts.size()), rows = B * K;
  // Enough continuations that num_beams of them are still running even if all others hit eos.
  const int64_t keep = std::max<int64_t>(2, 1 + int64_t(rc.eos_token_id.size())) * K;
  if (keep > K * V)
    throw InvalidArgumentError(detail::str_cat("generate: beam search keeps ", keep,
                                               " candidates per step but the vocabulary has only ",
                                               V, " tokens per beam; lower num_beams"));
  auto is_eos = [&](int32_t id) {
    return std::find(rc.eos_token_id.begin(), rc.eos_token_id.end(), id) != rc.eos_token_id.end();
  };
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, int64_t(p.size()));

  LogitsProcessorList processors(rc, V);
  m.reset_cache(rows, cache_len);
  // Only the first beam is live at the start: the others would repeat its continuations.
  std::vector<std::vector<Hypothesis>> running(static_cast<size_t>(B),
                                               std::vector<Hypothesis>(static_cast<size_t>(K)));
  std::vector<std::vector<Hypothesis>> finished = running;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < K; ++k) {
      if (k > 0) running[b][k].score = kImpossible;
      finished[b][k].score = kImpossible;
    }
  // Transformers' is_early_stop_heuristic_unsatisfied: may a running beam still beat a
  // finished one?
  std::vector<bool> improvable(static_cast<size_t>(B), true);
  Tensor logits = Tensor::zeros({rows, 1, V}, DType::f32);
  std::vector<std::vector<int32_t>> seqs(static_cast<size_t>(rows));
  GenerateOutput out;
  bool cancelled = false;

  for (int64_t t = 0; t < N; ++t) {
    std::vector<std::span<const int32_t>> spans;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t k = 0; k < K; ++k) {
        std::vector<int32_t>& s = seqs[b * K + k];
        s = prompts[b];
        s.insert(s.end(), running[b][k].tokens.begin(), running[b][k].tokens.end());
        spans.emplace_back(s);
      }
    const int64_t P = padded_len(longest + t);
    LeftPadded batch = left_pad(spans, P, cache_len, int32_t(rc.pad_token_id.value_or(0)));
    m.set_attention_mask(batch.attention_mask);
    m.run_static(m.prepare_static(P, 1, rc.disable_compile), batch.input_ids, batch.position_ids, 0,
                 logits);
    float* all = logits.data<float>();
    if (rc.output_logits) out.logits.emplace_back(all, all + rows * V);
    for (int64_t r = 0; r < rows; ++r) {
      std::span<float> row(all + r * V, size_t(V));
      log_softmax(row);
      processors.process(seqs[r], int64_t(prompts[r / K].size()), row);
    }
    if (rc.output_scores) out.scores.emplace_back(all, all + rows * V);
    for (int64_t r = 0; r < rows; ++r) {
      const float beam_score = running[r / K][r % K].score;
      for (float& v : std::span<float>(all + r * V, size_t(V))) v += beam_score;
    }
    // A cancelled search ends as at max_new_tokens: every candidate finishes here.
    cancelled = on_step && !on_step();
    const bool last = t + 1 == N || cancelled;

    bool all_hit = true;
    for (int64_t b = 0; b < B; ++b) {
      // The best continuations of all of this prompt's beams.
      std::span<const float> scores(all + b * K * V, size_t(K * V));
      std::vector<int64_t> best = top_k(scores, keep);
      const auto n = static_cast<size_t>(keep);
      std::vector<float> cand(n), cand_running(n);
      std::vector<bool> hit(n);
      for (int64_t c = 0; c < keep; ++c) {
        cand[c] = scores[best[c]];
        hit[c] = is_eos(int32_t(best[c] % V)) || last;
        all_hit = all_hit && hit[c];
        cand_running[c] = cand[c] + (hit[c] ? kImpossible : 0.0f);
      }
      auto candidate = [&](int64_t c) {
        Hypothesis h;
        h.tokens = running[b][best[c] / V].tokens;
        h.tokens.push_back(int32_t(best[c] % V));
        return h;
      };

      // Finished: the top num_beams candidates that just hit a stop compete with the finished
      // hypotheses, scored with the length penalty.
      const float length_div = float(std::pow(double(t + 1), rc.length_penalty));
      bool full = rc.early_stopping == EarlyStopping::kTrue;
      for (const Hypothesis& h : finished[b]) full = full && h.finished;
      std::vector<float> merged;
      for (const Hypothesis& h : finished[b]) merged.push_back(h.score);
      for (int64_t c = 0; c < keep; ++c) {
        float s = cand[c] / length_div;
        if (full) s += kImpossible;
        if (!improvable[b]) s += kImpossible;
        if (!(hit[c] && c < K)) s += kImpossible;
        merged.push_back(s);
      }
      std::vector<Hypothesis> next_finished;
      for (int64_t i : top_k(merged, K)) {
        if (i < K) {
          next_finished.push_back(finished[b][i]);
        } else {
          Hypothesis h = candidate(i - K);
          h.score = merged[i];
          h.finished = hit[i - K] && i - K < K;
          next_finished.push_back(std::move(h));
        }
      }
      finished[b] = std::move(next_finished);

      // Running: the best num_beams candidates that did not stop.
      std::vector<Hypothesis> next_running;
      for (int64_t c : top_k(cand_running, K)) {
        Hypothesis h = candidate(c);
        h.score = cand_running[c];
        next_running.push_back(std::move(h));
      }
      running[b] = std::move(next_running);

      // Could the best running beam still beat the worst finished one? With early_stopping
      // "never" and a positive length penalty it is scored at the longest length it can reach,
      // otherwise at the current one (Transformers' heuristic).
      const int64_t hypothetical_len =
          rc.early_stopping == EarlyStopping::kNever && rc.length_penalty > 0 ? N : t + 1;
      const float best_running =
          running[b][0].score / float(std::pow(double(hypothetical_len), rc.length_penalty));
      float worst = finished[b][0].score;
      for (const Hypothesis& h : finished[b]) worst = std::min(worst, h.score);
      bool beatable = false;
      for (const Hypothesis& h : finished[b])
        beatable = beatable || best_running > (h.finished ? worst : kImpossible);
      improvable[b] = improvable[b] && beatable;
    }

    bool improvement_possible = false, all_finished = true;
    for (int64_t b = 0; b < B; ++b) {
      improvement_possible = improvement_possible || improvable[b];
      for (const Hypothesis& h : finished[b]) all_finished = all_finished && h.finished;
    }
    const bool open_beam = !(all_finished && rc.early_stopping == EarlyStopping::kTrue);
    if (!(improvement_possible && open_beam && !all_hit)) break;
  }

  // The best num_return_sequences per prompt, all as long as the longest; Transformers fills
  // with `pad_token_id or eos_token_id[0]` (so a pad id of 0 gives way to eos, as in Python).
  const int64_t R = rc.num_return_sequences;
  size_t generated = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < R; ++r) generated = std::max(generated, finished[b][r].tokens.size());
  const int32_t fill =
      rc.eos_token_id.empty()
          ? -1
          : int32_t(rc.pad_token_id.value_or(0) != 0 ? *rc.pad_token_id : rc.eos_token_id[0]);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < R; ++r) {
      const Hypothesis& h = finished[b][r];
      std::vector<int32_t> seq = prompts[b];
      seq.insert(seq.end(), h.tokens.begin(), h.tokens.end());
      seq.resize(prompts[b].size() + generated, fill);
      out.sequences.push_back(std::move(seq));
      out.sequences_scores.push_back(h.score);
      out.finish_reasons.push_back(!h.tokens.empty() && is_eos(h.tokens.back()) ? "stop"
                                   : cancelled                                  ? "callback"
                                                                                : "length");
    }
  return out;
}

}  // namespace tformers::generation
