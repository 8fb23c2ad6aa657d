// apply_chat_template: renders tokenizer_config.json's Jinja chat template with the context
// Transformers builds (messages, tools, add_generation_prompt, the special tokens map, and any
// extra variables such as enable_thinking).
#include "tformers/error.h"
#include "tformers/tokenizer.h"
#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer_impl.h"

namespace tformers {

std::string Tokenizer::apply_chat_template(const nlohmann::ordered_json& messages,
                                           bool add_generation_prompt,
                                           const nlohmann::ordered_json& tools,
                                           const nlohmann::ordered_json& extra,
                                           const std::string& chat_template) const {
  const std::string& source = chat_template.empty() ? impl_->chat_template : chat_template;
  if (source.empty()) {
    throw InvalidArgumentError(
        "this tokenizer has no chat_template in tokenizer_config.json; pass one as the "
        "chat_template argument");
  }
  if (!messages.is_array()) {
    throw InvalidArgumentError(
        "apply_chat_template: messages must be an array of {\"role\": ..., \"content\": ...}");
  }
  if (!extra.is_object() && !extra.is_null()) {
    throw InvalidArgumentError("apply_chat_template: extra variables must be a JSON object");
  }
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  // Transformers: template_kwargs = {**self.special_tokens_map, **kwargs}.
  auto special = [&](const char* key, const std::string& value) {
    if (!value.empty()) ctx[key] = value;
  };
  special("bos_token", impl_->bos_token);
  special("eos_token", impl_->eos_token);
  special("unk_token", impl_->unk_token);
  special("pad_token", impl_->pad_token);
  for (const char* key : {"sep_token", "cls_token", "mask_token"}) {
    auto it = impl_->config.find(key);
    if (it == impl_->config.end()) continue;
    if (it->is_string()) ctx[key] = it->get<std::string>();
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      ctx[key] = (*it)["content"].get<std::string>();
    }
  }
  if (auto it = impl_->config.find("additional_special_tokens");
      it != impl_->config.end() && it->is_array()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& t : *it) {
      if (t.is_string()) list.push_back(t.get<std::string>());
      if (t.is_object() && t.contains("content") && t["content"].is_string()) {
        list.push_back(t["content"].get<std::string>());
      }
    }
    ctx["additional_special_tokens"] = list;
  }
  // Transformers drops the None-valued keys of each message, then copies a message's reasoning
  // (reasoning_content, thinking or reasoning, the first that is set) into `thinking` and
  // `reasoning_content`, the names templates read.
  nlohmann::ordered_json received = nlohmann::ordered_json::array();
  for (const auto& m : messages) {
    if (!m.is_object()) {
      received.push_back(m);
      continue;
    }
    nlohmann::ordered_json kept = nlohmann::ordered_json::object();
    for (const auto& [key, value] : m.items())
      if (!value.is_null()) kept[key] = value;
    const nlohmann::ordered_json* reasoning = nullptr;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"})
      if (!reasoning && kept.contains(key)) reasoning = &kept[key];
    if (reasoning) {
      nlohmann::ordered_json aliased = {{"thinking", *reasoning}};
      nlohmann::ordered_json value = *reasoning;
      for (const auto& [key, v] : kept.items()) aliased[key] = v;
      aliased["reasoning_content"] = value;
      kept = std::move(aliased);
    }
    received.push_back(std::move(kept));
  }
  ctx["messages"] = std::move(received);
  // tools and documents are always passed, None when absent (`tools is defined` is true).
  ctx["tools"] = tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  if (extra.is_object()) {
    for (const auto& [key, value] : extra.items()) ctx[key] = value;
  }
  return jinja::Template(source).render(ctx);
}

}  // namespace tformers
