// `tformers perplexity`, in the spirit of llama-perplexity, with the windows of the shipped
// model's held-out loss (tools/train/heldout_loss.py):
//  - the file is encoded as it is, without the tokenizer's added special tokens;
//  - the ids are cut into consecutive, non-overlapping windows of --ctx tokens; the last one may
//    be shorter and is used when it has at least 2 tokens;
//  - each window runs as a fresh sequence from position 0, and every token but its first is
//    scored: -log softmax(logits)[next id], in double from the float32 logits.
// Early tokens of a window see little context, so on the same model and --ctx this perplexity
// is higher than that of a strided sliding window (Transformers' docs) or llama-perplexity's
// (which scores only the second half of each window); it is the simplest to reproduce exactly,
// and tools/reference/perplexity.py computes the same in PyTorch.
//
// ± is llama-perplexity's estimate: the standard error of the mean NLL over the scored tokens,
// sqrt(var / (n - 1)), carried to the perplexity to first order (times exp(mean)). It treats the
// tokens as independent, which they are not, so the real uncertainty is larger.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/progress.h"
#include "core/thread_pool.h"
#include "eval.h"
#include "interrupt.h"
#include "io/file.h"
#include "tformers/error.h"
#include "tformers/tokenizer.h"

namespace tformers::cli {
namespace {

constexpr uint64_t kMaxTextBytes = uint64_t(256) << 20;
// From this size up, encoding the text takes seconds, so a terminal is told it runs.
constexpr size_t kTokenizeNoteBytes = size_t(1) << 20;

// -log softmax(row)[target], in double.
double token_nll(const float* row, int64_t vocab, int32_t target) {
  double mx = row[0];
  for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, double(row[v]));
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - mx);
  return std::log(sum) + mx - double(row[target]);
}

}  // namespace

int run_perplexity(const PerplexityArgs& a) {
  check_perplexity_args(a);
  const auto t0 = std::chrono::steady_clock::now();
  // read_regular_file's own message for a missing file does not say which flag named it.
  if (!std::filesystem::exists(a.file))
    throw NotFoundError("perplexity: --file " + a.file + ": no such file");
  const std::string text = io::read_regular_file(a.file, kMaxTextBytes, "--file text");
  const StopOnCtrlC stop;
  const bool terminal = isatty(fileno(stderr));
  Tokenizer tok = AutoTokenizer::from_pretrained(a.model.model, a.model.revision);
  // Encoding is one call with no progress of its own (seconds to a minute for 10 MB, by
  // tokenizer), so a terminal is told what runs.
  if (terminal && text.size() >= kTokenizeNoteBytes)
    std::fprintf(stderr, "tformers: perplexity: tokenizing %.1f MB of text...\n",
                 double(text.size()) / 1e6);
  const std::vector<int32_t> ids = tok.encode(text, /*add_special_tokens=*/false);
  const int64_t n = int64_t(ids.size());
  if (n < 2)
    throw InvalidArgumentError("perplexity: " + a.file + " encodes to " + std::to_string(n) +
                               " token" + (n == 1 ? "" : "s") +
                               "; scoring needs at least 2 (one to predict from)");
  CausalLM lm = load_with_progress(a.model, "auto");
  const int64_t positions = lm.config().max_position_embeddings;
  const int64_t ctx = a.ctx.value_or(std::min(kPerplexityCtx, positions));
  if (ctx > positions)
    throw InvalidArgumentError("perplexity: --ctx " + std::to_string(ctx) +
                               " is more than the model's " + std::to_string(positions) +
                               " positions (max_position_embeddings); give at most " +
                               std::to_string(positions));
  const int64_t windows = n / ctx + (n % ctx >= 2 ? 1 : 0), vocab = lm.config().vocab_size;

  ProgressBar bar(stderr, terminal, 0.5, "windows");
  double sum = 0, sum_sq = 0;
  int64_t scored = 0;
  for (int64_t w = 0; w < windows; ++w) {
    if (stop.requested()) {
      bar.finish();
      std::fprintf(stderr,
                   "tformers: perplexity: stopped (Ctrl-C) after %lld of %lld windows; %s\n",
                   (long long)w, (long long)windows,
                   scored ? ("perplexity so far " + std::to_string(std::exp(sum / double(scored))) +
                             " over " + std::to_string(scored) + " tokens")
                                .c_str()
                          : "nothing scored yet");
      return StopOnCtrlC::kExitCode;
    }
    const int64_t start = w * ctx, len = std::min(ctx, n - start);
    // A fresh sequence: nothing of the previous window stays in the cache.
    lm.reset_cache(1, ctx);
    ForwardArgs fa;
    fa.input_ids = Tensor::from_vector<int32_t>(
        {1, len}, DType::i32, std::vector<int32_t>(ids.begin() + start, ids.begin() + start + len));
    fa.logits_to_keep = 0;
    const Tensor logits = lm.forward(fa);
    // Row t predicts the window's token t + 1, which was also an input (so a valid id).
    std::vector<double> nll(size_t(len - 1));
    ThreadPool::global().parallel_for(len - 1, [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t)
        nll[size_t(t)] =
            token_nll(logits.data<float>() + t * vocab, vocab, ids[size_t(start + t + 1)]);
    });
    // Summed in order, so the result does not depend on the thread count.
    for (double x : nll) {
      sum += x;
      sum_sq += x * x;
    }
    scored += len - 1;
    char label[64];
    std::snprintf(label, sizeof label, "perplexity %.4f", std::exp(sum / double(scored)));
    bar.update(label, w + 1, windows);
  }
  bar.finish();

  const double mean = sum / double(scored), var = sum_sq / double(scored) - mean * mean;
  const double se = scored > 1 && var > 0 ? std::sqrt(var / double(scored - 1)) : 0.0;
  const double ppl = std::exp(mean);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.json) {
    nlohmann::ordered_json j = {{"perplexity", ppl},
                                {"perplexity_stderr", ppl * se},
                                {"nll", mean},
                                {"nll_stderr", se},
                                {"tokens", n},
                                {"scored_tokens", scored},
                                {"windows", windows},
                                {"ctx", ctx},
                                {"dtype", std::string(dtype_name(lm.dtype()))},
                                {"quantize", a.model.quantize},
                                {"seconds", seconds}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("perplexity: %.4f ± %.4f\n", ppl, ppl * se);
  }
  std::fprintf(stderr,
               "tformers: perplexity: %lld tokens in %lld windows of up to %lld (the first token "
               "of each is context only), %lld scored; mean NLL %.6f ± %.6f nats/token; %.1f s\n",
               (long long)n, (long long)windows, (long long)ctx, (long long)scored, mean, se,
               seconds);
  return 0;
}

}  // namespace tformers::cli
