#include "io/shared_library.h"

#include <elf.h>

#include <bit>
#include <cstring>

#include "io/file.h"
#include "tformers/error.h"

namespace tformers::io {

namespace {

using detail::str_cat;

// Large enough for any real library (libtpu is a few hundred MiB); the check reads only headers.
constexpr uint64_t kMaxLibraryBytes = uint64_t(64) << 30;

// Reads `n` bytes at `offset` of the library, which the caller has checked lie inside it.
using ReadAt = std::function<void(uint64_t offset, void* out, size_t n)>;

// Whether [offset, offset + count * entry) lies inside `size` bytes, without overflow.
bool fits(uint64_t offset, uint64_t count, uint64_t entry, uint64_t size) {
  if (offset > size) return false;
  return entry == 0 || count <= (size - offset) / entry;
}

void check_elf(uint64_t size, const ReadAt& read_at, const std::string& where) {
  auto refuse = [&](const std::string& why) {
    throw FormatError(str_cat(where, " is not a loadable shared library: ", why,
                              "; reinstall or copy it again in full"));
  };
  if (size < EI_NIDENT) refuse(str_cat("the file has ", size, " bytes, too few for an ELF header"));
  unsigned char ident[EI_NIDENT];
  read_at(0, ident, EI_NIDENT);
  if (std::memcmp(ident, ELFMAG, SELFMAG) != 0) refuse("it does not start with the ELF magic");
  if (ident[EI_CLASS] != ELFCLASS64) refuse("it is not a 64-bit ELF object");
  const unsigned char native =
      std::endian::native == std::endian::little ? ELFDATA2LSB : ELFDATA2MSB;
  if (ident[EI_DATA] != native) refuse("it is built for the other byte order");
  Elf64_Ehdr h;
  if (size < sizeof h) refuse(str_cat("the file has ", size, " bytes, too few for an ELF header"));
  read_at(0, &h, sizeof h);
  if (h.e_phentsize != sizeof(Elf64_Phdr) || !fits(h.e_phoff, h.e_phnum, h.e_phentsize, size))
    refuse(str_cat("its program headers (", h.e_phnum, " at byte ", h.e_phoff,
                   ") do not fit in its ", size, " bytes: the file is truncated"));
  for (uint16_t i = 0; i < h.e_phnum; ++i) {
    Elf64_Phdr p;
    read_at(h.e_phoff + uint64_t(i) * sizeof p, &p, sizeof p);
    if (p.p_type == PT_LOAD && !fits(p.p_offset, 1, p.p_filesz, size))
      refuse(str_cat("loadable segment ", i, " needs bytes up to ", p.p_offset, " + ", p.p_filesz,
                     ", the file has ", size, ": it is truncated"));
  }
  if (h.e_shoff != 0 && !fits(h.e_shoff, h.e_shnum, h.e_shentsize, size))
    refuse(str_cat("its section header table (", h.e_shnum, " entries at byte ", h.e_shoff,
                   ") runs past its ", size, " bytes: the file is truncated"));
}

}  // namespace

void check_shared_library(const std::string& path) {
  const RegularFile file(path, kMaxLibraryBytes, "shared library");
  check_elf(
      file.size(), [&](uint64_t offset, void* out, size_t n) { file.read_at(offset, out, n); },
      path);
}

void check_shared_library(std::span<const char> bytes, const std::string& where) {
  check_elf(
      bytes.size(),
      [&](uint64_t offset, void* out, size_t n) { std::memcpy(out, bytes.data() + offset, n); },
      where);
}

}  // namespace tformers::io
