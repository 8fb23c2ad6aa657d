// Executables cached by (graph hash, backend): a graph with the same structure, shapes and dtypes
// is compiled once per backend and process. The counters are what tests and --verbose read.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "backends/backend.h"
#include "tformers/compile_stats.h"

namespace tformers::backends {

class CompileCache {
 public:
  static CompileCache& global();
  // The cached executable for this graph on this backend, compiling it on a miss.
  std::shared_ptr<Executable> get(Backend& backend, const graph::Graph& graph);
  CompileStats stats() const;
  void clear();

 private:
  mutable std::mutex mu_;
  std::map<std::pair<uint64_t, std::string>, std::shared_ptr<Executable>> cache_;
  CompileStats stats_;
};

}  // namespace tformers::backends
