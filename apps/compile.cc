// Each prefill bucket that fits the cache and the decode step are prepared through the step API
// on a TopologyBackend, exactly as generate() would prepare them on a TPU, so what is compiled
// here is what a TPU host would compile: the same graphs, lowered the same way.
#include "compile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "backends/pjrt/pjrt_api.h"
#include "backends/pjrt/topology_backend.h"
#include "backends/registry.h"
#include "eval.h"
#include "models/model_runner.h"
#include "tformers/error.h"

namespace tformers::cli {

namespace {

struct StepRow {
  std::string step;  // "prefill" or "decode"
  int64_t tokens;
  const backends::TopologyCompile* compiled;
};

double mib(int64_t bytes) { return double(bytes) / (1 << 20); }

double cost(const backends::pjrt::CompiledProgram& p, const std::string& name) {
  for (const auto& [key, value] : p.cost)
    if (key == name) return value;
  return 0;
}

}  // namespace

int run_compile(const CompileArgs& a) {
  if (a.device != "tpu")
    throw UsageError("--device " + a.device +
                     ": only tpu compiles for a topology without the device (libtpu); on "
                     "xla-cpu and cuda, run the model (tformers generate --device " +
                     a.device + ")");
  try {
    backends::pjrt::check_topology_name(a.topology);  // before loading the model, or libtpu
  } catch (const InvalidArgumentError& e) {
    throw UsageError(std::string("--topology: ") + e.what());
  }
  const std::string device_map = "tpu-topology:" + a.topology;
  ModelFlags flags = a.model;
  flags.load_mode = "mmap";  // the weights are never read: their types are all a compile needs
  const auto t0 = std::chrono::steady_clock::now();
  CausalLM lm = load_with_progress(flags, device_map);
  auto& backend =
      dynamic_cast<backends::TopologyBackend&>(backends::backend_for(device_map, false));
  models::ModelRunner runner(lm);
  const int64_t positions = lm.config().max_position_embeddings;
  const int64_t cache_len =
      a.cache_len.value_or(positions > 0 ? std::min<int64_t>(positions, 4096) : 4096);
  if (positions > 0 && cache_len > positions)
    throw UsageError("--max-cache-len " + std::to_string(cache_len) + " exceeds the model's " +
                     std::to_string(positions) + " positions (max_position_embeddings)");
  runner.reset_cache(a.batch, cache_len);

  std::vector<StepRow> rows;
  auto prepare = [&](const std::string& step, int64_t tokens) {
    const size_t before = backend.compiled().size();
    runner.prepare_static(tokens, 1);
    // A step whose graph was compiled already (a 1-token prefill is the decode step) adds none.
    if (backend.compiled().size() > before) rows.push_back({step, tokens, nullptr});
  };
  for (int64_t bucket : runner.prompt_buckets())
    if (bucket <= cache_len) prepare("prefill", bucket);
  prepare("decode", 1);
  for (size_t i = 0; i < rows.size(); ++i)
    rows[i].compiled = &backend.compiled()[backend.compiled().size() - rows.size() + i];
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const backends::pjrt::Plugin& plugin = backend.topology().plugin();
  const int64_t hbm = backends::pjrt::chip_hbm_bytes(a.topology);
  std::vector<StepPeak> peaks;
  for (const StepRow& r : rows)
    peaks.push_back({r.step, r.tokens, r.compiled->program.memory.peak_bytes});
  const std::string advice = over_hbm_advice(peaks, hbm, a.topology);
  if (a.output == "json") {
    nlohmann::ordered_json out;
    out["topology"] = a.topology;
    out["plugin"] = plugin.path();
    out["pjrt_api"] = std::to_string(plugin.api_major()) + "." + std::to_string(plugin.api_minor());
    out["architecture"] = lm.config().architecture;
    out["dtype"] = std::string(dtype_name(lm.dtype()));
    out["batch"] = a.batch;
    out["cache_len"] = cache_len;
    out["seconds"] = seconds;
    out["hbm_bytes_per_chip"] = hbm;
    for (const StepRow& r : rows) {
      const backends::pjrt::CompiledMemoryStats& m = r.compiled->program.memory;
      nlohmann::ordered_json s{{"step", r.step},
                               {"tokens", r.tokens},
                               {"inputs", r.compiled->inputs},
                               {"argument_bytes", m.argument_bytes},
                               {"output_bytes", m.output_bytes},
                               {"alias_bytes", m.alias_bytes},
                               {"temp_bytes", m.temp_bytes},
                               {"peak_bytes", m.peak_bytes},
                               {"fits", m.peak_bytes <= hbm},
                               {"generated_code_bytes", m.generated_code_bytes}};
      for (const auto& [key, value] : r.compiled->program.cost) s["cost"][key] = value;
      out["steps"].push_back(s);
    }
    std::printf("%s\n", out.dump(2).c_str());
    if (!advice.empty()) std::fprintf(stderr, "tformers: compile: %s\n", advice.c_str());
    return 0;
  }
  std::printf(
      "%s (%s) compiled for TPU topology %s by %s (PJRT C API %d.%d): batch %lld, cache %lld "
      "positions, %zu steps in %.1f s; one chip has %.0f MiB of HBM\n\n",
      lm.config().architecture.c_str(), std::string(dtype_name(lm.dtype())).c_str(),
      a.topology.c_str(), plugin.path().c_str(), plugin.api_major(), plugin.api_minor(),
      static_cast<long long>(a.batch), static_cast<long long>(cache_len), rows.size(), seconds,
      mib(hbm));
  std::printf(
      "| step | tokens | arguments MiB | outputs MiB | donated MiB | temporaries MiB | peak MiB | "
      "fits | code MiB | GFLOP |\n|---|--:|--:|--:|--:|--:|--:|---|--:|--:|\n");
  for (const StepRow& r : rows) {
    const backends::pjrt::CompiledMemoryStats& m = r.compiled->program.memory;
    std::printf("| %s | %lld | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %.2f | %.3f |\n",
                r.step.c_str(), static_cast<long long>(r.tokens), mib(m.argument_bytes),
                mib(m.output_bytes), mib(m.alias_bytes), mib(m.temp_bytes), mib(m.peak_bytes),
                m.peak_bytes <= hbm ? "yes" : "no", mib(m.generated_code_bytes),
                cost(r.compiled->program, "flops") / 1e9);
  }
  std::printf(
      "\narguments: weights, KV cache and step inputs; donated: the KV cache and key mask, "
      "updated in place; fits: the peak within one chip's HBM; GFLOP: libtpu's cost analysis\n");
  if (!advice.empty()) std::printf("\n%s\n", advice.c_str());
  return 0;
}

}  // namespace tformers::cli
