// `tformers bench` (speed) and `tformers perplexity` (quality on a text), run from the arguments
// apps/cli.cc parsed.
#pragma once

#include <optional>
#include <string>

#include "cli.h"
#include "tformers/model.h"

namespace tformers::cli {

// Loads the model on `device_map`, split as `distributed` says, with a progress bar on rank 0's
// stderr when that is a terminal and the load takes more than half a second.
CausalLM load_with_progress(const ModelFlags& flags, const std::string& device_map,
                            std::optional<DistributedConfig> distributed = std::nullopt);

// Swaps the model's layers for the hub kernels of tformers::default_kernel_mapping()
// (--use-kernels) and says on rank 0's stderr what each layer runs.
void use_hub_kernels(CausalLM& lm);

// Prompt processing (one forward pass over P tokens) and token generation (N single-token steps
// after a short prompt) in tokens/s, mean and standard deviation over the repetitions, for every
// thread count; each generation figure beside its memory roofline.
int run_bench(const BenchArgs& args);

// The perplexity of the model on a text file, over non-overlapping windows.
int run_perplexity(const PerplexityArgs& args);

}  // namespace tformers::cli
