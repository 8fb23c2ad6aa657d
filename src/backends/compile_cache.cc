#include "backends/compile_cache.h"

namespace tformers::backends {

CompileCache& CompileCache::global() {
  static CompileCache cache;
  return cache;
}

std::shared_ptr<Executable> CompileCache::get(Backend& backend, const graph::Graph& graph) {
  std::pair<uint64_t, std::string> key{graph.hash(), backend.name()};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      ++stats_.hits;
      return it->second;
    }
  }
  std::shared_ptr<Executable> exe = backend.compile(graph);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.compiles;
  cache_.emplace(key, exe);
  return exe;
}

CompileStats CompileCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CompileCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  cache_.clear();
}

}  // namespace tformers::backends
