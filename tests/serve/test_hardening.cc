// tformers serve under clients that do not behave: no or a wrong API key, bodies over the limit
// (with a length or chunked), bad fields, too many requests, methods the server does not take,
// bodies of many keys, a client that hangs up mid-stream, requests past --request-timeout, and
// SIGTERM while streams run.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error_of.h"
#include "serve/openai.h"
#include "serve/serve_process.h"

namespace tformers::serve::testing {
namespace {

const std::string kKey = "s3cret";
const httplib::Headers kAuth = {{"Authorization", "Bearer " + kKey}};

// The error object of an OpenAI error body.
Json error_in(const httplib::Result& r) {
  if (!r) return Json();
  const Json j = Json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("error") ? j["error"] : Json();
}

std::string completion_body(const Json& extra = Json::object()) {
  Json j = {{"model", kModel}, {"prompt", "And the LORD said"}, {"max_tokens", 4}};
  j.update(extra);
  return j.dump();
}

TEST(ServeHardening, ApiKeyIsRequiredOnV1Only) {
  ServeProcess server({}, {"TFORMERS_API_KEY=" + kKey});
  httplib::Client c = server.client();
  auto r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(error_in(r)["code"], "invalid_api_key");
  EXPECT_CONTAINS(error_in(r)["message"].get<std::string>(), "Authorization: Bearer");
  r = c.Post("/v1/completions", {{"Authorization", "Bearer nope"}}, completion_body(),
             "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(error_in(r)["message"], "incorrect API key");
  r = c.Post("/v1/completions", {{"Authorization", "Bearer " + kKey + "x"}}, completion_body(),
             "application/json");
  EXPECT_EQ(r->status, 401);
  r = c.Get("/v1/models", kAuth);
  EXPECT_EQ(r->status, 200);
  r = c.Post("/v1/completions", kAuth, completion_body(), "application/json");
  EXPECT_EQ(r->status, 200) << r->body;
  // Health checks and scrapes need no key.
  EXPECT_EQ(c.Get("/health")->status, 200);
  EXPECT_EQ(c.Get("/metrics")->status, 200);
  EXPECT_EQ(metric(server, "tformers_requests_total{endpoint=\"/v1/models\",status=\"401\"}"), 1);
  EXPECT_EQ(server.stop(), 0);
}

TEST(ServeHardening, BodiesOverTheLimitAre413) {
  ServeProcess server({"--max-body-bytes", "65536"});
  const std::string big = completion_body({{"prompt", std::string(70000, 'a')}});
  auto r = server.client().Post("/v1/completions", big, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(error_in(r)["code"], "request_too_large");
  EXPECT_CONTAINS(error_in(r)["message"].get<std::string>(), "65536 bytes (--max-body-bytes)");
  // A chunked body has no length to refuse up front; it is counted as it arrives.
  RawConnection raw(server.port());
  std::string request =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
      "Connection: close\r\n\r\n";
  for (int i = 0; i < 20; ++i) request += "1000\r\n" + std::string(4096, ' ') + "\r\n";
  request += "0\r\n\r\n";
  raw.send(request);
  const std::string answer = raw.read_until();
  EXPECT_EQ(answer.rfind("HTTP/1.1 413", 0), 0u) << answer.substr(0, 200);
  // Under the limit, chunked bodies are read.
  RawConnection small(server.port());
  const std::string body = completion_body();
  small.send(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
      "Connection: close\r\n\r\n" +
      [&] {
        char size[16];
        std::snprintf(size, sizeof size, "%zx", body.size());
        return std::string(size);
      }() +
      "\r\n" + body + "\r\n0\r\n\r\n");
  EXPECT_EQ(small.read_until().rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(server.stop(), 0);
}

TEST(ServeHardening, BadRequestsAre400sNamingTheField) {
  ServeProcess server;
  httplib::Client c = server.client();
  struct Case {
    std::string path, body, param;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", completion_body({{"temperature", "hot"}}), "temperature"},
      {"/v1/completions", completion_body({{"max_tokens", 300}}), "max_tokens"},
      {"/v1/completions", completion_body({{"prompt", std::string(2000, 'a')}}), "prompt"},
      {"/v1/completions", completion_body({{"stop", {1}}}), "stop"},
      {"/v1/chat/completions", Json{{"model", kModel}, {"messages", {{{"role", "user"}}}}}.dump(),
       "messages[0].content"},
      {"/v1/chat/completions", R"({"model": ")" + kModel + R"(", "messages": [)", ""},
  };
  for (const Case& bad : cases) {
    auto r = c.Post(bad.path, bad.body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << bad.body.substr(0, 100);
    const Json e = error_in(r);
    EXPECT_EQ(e["type"], "invalid_request_error");
    if (bad.param.empty())
      EXPECT_TRUE(e["param"].is_null()) << r->body;
    else
      EXPECT_EQ(e["param"], bad.param) << r->body;
  }
  auto r = c.Post("/v1/completions", completion_body({{"model", "gpt-4"}}), "application/json");
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(error_in(r)["code"], "model_not_found");
  r = c.Get("/v1/nothing");
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(error_in(r)["message"], "no route for GET /v1/nothing");
  EXPECT_EQ(server.stop(), 0);
}

// A stream that runs for a while, its first text read: a request being served.
std::unique_ptr<RawConnection> running_stream(const ServeProcess& server) {
  auto stream = std::make_unique<RawConnection>(server.port());
  stream->send(
      post_request("/v1/completions",
                   completion_body({{"stream", true}, {"ignore_eos", true}, {"max_tokens", 240}})));
  stream->read_until("data: {");
  return stream;
}

TEST(ServeHardening, RequestsOverTheLimitAre503ThenServedAgain) {
  ServeProcess server({"--max-connections", "2"});
  {
    // Two streams are the two requests being served; a third request is refused at once. (A
    // stream runs about half a second: should a loaded machine let one end before the third
    // request comes, that one is served, and the test tries again.)
    std::string answer;
    for (int attempt = 0; attempt < 5 && answer.rfind("HTTP/1.1 503", 0) != 0; ++attempt) {
      auto first = running_stream(server);
      auto second = running_stream(server);
      RawConnection over(server.port());
      over.send(post_request("/v1/completions", completion_body()));
      answer = over.read_until();
    }
    EXPECT_EQ(answer.rfind("HTTP/1.1 503", 0), 0u) << answer.substr(0, 300);
    EXPECT_CONTAINS(answer, "too_many_requests");
    EXPECT_CONTAINS(answer, "serving 2 requests, its limit (--max-connections)");
    EXPECT_CONTAINS(answer, "Retry-After: 1");
  }
  // Once they end, requests are served again.
  int status = 0;
  for (int i = 0; i < 100 && status != 200; ++i) {
    auto r = server.client().Post("/v1/completions", completion_body(), "application/json");
    status = r ? r->status : 0;
    if (status != 200) std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(status, 200);
  EXPECT_EQ(server.stop(), 0);
}

TEST(ServeHardening, MethodsAre405WithAllowOr501) {
  ServeProcess server;
  struct Case {
    std::string method, path;
    int status;
    std::string allow;
  };
  // Methods are case-sensitive: `get` is no method this server implements.
  const std::vector<Case> cases = {{"FOO", "/health", 501, ""},
                                   {"get", "/health", 501, ""},
                                   {"POST", "/health", 405, "GET"},
                                   {"DELETE", "/v1/models", 405, "GET"},
                                   {"GET", "/v1/chat/completions", 405, "POST"},
                                   {"PUT", "/v1/completions", 405, "POST"},
                                   {"GET", "/v1/responses", 405, "POST"},
                                   {"DELETE", "/nothing", 404, ""}};
  for (const Case& c : cases) {
    RawConnection raw(server.port());
    raw.send(c.method + " " + c.path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    const std::string answer = raw.read_until();
    const std::string what = c.method + " " + c.path + ": " + answer.substr(0, 300);
    EXPECT_EQ(answer.rfind("HTTP/1.1 " + std::to_string(c.status), 0), 0u) << what;
    if (c.allow.empty()) {
      EXPECT_EQ(answer.find("Allow:"), std::string::npos) << what;
    } else {
      EXPECT_CONTAINS(answer, "\r\nAllow: " + c.allow + "\r\n");
    }
    if (c.status == 501) {
      EXPECT_CONTAINS(answer, "'" + c.method + "' is not implemented");
    }
  }
  EXPECT_EQ(server.stop(), 0);
}

TEST(ServeHardening, BodiesOfManyKeysDoNotHoldTheServer) {
  // Four bodies of 300,000 keys each (3.5 MB, under --max-body-bytes) held the server for
  // minutes, and SIGTERM did not stop it. Parsed in linear time, they are answered in well
  // under a second, and SIGTERM right after them stops the server promptly.
  ServeProcess server;
  std::string body = completion_body();
  body.pop_back();
  for (int i = 0; i < 300000; ++i) body += ",\"k" + std::to_string(i) + "\":0";
  body += "}";
  std::vector<std::unique_ptr<RawConnection>> clients;
  for (int i = 0; i < 4; ++i) {
    clients.push_back(std::make_unique<RawConnection>(server.port()));
    clients.back()->send(post_request("/v1/completions", body));
  }
  std::this_thread::sleep_for(200ms);
  const auto start = std::chrono::steady_clock::now();
  // Within --shutdown-timeout (10 s) and a margin for a loaded machine under sanitizers.
  EXPECT_EQ(server.stop(SIGTERM, 30s), 0) << server.log();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20);
}

TEST(ServeHardening, AClientThatHangsUpMidStreamIsCancelled) {
  ServeProcess server;
  RawConnection raw(server.port());
  raw.send(post_request(
      "/v1/completions",
      completion_body(
          {{"stream", true}, {"ignore_eos", true}, {"max_tokens", 240}, {"temperature", 0}})));
  raw.read_until("data: {");
  raw.close();
  EXPECT_EQ(
      wait_for_metric(server, "tformers_completions_finished_total{reason=\"disconnected\"}", 1), 1)
      << server.log();
  EXPECT_EQ(wait_for_metric(server, "tformers_num_requests_running", 0), 0);
  // It stopped early: far fewer than 240 tokens were generated.
  EXPECT_LT(metric(server, "tformers_generation_tokens_total"), 200);
  EXPECT_EQ(server.stop(), 0);
}

TEST(ServeHardening, RequestsPastTheTimeoutAreCancelled) {
  ServeProcess server({"--request-timeout", "0.001"});
  const std::string body = completion_body({{"ignore_eos", true}, {"max_tokens", 240}});
  auto r = server.client().Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 504);
  EXPECT_EQ(error_in(r)["code"], "timeout");
  EXPECT_CONTAINS(error_in(r)["message"].get<std::string>(), "--request-timeout of 0.001 s");
  // Streamed, the error is an event, and the stream still ends with [DONE].
  RawConnection raw(server.port());
  raw.send(
      post_request("/v1/completions",
                   completion_body({{"ignore_eos", true}, {"max_tokens", 240}, {"stream", true}})));
  const std::string stream = raw.read_until("data: [DONE]");
  EXPECT_CONTAINS(stream, "HTTP/1.1 200");
  EXPECT_CONTAINS(stream, R"(data: {"error":{"message":"the request ran longer)");
  EXPECT_CONTAINS(stream, "data: [DONE]");
  // A Responses stream ends as OpenAI's does: an error event, then response.failed.
  RawConnection responses(server.port());
  responses.send(post_request("/v1/responses", Json{{"model", kModel},
                                                    {"input", "And the LORD said"},
                                                    {"ignore_eos", true},
                                                    {"max_output_tokens", 240},
                                                    {"stream", true}}
                                                   .dump()));
  const std::string events = responses.read_until(R"("status":"failed")");
  EXPECT_CONTAINS(events, "event: error\ndata: {\"type\":\"error\"");
  EXPECT_CONTAINS(events, R"("code":"timeout","message":"the request ran longer)");
  EXPECT_CONTAINS(events, "event: response.failed\n");
  EXPECT_EQ(metric(server, "tformers_completions_finished_total{reason=\"timeout\"}"), 3);
  EXPECT_EQ(server.stop(), 0);
}

TEST(ServeHardening, SigtermLetsRunningStreamsFinishAndExitsZero) {
  ServeProcess server;
  std::optional<int> status;
  for (const std::string& stream : sigterm_while_streaming(server, 4, status)) {
    EXPECT_CONTAINS(stream, R"("finish_reason":"length")");
    EXPECT_CONTAINS(stream, "data: [DONE]");
  }
  EXPECT_EQ(status, 0) << server.log();
  EXPECT_CONTAINS(server.log(), "stopping: no new requests");
}

TEST(ServeHardening, SigtermPastTheGraceAbortsStreamsAndExitsZero) {
  ServeProcess server({"--shutdown-timeout", "0"});
  std::optional<int> status;
  for (const std::string& stream : sigterm_while_streaming(server, 4, status)) {
    EXPECT_CONTAINS(stream, R"("code":"shutting_down")");
    EXPECT_CONTAINS(stream, "data: [DONE]");
  }
  EXPECT_EQ(status, 0) << server.log();
}

}  // namespace
}  // namespace tformers::serve::testing
