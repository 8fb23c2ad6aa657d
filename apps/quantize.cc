#include "quantize.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "core/progress.h"
#include "interrupt.h"
#include "io/hub.h"
#include "tformers/error.h"
#include "tformers/model.h"

namespace tformers::cli {

namespace fs = std::filesystem;

int run_quantize(const QuantizeArgs& a) {
  if (fs::exists(a.out) && !(fs::is_directory(a.out) && fs::is_empty(a.out)))
    throw InvalidArgumentError("quantize: " + a.out +
                               " exists and is not an empty folder; name a new folder for the "
                               "quantized model");
  const auto start = std::chrono::steady_clock::now();
  const std::string source = io::resolve_model_path(a.model, a.revision);
  // The weights are read once from the mapping, so it need not be copied first.
  LoadOptions opt{
      .device_map = "cpu", .revision = a.revision, .quantize = a.to, .load_mode = "mmap"};
  opt.dtype = parse_dtype_flag(a.dtype);
  ProgressBar bar(stderr, isatty(fileno(stderr)));
  const StopOnCtrlC stop;
  opt.progress = [&](std::string_view stage, int64_t done, int64_t total) {
    stop.throw_if_requested();
    bar.update(stage, done, total);
  };
  // Ctrl-C stops the conversion, before anything is written; once writing has begun it ends
  // the writing first, so the folder is never left half written.
  try {
    CausalLM lm = AutoModelForCausalLM::from_pretrained(source, opt);
    bar.finish();
    stop.throw_if_requested();
    lm.save_pretrained(a.out);
  } catch (const StopOnCtrlC::Stopped&) {
    bar.finish();
    std::fprintf(stderr, "tformers: quantize: stopped (Ctrl-C); nothing was written to %s\n",
                 a.out.c_str());
    return StopOnCtrlC::kExitCode;
  }
  // The rest of the folder (tokenizer, generation_config.json, chat template, README) as is;
  // the source's weights and config.json are what was just rewritten.
  uintmax_t in_bytes = 0;
  for (const auto& e : fs::directory_iterator(source)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file()) continue;
    if (e.path().extension() == ".safetensors" || name == "model.safetensors.index.json") {
      in_bytes += e.file_size();
      continue;
    }
    if (name != "config.json") fs::copy_file(e.path(), fs::path(a.out) / name);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "tformers: wrote %s (%s): %.1f MB of weights from %.1f MB in %.1f s\n",
               a.out.c_str(), a.to.c_str(),
               double(fs::file_size(fs::path(a.out) / "model.safetensors")) / 1e6,
               double(in_bytes) / 1e6, seconds);
  return 0;
}

}  // namespace tformers::cli
