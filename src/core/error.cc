#include "tformers/error.h"

namespace tformers::detail {

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(str_cat("internal error at ", file, ":", line, ": check '", cond, "' failed",
                              msg.empty() ? "" : ": ", msg,
                              " (this is a bug in tformers; please report it)"));
}

}  // namespace tformers::detail
