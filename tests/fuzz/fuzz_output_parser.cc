// A model's output through the server's parsers, which read whatever a model writes: the
// reasoning split (harmony, <think>, opened by the prompt or not) and the tool calls of every
// format, with calls kept one or many, the text fed in pieces whose lengths the input's first
// bytes choose. Nothing may throw, crash or read out of bounds.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

#include "serve/reasoning.h"
#include "serve/tool_calls.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tformers::serve;
  if (size < 2) return 0;
  // Byte 0: the formats and options; byte 1: the piece length seed; the rest: the output.
  const uint8_t how = data[0];
  const size_t piece = 1 + data[1] % 16;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  const ReasoningFormat reasoning = std::array{ReasoningFormat::kNone, ReasoningFormat::kThink,
                                               ReasoningFormat::kHarmony}[how % 3];
  const ToolCallFormat calls =
      std::array{ToolCallFormat::kNone, ToolCallFormat::kHermes, ToolCallFormat::kLlama,
                 ToolCallFormat::kMistral}[(how / 3) % 4];
  const bool think_open = how & 0x20, parallel = how & 0x40, tools = how & 0x80;
  std::optional<ToolCallParser> parser;
  if (tools && reasoning != ReasoningFormat::kHarmony) parser.emplace(calls, parallel);
  ChatOutputParser out(reasoning, think_open, parallel, std::move(parser));
  for (size_t at = 0; at < text.size(); at += piece) out.put(text.substr(at, piece));
  out.finish();
  return 0;
}
