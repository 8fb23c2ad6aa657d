#include "generation/draft_model.h"

#include <algorithm>
#include <cmath>

#include "tformers/error.h"

namespace tformers::generation {

DraftModel::DraftModel(CausalLM& assistant, int64_t cache_len, double confidence)
    : m_(assistant),
      logits_(Tensor::zeros({1, 1, m_.vocab_size()}, DType::f32)),
      confidence_(confidence) {
  m_.reset_cache(1, cache_len);
  m_.set_attention_mask(Tensor::from_vector<int32_t>({1, cache_len}, DType::i32,
                                                     std::vector<int32_t>(size_t(cache_len), 1)));
}

void DraftModel::feed(std::span<const int32_t> tokens) {
  const int64_t T = int64_t(tokens.size()), start = int64_t(cached_.size());
  std::vector<int32_t> positions(tokens.size());
  for (int64_t t = 0; t < T; ++t) positions[size_t(t)] = int32_t(start + t);
  m_.run_static(m_.prepare_static(T, 1),
                Tensor::from_vector<int32_t>({1, T}, DType::i32, {tokens.begin(), tokens.end()}),
                Tensor::from_vector<int32_t>({1, T}, DType::i32, positions), start, logits_);
  cached_.insert(cached_.end(), tokens.begin(), tokens.end());
}

std::vector<int32_t> DraftModel::propose(std::span<const int32_t> sequence, int64_t count,
                                         const Pick& pick) {
  TF_CHECK(!sequence.empty(), "DraftModel::propose: an empty sequence");
  // The cache's tokens that the sequence still begins with stay; the last token is computed
  // again when nothing follows them, for its logits. A rejected proposal's keys and values lie
  // past them, where the next step writes over them before any query reads them.
  const auto diverge =
      std::mismatch(cached_.begin(), cached_.end(), sequence.begin(), sequence.end());
  const size_t keep = std::min(size_t(diverge.first - cached_.begin()), sequence.size() - 1);
  cached_.resize(keep);
  feed(sequence.subspan(keep));
  std::vector<int32_t> context(sequence.begin(), sequence.end());
  const size_t proposed = context.size();
  const int64_t V = m_.vocab_size();
  while (int64_t(context.size() - proposed) < count) {
    const std::span<float> scores(logits_.data<float>(), size_t(V));
    const int32_t next = pick(context, scores);
    context.push_back(next);
    // softmax(scores)[next] = 1 / sum(exp(scores - scores[next])).
    double sum = 0;
    for (float s : scores) sum += std::exp(double(s) - double(scores[size_t(next)]));
    if (int64_t(context.size() - proposed) == count || 1.0 / sum < confidence_) break;
    const int32_t last[] = {next};
    feed(last);
  }
  return {context.begin() + int64_t(proposed), context.end()};
}

}  // namespace tformers::generation
