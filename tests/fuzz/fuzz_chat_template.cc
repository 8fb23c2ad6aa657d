// A chat template and the messages it renders: the input is the template, optionally followed
// by "\n---\n" and a JSON array of messages (two fixed messages otherwise, and when the JSON
// does not parse).
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "tokenizer/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tformers;
  auto [source, messages_text] = fuzz::split_input(data, size);
  nlohmann::ordered_json messages = nlohmann::ordered_json::parse(messages_text, nullptr, false);
  if (messages.is_discarded())
    messages = nlohmann::ordered_json::parse(
        R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])");
  nlohmann::ordered_json ctx = {{"messages", messages},
                                {"add_generation_prompt", true},
                                {"bos_token", "<s>"},
                                {"eos_token", "</s>"}};
  // Small budgets keep each run fast; the limits themselves are what is being exercised.
  jinja::Limits limits;
  limits.max_output_bytes = 1 << 20;
  limits.max_loop_iterations = 100000;
  limits.max_steps = 1000000;
  limits.max_memory_bytes = 16 << 20;
  fuzz::expect_ok_or_error(
      [&, source = source] { jinja::Template(std::string(source), limits).render(ctx); });
  return 0;
}
