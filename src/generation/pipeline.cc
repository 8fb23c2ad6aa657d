#include "tformers/pipeline.h"

#include "tformers/error.h"

namespace tformers {

TextGenerationPipeline::TextGenerationPipeline(CausalLM model, Tokenizer tokenizer)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)) {}

std::string TextGenerationPipeline::operator()(const std::string& prompt,
                                               const GenerationConfig& config,
                                               bool return_full_text) {
  std::vector<int32_t> ids = tokenizer_.encode(prompt);
  if (ids.empty())
    throw InvalidArgumentError("text-generation: the prompt encodes to no tokens; give some text");
  auto out = model_.generate({ids}, config, {}, &tokenizer_);
  std::vector<int32_t> generated(out[0].begin() + ids.size(), out[0].end());
  std::string text = tokenizer_.decode(generated, {.skip_special_tokens = true});
  return return_full_text ? prompt + text : text;
}

std::string TextGenerationPipeline::chat(const nlohmann::ordered_json& messages,
                                         const GenerationConfig& config) {
  std::string rendered = tokenizer_.apply_chat_template(messages, /*add_generation_prompt=*/true);
  // The template already wrote the special tokens the model expects.
  std::vector<int32_t> ids = tokenizer_.encode(rendered, /*add_special_tokens=*/false);
  auto out = model_.generate({ids}, config, {}, &tokenizer_);
  std::vector<int32_t> generated(out[0].begin() + ids.size(), out[0].end());
  return tokenizer_.decode(generated, {.skip_special_tokens = true});
}

TextGenerationPipeline pipeline(const std::string& task, const std::string& model,
                                const LoadOptions& options) {
  if (task != "text-generation")
    throw InvalidArgumentError("pipeline: task '" + task +
                               "' is not supported; the only task is \"text-generation\"");
  // The tokenizer comes from the same snapshot as the weights.
  Tokenizer tok = AutoTokenizer::from_pretrained(model, options.revision);
  return TextGenerationPipeline(AutoModelForCausalLM::from_pretrained(model, options),
                                std::move(tok));
}

}  // namespace tformers
