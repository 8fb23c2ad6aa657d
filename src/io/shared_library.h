// Checks a shared library against its own ELF headers before dlopen maps it. The dynamic loader
// maps each loadable segment from the file at the offsets the headers give; a segment that runs
// past the end of a truncated file is mapped anyway, and the first touch of a page beyond the
// end ends the process with SIGBUS rather than a dlopen error. A half-copied plugin or a cut
// kernel library is refused here instead, with the file named.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

namespace tformers::io {

// The library at `path` (a regular file, read only as far as its headers): FormatError naming
// the file when it is no 64-bit ELF object of this machine's byte order, or shorter than a
// loadable segment (p_offset + p_filesz) or its section header table needs. NotFoundError and
// IoError as RegularFile gives them.
void check_shared_library(const std::string& path);

// The same for a library held in memory; `where` names it in messages.
void check_shared_library(std::span<const char> bytes, const std::string& where);

}  // namespace tformers::io
