// The HTTP layer's request parser, without a server: heads whole and a byte at a time, each
// limit at its edge, framing that could be read two ways, and chunked bodies.
#include <gtest/gtest.h>

#include <string>

#include "serve/http.h"

namespace tformers::serve::http {
namespace {

HeadResult parse(std::string_view bytes, const Limits& limits = {}) {
  size_t scanned = 0;
  return parse_head(bytes, limits, scanned);
}

// The status of a refused head (0 when it was not refused).
int refused(std::string_view bytes, const Limits& limits = {}) {
  const HeadResult r = parse(bytes, limits);
  return r.status == HeadResult::kError ? r.error.status : 0;
}

// GET /v1/models/{id}: the openai client escapes the '/' of "org/model" as %2F.
TEST(HttpPath, PercentEscapesDecodeAndBadOnesAreRefused) {
  EXPECT_EQ(percent_decoded("models%2Fkjv-fortunes-tiny"), "models/kjv-fortunes-tiny");
  EXPECT_EQ(percent_decoded("a%20b%2fc"), "a b/c");
  EXPECT_EQ(percent_decoded("plain"), "plain");
  for (const char* bad : {"%", "%2", "a%g1", "%%", "x%2"})
    EXPECT_EQ(percent_decoded(bad), std::nullopt) << bad;
}

TEST(HttpParser, ReadsAHead) {
  const std::string head =
      "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n"
      "Authorization:   Bearer k  \r\n\r\n{\"body\": 1}";
  const HeadResult r = parse(head);
  ASSERT_EQ(r.status, HeadResult::kComplete) << r.error.message;
  EXPECT_EQ(r.consumed, head.find("{"));
  EXPECT_EQ(r.head.method, "POST");
  EXPECT_EQ(r.head.path, "/v1/completions");
  EXPECT_EQ(r.head.query, "x=1");
  EXPECT_EQ(r.head.content_length, 12);
  EXPECT_FALSE(r.head.chunked);
  EXPECT_TRUE(r.head.keep_alive);
  EXPECT_EQ(r.head.header("authorization"), "Bearer k");
  EXPECT_EQ(r.head.header("content-length"), "12");
  EXPECT_EQ(r.head.header("missing"), "");
}

TEST(HttpParser, AHeadSentAByteAtATimeReadsTheSame) {
  const std::string head = "GET /health HTTP/1.0\nConnection: keep-alive\n\n";
  size_t scanned = 0;
  for (size_t n = 1; n < head.size(); ++n)
    EXPECT_EQ(parse_head(std::string_view(head).substr(0, n), {}, scanned).status,
              HeadResult::kIncomplete)
        << n;
  const HeadResult r = parse_head(head, {}, scanned);
  ASSERT_EQ(r.status, HeadResult::kComplete);
  EXPECT_EQ(r.head.minor_version, 0);
  EXPECT_TRUE(r.head.keep_alive);
  EXPECT_EQ(r.consumed, head.size());
}

TEST(HttpParser, ConnectionAndVersionSetKeepAlive) {
  EXPECT_FALSE(parse("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").head.keep_alive);
  EXPECT_FALSE(parse("GET / HTTP/1.0\r\n\r\n").head.keep_alive);
  EXPECT_TRUE(parse("GET / HTTP/1.1\r\n\r\n").head.keep_alive);
  EXPECT_TRUE(parse("\r\n\r\nGET / HTTP/1.1\r\n\r\n").head.keep_alive);  // leading empty lines
}

TEST(HttpParser, ALongRequestLineIsRefusedBeforeItEnds) {
  Limits limits;
  // No newline yet: refused once the line is past the limit, not when (if ever) it ends.
  EXPECT_EQ(refused("GET /" + std::string(limits.max_line - 5, 'a'), limits), 0);
  EXPECT_EQ(refused("GET /" + std::string(limits.max_line, 'a'), limits), 414);
  EXPECT_EQ(refused("GET /" + std::string(200000, 'a'), limits), 414);
}

TEST(HttpParser, HeaderFloodsAreRefusedAt431) {
  Limits limits;
  std::string many = "GET / HTTP/1.1\r\n";
  for (size_t i = 0; i < limits.max_headers; ++i) many += "a: b\r\n";
  EXPECT_EQ(refused(many + "\r\n", limits), 0);
  EXPECT_EQ(refused(many + "a: b\r\n\r\n", limits), 431);
  // A head that never ends is refused once it passes max_head, whatever its lines.
  std::string endless = "GET / HTTP/1.1\r\n";
  while (endless.size() <= limits.max_head)
    endless += "x-filler: " + std::string(100, 'f') + "\r\n";
  EXPECT_EQ(refused(endless, limits), 431);
  EXPECT_EQ(refused("GET / HTTP/1.1\r\nx: " + std::string(limits.max_line, 'v'), limits), 431);
}

TEST(HttpParser, FramingThatCouldBeReadTwoWaysIsRefused) {
  const std::string get = "POST / HTTP/1.1\r\n";
  EXPECT_EQ(refused(get + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
  EXPECT_EQ(refused(get + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"), 400);
  EXPECT_EQ(refused(get + "Content-Length: 5\r\nContent-Length: 6\r\n\r\n"), 400);
  EXPECT_EQ(refused(get + "Content-Length: 5, 6\r\n\r\n"), 400);
  EXPECT_EQ(refused(get + "Content-Length: -5\r\n\r\n"), 400);
  EXPECT_EQ(refused(get + "Content-Length: +5\r\n\r\n"), 400);
  EXPECT_EQ(refused(get + "Content-Length: 0x10\r\n\r\n"), 400);
  EXPECT_EQ(refused(get + "Content-Length:\r\n\r\n"), 400);
  EXPECT_EQ(refused(get + "Content-Length: 99999999999999999999999\r\n\r\n"), 413);
  EXPECT_EQ(refused(get + "Content-Length: 4194305\r\n\r\n"), 413);
  EXPECT_EQ(refused(get + "Transfer-Encoding: gzip, chunked\r\n\r\n"), 501);
  EXPECT_EQ(refused(get + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"), 501);
  EXPECT_EQ(refused("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
  // The same length twice says one thing.
  const HeadResult same = parse(get + "Content-Length: 5\r\nContent-Length: 5\r\n\r\n");
  ASSERT_EQ(same.status, HeadResult::kComplete);
  EXPECT_EQ(same.head.content_length, 5);
  EXPECT_TRUE(parse(get + "Transfer-Encoding: Chunked\r\n\r\n").head.chunked);
}

TEST(HttpParser, MalformedHeadsAre400) {
  EXPECT_EQ(refused("GET /\r\n\r\n"), 400);
  EXPECT_EQ(refused("GET  / HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(refused("GET / HTTP/1.1 x\r\n\r\n"), 400);
  EXPECT_EQ(refused("G(T / HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(refused("GET nowhere HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(refused("GET / HTTP/2.0\r\n\r\n"), 505);
  EXPECT_EQ(refused("GET / SPDY/1\r\n\r\n"), 400);
  EXPECT_EQ(refused("GET / HTTP/1.1\r\nHost : a\r\n\r\n"), 400);
  EXPECT_EQ(refused("GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n"), 400);
  EXPECT_EQ(refused("GET / HTTP/1.1\r\nno colon\r\n\r\n"), 400);
  EXPECT_EQ(refused(std::string("GET / HTTP/1.1\r\nx: a\0b\r\n\r\n", 26)), 400);
  EXPECT_EQ(refused("GET / HTTP/1.1\r\nx: a\rb\r\n\r\n"), 400);
  EXPECT_EQ(refused("GET / HTTP/1.1\r\nExpect: something\r\n\r\n"), 417);
  EXPECT_TRUE(parse("POST / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n").head.expect_continue);
  EXPECT_EQ(parse("GET http://example.com/health?a HTTP/1.1\r\n\r\n").head.path, "/health");
  // Messages quote what was wrong, escaped.
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nContent-Length: -5\r\n\r\n").error.message,
            "Content-Length '-5' is not a number of bytes");
}

// Feeds `body` to a decoder in pieces of `step` bytes; returns the final status.
ChunkedDecoder::Status decode(const std::string& body, size_t step, std::string& out,
                              size_t& left_over, int64_t max_body = 1 << 20) {
  ChunkedDecoder d;
  std::string pending;
  for (size_t at = 0; at < body.size(); at += step) {
    pending += body.substr(at, step);
    size_t consumed = 0;
    const ChunkedDecoder::Status st = d.feed(pending, max_body, out, consumed);
    pending.erase(0, consumed);
    if (st != ChunkedDecoder::kIncomplete) {
      left_over = pending.size() + (body.size() > at + step ? body.size() - at - step : 0);
      return st;
    }
  }
  return ChunkedDecoder::kIncomplete;
}

TEST(HttpParser, ChunkedBodiesDecodeInAnyPieces) {
  const std::string body = "5;ext=1\r\nhello\r\nA\r\n, chunked!\r\n0\r\nTrailer: x\r\n\r\nNEXT";
  for (size_t step : {size_t(1), size_t(3), body.size()}) {
    std::string out;
    size_t left_over = 0;
    EXPECT_EQ(decode(body, step, out, left_over), ChunkedDecoder::kComplete) << step;
    EXPECT_EQ(out, "hello, chunked!");
    EXPECT_EQ(left_over, 4u) << step;  // "NEXT" is the next request's
  }
}

TEST(HttpParser, BadChunkedBodiesAreRefused) {
  const auto status_of = [](const std::string& body, int64_t max_body = 1 << 20) {
    ChunkedDecoder d;
    std::string out;
    size_t consumed = 0;
    return d.feed(body, max_body, out, consumed) == ChunkedDecoder::kError ? d.error().status : 0;
  };
  EXPECT_EQ(status_of("zz\r\n"), 400);
  EXPECT_EQ(status_of("-1\r\n"), 400);
  EXPECT_EQ(status_of("5\r\nhelloX\r\n"), 400);
  EXPECT_EQ(status_of("ffffffffffffffffff\r\n"), 400);
  EXPECT_EQ(status_of("11\r\n", 16), 413);
  EXPECT_EQ(status_of("8\r\n12345678\r\n9\r\n", 16), 413);
  EXPECT_EQ(status_of(std::string(5000, '1')), 400);
  EXPECT_EQ(status_of("0\r\n" + std::string(9000, 't')), 431);
  EXPECT_EQ(status_of("8\r\n1234"), 0);  // not refused: more is to come
}

}  // namespace
}  // namespace tformers::serve::http
