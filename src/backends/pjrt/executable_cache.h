// Compiled programs kept on disk between processes, so that a second run of the same model on
// the same plugin compiles nothing (XLA takes seconds per shape on a CPU and minutes for a large
// model on a TPU). Entries are the plugin's own serialization, keyed by everything that decides
// it (the module's text and the client's build identity); an entry that is truncated, corrupt,
// made under another key, or not a regular file of a plausible size (a link, a FIFO, a huge
// sparse file) is ignored and rewritten, never loaded.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace tformers::backends::pjrt {

class ExecutableCache {
 public:
  // The cache folder from TFORMERS_COMPILE_CACHE (a folder; "0", "off" or "false" turn the
  // cache off), else user_cache_dir("pjrt"); empty when off or when there is no home folder.
  static std::string default_dir();

  explicit ExecutableCache(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }

  // The payload stored under `key`; nothing when there is none or it does not check out.
  std::optional<std::string> load(const std::string& key) const;
  // Stores `payload` under `key` (written to a temporary file, then renamed, so a reader never
  // sees half an entry). A cache that cannot be written is not an error: false, and a note on
  // stderr once per process.
  bool store(const std::string& key, std::string_view payload) const;
  // The file an entry of `key` lives in.
  std::string path_of(const std::string& key) const;
  // The key and payload of the entry in file `path`; nothing when it does not check out.
  static std::optional<std::pair<std::string, std::string>> read_entry(const std::string& path);

 private:
  std::string dir_;
};

}  // namespace tformers::backends::pjrt
