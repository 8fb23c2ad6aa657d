// Raw request bytes into tformers serve's HTTP parser, as the event loop gives them: the head
// parsed from a prefix that grows in steps (the first byte of the input picks the step, so that
// both a head sent at once and one sent a few bytes at a time are tried), then the body decoded
// when chunked, and again for the next request when bytes are left (pipelining). Every input
// must end complete, refused with a 4xx/5xx status and a message, or wanting more bytes; and a
// head must never be taken past the limits.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "serve/http.h"

namespace {

using namespace tformers::serve::http;

void check(bool ok) {
  if (!ok) std::abort();
}

// Parses one request from the start of `bytes`; returns the bytes it took (0: none complete).
size_t one_request(std::string_view bytes, size_t step, const Limits& limits) {
  size_t scanned = 0;
  HeadResult r;
  for (size_t n = std::min(step, bytes.size());; n = std::min(n + step, bytes.size())) {
    r = parse_head(bytes.substr(0, n), limits, scanned);
    if (r.status != HeadResult::kIncomplete || n == bytes.size()) break;
  }
  if (r.status == HeadResult::kError) {
    check(r.error.status >= 400 && r.error.status < 600 && !r.error.message.empty());
    return 0;
  }
  if (r.status == HeadResult::kIncomplete) return 0;
  check(r.consumed <= bytes.size());
  check(r.head.headers.size() <= limits.max_headers);
  check(!r.head.method.empty() && !r.head.path.empty());
  check(r.head.content_length >= 0 && r.head.content_length <= limits.max_body);
  std::string_view rest = bytes.substr(r.consumed);
  if (!r.head.chunked) {
    if (rest.size() < size_t(r.head.content_length)) return 0;
    return r.consumed + size_t(r.head.content_length);
  }
  ChunkedDecoder decoder;
  std::string body;
  size_t taken = 0;
  std::string pending;
  for (size_t at = 0; at < rest.size(); at += step) {
    pending.append(rest.substr(at, step));
    size_t consumed = 0;
    const ChunkedDecoder::Status st = decoder.feed(pending, limits.max_body, body, consumed);
    check(consumed <= pending.size());
    check(int64_t(body.size()) <= limits.max_body);
    pending.erase(0, consumed);
    taken += consumed;
    if (st == ChunkedDecoder::kError) {
      check(decoder.error().status >= 400 && !decoder.error().message.empty());
      return 0;
    }
    if (st == ChunkedDecoder::kComplete) return r.consumed + taken;
  }
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t step = size_t(data[0] % 16) + 1;
  std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  // Small limits, so that the fuzzer reaches each of them.
  Limits limits;
  limits.max_line = 256;
  limits.max_head = 1024;
  limits.max_headers = 8;
  limits.max_body = 4096;
  for (int i = 0; i < 8 && !bytes.empty(); ++i) {
    const size_t taken = one_request(bytes, step, limits);
    if (taken == 0) break;
    bytes.remove_prefix(taken);
  }
  return 0;
}
