// A checkpoint served under --load-mode mmap that shrinks: the pages past its new end read as
// zeros from then on, so every generation fails, even once the bytes are back. /health answered
// 200 all the while; it now says the model is unusable, naming the file, so that a supervisor
// restarts the server.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/error_of.h"
#include "serve/openai.h"
#include "serve/serve_process.h"

namespace tformers::serve::testing {
namespace {

namespace fs = std::filesystem;

TEST(ServeCheckpoint, HealthReportsAShrunkMappedCheckpoint) {
  const fs::path dir =
      fs::temp_directory_path() / ("tformers_shrunk_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(fs::path(TFORMERS_SOURCE_DIR) / kModel, dir, fs::copy_options::recursive);
  const fs::path weights = dir / "model.safetensors";
  const uintmax_t size = fs::file_size(weights);
  ServeProcess server({"--load-mode", "mmap", "--served-model-name", "kjv"}, {}, {}, dir.string());
  httplib::Client c = server.client();
  const std::string body = R"({"model": "kjv", "prompt": "And the LORD said", "max_tokens": 4})";
  ASSERT_EQ(c.Post("/v1/completions", body, "application/json")->status, 200);

  fs::resize_file(weights, size / 2);
  EXPECT_EQ(c.Post("/v1/completions", body, "application/json")->status, 500);
  fs::resize_file(weights, size);  // the bytes are back, the mapping's zeros stay
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503) << health->body;
  EXPECT_CONTAINS(health->body, weights.string() + ": the file shrank");
  EXPECT_CONTAINS(health->body, "restart the server");
  EXPECT_CONTAINS(health->body, "model_unusable");
  EXPECT_EQ(server.stop(), 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tformers::serve::testing
