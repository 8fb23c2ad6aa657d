// A request body of tformers serve through what the server does with it before the engine:
// parse_request on every endpoint and, for what it accepts, the engine request with the shipped
// model's tokenizer (the chat template rendered with the messages and tools given), its text
// put back through OutputText with the request's stop strings, and a response written (the
// Responses API's through ResponseWriter). Any input is accepted or answered with an ApiError
// (an HTTP 4xx); anything else would be a 500.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "serve/openai.h"
#include "serve/responses.h"
#include "tformers/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tformers;
  using namespace tformers::serve;
  static const Tokenizer tok =
      AutoTokenizer::from_pretrained(TFORMERS_SOURCE_DIR "/models/kjv-fortunes-tiny");
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (Endpoint endpoint :
       {Endpoint::kChatCompletions, Endpoint::kCompletions, Endpoint::kResponses}) {
    try {
      const ApiRequest request = parse_request(endpoint, body);
      const ServingRequest engine_request = to_engine_request(request, tok, 256, 4096);
      OutputText text(tok, request.stop);
      std::string out;
      for (int32_t id : engine_request.prompt) out += text.put(id);
      out += text.finish();
      const ResponseHead head = new_response_head(endpoint, request.model);
      if (endpoint == Endpoint::kResponses) {
        ResponseWriter writer(head, request.echo);
        writer.put("", out, {});
        writer.end(/*cut=*/false, {});
        dump(writer.response());
        continue;
      }
      const ChoiceOutput choice{out, "stop", nullptr};
      dump(response_json(head, {&choice, 1}, {}));
    } catch (const ApiError&) {
    }
  }
  return 0;
}
