#include "backends/kernel_registry.h"

#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace tformers::backends {

namespace {

struct Registered {
  const void* fn;
  std::weak_ptr<const void> owner;
};

struct Registry {
  std::mutex mu;
  std::map<std::pair<std::string, std::string>, std::vector<Registered>> entries;  // guarded by mu
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_kernel(const std::string& backend, const std::string& target, const void* fn,
                     const std::shared_ptr<const void>& owner) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<Registered>& list = r.entries[{backend, target}];
  // Entries of unloaded libraries go as soon as their name is registered again.
  std::erase_if(list, [](const Registered& e) { return e.owner.expired(); });
  list.push_back({fn, owner});
}

KernelEntry find_kernel(const std::string& backend, const std::string& target) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.entries.find({backend, target});
  if (it == r.entries.end()) return {};
  for (const Registered& e : it->second)
    if (std::shared_ptr<const void> owner = e.owner.lock()) return {e.fn, std::move(owner)};
  return {};
}

}  // namespace tformers::backends
