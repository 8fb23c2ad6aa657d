// Causal language models loaded from Hugging Face checkpoint folders.
//
//   auto model = tformers::AutoModelForCausalLM::from_pretrained(
//       "Qwen/Qwen3-0.6B", {.dtype = tformers::bfloat16, .device_map = "cpu"});
//   auto out = model.generate({{785, 8585, 49041}}, {.max_new_tokens = 20});
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tformers/compile_stats.h"
#include "tformers/distributed.h"
#include "tformers/dtype.h"
#include "tformers/error.h"
#include "tformers/generation.h"
#include "tformers/tensor.h"

namespace tformers {

class Tokenizer;
namespace models {
struct CausalLMAccess;
}

struct LoadOptions {
  // Weight dtype; unset means the checkpoint's config.json "torch_dtype" (as dtype="auto" in
  // Transformers). Activations are computed in float32 on the CPU backend either way.
  std::optional<DType> dtype;
  // "cpu", "auto" (the best available device; says which on stderr), "tpu" or "cuda".
  std::string device_map = "auto";
  std::string revision = "main";
  bool verbose = false;
  // Tensor parallelism: split the model over the ranks of mpirun (see distributed.h). Unset:
  // the whole model in this process.
  std::optional<DistributedConfig> distributed_config;
  // Weight-only quantization at load: "" (none), "int8" or "int4". With "int8" every linear
  // weight (attention and MLP projections, lm_head) is stored as int8 with one f32 scale per
  // block of 32 consecutive input values of an output channel (symmetric, scale = max|block| /
  // 127, as llama.cpp's Q8_0: 9 bits per weight). With "int4" each block of 32 is 4-bit codes
  // with one f16 scale, as llama.cpp's Q4_0 (4.5 bits per weight; a weight whose output count
  // is not a multiple of 8 gets int8). Activations stay f32. Embeddings and norms keep `dtype`;
  // a tied lm_head gets its own quantized copy while the embedding gather stays unquantized.
  std::string quantize;
  // Where weights used as stored live: "copy" (default) reads them into anonymous memory aligned
  // to 2 MiB with transparent huge pages, in parallel (decode reads every weight per token, and
  // on some hosts a file-backed mapping streams at a third of the speed); "mmap" uses the
  // checkpoint's mapping itself: instant loads and pages shared with the page cache, for low
  // memory. Converted or quantized weights are always in their own memory. The names are
  // llama.cpp's load modes.
  std::string load_mode = "copy";
  // Called as weights are read: the stage ("loading weights", "quantizing to int8") and the
  // bytes of checkpoint tensors done out of the total. `tformers generate` draws a progress bar
  // from it when loading takes more than half a second (conversion or quantization; weights used
  // from the mapping as stored take milliseconds).
  std::function<void(std::string_view stage, int64_t done, int64_t total)> progress;
};

// config.json as the model read it: the fields every causal LM has, checked, and the whole file
// for anything else (`model.config().json["rope_scaling"]`), as Transformers' PretrainedConfig.
// Each architecture reads and validates its own fields besides these (src/models/).
struct PretrainedConfig {
  std::string architecture;  // "Qwen3ForCausalLM"
  std::string model_type;    // "qwen3"
  int64_t vocab_size = 0, hidden_size = 0, num_hidden_layers = 0;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  std::optional<DType> torch_dtype;
  nlohmann::json json;  // config.json as read
};

// Inputs of one forward pass over a static KV cache. Shapes (B,T) for ids and positions.
struct ForwardArgs {
  Tensor input_ids;            // int32 (B,T)
  Tensor position_ids;         // int32 (B,T); default: cache_position + arange(T)
  Tensor attention_mask;       // int32 (B, max_cache_len) over cache slots; default: all ones
  int64_t cache_position = 0;  // cache slot of the first new token
  int64_t logits_to_keep = 1;  // last positions whose logits are returned; 0 = all
};

// Threads: one model may be shared by several threads. The calls that run it (generate,
// tformers::generate, forward, reset_cache) take turns on a lock inside the model, since they
// share its one KV cache; models loaded separately run in parallel. A call made from inside
// another on the same model and thread (from a token callback) throws InvalidArgumentError.
// forward() continues from what the cache holds, so a decode loop of forward calls is one
// thread's at a time; a ServingEngine owns its model while it runs.
class CausalLM {
 public:
  const PretrainedConfig& config() const;
  const std::string& device() const;  // the backend it runs on: "cpu"
  const std::string& folder() const;  // the model folder read (a Hub id's cache snapshot)
  DType dtype() const;

  // Allocates (or resets and reuses) the static KV cache for (batch, max_cache_len), at most the
  // model's max_position_embeddings.
  void reset_cache(int64_t batch, int64_t max_cache_len);
  int64_t cache_batch() const;
  int64_t max_cache_len() const;
  // One forward step; returns float32 logits (B, logits_to_keep or T, V). Token ids outside
  // [0, vocab_size) are refused.
  Tensor forward(const ForwardArgs& args);

  // Generates from prompts of any lengths (rows are left-padded internally and masked, so each
  // row gets what it would get alone). `config` is layered over the model's
  // generation_config.json. Each returned row is its prompt followed by the same number of new
  // tokens for every row; rows that finished early are filled with pad_token_id.
  // num_return_sequences > 1 repeats each prompt that many times (consecutive rows).
  // `on_token(row, id)` is called for every new token as it is chosen; returning false stops.
  // `tokenizer` is needed for stop_strings, as in Transformers: a row stops once its generated
  // text contains a stop string that ends within the token just added.
  std::vector<std::vector<int32_t>> generate(const std::vector<std::vector<int32_t>>& input_ids,
                                             const GenerationConfig& config = {},
                                             const TokenCallback& on_token = {},
                                             const Tokenizer* tokenizer = nullptr);

  // The model's generation_config.json (empty when absent), applied under each call's config.
  GenerationConfig& generation_config();
  // Prompt lengths are padded up to the smallest of these, so prompts of many lengths share a
  // compiled prefill graph. Default: powers of two from 16 up to max_position_embeddings.
  void set_prompt_buckets(std::vector<int64_t> buckets);

  // Writes the model as loaded into `dir` (created if needed): config.json and model.safetensors,
  // as Transformers' save_pretrained. Weights quantized at load are written quantized, with
  // "quantization_config": {"quant_method": "tformers", ...} in config.json, and load again
  // without quantizing (docs/quantization.md has the layout); other weights are written in
  // dtype(). A tied head that shares its embedding is not written. The tokenizer files and
  // generation_config.json are not written (`tformers quantize` copies them). UnsupportedError
  // under tensor parallelism (each rank holds only its slices).
  void save_pretrained(const std::string& dir) const;

  // Compiles and cache hits for this model's steps.
  CompileStats compile_stats() const;
  // Bytes that crossed between host and device (inputs in, logits out) since load.
  uint64_t host_to_device_bytes() const;
  uint64_t device_to_host_bytes() const;

  // The engine's state behind the handle (src/models/causal_lm_impl.h); a copy of a CausalLM
  // shares it.
  struct Impl;

 private:
  friend struct models::CausalLMAccess;
  explicit CausalLM(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

class AutoModelForCausalLM {
 public:
  // `path` is a model folder or a Hub id found in the local Hugging Face cache. The class is
  // chosen from config.json "architectures".
  static CausalLM from_pretrained(const std::string& path, const LoadOptions& options = {});
};

// Architectures this build can load ("LlamaForCausalLM", "Qwen3ForCausalLM", ...).
std::vector<std::string> supported_architectures();

}  // namespace tformers
