// Devices, as torch.accelerator presents them. The CPU is always there; accelerators ("tpu",
// "cuda") are driven through PJRT plugins found at run time.
#pragma once

#include <string>
#include <vector>

namespace tformers::accelerator {

// True when an accelerator runtime was found and can run graphs.
bool is_available();
int device_count();
// "tpu", "cuda", or "" when none.
std::string current_accelerator();

// What `tformers env` prints: one line per backend, with where each runtime was looked for.
std::vector<std::string> describe_backends();

}  // namespace tformers::accelerator
