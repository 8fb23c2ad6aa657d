// The host side of generation: token ids, masks and output sequences stay on the host; each
// step sends the device only what forward consumes (new ids, their positions, the cache mask,
// the cache slot) and brings back the last position's logits. The KV cache never leaves the
// device. One compiled step serves the prompt, another serves every decode step.
#include <algorithm>

#include "models/causal_lm_impl.h"
#include "tformers/error.h"

namespace tformers {

namespace {

// The first index among equal maxima, as torch.argmax.
int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return int32_t(best);
}

}  // namespace

std::vector<std::vector<int32_t>> CausalLM::generate(
    const std::vector<std::vector<int32_t>>& input_ids, const GenerationConfig& gc) {
  Impl& m = *impl_;
  if (input_ids.empty()) throw InvalidArgumentError("generate: input_ids has no rows");
  const int64_t B = int64_t(input_ids.size()), T = int64_t(input_ids[0].size());
  if (T == 0) throw InvalidArgumentError("generate: the prompt is empty; give at least one token");
  for (const auto& row : input_ids)
    if (int64_t(row.size()) != T)
      throw InvalidArgumentError(
          "generate: all prompts in a batch must have the same length (left padding with an "
          "attention mask is not supported yet)");
  // Transformers: max_new_tokens wins over max_length; max_length defaults to 20 in total.
  int64_t new_tokens = gc.max_new_tokens ? *gc.max_new_tokens : gc.max_length.value_or(20) - T;
  if (new_tokens <= 0)
    throw InvalidArgumentError("generate: nothing to generate: max_new_tokens is " +
                               std::to_string(new_tokens) + " for a prompt of " +
                               std::to_string(T) + " tokens; raise max_new_tokens");
  const int64_t cache_len = gc.max_cache_len.value_or(T + new_tokens);
  if (T + new_tokens > cache_len)
    throw InvalidArgumentError("generate: the prompt (" + std::to_string(T) + ") plus " +
                               std::to_string(new_tokens) +
                               " new tokens do not fit max_cache_len " + std::to_string(cache_len));
  reset_cache(B, cache_len);
  const int64_t V = m.config.vocab_size;

  // Host tensors for the prompt step.
  Tensor ids = Tensor::zeros({B, T}, DType::i32), pos = Tensor::zeros({B, T}, DType::i32);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      ids.data<int32_t>()[b * T + t] = input_ids[b][t];
      pos.data<int32_t>()[b * T + t] = int32_t(t);
    }
  Tensor mask = Tensor::zeros({B, cache_len}, DType::i32);
  std::fill_n(mask.data<int32_t>(), mask.numel(), 1);
  Tensor logits = Tensor::zeros({B, 1, V}, DType::f32);

  const std::vector<int64_t> eos = gc.eos_token_id.value_or(std::vector<int64_t>{});
  std::vector<std::vector<int32_t>> out = input_ids;
  std::vector<bool> done(size_t(B), false);
  auto append = [&] {
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) continue;  // finished rows are not extended (single-length batches only)
      int32_t next = argmax(logits.data<float>() + b * V, V);
      out[b].push_back(next);
      if (std::find(eos.begin(), eos.end(), next) != eos.end()) done[b] = true;
      all_done = all_done && done[b];
    }
    return all_done;
  };

  Impl::Step& prefill = m.step({B, T, cache_len, 1});
  m.run(prefill, ids, pos, mask, 0, logits);
  if (append() || new_tokens == 1) return out;

  Impl::Step& decode = m.step({B, 1, cache_len, 1});
  Tensor step_ids = Tensor::zeros({B, 1}, DType::i32), step_pos = Tensor::zeros({B, 1}, DType::i32);
  for (int64_t i = 1; i < new_tokens; ++i) {
    const int64_t slot = T + i - 1;  // cache slot of the token generated last
    for (int64_t b = 0; b < B; ++b) {
      step_ids.data<int32_t>()[b] = out[b].back();
      step_pos.data<int32_t>()[b] = int32_t(slot);
    }
    m.run(decode, step_ids, step_pos, mask, slot, logits);
    if (append()) break;
  }
  return out;
}

}  // namespace tformers
