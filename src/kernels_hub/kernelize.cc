// kernelize(): resolves a layer -> device -> package mapping into custom calls that the graph
// builder emits in place of built-in ops.
//
// The resolved kernels reach the model through models::set_layer_overrides: the layer library
// asks them whenever a graph is built, so every architecture that uses the shared layers is
// kernelized without knowing it.
#include "kernels_hub/kernelize.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "kernels_hub/package.h"
#include "models/overrides.h"
#include "tformers/error.h"
#include "tformers/kernels.h"
#include "tformers/model.h"

namespace tformers {

using namespace kernels_hub;

namespace kernels_hub {

namespace {

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

}  // namespace

std::shared_ptr<const graph::CustomCall> LayerKernels::find(
    const std::string& layer, Mode mode, const std::vector<graph::TensorType>& inputs,
    const std::string& node_name) const {
  auto it = slots.find(layer);
  if (it == slots.end() || !it->second.call) return nullptr;
  const Slot& s = it->second;
  std::string why;
  if (!(s.modes & uint32_t(mode))) {
    why = std::string("does not support ") + (mode == Mode::kDecode ? "decode" : "prefill") +
          " (it supports " + modes_str(s.modes) + ")";
  } else if (inputs.size() != s.input_dtypes.size()) {
    why = "takes " + std::to_string(s.input_dtypes.size()) + " inputs, the layer has " +
          std::to_string(inputs.size());
  } else {
    for (size_t i = 0; i < inputs.size() && why.empty(); ++i) {
      const auto& ok = s.input_dtypes[i];
      const std::string code(dtype_short_name(inputs[i].dtype));
      if (std::find(ok.begin(), ok.end(), code) == ok.end())
        why = "takes input " + std::to_string(i) + " as " + join(ok, "|") + ", not " + code;
    }
  }
  if (why.empty()) return s.call;
  if (use_fallback) return nullptr;
  throw UnsupportedError("hub kernel " + s.kernel + " for " + layer + " at " + node_name + " " +
                         why + "; kernelize with use_fallback=true to use the built-in op there");
}

}  // namespace kernels_hub

KernelMapping default_kernel_mapping() {
  const LayerRepository fused_norms{"tformers-community/fused-norms", 1, ""};
  return {{"RMSNorm", {{"cpu", fused_norms}}}, {"SiLUAndMul", {{"cpu", fused_norms}}}};
}

std::vector<KernelizedLayer> kernelize(CausalLM& model, const KernelMapping& mapping,
                                       const KernelizeOptions& opt) {
  const char* use = std::getenv("USE_HUB_KERNELS");
  if (use && (std::string(use) == "0" || std::string(use) == "false" || std::string(use) == "no" ||
              std::string(use) == "off")) {
    models::set_layer_overrides(model, nullptr);
    return {
        {"*", "", "USE_HUB_KERNELS=" + std::string(use) + ": every layer uses its built-in op"}};
  }

  const std::string device = model.device();
  KernelOptions ko = opt.kernel_options;
  ko.device = device;
  auto lk = std::make_shared<LayerKernels>();
  lk->use_fallback = opt.use_fallback;
  std::vector<KernelizedLayer> report;
  std::map<std::pair<std::string, int>, Kernel> loaded;
  const auto& contracts = layer_contracts();

  for (const auto& [layer, per_device] : mapping) {
    if (!contracts.count(layer)) {
      std::vector<std::string> names;
      for (const auto& [n, c] : contracts) names.push_back(n);
      throw InvalidArgumentError(
          "kernelize: '" + layer +
          "' is not a layer that can be replaced; layers: " + join(names, ", "));
    }
    auto d = per_device.find(device);
    if (d == per_device.end()) {
      std::vector<std::string> devices;
      for (const auto& [dev, r] : per_device) devices.push_back(dev);
      std::string note =
          "no kernel is mapped for device " + device + " (mapped: " + join(devices, ", ") + ")";
      if (!opt.use_fallback)
        throw UnsupportedError("kernelize: " + layer + ": " + note +
                               "; map one, or kernelize with use_fallback=true");
      report.push_back({layer, "", note + ": built-in op"});
      continue;
    }
    const LayerRepository& r = d->second;
    auto key = std::make_pair(r.repo_id, r.version);
    auto k = loaded.find(key);
    if (k == loaded.end()) {
      try {
        k = loaded.emplace(key, get_kernel(r.repo_id, r.version, ko)).first;
      } catch (const UnsupportedError& e) {
        // No variant fits this machine: the device cannot run the kernel.
        if (!opt.use_fallback) throw;
        report.push_back({layer, "", std::string(e.what()) + "\n=> built-in op"});
        continue;
      }
    }
    const Kernel& kernel = k->second;
    const std::string pkg_layer = r.layer_name.empty() ? layer : r.layer_name;
    auto e = kernels_hub::KernelAccess::impl(kernel)->entries.find(pkg_layer);
    if (e == kernels_hub::KernelAccess::impl(kernel)->entries.end())
      throw InvalidArgumentError(
          "kernelize: " + layer + " is mapped to " + kernel.describe() + " layer '" + pkg_layer +
          "', which it does not have; it has: " + join(kernel.layers(), ", "));
    if (std::string why = check_against_contract(layer, e->second.schema); !why.empty())
      throw FormatError("kernelize: " + kernel.describe() + " layer " + pkg_layer +
                        " cannot replace " + layer + ": its schema \"" + e->second.schema_text +
                        "\" does not match the layer: " + why);
    auto call = std::make_shared<graph::CustomCall>();
    call->target = kernels_hub::KernelAccess::impl(kernel)->target(pkg_layer);
    call->backend = device;
    call->owner = kernels_hub::KernelAccess::impl(kernel);
    LayerKernels::Slot slot;
    slot.call = call;
    slot.modes = e->second.modes;
    slot.kernel = kernel.describe();
    for (const auto& a : e->second.schema.inputs) slot.input_dtypes.push_back(a.dtypes);
    lk->slots[layer] = std::move(slot);
    report.push_back(
        {layer, kernel.describe(),
         "modes: " + modes_str(e->second.modes) + "; schema " + e->second.schema_text});
  }

  if (models::is_verbose(model))
    for (const auto& r : report)
      std::fprintf(stderr, "tformers: kernelize %s: %s\n", r.layer.c_str(),
                   r.kernel.empty() ? r.note.c_str() : (r.kernel + "; " + r.note).c_str());
  models::set_layer_overrides(model, lk->slots.empty() ? nullptr : lk);
  return report;
}

}  // namespace tformers
