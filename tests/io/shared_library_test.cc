// io::check_shared_library against headers a cut or forged library can hold: the numbers come
// from the file, so every sum they take part in must be checked without overflowing.
#include <elf.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "io/io_test_util.h"
#include "io/shared_library.h"
#include "tformers/error.h"

namespace tformers::io {
namespace {

using testing::error_of;

// An ELF header of this machine with one program header after it, and `tail` more bytes.
std::vector<char> elf(const Elf64_Phdr& phdr, size_t tail = 0) {
  Elf64_Ehdr h{};
  std::memcpy(h.e_ident, ELFMAG, SELFMAG);
  h.e_ident[EI_CLASS] = ELFCLASS64;
  h.e_ident[EI_DATA] = ELFDATA2LSB;
  h.e_phoff = sizeof h;
  h.e_phnum = 1;
  h.e_phentsize = sizeof(Elf64_Phdr);
  std::vector<char> out(sizeof h + sizeof phdr + tail);
  std::memcpy(out.data(), &h, sizeof h);
  std::memcpy(out.data() + sizeof h, &phdr, sizeof phdr);
  return out;
}

std::string refusal(const std::vector<char>& bytes) {
  return error_of<FormatError>([&] { check_shared_library(bytes, "lib.so"); });
}

TEST(SharedLibrary, ALibraryOnDiskPasses) {
  EXPECT_NO_THROW(check_shared_library("/proc/self/exe"));
}

TEST(SharedLibrary, SegmentsPastTheEndAreRefused) {
  Elf64_Phdr p{};
  p.p_type = PT_LOAD;
  p.p_filesz = 100;
  EXPECT_NO_THROW(check_shared_library(elf(p), "lib.so"));  // 120 bytes hold offset 0 + 100
  p.p_offset = 64;
  EXPECT_HAS(refusal(elf(p)), "lib.so is not a loadable shared library: loadable segment 0");
  // p_offset + p_filesz wraps around to a small number.
  p.p_offset = 16;
  p.p_filesz = ~uint64_t(0) - 8;
  EXPECT_HAS(refusal(elf(p)), "it is truncated");
  // Segments that are not loaded are not mapped, so they are not checked.
  p.p_type = PT_NOTE;
  EXPECT_NO_THROW(check_shared_library(elf(p), "lib.so"));
}

TEST(SharedLibrary, HeadersPastTheEndAreRefused) {
  std::vector<char> bytes = elf(Elf64_Phdr{});
  auto* h = reinterpret_cast<Elf64_Ehdr*>(bytes.data());
  h->e_phoff = ~uint64_t(0) - 16;
  EXPECT_HAS(refusal(bytes), "its program headers (1 at byte");
  h->e_phoff = sizeof(Elf64_Ehdr);
  h->e_shoff = 100;
  h->e_shnum = 3;
  h->e_shentsize = sizeof(Elf64_Shdr);
  EXPECT_HAS(refusal(bytes), "its section header table (3 entries at byte 100)");
  EXPECT_HAS(refusal(std::vector<char>(bytes.begin(), bytes.begin() + 40)),
             "the file has 40 bytes, too few for an ELF header");
  EXPECT_HAS(refusal({'M', 'Z', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}),
             "it does not start with the ELF magic");
}

}  // namespace
}  // namespace tformers::io
