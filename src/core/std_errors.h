// Public entry points promise to throw only tformers::Error subclasses. Standard-library calls
// inside them can still throw their own exceptions (std::filesystem on an unreadable folder,
// std::bad_alloc, std::length_error from a size that slipped past a check); this wraps an entry
// point's body and turns those into tformers errors that say what was being done.
#pragma once

#include <filesystem>
#include <new>
#include <stdexcept>
#include <string_view>
#include <system_error>

#include "tformers/error.h"

namespace tformers::detail {

template <typename F>
decltype(auto) with_tformers_errors(std::string_view what, F&& f) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::filesystem::filesystem_error& e) {
    throw IoError(str_cat(what, ": ", e.code().message(), ": ", e.path1().string(),
                          " (check that it exists and that its folders can be read)"));
  } catch (const std::bad_alloc&) {
    throw ResourceError(str_cat(what, ": out of memory"));
  } catch (const std::length_error& e) {
    throw ResourceError(str_cat(what, ": a size is beyond what can be allocated (", e.what(), ")"));
  } catch (const std::system_error& e) {
    throw IoError(str_cat(what, ": ", e.what()));
  } catch (const std::exception& e) {
    throw InternalError(str_cat(what, ": unexpected error: ", e.what(),
                                " (this is a bug in tformers; please report it)"));
  }
}

}  // namespace tformers::detail
