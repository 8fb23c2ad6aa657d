#include "eval.h"

#include <cstdio>

#include <unistd.h>

#include "core/progress.h"
#include "tformers/distributed.h"
#include "tformers/kernels.h"

namespace tformers::cli {

CausalLM load_with_progress(const ModelFlags& flags, const std::string& device_map,
                            std::optional<DistributedConfig> distributed) {
  LoadOptions opt;
  opt.distributed_config = std::move(distributed);
  opt.device_map = device_map;
  opt.revision = flags.revision;
  opt.quantize = flags.quantize;
  opt.load_mode = flags.load_mode;
  opt.dtype = parse_dtype_flag(flags.dtype);
  ProgressBar bar(stderr, isatty(fileno(stderr)) && distributed::is_main_process());
  opt.progress = [&bar](std::string_view stage, int64_t done, int64_t total) {
    bar.update(stage, done, total);
  };
  CausalLM lm = AutoModelForCausalLM::from_pretrained(flags.model, opt);
  if (flags.use_kernels) use_hub_kernels(lm);
  return lm;
}

void use_hub_kernels(CausalLM& lm) {
  for (const KernelizedLayer& k : kernelize(lm, default_kernel_mapping()))
    if (distributed::is_main_process())
      std::fprintf(stderr, "tformers: kernels: %s: %s%s%s\n", k.layer.c_str(),
                   k.kernel.empty() ? "the built-in op" : k.kernel.c_str(),
                   k.note.empty() ? "" : "; ", k.note.c_str());
}

}  // namespace tformers::cli
