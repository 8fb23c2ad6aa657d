// tokenizer.json, then text to encode: the input is the file, optionally followed by
// "\n---\n" and the text (a fixed sentence otherwise). Encoding and decoding run the
// file's normalizer, pre-tokenizer, model, post-processor and decoder.
#include "fuzz_util.h"
#include "tformers/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tformers;
  auto [json, text] = fuzz::split_input(data, size);
  fuzz::expect_ok_or_error([&, json = json, text = text] {
    Tokenizer tok = Tokenizer::from_json_string(json, "tokenizer.json");
    std::string input = text.empty() ? std::string("Hello world, it's 2024! \xC3\xA9t\xC3\xA9 ")
                                     : std::string(text);
    std::vector<int32_t> ids = tok.encode(input);
    tok.decode(ids);
    tok.encode_pair(input, "a b", true);
  });
  return 0;
}
