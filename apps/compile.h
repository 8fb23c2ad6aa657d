// `tformers compile`: a model's steps compiled for a TPU topology by libtpu on a host without a
// TPU, with the device memory each needs, run from the arguments apps/cli.cc parsed.
#pragma once

#include "cli.h"

namespace tformers::cli {

int run_compile(const CompileArgs& args);

}  // namespace tformers::cli
