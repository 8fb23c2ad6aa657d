// Generation on XLA's CPU plugin through device_map="xla-cpu" (or the PJRT device of
// TFORMERS_PJRT_TEST_DEVICE, test_device.h): every tiny architecture against
// Transformers' goldens and against the CPU backend (greedy tokens identical in float32, logits
// within bf16's tolerance in bfloat16), int4 checkpoints and weights quantized at load, the paged
// cache and the serving engine, beam search, seeded sampling, the bytes one step moves, compiles
// made once per shape, and the command line.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "../io/io_test_util.h"
#include "../models/golden_util.h"
#include "backends/compile_cache.h"
#include "backends/pjrt/plugin_discovery.h"
#include "common/missing_dependency.h"
#include "core/cpu_features.h"
#include "io/json.h"
#include "models/model_runner.h"
#include "test_device.h"
#include "tformers/generation.h"
#include "tformers/model.h"
#include "tformers/serving.h"

namespace tformers {
namespace {

using testing::load_goldens;
using testing::model_dir;
using testing::prefill_logits;
using testing::row_error;

// "xla-cpu" unless TFORMERS_PJRT_TEST_DEVICE says otherwise (test_device.h).
const std::string& device() { return tformers::testing::pjrt_test_device(); }

#define SKIP_WITHOUT_PLUGIN()                                         \
  do {                                                                \
    const std::string why = tformers::testing::missing_pjrt_plugin(); \
    if (!why.empty()) TF_SKIP_MISSING_DEPENDENCY(why);                \
  } while (0)

CausalLM load(const std::string& name, DType dtype, const std::string& device) {
  return AutoModelForCausalLM::from_pretrained(model_dir(name),
                                               {.dtype = dtype, .device_map = device});
}

GenerationConfig greedy(int64_t n) {
  GenerationConfig gc{.max_new_tokens = n, .pad_token_id = 0};
  gc.eos_token_id = std::vector<int64_t>{};  // every row runs to the end
  return gc;
}

// Two prompts of different lengths: one generate() call left-pads and masks the shorter one.
const std::vector<std::vector<int32_t>> kPrompts = {{5, 77, 300},
                                                    {1, 17, 300, 45, 9, 401, 23, 150, 8}};

// Two bf16 computations with different rounding points, as tests/models/test_golden.cc bounds
// the CPU backend's float32 math against PyTorch's bf16 (max |a - b| / max |b| per row).
constexpr double kBf16Tolerance = 5e-2;
// The same for f16, whose 11 significant bits are bf16's 8 plus 3: over 8.
constexpr double kF16Tolerance = kBf16Tolerance / 8;

class XlaCpuModel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { SKIP_WITHOUT_PLUGIN(); }
};

// A model's float32 logits within 1e-4 of Transformers' and its greedy tokens equal to them and to
// the CPU backend's.
void expect_float32_matches(const std::string& name) {
  CausalLM xla = load(name, float32, device()), cpu = load(name, float32, "cpu");
  EXPECT_EQ(xla.device(), device());
  const int64_t V = xla.config().vocab_size;
  for (const auto& c : load_goldens(name, "float32")) {
    const Tensor logits = prefill_logits(xla, c.input_ids);
    ASSERT_EQ(logits.numel(), int64_t(c.logits.size()) * V);
    for (size_t t = 0; t < c.logits.size(); ++t)
      EXPECT_LT(row_error(logits.data<float>() + t * V, c.logits[t]), 1e-4)
          << name << " prompt of " << c.input_ids.size() << " tokens, position " << t;
    const auto out = xla.generate({c.input_ids}, greedy(int64_t(c.greedy.size())));
    EXPECT_EQ(std::vector<int32_t>(out[0].begin() + c.input_ids.size(), out[0].end()), c.greedy)
        << name << " prompt of " << c.input_ids.size() << " tokens";
  }
  EXPECT_EQ(xla.generate(kPrompts, greedy(12)), cpu.generate(kPrompts, greedy(12))) << name;
}

TEST_P(XlaCpuModel, Float32MatchesTransformersAndTheCpuBackend) {
  expect_float32_matches(GetParam());
}

// A bfloat16 model's graphs compute in bfloat16 on XLA, as PyTorch computes the model: within
// bf16's tolerance of Transformers' bfloat16 goldens and of the CPU backend (bf16 weights with
// float32 math), and not equal to the latter, since every activation is rounded to bf16.
TEST_P(XlaCpuModel, Bfloat16ComputesInBfloat16WithinToleranceOfTransformersAndTheCpuBackend) {
  const std::string name = GetParam();
  CausalLM xla = load(name, bfloat16, device()), cpu = load(name, bfloat16, "cpu");
  const int64_t V = xla.config().vocab_size;
  double from_cpu = 0;
  for (const auto& c : load_goldens(name, "bfloat16")) {
    const Tensor got = prefill_logits(xla, c.input_ids), want = prefill_logits(cpu, c.input_ids);
    for (size_t t = 0; t < c.logits.size(); ++t) {
      const float* row = got.data<float>() + t * V;
      EXPECT_LT(row_error(row, c.logits[t]), kBf16Tolerance) << name << " position " << t;
      const std::vector<float> cpu_row(want.data<float>() + t * V,
                                       want.data<float>() + (t + 1) * V);
      const double e = row_error(row, cpu_row);
      EXPECT_LT(e, kBf16Tolerance) << name << " position " << t;
      from_cpu = std::max(from_cpu, e);
    }
  }
  EXPECT_GT(from_cpu, 1e-3) << name << ": as close to the float32 math as float32 is";
}

// A float16 model's graphs compute in float16 on XLA: within f16's tolerance of the exact
// (float32) model, Transformers' float32 goldens, and of the CPU backend's float16 (f16 weights,
// float32 math), and not equal to the latter.
TEST_P(XlaCpuModel, Float16ComputesInFloat16NearFloat32AndTheCpuBackend) {
  const std::string name = GetParam();
  CausalLM xla = load(name, float16, device()), cpu = load(name, float16, "cpu");
  EXPECT_EQ(xla.dtype(), float16);
  const int64_t V = xla.config().vocab_size;
  double from_cpu = 0;
  for (const auto& c : load_goldens(name, "float32")) {
    const Tensor got = prefill_logits(xla, c.input_ids), want = prefill_logits(cpu, c.input_ids);
    for (size_t t = 0; t < c.logits.size(); ++t) {
      const float* row = got.data<float>() + t * V;
      EXPECT_LT(row_error(row, c.logits[t]), kF16Tolerance) << name << " position " << t;
      const std::vector<float> cpu_row(want.data<float>() + t * V,
                                       want.data<float>() + (t + 1) * V);
      const double e = row_error(row, cpu_row);
      EXPECT_LT(e, kF16Tolerance) << name << " position " << t;
      from_cpu = std::max(from_cpu, e);
    }
  }
  EXPECT_GT(from_cpu, 1e-4) << name << ": as close to the float32 math as float32 is";
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

// Every architecture of tests/data, single and sharded checkpoint files.
INSTANTIATE_TEST_SUITE_P(TinyModels, XlaCpuModel,
                         ::testing::Values("tiny-qwen3", "tiny-qwen3-sharded", "tiny-qwen2",
                                           "tiny-llama", "tiny-llama-sharded", "tiny-mistral",
                                           "tiny-glm4", "tiny-glm", "tiny-gemma3",
                                           "tiny-llama-longrope"),
                         param_name);
// Mixtures of experts that Transformers 5 built and saved with their per-expert tensor names. In
// bfloat16 a router's near-tie may round to another expert than PyTorch's does (a discrete
// choice, tests/models/test_golden.cc), so only their float32 computation is compared.
class XlaCpuRoutedModel : public XlaCpuModel {};
TEST_P(XlaCpuRoutedModel, Float32MatchesTransformersAndTheCpuBackend) {
  expect_float32_matches(GetParam());
}
INSTANTIATE_TEST_SUITE_P(HfModels, XlaCpuRoutedModel,
                         ::testing::Values("hf-qwen3-moe", "hf-mixtral", "hf-glm4-moe",
                                           "hf-gpt-oss", "hf-gpt-oss-mxfp4", "hf-qwen3-next",
                                           "hf-qwen3-5", "hf-qwen3-5-moe", "hf-qwen3-5-vl",
                                           "hf-gemma4", "hf-gemma4-moe", "hf-gemma4-vl"),
                         param_name);

// AWQ and GPTQ checkpoints: XLA multiplies the dequantized f32 weights, so the goldens computed
// from those weights hold to float32's 1e-4 at every prompt length, greedy tokens included.
class XlaCpuImported : public XlaCpuModel {};

TEST_P(XlaCpuImported, Int4CheckpointsMatchTheirDequantizedGoldens) {
  const std::string name = GetParam();
  CausalLM lm = load(name, float32, device());
  const int64_t V = lm.config().vocab_size;
  for (const auto& c : load_goldens(name, "float32")) {
    const Tensor logits = prefill_logits(lm, c.input_ids);
    for (size_t t = 0; t < c.logits.size(); ++t)
      EXPECT_LT(row_error(logits.data<float>() + t * V, c.logits[t]), 1e-4)
          << name << " prompt of " << c.input_ids.size() << " tokens, position " << t;
    const auto out = lm.generate({c.input_ids}, greedy(int64_t(c.greedy.size())));
    EXPECT_EQ(std::vector<int32_t>(out[0].begin() + c.input_ids.size(), out[0].end()), c.greedy)
        << name << " prompt of " << c.input_ids.size() << " tokens";
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, XlaCpuImported,
                         ::testing::Values("tiny-llama-awq", "tiny-qwen3-gptq"), param_name);

class XlaCpuGenerate : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_PLUGIN(); }
};

TEST_F(XlaCpuGenerate, SeededSamplingIsReproducibleAndDrawsWhatTheCpuBackendDraws) {
  CausalLM lm = load("tiny-qwen3", float32, device());
  GenerationConfig gc{
      .max_new_tokens = 16, .do_sample = true, .temperature = 1.5, .top_k = 0, .pad_token_id = 0};
  gc.eos_token_id = std::vector<int64_t>{};
  gc.seed = 1234;
  const auto a = lm.generate(kPrompts, gc);
  EXPECT_EQ(lm.generate(kPrompts, gc), a);
  // Sampling runs on the host from the logits, which agree with the CPU backend's to ~1e-6.
  EXPECT_EQ(load("tiny-qwen3", float32, "cpu").generate(kPrompts, gc), a);
  gc.seed = 99;
  EXPECT_NE(lm.generate(kPrompts, gc), a);
}

struct Moved {
  uint64_t up = 0, down = 0;
};
template <class F>
Moved moved(const CausalLM& lm, F f) {
  const uint64_t up = lm.host_to_device_bytes(), down = lm.device_to_host_bytes();
  f();
  return {lm.host_to_device_bytes() - up, lm.device_to_host_bytes() - down};
}

TEST_F(XlaCpuGenerate, ADecodeStepMovesIdsPositionsAndSlotInAndLogitsOut) {
  CausalLM lm = load("tiny-qwen3", float32, device());
  models::ModelRunner m(lm);
  const int64_t B = 3, S = 32, V = m.vocab_size();
  m.reset_cache(B, S);
  Tensor mask = Tensor::zeros({B, S}, DType::i32);
  std::fill_n(mask.data<int32_t>(), mask.numel(), 1);
  // The key mask goes up once, at set_attention_mask, not at each step.
  EXPECT_EQ(moved(lm, [&] { m.set_attention_mask(mask); }).up, uint64_t(4 * B * S));
  Tensor ids = Tensor::zeros({B, 1}, DType::i32), pos = Tensor::zeros({B, 1}, DType::i32);
  Tensor logits = Tensor::zeros({B, 1, V}, DType::f32);
  models::ModelRunner::Step& step = m.prepare_static(1, 1);
  for (int64_t slot = 0; slot < 4; ++slot) {
    const backends::TransferStats before = m.transfer_stats();
    const Moved d = moved(lm, [&] { m.run_static(step, ids, pos, slot, logits); });
    // ids and positions (B int32 each) and the cache slot (one int32) up; B x V f32 down. The
    // KV cache, donated to each run and handed back, never crosses.
    EXPECT_EQ(d.up, uint64_t(4 * (B + B + 1))) << "slot " << slot;
    EXPECT_EQ(d.down, uint64_t(4 * B * V)) << "slot " << slot;
    // One execution, whose time bench_host_overhead subtracts from the step's.
    const backends::TransferStats after = m.transfer_stats();
    EXPECT_EQ(after.executions - before.executions, 1u) << "slot " << slot;
    EXPECT_GT(after.execute_ns, before.execute_ns) << "slot " << slot;
  }
}

TEST_F(XlaCpuGenerate, OnlyWhatForwardConsumesCrossesPerGeneratedToken) {
  CausalLM lm = load("tiny-llama", float32, device());
  const int64_t V = lm.config().vocab_size, B = 2;
  GenerationConfig gc = greedy(10);
  gc.max_cache_len = 64;
  lm.generate(kPrompts, gc);  // compile first
  const uint64_t in0 = lm.host_to_device_bytes(), out0 = lm.device_to_host_bytes();
  gc.max_new_tokens = 11;
  lm.generate(kPrompts, gc);
  const uint64_t in1 = lm.host_to_device_bytes(), out1 = lm.device_to_host_bytes();
  gc.max_new_tokens = 12;
  lm.generate(kPrompts, gc);
  const uint64_t in2 = lm.host_to_device_bytes(), out2 = lm.device_to_host_bytes();
  // One more decode step: ids and positions (B int32 each) and the slot (one int32) in, the
  // last position's logits (B x V f32) out.
  EXPECT_EQ((in2 - in1) - (in1 - in0), uint64_t(4 * (B + B + 1)));
  EXPECT_EQ((out2 - out1) - (out1 - out0), uint64_t(4 * B * V));
}

// Weights quantized at load: the CPU backend's scalar target, the reference its SIMD kernels are
// tested against, multiplies the same dequantized weights by exact f32 activations, as XLA does.
TEST_F(XlaCpuGenerate, QuantizedAtLoadMatchesTheCpuScalarReference) {
  const cpu::Target saved = cpu::active_target();
  cpu::set_active_target(cpu::Target::kScalar);
  for (const std::string q : {"int8", "int4"}) {
    const LoadOptions opt{.dtype = float32, .quantize = q};
    LoadOptions on_xla = opt, on_cpu = opt;
    on_xla.device_map = device();
    on_cpu.device_map = "cpu";
    CausalLM xla = AutoModelForCausalLM::from_pretrained(model_dir("tiny-qwen3"), on_xla);
    CausalLM cpu = AutoModelForCausalLM::from_pretrained(model_dir("tiny-qwen3"), on_cpu);
    const std::vector<int32_t> prompt = kPrompts[1];
    const Tensor got = prefill_logits(xla, prompt), want = prefill_logits(cpu, prompt);
    const int64_t V = xla.config().vocab_size;
    for (size_t t = 0; t < prompt.size(); ++t)
      EXPECT_LT(row_error(got.data<float>() + t * V,
                          std::vector<float>(want.data<float>() + t * V,
                                             want.data<float>() + (t + 1) * V)),
                1e-4)
          << q << " position " << t;
    EXPECT_EQ(xla.generate(kPrompts, greedy(10)), cpu.generate(kPrompts, greedy(10))) << q;
    // Each backend holds the weights its own way (CPU: int4 tiles; XLA: rows), and both save
    // tformers' stored layouts, the same bytes; the stored checkpoint loads on XLA as the weights
    // quantized there at load.
    io::testing::TempDir dir;
    cpu.save_pretrained(dir.file("cpu"));
    xla.save_pretrained(dir.file("xla"));
    EXPECT_EQ(io::testing::read_bytes(dir.file("cpu/model.safetensors")),
              io::testing::read_bytes(dir.file("xla/model.safetensors")))
        << q;
    LoadOptions stored{.dtype = float32};
    stored.device_map = device();
    CausalLM loaded = AutoModelForCausalLM::from_pretrained(dir.file("cpu"), stored);
    const Tensor again = prefill_logits(loaded, prompt);
    EXPECT_EQ(std::memcmp(again.raw(), got.raw(), got.nbytes()), 0) << q;
  }
  cpu::set_active_target(saved);
}

// The paged cache of the serving engine: a step's transfers, and a ragged step mixing a decode
// and a prefill row against each sequence alone and against the CPU backend.
TEST_F(XlaCpuGenerate, PagedStepsMoveOnlyTablesAndMatchTheCpuBackend) {
  CausalLM xla = load("tiny-qwen3", float32, device()), cpu = load("tiny-qwen3", float32, "cpu");
  models::ModelRunner mx(xla), mc(cpu);
  const int64_t V = mx.vocab_size(), rows = 4, table = 4;
  const std::vector<int32_t> a = {5, 77, 300, 2, 41, 7}, b = {9, 8, 123};
  const std::vector<int32_t> a_blocks = {0, 1}, b_blocks = {2};
  const std::vector<int32_t> a_head(a.begin(), a.end() - 1);
  const models::SequenceChunk head{.tokens = a_head, .position = 0, .blocks = a_blocks};
  const models::SequenceChunk mixed[] = {
      {.tokens = std::span(a).last(1), .position = int64_t(a.size()) - 1, .blocks = a_blocks},
      {.tokens = b, .position = 0, .blocks = b_blocks}};
  auto run = [&](models::ModelRunner& m) {
    m.allocate_pool(16, 4, table);
    Tensor one = Tensor::zeros({1, 1, V}, DType::f32),
           logits = Tensor::zeros({rows, 1, V}, DType::f32);
    m.run_paged(m.prepare_paged(1, 8), {&head, 1}, one);
    m.run_paged(m.prepare_paged(rows, 4), mixed, logits);
    return logits;
  };
  const Tensor got = run(mx), want = run(mc);
  for (int64_t r = 0; r < 2; ++r)
    EXPECT_LT(
        row_error(got.data<float>() + r * V,
                  std::vector<float>(want.data<float>() + r * V, want.data<float>() + (r + 1) * V)),
        1e-4)
        << "row " << r;
  // The lowering gathers a sequence's blocks per row: no packed steps, which the CPU runs.
  EXPECT_FALSE(mx.packs_sequences());
  EXPECT_TRUE(mc.packs_sequences());
  // A decode step of two sequences and two padding rows: ids and positions (rows int32 each) and
  // the tables (rows x table int32) up, each row's logits down; the pools never cross.
  models::ModelRunner::Step& step = mx.prepare_paged(rows, 1);
  Tensor logits = Tensor::zeros({rows, 1, V}, DType::f32);
  const Moved d = moved(xla, [&] { mx.run_paged(step, std::span(mixed).first(1), logits); });
  EXPECT_EQ(d.up, uint64_t(4 * (rows + rows + rows * table)));
  EXPECT_EQ(d.down, uint64_t(4 * rows * V));
}

TEST_F(XlaCpuGenerate, BeamSearchKeepsTheCpuBackendsBeams) {
  CausalLM xla = load("tiny-llama", float32, device()), cpu = load("tiny-llama", float32, "cpu");
  GenerationConfig gc = greedy(8);
  gc.num_beams = 4;
  EXPECT_EQ(xla.generate({kPrompts[1]}, gc), cpu.generate({kPrompts[1]}, gc));
}

// The serving engine's paged steps: requests decoded together give each the tokens generate()
// gives it alone on the CPU backend, and after warm_up() nothing compiles.
void expect_serving_gives_generate_tokens(const std::string& name) {
  CausalLM xla = load(name, float32, device()), cpu = load(name, float32, "cpu");
  ServingEngine engine(xla, {.max_num_seqs = 4, .max_model_len = 64});
  engine.warm_up();
  engine.start();
  struct Result {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int32_t> tokens;
    std::string reason;
  };
  const std::vector<std::vector<int32_t>> prompts = {kPrompts[0], kPrompts[1], {499, 3}};
  std::vector<Result> results(prompts.size());
  for (size_t r = 0; r < prompts.size(); ++r)
    engine.submit({.prompt = prompts[r], .config = greedy(int64_t(6 + 2 * r))},
                  [&res = results[r]](const ServingEvent& e) {
                    std::lock_guard<std::mutex> lock(res.mu);
                    if (e.token >= 0) res.tokens.push_back(e.token);
                    if (!e.finish_reason.empty()) {
                      res.reason = e.finish_reason;
                      res.cv.notify_all();
                    }
                  });
  for (size_t r = 0; r < prompts.size(); ++r) {
    Result& res = results[r];
    std::unique_lock<std::mutex> lock(res.mu);
    res.cv.wait_for(lock, std::chrono::seconds(120), [&] { return !res.reason.empty(); });
    ASSERT_EQ(res.reason, "length") << "request " << r;
    const auto alone = cpu.generate({prompts[r]}, greedy(int64_t(6 + 2 * r)));
    EXPECT_EQ(res.tokens,
              std::vector<int32_t>(alone[0].begin() + prompts[r].size(), alone[0].end()))
        << "request " << r;
  }
  EXPECT_EQ(engine.stats().compiles_since_ready, 0u);
  engine.shutdown(std::chrono::milliseconds(0));
}

// A transformer, and a hybrid whose linear-attention layers keep their recurrent states in slots
// of the pools (the paged forms of the Gated DeltaNet ops).
TEST_F(XlaCpuGenerate, TheServingEngineGivesGenerateTokens) {
  for (const char* name : {"tiny-qwen3", "hf-qwen3-5"}) {
    SCOPED_TRACE(name);
    expect_serving_gives_generate_tokens(name);
  }
}

// Assisted generation on the device (both models there, the assistant's steps compiled per catch-up
// length) and prompt lookup: greedy search's tokens, with some proposals kept.
TEST_F(XlaCpuGenerate, ProposalsCheckedOnTheDeviceKeepGreedyTokens) {
  CausalLM lm = load("hf-llama", float32, device()), twin = load("hf-llama", float32, device());
  const std::vector<int32_t> prompt = {1, 93, 211, 7, 93, 211};
  const GenerationConfig plain = greedy(12);
  const GenerateOutput want = generate(lm, {prompt}, plain);
  GenerationConfig assisted = plain;
  assisted.num_assistant_tokens = 3;
  assisted.assistant_confidence_threshold = 0.0;
  const GenerateOutput got = generate(lm, {prompt}, assisted, {}, nullptr, {}, nullptr, &twin);
  EXPECT_EQ(got.sequences, want.sequences);
  EXPECT_GT(got.accepted_draft_tokens, 0);
  GenerationConfig lookup = plain;
  lookup.prompt_lookup_num_tokens = 3;
  EXPECT_EQ(generate(lm, {prompt}, lookup).sequences, want.sequences);
}

TEST_F(XlaCpuGenerate, TheSameShapesCompileOnce) {
  backends::CompileCache::global().clear();
  CausalLM lm = load("tiny-qwen3", float32, device());
  const auto first = lm.generate(kPrompts, greedy(6));
  // A prefill bucket and the decode step.
  EXPECT_EQ(lm.compile_stats().compiles, 2u);
  const uint64_t global = compile_stats().compiles;
  EXPECT_EQ(lm.generate(kPrompts, greedy(6)), first);
  EXPECT_EQ(lm.compile_stats().compiles, 2u);
  // A second model of the same shapes finds both steps in the compile cache.
  CausalLM again = load("tiny-qwen3", float32, device());
  EXPECT_EQ(again.generate(kPrompts, greedy(6)), first);
  EXPECT_EQ(again.compile_stats().compiles, 0u);
  EXPECT_EQ(again.compile_stats().hits, 2u);
  EXPECT_EQ(compile_stats().compiles, global);
}

// What `tformers ARGS` prints on stdout and stderr; a non-zero exit fails the test.
std::string cli(const std::string& args) {
  std::string out;
  FILE* p = ::popen((std::string(TFORMERS_CLI) + " " + args + " 2>&1").c_str(), "r");
  EXPECT_NE(p, nullptr);
  if (!p) return out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << out;
  return out;
}

TEST_F(XlaCpuGenerate, TheCommandLineGeneratesOnXlaCpu) {
  auto run = [](const std::string& device) {
    return cli("generate -m " + model_dir("tiny-qwen3") + " --prompt-ids 5,77,300 -n 8 --device " +
               device + " --json");
  };
  const std::string xla = run(device()), cpu = run("cpu");
  // The ids are the same; the timings in the JSON differ.
  auto ids = [](const std::string& json) {
    const size_t at = json.find("\"ids\"");
    return at == std::string::npos ? std::string() : json.substr(at, json.find(']', at) - at);
  };
  ASSERT_FALSE(ids(cpu).empty()) << cpu;
  EXPECT_EQ(ids(xla), ids(cpu)) << xla;
  // `env` says the plugin runs graphs.
  const std::string env = cli("env");
  EXPECT_NE(env.find("; device_map=\"" + device() + "\" runs on it"), std::string::npos) << env;
}

// `tformers bench --device xla-cpu`: the steps run on the plugin, and the roofline is the
// device's own memory bandwidth (PjrtBackendTest.ReadBandwidthIsMeasuredInDeviceMemory).
TEST_F(XlaCpuGenerate, TheBenchCommandJudgesDecodeAgainstTheDeviceRoofline) {
  const std::string out = cli("bench -m " + model_dir("tiny-qwen3") +
                              " -p 8 -n 4 -t 1 -r 1 -o json --device " + device());
  // stderr, which may say how the load went, comes first.
  const size_t json = out.find("[\n  {");
  ASSERT_NE(json, std::string::npos) << out;
  const io::Json rows = io::Json::parse(out.substr(json));
  ASSERT_EQ(rows.size(), 2u) << rows.dump(2);
  for (const io::Json& r : rows) EXPECT_EQ(r["device"], device());
  const io::Json& tg = rows[1];
  EXPECT_EQ(tg["test"], "tg4");
  const double gbs = tg["read_gbs"].get<double>(), roof = tg["roofline_tok_s"].get<double>();
  EXPECT_GT(gbs, 0);
  EXPECT_NEAR(roof, gbs * 1e9 / tg["weight_bytes_per_token"].get<double>(), 1e-9 * roof);
  EXPECT_GT(tg["avg_tok_s"].get<double>(), 0);
}

}  // namespace
}  // namespace tformers
