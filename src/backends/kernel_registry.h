// Hub kernels' entry points by the name a graph gives them. A graph's custom call names its
// kernel (graph::CustomCall::target) and never points to it; kernels_hub registers every kernel
// of a package when it loads one, and a backend resolves the names when it compiles a graph.
// The registry holds its entries weakly: an entry lives as long as the library it points into,
// and a lookup hands back the owner that keeps that library loaded.
#pragma once

#include <memory>
#include <string>

namespace tformers::backends {

struct KernelEntry {
  const void* fn = nullptr;           // the backend's entry point (a TfKernelFn on the CPU)
  std::shared_ptr<const void> owner;  // keeps the library loaded while held
};

// Registers `fn` as kernel `target` for `backend`, alive while `owner` is. Thread-safe. A
// target registered again (the same package loaded twice) resolves to either live copy: a
// target names the library's digest, so both run the same code.
void register_kernel(const std::string& backend, const std::string& target, const void* fn,
                     const std::shared_ptr<const void>& owner);

// The live entry for `target` on `backend`; fn is null when no loaded library has it.
KernelEntry find_kernel(const std::string& backend, const std::string& target);

}  // namespace tformers::backends
