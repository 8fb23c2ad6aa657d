// A response_format schema and bytes through the structured-output grammar: the first line is
// the schema (JSON), the rest the text fed to its matcher. A schema is compiled or refused with a
// SchemaError; the matcher takes bytes or refuses them, and every state it reaches has a way on
// (a byte it takes, or the value is whole): no byte it accepts leads to a dead end, which would
// leave generation with no token to choose. Token masks over a vocabulary of the 256 single bytes
// and a few longer tokens agree with the byte-level answers.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "generation/json_grammar.h"
#include "generation/token_matcher.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tformers::generation;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t line = input.find('\n');
  const std::string_view schema_text = input.substr(0, line);
  const std::string_view text = line == std::string_view::npos ? "" : input.substr(line + 1);
  OrderedJson schema;
  try {
    schema = OrderedJson::parse(schema_text, nullptr, true, false);
  } catch (const OrderedJson::exception&) {
    return 0;
  }
  std::shared_ptr<const JsonGrammar> g;
  try {
    g = JsonGrammar::compile(schema);
  } catch (const SchemaError&) {
    return 0;
  }
  static const std::shared_ptr<const TokenVocabulary> vocab = [] {
    std::vector<std::optional<std::string>> bytes;
    for (int b = 0; b < 256; ++b) bytes.emplace_back(std::string(1, char(b)));
    for (const char* t : {"{\"", "\":", "\",\"", "true", "null", "12", "\\u00", "\xC3\xA9"})
      bytes.emplace_back(t);
    bytes.emplace_back(std::nullopt);  // the stop id
    return std::make_shared<TokenVocabulary>(bytes);
  }();
  const int64_t stop = vocab->size() - 1;
  JsonMatcher m(g);
  TokenMatcher tokens(g, vocab, {stop});
  std::vector<uint64_t> bits;
  JsonMatcher::State next;
  for (size_t i = 0; i <= text.size(); ++i) {
    tokens.allowed(bits);
    bool any_byte = false;
    for (int b = 0; b < 256; ++b) {
      JsonMatcher::step(*g, m.state(), uint8_t(b), next);
      const bool allowed = bits[size_t(b) / 64] >> (b % 64) & 1;
      if (allowed != !next.empty()) std::abort();  // the mask disagrees with the matcher
      any_byte |= allowed;
    }
    const bool stop_allowed = bits[size_t(stop) / 64] >> (stop % 64) & 1;
    if (stop_allowed != m.accepting()) std::abort();
    if (!any_byte && !m.accepting()) std::abort();  // a dead end
    if (m.finished() && any_byte) std::abort();
    if (i == text.size() || !m.advance(uint8_t(text[i]))) break;
    if (!tokens.accept(uint8_t(text[i]))) std::abort();
  }
  return 0;
}
