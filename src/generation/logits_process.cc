#include "generation/logits_process.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "generation/token_matcher.h"
#include "tformers/error.h"

namespace tformers::generation {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t size_of(std::span<float> s) { return int64_t(s.size()); }

// A finite score scaled by a valid factor (resolve() keeps temperature and repetition_penalty
// within float's normal range) can still overflow, e.g. 100 / 1e-37. It saturates at the largest
// float instead: the order of the scores is kept and softmax stays defined, where an inf would
// make it nan. A score that was -inf (filtered) stays -inf.
float saturate(float before, float after) {
  if (!std::isfinite(before) || std::isfinite(after)) return after;
  return after > 0 ? std::numeric_limits<float>::max() : std::numeric_limits<float>::lowest();
}

void check_id(int64_t id, std::span<float> scores, const char* what) {
  TF_CHECK(id >= 0 && id < size_of(scores), what, " id ", id, " outside the vocabulary [0, ",
           scores.size(), ")");
}

// Indices of the finite scores. Filtered (-inf) tokens have probability 0: every warper below
// leaves them filtered, so the sorts only need the rest (with top_k before top_p, that is k
// entries instead of the whole vocabulary).
std::vector<int64_t> finite_indices(std::span<const float> scores) {
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < int64_t(scores.size()); ++i)
    if (scores[i] != kNegInf) idx.push_back(i);
  return idx;
}

double max_of(std::span<const float> scores, const std::vector<int64_t>& idx) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i : idx) m = std::max(m, double(scores[i]));
  return m;
}

// Calls fn(id, count) once for every distinct id in `ids`, in ascending order of id.
template <typename Fn>
void for_each_count(std::span<const int32_t> ids, Fn fn) {
  std::vector<int32_t> sorted(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  for (auto run = sorted.begin(); run != sorted.end();) {
    const auto end = std::upper_bound(run, sorted.end(), *run);
    fn(*run, int64_t(end - run));
    run = end;
  }
}

}  // namespace

void apply_repetition_penalty(std::span<const int32_t> ids, float penalty,
                              std::span<float> scores) {
  // Transformers gathers the scores at every id, penalizes and scatters them back, so an id that
  // occurs several times is penalized once.
  for_each_count(ids, [&](int32_t id, int64_t) {
    check_id(id, scores, "repetition_penalty: input");
    float& s = scores[id];
    s = saturate(s, s < 0 ? s * penalty : s / penalty);
  });
}

void apply_presence_frequency_penalty(std::span<const int32_t> generated, float presence,
                                      float frequency, std::span<float> scores) {
  for_each_count(generated, [&](int32_t id, int64_t count) {
    check_id(id, scores, "presence_frequency_penalty: input");
    float& s = scores[id];
    // vLLM's order: logits -= frequency * counts, then logits -= presence * (counts > 0).
    s -= frequency * float(count);
    s -= presence;
  });
}

void apply_logit_bias(std::span<const std::pair<int32_t, float>> bias, std::span<float> scores) {
  for (const auto& [id, b] : bias) {
    check_id(id, scores, "logit_bias");
    scores[id] += b;
  }
}

void apply_no_repeat_ngram(std::span<const int32_t> ids, int64_t ngram_size,
                           std::span<float> scores) {
  TF_CHECK(ngram_size >= 1, "no_repeat_ngram_size ", ngram_size);
  const int64_t cur_len = int64_t(ids.size()), n = ngram_size;
  if (cur_len + 1 < n) return;
  // The last n-1 tokens are the prefix of the n-gram the next token would complete; every
  // earlier n-gram starting with the same n-1 tokens bans its last token.
  const int64_t prefix_start = cur_len + 1 - n;
  for (int64_t i = 0; i + n <= cur_len; ++i) {
    if (!std::equal(ids.begin() + i, ids.begin() + i + n - 1, ids.begin() + prefix_start)) continue;
    const int32_t banned = ids[i + n - 1];
    check_id(banned, scores, "no_repeat_ngram: input");
    scores[banned] = kNegInf;
  }
}

void apply_bad_words(std::span<const int32_t> ids,
                     const std::vector<std::vector<int64_t>>& bad_words_ids,
                     std::span<const int64_t> eos_token_id, std::span<float> scores) {
  const int64_t cur_len = int64_t(ids.size());
  for (const auto& seq : bad_words_ids) {
    TF_CHECK(!seq.empty(), "bad_words_ids holds an empty sequence");
    if (seq.size() == 1 &&
        std::find(eos_token_id.begin(), eos_token_id.end(), seq[0]) != eos_token_id.end())
      continue;  // Transformers drops a bad word that is just an eos token
    // SequenceBiasLogitsProcessor (Transformers 5.x) skips a sequence only when its prefix is
    // longer than the context: a prefix as long as the context is compared with all of it.
    const int64_t prefix_len = int64_t(seq.size()) - 1;
    if (prefix_len > cur_len) continue;
    bool match = true;
    for (int64_t j = 0; j < prefix_len && match; ++j)
      match = int64_t(ids[cur_len - prefix_len + j]) == seq[j];
    if (!match) continue;
    check_id(seq.back(), scores, "bad_words_ids");
    scores[seq.back()] = kNegInf;
  }
}

void apply_min_new_tokens(int64_t generated, int64_t min_new_tokens,
                          std::span<const int64_t> eos_token_id, std::span<float> scores) {
  if (generated >= min_new_tokens) return;
  for (int64_t e : eos_token_id) {
    check_id(e, scores, "eos_token_id");
    scores[e] = kNegInf;
  }
}

void apply_suppress_tokens(std::span<const int64_t> suppress_tokens, std::span<float> scores) {
  for (int64_t t : suppress_tokens) {
    check_id(t, scores, "suppress_tokens");
    scores[t] = kNegInf;
  }
}

void apply_temperature(float temperature, std::span<float> scores) {
  TF_CHECK(temperature > 0, "temperature ", temperature);
  for (float& s : scores) s = saturate(s, s / temperature);
}

void apply_top_k(int64_t top_k, std::span<float> scores, int64_t min_tokens_to_keep) {
  const int64_t k = std::min(std::max(top_k, min_tokens_to_keep), size_of(scores));
  if (k <= 0) return;
  // The k-th largest score (duplicates counted), from a min-heap of the k largest seen so far:
  // one comparison for most entries, instead of sorting the vocabulary. Everything strictly below
  // it goes; ties with it stay.
  std::vector<float> heap(scores.begin(), scores.begin() + k);
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  for (int64_t i = k; i < size_of(scores); ++i) {
    if (!(scores[i] > heap.front())) continue;
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    heap.back() = scores[i];
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  }
  const float kth = heap.front();
  for (float& s : scores)
    if (s < kth) s = kNegInf;
}

void apply_top_p(double top_p, std::span<float> scores, int64_t min_tokens_to_keep) {
  std::vector<int64_t> idx = finite_indices(scores);
  if (idx.empty()) return;
  const int64_t n = int64_t(idx.size());
  const double m = max_of(scores, idx);
  auto weight = [&](int64_t i) { return std::exp(double(scores[i]) - m); };
  double total = 0;
  for (int64_t i : idx) total += weight(i);
  // Transformers sorts ascending (stably: ties in index order), accumulates probabilities and
  // removes the tokens whose cumulative probability is <= 1 - top_p. A token's cumulative
  // probability is 1 minus the mass of the tokens after it in that order, so the same test reads
  // from the top: walking down in descending order (ties: higher index first), a token goes once
  // the mass above it reaches top_p. That needs only the head of the order, which is sorted in
  // growing chunks (a peaked distribution needs a few dozen tokens, not the whole vocabulary).
  auto before = [&](int64_t a, int64_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a > b);
  };
  int64_t cut = n;  // idx[cut..n) in descending order are removed
  for (int64_t k = std::min<int64_t>(n, 64);; k = std::min(n, 4 * k)) {
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), before);
    double above = 0;
    for (int64_t j = 0; j < k; ++j) {
      if (above / total >= top_p) {
        cut = j;
        break;
      }
      above += weight(idx[j]);
    }
    if (cut < n || k == n) break;
  }
  // The min_tokens_to_keep best tokens always stay.
  for (int64_t j = std::max(cut, min_tokens_to_keep); j < n; ++j) scores[idx[j]] = kNegInf;
}

void apply_min_p(double min_p, std::span<float> scores, int64_t min_tokens_to_keep) {
  std::vector<int64_t> idx = finite_indices(scores);
  if (idx.empty()) return;
  const double m = max_of(scores, idx);
  // p_i < min_p * p_max  <=>  exp(s_i - max) < min_p (the softmax's normalizer cancels).
  std::vector<int64_t> removed;
  for (int64_t i : idx)
    if (std::exp(double(scores[i]) - m) < min_p) removed.push_back(i);
  // The min_tokens_to_keep best tokens stay: descending order, ties in index order.
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  std::vector<int64_t> protect(idx.begin(),
                               idx.begin() + std::min<int64_t>(min_tokens_to_keep, idx.size()));
  for (int64_t i : removed)
    if (std::find(protect.begin(), protect.end(), i) == protect.end()) scores[i] = kNegInf;
}

void apply_typical_p(double mass, std::span<float> scores, int64_t min_tokens_to_keep) {
  std::vector<int64_t> idx = finite_indices(scores);
  if (idx.empty()) return;
  const int64_t n = int64_t(idx.size());
  const double m = max_of(scores, idx);
  double z = 0;
  for (int64_t i : idx) z += std::exp(double(scores[i]) - m);
  const double log_z = m + std::log(z);
  // log_softmax, probabilities and entropy (over finite entries: nansum drops -inf * 0).
  std::vector<double> logp(n), p(n);
  double ent = 0;
  for (int64_t j = 0; j < n; ++j) {
    logp[j] = double(scores[idx[j]]) - log_z;
    p[j] = std::exp(logp[j]);
    ent -= logp[j] * p[j];
  }
  // |surprisal - entropy| per token, sorted ascending (ties in index order).
  std::vector<double> shifted(n);
  for (int64_t j = 0; j < n; ++j) shifted[j] = std::abs(-logp[j] - ent);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return shifted[a] < shifted[b]; });
  // last_ind = how many cumulative probabilities (in that order) stay below mass, clamped.
  int64_t last_ind = 0;
  double cum = 0;
  for (int64_t j = 0; j < n; ++j) {
    cum += p[order[j]];
    if (cum < mass) ++last_ind;
  }
  last_ind = std::min(last_ind, n - 1);
  const double threshold = shifted[order[last_ind]];
  for (int64_t j = std::min<int64_t>(min_tokens_to_keep, n); j < n; ++j)
    if (shifted[order[j]] > threshold) scores[idx[order[j]]] = kNegInf;
}

LogitsProcessorList::LogitsProcessorList(const ResolvedGenerationConfig& c, int64_t vocab_size,
                                         std::shared_ptr<TokenMatcher> constraint)
    : vocab_size_(vocab_size), constraint_(std::move(constraint)) {
  TF_CHECK(vocab_size > 0, "vocab_size ", vocab_size);
  auto add = [&](std::string name, Fn fn) { stages_.push_back({std::move(name), std::move(fn)}); };
  if (constraint_) {
    TF_CHECK(constraint_->vocabulary().size() == vocab_size, "the grammar's vocabulary has ",
             constraint_->vocabulary().size(), " tokens, the logits ", vocab_size);
    add("grammar", [m = constraint_](auto ids, int64_t prompt_len, auto scores) {
      m->sync(ids.subspan(size_t(prompt_len)));
      m->apply(scores);
    });
  }
  if (c.repetition_penalty != 1.0) {
    const float penalty = float(c.repetition_penalty);
    add("repetition_penalty", [penalty](auto ids, int64_t, auto scores) {
      apply_repetition_penalty(ids, penalty, scores);
    });
  }
  if (c.presence_penalty != 0 || c.frequency_penalty != 0) {
    const float presence = float(c.presence_penalty), frequency = float(c.frequency_penalty);
    add("presence_frequency_penalty",
        [presence, frequency](auto ids, int64_t prompt_len, auto scores) {
          apply_presence_frequency_penalty(ids.subspan(size_t(prompt_len)), presence, frequency,
                                           scores);
        });
  }
  if (!c.logit_bias.empty()) {
    add("logit_bias",
        [bias = c.logit_bias](auto, int64_t, auto scores) { apply_logit_bias(bias, scores); });
  }
  if (c.no_repeat_ngram_size > 0) {
    const int64_t n = c.no_repeat_ngram_size;
    add("no_repeat_ngram",
        [n](auto ids, int64_t, auto scores) { apply_no_repeat_ngram(ids, n, scores); });
  }
  if (!c.bad_words_ids.empty()) {
    add("no_bad_words",
        [bad = c.bad_words_ids, eos = c.eos_token_id](auto ids, int64_t, auto scores) {
          apply_bad_words(ids, bad, eos, scores);
        });
  }
  if (c.min_new_tokens > 0 && !c.eos_token_id.empty()) {
    add("min_new_tokens",
        [n = c.min_new_tokens, eos = c.eos_token_id](auto ids, int64_t prompt_len, auto scores) {
          apply_min_new_tokens(int64_t(ids.size()) - prompt_len, n, eos, scores);
        });
  }
  if (!c.suppress_tokens.empty()) {
    add("suppress_tokens", [ids = c.suppress_tokens](auto, int64_t, auto scores) {
      apply_suppress_tokens(ids, scores);
    });
  }
  first_warper_ = stages_.size();
  if (!c.do_sample) return;  // the warpers only shape a distribution to sample from
  if (c.temperature != 1.0) {
    const float t = float(c.temperature);
    add("temperature", [t](auto, int64_t, auto scores) { apply_temperature(t, scores); });
  }
  if (c.top_k != 0) {
    const int64_t k = c.top_k;
    add("top_k", [k](auto, int64_t, auto scores) { apply_top_k(k, scores); });
  }
  if (c.top_p < 1.0) {
    const double p = c.top_p;
    add("top_p", [p](auto, int64_t, auto scores) { apply_top_p(p, scores); });
  }
  if (c.min_p) {
    const double p = *c.min_p;
    add("min_p", [p](auto, int64_t, auto scores) { apply_min_p(p, scores); });
  }
  if (c.typical_p < 1.0) {
    const double p = c.typical_p;
    add("typical_p", [p](auto, int64_t, auto scores) { apply_typical_p(p, scores); });
  }
}

void LogitsProcessorList::process(std::span<const int32_t> ids, int64_t prompt_len,
                                  std::span<float> scores, const StageCallback& after_each) const {
  TF_CHECK(int64_t(scores.size()) == vocab_size_, "scores have ", scores.size(),
           " entries, the vocabulary ", vocab_size_);
  TF_CHECK(prompt_len >= 0 && prompt_len <= int64_t(ids.size()), "prompt_len ", prompt_len, " of ",
           ids.size(), " ids");
  // The grammar wins over processors that leave nothing it allows (see the class comment).
  auto keep_the_grammar = [&] {
    if (!constraint_ || first_warper_ < 2) return;
    if (std::all_of(scores.begin(), scores.end(), [](float x) { return x == kNegInf; }))
      std::copy(constrained_.begin(), constrained_.end(), scores.begin());
  };
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (i == first_warper_) keep_the_grammar();
    const Stage& s = stages_[i];
    s.fn(ids, prompt_len, scores);
    if (constraint_ && i == 0 && first_warper_ > 1)
      constrained_.assign(scores.begin(), scores.end());
    if (after_each) after_each(s.name, scores);
  }
  if (first_warper_ == stages_.size()) keep_the_grammar();
}

std::vector<std::string> LogitsProcessorList::names() const {
  std::vector<std::string> out;
  for (const Stage& s : stages_) out.push_back(s.name);
  return out;
}

}  // namespace tformers::generation
