// What the command line needs to write to a terminal safely: escaping of strings read from
// files, whether output may be styled, and holding stderr back while text streams to stdout.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <unistd.h>

namespace tformers::cli {

// `s` with every byte that could act on a terminal written as \xNN: C0 controls other than
// newline and tab (ESC starts colour, title and cursor sequences), DEL, C1 controls (U+0080 to
// U+009F, which some terminals obey too) and bytes that are not valid UTF-8. Strings from model
// files (tensor names, dtypes, architecture names, tokens) go through this before printing.
inline std::string escape_for_terminal(std::string_view s) {
  std::string out;
  auto hex = [&out](unsigned char c) {
    static const char digits[] = "0123456789abcdef";
    out += "\\x";
    out += digits[c >> 4];
    out += digits[c & 15];
  };
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7f)) {
      out += char(c);
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence of 2 to 4 bytes (no overlongs, surrogates or values above
    // U+10FFFF) that is not a C1 control is kept whole.
    size_t n = c >= 0xc2 && c <= 0xdf   ? 2
               : c >= 0xe0 && c <= 0xef ? 3
               : c >= 0xf0 && c <= 0xf4 ? 4
                                        : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    if (ok) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0) && !(c == 0xf0 && c1 < 0x90) &&
           !(c == 0xf4 && c1 >= 0x90) && !(c == 0xc2 && c1 < 0xa0);
    }
    if (ok) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      hex(c);
      ++i;
    }
  }
  return out;
}

// Whether text written to `fd` may be styled with SGR sequences (dim, colour): it is a terminal,
// and NO_COLOR (no-color.org) is unset or empty.
inline bool styled_terminal(int fd) {
  const char* no_color = std::getenv("NO_COLOR");
  return ::isatty(fd) && !(no_color && *no_color);
}

// While text streams to stdout, diagnostics written to stderr (compile notes, warnings) would land
// in the middle of a line when both go to one terminal. HeldStderr points file descriptor 2 at a
// temporary file and writes what collected there to the real stderr when release() is called,
// which the caller does when stdout is at the start of a line, and on destruction.
class HeldStderr {
 public:
  HeldStderr() : held_(std::tmpfile()), real_(held_ ? ::dup(2) : -1) {
    std::fflush(stderr);
    if (real_ >= 0) ::dup2(::fileno(held_), 2);
    if (real_ >= 0) active() = this;
  }
  HeldStderr(const HeldStderr&) = delete;
  HeldStderr& operator=(const HeldStderr&) = delete;
  ~HeldStderr() {
    if (real_ < 0) return;
    if (active() == this) active() = nullptr;
    release();
    ::dup2(real_, 2);
    ::close(real_);
    std::fclose(held_);
  }

  void release() {
    if (real_ < 0) return;
    std::fflush(stderr);
    const int fd = ::fileno(held_);
    // Descriptor 2 shares this file's offset, so rewinding it rewinds both.
    const off_t size = ::lseek(fd, 0, SEEK_CUR);
    if (size <= 0) return;
    ::lseek(fd, 0, SEEK_SET);
    char buf[4096];
    for (off_t done = 0; done < size;) {
      // The file may be longer: what an earlier, longer batch left behind the offset.
      const ssize_t n = ::read(fd, buf, std::min<size_t>(sizeof buf, size_t(size - done)));
      if (n <= 0) break;
      for (ssize_t w = 0; w < n;) {
        const ssize_t k = ::write(real_, buf + w, size_t(n - w));
        if (k <= 0) break;
        w += k;
      }
      done += n;
    }
    // Later writes overwrite from the start; only the bytes before the offset are read back.
    ::lseek(fd, 0, SEEK_SET);
  }

  // Releases the lines held by the HeldStderr alive now, if any: for a path that ends the
  // process without unwinding (MPI_Abort after a collective got no answer), so that what was
  // held is not lost with it.
  static void release_active() {
    if (HeldStderr* h = active()) h->release();
  }

 private:
  static HeldStderr*& active() {
    static HeldStderr* current = nullptr;
    return current;
  }

  std::FILE* held_;
  int real_;
};

}  // namespace tformers::cli
