// Assisted generation's drafts (Transformers' assistant_model and its AssistedCandidateGenerator,
// llama.cpp's draft model): a smaller model of the same vocabulary proposes the tokens it would
// choose greedily after the sequence so far, and generate() checks them all in one step of the
// main model, keeping those the main model would have chosen itself. The output is greedy
// search's; the main model reads its weights once for every run of proposals it accepts.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "models/model_runner.h"

namespace tformers::generation {

class DraftModel {
 public:
  // `assistant`'s static cache becomes one row of `cache_len` positions; `confidence`: drafting
  // stops early once the assistant gives its own choice less than this probability
  // (assistant_confidence_threshold; 0 never stops early).
  DraftModel(CausalLM& assistant, int64_t cache_len, double confidence);
  // Chooses the assistant's next token after `context` from its scores, which it may process in
  // place first (the model's logits processors, so that sampling draws from what it processed).
  using Pick = std::function<int32_t(std::span<const int32_t> context, std::span<float> scores)>;
  // Up to `count` tokens after `sequence`, each picked by `pick`. The assistant's cache keeps what
  // it computed: a later sequence that shares a prefix with it computes only the rest.
  std::vector<int32_t> propose(std::span<const int32_t> sequence, int64_t count, const Pick& pick);

 private:
  // Runs `tokens` at positions from cached_.size() and leaves the last one's logits in logits_.
  void feed(std::span<const int32_t> tokens);

  models::ModelRunner m_;
  std::vector<int32_t>
      cached_;  // the tokens whose keys and values the cache holds, slot = position
  Tensor logits_;
  double confidence_;
};

}  // namespace tformers::generation
