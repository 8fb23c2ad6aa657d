// Errors thrown by the public API. Each message says what was wrong, where (file, tensor name,
// byte offset, JSON path) and, when there is one, what to do about it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tformers {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed a value that cannot work (wrong shape, impossible option, bad request).
class InvalidArgumentError : public Error {
 public:
  using Error::Error;
};

// A file exists but its content is malformed (safetensors, JSON, tokenizer.json, templates).
class FormatError : public Error {
 public:
  using Error::Error;
};

// A file exists but cannot be read as one: no permission, not a regular file (a FIFO, a device,
// a directory), a read failure.
class IoError : public Error {
 public:
  using Error::Error;
};

// Memory ran out, or an input asked for more than a fixed budget allows.
class ResourceError : public Error {
 public:
  using Error::Error;
};

// Something looked up by name is absent: a file, a model, a tensor, a config field.
class NotFoundError : public Error {
 public:
  using Error::Error;
};

// Valid input that this build does not handle (an architecture, an op, a tokenizer component).
class UnsupportedError : public Error {
 public:
  using Error::Error;
};

// A device or runtime that was asked for is not present.
class DeviceError : public Error {
 public:
  using Error::Error;
};

// An internal invariant failed: a bug in tformers, reported with file and line.
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
// Builds a message from any streamable parts: str_cat("tensor ", name, " at ", offset).
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void check_failed(const char* file, int line, const char* cond,
                               const std::string& msg);
}  // namespace detail

}  // namespace tformers

// Always-on invariant check (also in release builds): internal bugs must not turn into garbage.
#define TF_CHECK(cond, ...)                                                       \
  do {                                                                            \
    if (!(cond)) [[unlikely]]                                                     \
      ::tformers::detail::check_failed(__FILE__, __LINE__, #cond,                 \
                                       ::tformers::detail::str_cat(__VA_ARGS__)); \
  } while (0)
