// Tensor-parallel plans without processes: rule matching, overrides, validation messages,
// torch.chunk slicing, and a one-rank split model against the whole one.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "distributed/tp_plan.h"
#include "tformers/error.h"
#include "tformers/model.h"

namespace tformers::distributed {
namespace {

const std::vector<std::string> kModules = {"model.embed_tokens",
                                           "model.layers.0.self_attn.q_proj",
                                           "model.layers.0.self_attn.k_proj",
                                           "model.layers.1.self_attn.q_proj",
                                           "model.layers.1.self_attn.k_proj",
                                           "model.layers.0.mlp.down_proj",
                                           "model.layers.1.mlp.down_proj",
                                           "model.norm",
                                           "lm_head"};

const std::map<std::string, std::string> kDefaults = {{"layers.*.self_attn.q_proj", "colwise"},
                                                      {"layers.*.self_attn.k_proj", "colwise"},
                                                      {"layers.*.mlp.down_proj", "rowwise"},
                                                      {"embed_tokens", "embedding_rowwise"},
                                                      {"lm_head", "colwise_rep"}};

TEST(TpPlan, MatchesModulesRelativeToTheBaseModelWithStarForOneComponent) {
  EXPECT_TRUE(TpPlan::matches("layers.*.self_attn.q_proj", "model.layers.12.self_attn.q_proj"));
  EXPECT_TRUE(
      TpPlan::matches("model.layers.*.self_attn.q_proj", "model.layers.3.self_attn.q_proj"));
  EXPECT_TRUE(TpPlan::matches("lm_head", "lm_head"));
  EXPECT_FALSE(TpPlan::matches("layers.*.self_attn.q_proj", "model.layers.1.self_attn.q_norm"));
  EXPECT_FALSE(TpPlan::matches("layers.*", "model.layers.1.self_attn.q_proj"));  // one component
  EXPECT_FALSE(TpPlan::matches("layers.1.self_attn.q_proj", "model.layers.11.self_attn.q_proj"));
  EXPECT_EQ(TpPlan::key_form("model.layers.11.mlp.up_proj"), "layers.*.mlp.up_proj");
}

TEST(TpPlan, DefaultsApplyAndAliasesParse) {
  TpPlan plan(kDefaults, {}, kModules);
  EXPECT_EQ(plan.style_of("model.layers.1.self_attn.q_proj"), TpStyle::kColwise);
  EXPECT_EQ(plan.style_of("model.layers.0.mlp.down_proj"), TpStyle::kRowwise);
  EXPECT_EQ(plan.style_of("lm_head"), TpStyle::kColwiseGatherOutput);  // colwise_rep
  EXPECT_EQ(plan.style_of("model.norm"), TpStyle::kReplicate);         // no rule
  EXPECT_EQ(parse_style("rowwise_rep"), TpStyle::kRowwiseSplitInput);
  EXPECT_EQ(parse_style("local"), TpStyle::kReplicate);
  EXPECT_FALSE(parse_style("colwize").has_value());
}

TEST(TpPlan, UserRulesOverrideMatchingEntriesAndKeepTheRest) {
  TpPlan plan(kDefaults,
              {{"layers.*.self_attn.k_proj", "replicate"},  // same key: replaces the default
               {"layers.1.self_attn.q_proj", "replicate"},  // narrower key: wins for layer 1
               {"lm_head", "rowwise_split_input"}},
              kModules);
  EXPECT_EQ(plan.style_of("model.layers.0.self_attn.k_proj"), TpStyle::kReplicate);
  EXPECT_EQ(plan.style_of("model.layers.1.self_attn.q_proj"), TpStyle::kReplicate);
  EXPECT_EQ(plan.style_of("model.layers.0.self_attn.q_proj"), TpStyle::kColwise);
  EXPECT_EQ(plan.style_of("model.layers.1.mlp.down_proj"), TpStyle::kRowwise);  // kept
  EXPECT_EQ(plan.style_of("lm_head"), TpStyle::kRowwiseSplitInput);
  EXPECT_EQ(plan.rule_of("model.layers.1.self_attn.q_proj"), "layers.1.self_attn.q_proj");
  // Exact user rules beat wildcard user rules, whatever the map order.
  TpPlan p2(kDefaults,
            {{"layers.*.mlp.down_proj", "replicate"}, {"layers.0.mlp.down_proj", "rowwise"}},
            kModules);
  EXPECT_EQ(p2.style_of("model.layers.0.mlp.down_proj"), TpStyle::kRowwise);
  EXPECT_EQ(p2.style_of("model.layers.1.mlp.down_proj"), TpStyle::kReplicate);
}

TEST(TpPlan, UnknownKeyListsTheValidKeys) {
  try {
    TpPlan plan(kDefaults, {{"layers.*.self_attn.qproj", "colwise"}}, kModules);
    FAIL() << "accepted a key that names no module";
  } catch (const InvalidArgumentError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'layers.*.self_attn.qproj'"), std::string::npos) << m;
    EXPECT_NE(m.find("layers.*.self_attn.q_proj"), std::string::npos) << m;
    EXPECT_NE(m.find("lm_head"), std::string::npos) << m;
    EXPECT_NE(m.find("embed_tokens"), std::string::npos) << m;
  }
}

TEST(TpPlan, UnknownStyleListsTheValidStyles) {
  try {
    TpPlan plan(kDefaults, {{"lm_head", "colwise_gather"}}, kModules);
    FAIL() << "accepted an unknown style";
  } catch (const InvalidArgumentError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'colwise_gather'"), std::string::npos) << m;
    for (const char* s :
         {"colwise", "rowwise", "colwise_gather_output", "rowwise_split_input", "embedding_rowwise",
          "packed_colwise", "replicated_with_grad_allreduce", "replicate"})
      EXPECT_NE(m.find(s), std::string::npos) << s << " missing from: " << m;
  }
}

// torch.chunk(torch.arange(n), size): the independent reference, run through PyTorch from the
// reference group of .venv/ (scripts/setup.sh --dev); skipped where only the test group is there.
TEST(TpPlan, ChunkRangesMatchTorchChunk) {
  const std::vector<std::pair<int, int>> cases = {{8, 2}, {5, 4},   {7, 3},     {10, 4},
                                                  {3, 4}, {128, 3}, {151936, 3}};
  std::string script = "import torch\nfor n, p in " + [&] {
    std::string s = "[";
    for (auto [n, p] : cases) s += "(" + std::to_string(n) + "," + std::to_string(p) + "),";
    return s + "]";
  }() + ":\n  print(' '.join(str(c.numel()) for c in torch.chunk(torch.arange(n), p)))\n";
  std::string cmd = TFORMERS_SOURCE_DIR "/.venv/bin/python -c \"" + script + "\" 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, f)) out += buf;
  if (pclose(f) != 0 || out.empty())
    GTEST_SKIP() << "PyTorch not in .venv/ (scripts/setup.sh --dev)";
  std::istringstream lines(out);
  for (auto [n, p] : cases) {
    std::string line;
    ASSERT_TRUE(std::getline(lines, line));
    std::istringstream in(line);
    std::vector<int64_t> torch_sizes;
    for (int64_t v; in >> v;) torch_sizes.push_back(v);
    std::vector<int64_t> ours;
    for (int r = 0; r < p; ++r) {
      auto [b, e] = chunk_range(n, r, p);
      ours.push_back(e - b);
      EXPECT_LE(e - b, padded_chunk(n, p));
    }
    // torch.chunk may return fewer chunks; those ranks hold nothing.
    while (torch_sizes.size() < ours.size()) torch_sizes.push_back(0);
    EXPECT_EQ(ours, torch_sizes) << "n=" << n << " p=" << p;
    int64_t next = 0;
    for (int r = 0; r < p; ++r) {
      auto [b, e] = chunk_range(n, r, p);
      EXPECT_EQ(b, std::min<int64_t>(next, n));
      next = e;
    }
    EXPECT_EQ(next, n);
  }
}

TEST(TpPlan, ShardShapesFollowTheStyle) {
  // colwise: rows; rowwise: columns; a rowwise bias stays whole; colwise bias is split. Every
  // rank's shape is the padded chunk, whatever data it holds.
  WeightShard c = shard_for(TpStyle::kColwise, {10, 6}, 3, 4);  // data 3,3,3,1
  EXPECT_EQ(c.local_shape, Shape({3, 6}));
  EXPECT_EQ(c.chunk, 3);
  EXPECT_EQ(c.ranges, (std::vector<std::pair<int64_t, int64_t>>{{9, 10}}));
  WeightShard r = shard_for(TpStyle::kRowwise, {10, 6}, 1, 4);  // data 2,2,2,0
  EXPECT_EQ(r.dim, 1);
  EXPECT_EQ(r.local_shape, Shape({10, 2}));
  EXPECT_EQ(shard_for(TpStyle::kRowwise, {10}, 1, 4).local_shape, Shape({10}));
  EXPECT_EQ(shard_for(TpStyle::kColwise, {10}, 0, 4).local_shape, Shape({3}));
  EXPECT_EQ(shard_for(TpStyle::kReplicate, {10, 6}, 1, 4).local_shape, Shape({10, 6}));
  // packed_colwise: [gate; up] with 2 x 6 rows over 2 ranks: rank 1 holds gate 3..5, up 9..11.
  WeightShard p = shard_for(TpStyle::kPackedColwise, {12, 4}, 1, 2);
  EXPECT_EQ(p.ranges, (std::vector<std::pair<int64_t, int64_t>>{{3, 6}, {9, 12}}));
  EXPECT_EQ(p.local_shape, Shape({6, 4}));
  // 2 x 5 rows over 2 ranks: pieces of 3 per half, rank 1's padded with a zero row each.
  WeightShard q = shard_for(TpStyle::kPackedColwise, {10, 4}, 1, 2);
  EXPECT_EQ(q.ranges, (std::vector<std::pair<int64_t, int64_t>>{{3, 5}, {8, 10}}));
  EXPECT_EQ(q.local_shape, Shape({6, 4}));
  EXPECT_THROW(shard_for(TpStyle::kPackedColwise, {7, 4}, 0, 2), InvalidArgumentError);
}

std::string model_dir(const std::string& name) {
  return std::string(TFORMERS_TEST_DATA) + "/models/" + name;
}

// A one-rank tensor-parallel model runs every collective node (through the one-process group)
// and must equal the whole model.
TEST(TpPlan, OneRankSplitModelEqualsTheWholeModel) {
  for (const char* name : {"tiny-qwen3", "tiny-llama-sharded"}) {
    CausalLM whole = AutoModelForCausalLM::from_pretrained(model_dir(name),
                                                           {.dtype = float32, .device_map = "cpu"});
    CausalLM split = AutoModelForCausalLM::from_pretrained(
        model_dir(name), {.dtype = float32,
                          .device_map = "cpu",
                          .distributed_config = DistributedConfig{.tp_size = 1}});
    std::vector<int32_t> ids = {5, 17, 200, 33, 411, 7};
    auto a = whole.generate({ids}, {.max_new_tokens = 8});
    auto b = split.generate({ids}, {.max_new_tokens = 8});
    EXPECT_EQ(a, b) << name;
  }
}

TEST(TpPlan, IncompatibleStylesAreRejectedAtLoadNamingTheRule) {
  auto load = [](std::map<std::string, std::string> plan) {
    return AutoModelForCausalLM::from_pretrained(
        model_dir("tiny-qwen3"),
        {.dtype = float32,
         .device_map = "cpu",
         .distributed_config = DistributedConfig{.tp_size = 1, .tp_plan = plan}});
  };
  auto expect_error = [&](std::map<std::string, std::string> plan, const std::string& needle) {
    try {
      load(plan);
      ADD_FAILURE() << "accepted a plan that cannot run; expected: " << needle;
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({{"layers.*.mlp.down_proj", "colwise"}}, "layers.*.mlp.down_proj");
  expect_error({{"layers.*.self_attn.k_proj", "replicate"}}, "must all split their heads");
  expect_error({{"norm", "colwise"}}, "model.norm.weight");
  expect_error({{"layers.*.mlp.up_proj", "packed_colwise"}}, "unfused");
  expect_error({{"embed_tokens", "rowwise"}}, "embedding");
  expect_error({{"lm_head", "colwise"}}, "lm_head");
  expect_error({{"layers.*.self_attn.qproj", "colwise"}}, "valid keys");
  EXPECT_THROW(AutoModelForCausalLM::from_pretrained(
                   model_dir("tiny-qwen3"),
                   {.device_map = "cpu", .distributed_config = DistributedConfig{.tp_size = 2}}),
               InvalidArgumentError);  // two ranks wanted, one process running
}

}  // namespace
}  // namespace tformers::distributed
