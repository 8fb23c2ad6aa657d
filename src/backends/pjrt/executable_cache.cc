#include "backends/pjrt/executable_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/paths.h"

namespace tformers::backends::pjrt {

namespace {

namespace fs = std::filesystem;

// An entry: the magic, the key's and the payload's sizes (u64, little-endian as x86 and arm64
// write them), the key, the payload, then a check of both. The key is stored whole, so a
// collision of file names reads as another key, not as a hit.
constexpr char kMagic[8] = {'T', 'F', 'X', 'L', 'A', 'C', '0', '1'};

// 64-bit FNV-1a: names files and checks entries against a torn or corrupted write (not against
// a forger: the folder is the user's own, as trusted as the model folder).
uint64_t fnv1a(std::string_view bytes, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

uint64_t read_u64(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, sizeof v);
  return v;
}

// Far above a compiled program of any real model (a serialized XLA executable holds code, not
// weights); a larger file is not an entry this cache wrote.
constexpr uint64_t kMaxEntryBytes = uint64_t(1) << 30;

void append_u64(std::string& s, uint64_t v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// The bytes of the entry file `path`, or nothing when it is not one this process wrote: the
// file is opened without following a link (an entry linked to /dev/zero would never end) and
// without blocking (a FIFO would wait for a writer for ever), and only a regular file of at most
// kMaxEntryBytes is read (a sparse file of a terabyte would fill the memory with zeros).
std::optional<std::string> read_entry_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> bytes;
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && uint64_t(st.st_size) <= kMaxEntryBytes) {
    bytes.emplace(size_t(st.st_size), '\0');
    size_t got = 0;
    while (got < bytes->size()) {
      const ssize_t n = ::read(fd, bytes->data() + got, bytes->size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += size_t(n);
    }
    if (got != bytes->size()) bytes.reset();  // it shrank while read: torn
  }
  ::close(fd);
  return bytes;
}

}  // namespace

std::string ExecutableCache::default_dir() {
  if (const char* v = std::getenv("TFORMERS_COMPILE_CACHE"); v && *v) {
    const std::string s = v;
    if (s == "0" || s == "off" || s == "false") return "";
    return s;
  }
  return user_cache_dir("pjrt");
}

std::string ExecutableCache::path_of(const std::string& key) const {
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.xla", static_cast<unsigned long long>(fnv1a(key)));
  return dir_ + "/" + name;
}

std::optional<std::pair<std::string, std::string>> ExecutableCache::read_entry(
    const std::string& path) {
  const std::optional<std::string> bytes = read_entry_file(path);
  if (!bytes) return std::nullopt;
  const std::string& s = *bytes;
  constexpr size_t kHead = sizeof kMagic + 16, kTail = 8;
  if (s.size() < kHead + kTail || std::memcmp(s.data(), kMagic, sizeof kMagic) != 0)
    return std::nullopt;
  const uint64_t key_size = read_u64(s, 8), payload_size = read_u64(s, 16);
  if (key_size > s.size() || payload_size > s.size() ||
      s.size() != kHead + key_size + payload_size + kTail)
    return std::nullopt;
  const std::string_view body(s.data() + kHead, key_size + payload_size);
  if (read_u64(s, kHead + key_size + payload_size) != fnv1a(body)) return std::nullopt;
  return std::make_pair(s.substr(kHead, key_size), s.substr(kHead + key_size, payload_size));
}

std::optional<std::string> ExecutableCache::load(const std::string& key) const {
  std::optional<std::pair<std::string, std::string>> entry = read_entry(path_of(key));
  if (!entry || entry->first != key) return std::nullopt;
  return std::move(entry->second);
}

bool ExecutableCache::store(const std::string& key, std::string_view payload) const {
  std::string entry(kMagic, sizeof kMagic);
  append_u64(entry, key.size());
  append_u64(entry, payload.size());
  entry += key;
  entry += payload;
  append_u64(entry, fnv1a(std::string_view(entry).substr(sizeof kMagic + 16)));
  const std::string path = path_of(key);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  std::error_code ec;
  fs::create_directories(dir_, ec);
  bool ok = !ec;
  if (ok) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    ok = bool(out.write(entry.data(), std::streamsize(entry.size())));
    out.close();
    ok = ok && !out.fail();
  }
  if (ok) {
    fs::rename(tmp, path, ec);
    ok = !ec;
  }
  if (!ok) {
    fs::remove(tmp, ec);
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      std::fprintf(stderr,
                   "tformers: cannot write the compile cache in %s; compiled programs are not "
                   "kept (set TFORMERS_COMPILE_CACHE to a writable folder, or 0 to turn it off)\n",
                   dir_.c_str());
  }
  return ok;
}

}  // namespace tformers::backends::pjrt
