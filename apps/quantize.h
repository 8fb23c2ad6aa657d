// `tformers quantize`: a float checkpoint written again with int8 or int4 linear weights, in a
// folder that loads without quantizing (CausalLM::save_pretrained; docs/quantization.md), run
// from the arguments apps/cli.cc parsed.
#pragma once

#include "cli.h"

namespace tformers::cli {

// Loads, quantizes, writes; one summary line on stderr. Returns the exit status.
int run_quantize(const QuantizeArgs& args);

}  // namespace tformers::cli
