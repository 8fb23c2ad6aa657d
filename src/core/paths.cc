#include "core/paths.h"

#include <cstdlib>

namespace tformers {

std::string user_cache_dir(const std::string& sub) {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/tformers/" + sub;
  if (const char* h = std::getenv("HOME"); h && *h)
    return std::string(h) + "/.cache/tformers/" + sub;
  return "";
}

}  // namespace tformers
