// One clear line for any exception that reaches main: what failed and, where a cause is
// likely, how to fix it. Call inside a catch block.
#pragma once

#include <filesystem>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>

#include "tformers/error.h"

namespace tformers::cli {

inline std::string current_error_message() {
  try {
    throw;
  } catch (const tformers::Error& e) {
    return e.what();
  } catch (const std::bad_alloc&) {
    return "out of memory; try a smaller model, --dtype bfloat16, --quantize int8 or a smaller "
           "--ctx-size";
  } catch (const std::filesystem::filesystem_error& e) {
    return std::string("file system: ") + e.what();
  } catch (const std::system_error& e) {
    return std::string("system: ") + e.what() + " (error " + std::to_string(e.code().value()) + ")";
  } catch (const std::length_error& e) {
    return std::string("a size too large to allocate (") + e.what() +
           "); check the sizes in the model's config.json and the numbers given";
  } catch (const std::invalid_argument& e) {
    return std::string("invalid argument: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("unexpected failure: ") + e.what();
  } catch (...) {
    return "unexpected failure (an exception that is not a std::exception)";
  }
}

}  // namespace tformers::cli
