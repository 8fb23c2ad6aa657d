// Gemma 4's config reading and its KV-shared layers (the goldens are in test_golden.cc and
// test_step_cuts.cc).
#include <gtest/gtest.h>

#include "golden_util.h"
#include "io/json.h"
#include "models/architecture.h"
#include "models/causal_lm_impl.h"
#include "tformers/error.h"

namespace tformers {
namespace {

using testing::model_dir;

io::Json tiny_config() { return io::load_json_file(model_dir("hf-gemma4") + "/config.json"); }

std::vector<models::WeightSpec> weights_of(const io::Json& j) {
  const auto* arch = models::find_architecture(j["architectures"][0].get<std::string>());
  return arch->weights(*arch->config(j, "config.json"));
}

// The layers that read another layer's cache keep none of their own: the static cache holds the
// first three layers' keys and values (sliding 2 x 32, full 1 x 48, sliding 2 x 32 per
// position), and the memory checks count only those.
TEST(Gemma4, KvSharedLayersKeepNoCache) {
  CausalLM lm = AutoModelForCausalLM::from_pretrained(model_dir("hf-gemma4"), {.dtype = float32});
  lm.reset_cache(1, 32);
  const auto& impl = models::state_of(lm);
  std::vector<std::string> names;
  for (const auto& [name, buffer] : impl.cache)
    if (name.starts_with("past_key_values.")) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"past_key_values.0.key", "past_key_values.0.value",
                                             "past_key_values.1.key", "past_key_values.1.value",
                                             "past_key_values.2.key", "past_key_values.2.value"}));
  EXPECT_EQ(impl.kv_bytes_per_position(), 2 * (2 * 32 + 1 * 48 + 2 * 32) * 4);
}

// The Hub's configs name the full layers' head_dim and KV heads by global_head_dim and
// num_global_key_value_heads; Transformers 5.23 writes them as per_layer_config. Both declare the
// same weights.
TEST(Gemma4, GlobalHeadFieldsEqualPerLayerConfig) {
  io::Json hub = tiny_config();
  hub.erase("per_layer_config");
  hub["global_head_dim"] = 48;
  hub["num_global_key_value_heads"] = 1;
  const auto want = weights_of(tiny_config()), got = weights_of(hub);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(got[i].shape, want[i].shape) << got[i].name;
  }
}

// Every RMSNorm of the model takes rms_norm_eps, the router's weightless one and the per-layer
// inputs' too: a graph built from a config with another eps holds no norm with the default.
TEST(Gemma4, EveryNormTakesTheConfigsEps) {
  for (const char* name : {"hf-gemma4", "hf-gemma4-moe"}) {
    io::Json j = io::load_json_file(model_dir(name) + "/config.json");
    j["rms_norm_eps"] = 0.25;
    const auto* arch = models::find_architecture(j["architectures"][0].get<std::string>());
    const auto config = arch->config(j, "config.json");
    std::map<std::string, graph::TensorType> types;
    for (const models::WeightSpec& w : arch->weights(*config))
      types[w.name] = {DType::f32, w.shape};
    graph::GraphBuilder b(DType::f32);
    models::Params params(b, types);
    arch->build(b, params, *config, models::StepShape{.batch = 1, .new_tokens = 2, .cache_len = 8},
                DType::f32);
    int64_t norms = 0;
    const graph::Graph g = b.finish();
    for (const graph::Node& n : g.nodes())
      if (n.op == graph::Op::kRMSNorm) {
        EXPECT_EQ(n.attrs_as<graph::RMSNormAttrs>().eps, 0.25f) << name << " " << n.name;
        ++norms;
      }
    EXPECT_GT(norms, 20) << name;
  }
}

TEST(Gemma4, ImpossibleConfigsNameTheField) {
  const std::vector<std::pair<std::function<void(io::Json&)>, std::string>> cases = {
      {[](io::Json& j) {
         j["per_layer_config"]["7"] = {{"head_dim", 8}};
       },
       "per_layer_config.7: the key must be a layer index below 5"},
      {[](io::Json& j) { j["per_layer_config"]["1"]["sliding_window"] = 8; },
       "per_layer_config.1.sliding_window: only head_dim and num_key_value_heads may differ"},
      {[](io::Json& j) { j["num_kv_shared_layers"] = 4; },
       "num_kv_shared_layers 4 leaves layer 1 no earlier layer of its type"},
      {[](io::Json& j) { j["use_bidirectional_attention"] = "all"; },
       "use_bidirectional_attention \"all\""},
      {[](io::Json& j) { j["enable_moe_block"] = true; }, "num_experts"},
      {[](io::Json& j) { j["per_layer_config"]["1"]["num_key_value_heads"] = 3; },
       "layer 1 has 3 KV heads, which do not divide num_attention_heads 4"},
  };
  for (const auto& [edit, message] : cases) {
    io::Json j = tiny_config();
    edit(j);
    try {
      weights_of(j);
      ADD_FAILURE() << "accepted: " << message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tformers
