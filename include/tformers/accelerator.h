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

// The running Python interpreter's site-packages folders (sys.prefix's), where PJRT plugin
// packages are looked for first: a virtual environment run as venv/bin/python, not activated,
// sets no VIRTUAL_ENV. The Python package calls this when imported.
void set_python_site_packages(const std::vector<std::string>& dirs);

// What `tformers env` prints: one line per backend, with where each runtime was looked for.
std::vector<std::string> describe_backends();

}  // namespace tformers::accelerator
