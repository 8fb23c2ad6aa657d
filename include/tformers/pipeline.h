// pipeline("text-generation", ...), as in Transformers: a model and its tokenizer behind one call
// that takes text and returns text.
//
//   auto pipe = tformers::pipeline("text-generation", "Qwen/Qwen3-0.6B", {.device_map = "cpu"});
//   std::string text = pipe("The French Bread Law states", {.max_new_tokens = 30});
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tformers/generation.h"
#include "tformers/model.h"
#include "tformers/tokenizer.h"

namespace tformers {

class TextGenerationPipeline {
 public:
  TextGenerationPipeline(CausalLM model, Tokenizer tokenizer);
  // The prompt followed by its continuation (Transformers' return_full_text=True), or only the
  // continuation when return_full_text is false. Special tokens are skipped.
  std::string operator()(const std::string& prompt, const GenerationConfig& config = {},
                         bool return_full_text = true);
  // Chat messages ([{"role": ..., "content": ...}]) go through the chat template with a
  // generation prompt; the reply alone is returned.
  std::string chat(const nlohmann::ordered_json& messages, const GenerationConfig& config = {});

  CausalLM& model() { return model_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }

 private:
  CausalLM model_;
  Tokenizer tokenizer_;
};

// Only "text-generation" is a task here; anything else is an InvalidArgumentError naming it.
TextGenerationPipeline pipeline(const std::string& task, const std::string& model,
                                const LoadOptions& options = {});

}  // namespace tformers
