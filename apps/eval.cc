#include "eval.h"

#include <cstdio>

#include <unistd.h>

#include "core/progress.h"
#include "tformers/distributed.h"

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
  return AutoModelForCausalLM::from_pretrained(flags.model, opt);
}

}  // namespace tformers::cli
