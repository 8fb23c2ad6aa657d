#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "tformers/error.h"

namespace tformers::io {

using detail::str_cat;

namespace {

const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string human_bytes(uint64_t n) {
  if (n >= (1u << 20) && n % (1u << 20) == 0) return str_cat(n >> 20, " MiB");
  return str_cat(n, " bytes");
}

}  // namespace

RegularFile::RegularFile(const std::string& path, uint64_t max_bytes, std::string_view kind)
    : path_(path) {
  // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer. It has no effect on
  // regular files, the only kind read past the fstat below.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) throw NotFoundError(str_cat(path, ": file not found"));
    throw IoError(str_cat(path, ": cannot open ", kind, " for reading: ", std::strerror(err),
                          err == EACCES ? " (check the file's and its folders' permissions)" : ""));
  }
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    int err = errno;
    ::close(fd_);
    throw IoError(str_cat(path, ": cannot stat ", kind, ": ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw IoError(
        str_cat(path, ": is ", file_type_name(st.st_mode), ", expected a regular ", kind));
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > max_bytes) {
    ::close(fd_);
    throw FormatError(str_cat(path, ": ", kind, " is ", size_, " bytes, over the limit of ",
                              human_bytes(max_bytes), " for this kind of file"));
  }
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

RegularFile::RegularFile(RegularFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

void RegularFile::read_at(uint64_t offset, void* out, size_t n) const {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      throw IoError(str_cat(path_, ": read error at byte ", offset, ": ", std::strerror(errno)));
    if (got == 0)
      throw IoError(str_cat(path_, ": file ended at byte ", offset,
                            " while reading it; was it changed during the load?"));
    p += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
}

std::string RegularFile::read_all() const {
  std::string s(size_, '\0');
  read_at(0, s.data(), s.size());
  return s;
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes, std::string_view kind) {
  return RegularFile(path, max_bytes, kind).read_all();
}

namespace {

// Whether `p` is `root` or lies under it; both canonical.
bool is_under(const std::filesystem::path& p, const std::filesystem::path& root) {
  auto [r, q] = std::mismatch(root.begin(), root.end(), p.begin(), p.end());
  return r == root.end();
}

}  // namespace

std::string resolve_inside(const std::string& root, const std::string& name,
                           const std::string& where, bool file_may_link_out) {
  namespace fs = std::filesystem;
  fs::path rel(name);
  bool bad = name.empty() || rel.is_absolute() || name.find('\0') != std::string::npos;
  for (const auto& part : rel)
    if (part == "..") bad = true;
  if (bad)
    throw FormatError(
        str_cat(where, ": \"", name, "\" is not a file name inside the folder ", root));
  fs::path joined = fs::path(root) / rel;
  std::error_code ec;
  // The checked path: the file, or under file_may_link_out the folder that holds it.
  fs::path target = fs::canonical(file_may_link_out ? joined.parent_path() : joined, ec);
  if (ec) return joined.string();  // missing: the caller says so in its own words
  fs::path base = fs::canonical(root, ec);
  if (ec) return joined.string();
  // The joined path, not the resolved one, names the file in later messages: a hub cache's blob
  // hashes would mean nothing to the user.
  if (is_under(target, base)) return joined.string();
  // Hub cache snapshots link their files to content-addressed blobs two levels up.
  if (base.parent_path().filename() == "snapshots") {
    fs::path blobs = fs::canonical(base.parent_path().parent_path() / "blobs", ec);
    if (!ec && is_under(target, blobs)) return joined.string();
  }
  const fs::path shown = fs::weakly_canonical(joined, ec);
  throw FormatError(str_cat(where, ": \"", name, "\" resolves to ", (ec ? target : shown).string(),
                            " through a symbolic link, outside the folder ", base.string(),
                            "; refusing to read it"));
}

}  // namespace tformers::io
