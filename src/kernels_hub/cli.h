// `tformers kernels list | lock | verify`, called from apps/main.cc with the arguments after
// "kernels".
#pragma once

#include <string>
#include <vector>

namespace tformers::kernels_hub {

// Returns the process exit code; prints to stdout, errors to stderr. Throws tformers::Error on
// bad input (the caller prints it).
int kernels_cli(const std::vector<std::string>& args);

}  // namespace tformers::kernels_hub
