// The one way tformers opens a file it reads: never blocking on a FIFO or a device, never reading
// an unbounded stream, and with a size cap for the kind of file. Model folders come from
// strangers; `config.json` may be a FIFO (open() would wait for a writer forever) or a link to
// /dev/zero (a read would never end).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tformers::io {

// An open, regular, size-checked file. Owns the descriptor.
class RegularFile {
 public:
  // Opens `path` without blocking (O_NONBLOCK) and checks with fstat, before reading anything,
  // that it is a regular file (symlinks to one are fine) of at most `max_bytes`. `kind` names
  // the kind of file in messages ("config file", "safetensors file").
  // NotFoundError when it does not exist; IoError when it cannot be opened or is not a regular
  // file; FormatError when it is larger than `max_bytes`.
  RegularFile(const std::string& path, uint64_t max_bytes, std::string_view kind);
  ~RegularFile();
  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&&) = delete;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Reads `n` bytes at `offset`; IoError on a read error or when the file ends early (it
  // shrank after the open).
  void read_at(uint64_t offset, void* out, size_t n) const;
  // The whole file as fstat sized it at open.
  std::string read_all() const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// RegularFile(path, max_bytes, kind).read_all().
std::string read_regular_file(const std::string& path, uint64_t max_bytes, std::string_view kind);

// Joins `name` (a relative path read from a file: a shard name, a kernel package file) to the
// folder `root` and checks that the result stays inside `root` after symlinks are resolved.
// In a Hugging Face cache (`root` is .../snapshots/REV) files are symlinks into ../../blobs,
// which is allowed too. FormatError naming `where` and `name` when `name` is absolute, has a
// ".." part, or resolves elsewhere (through a symlinked folder or file). A path that does not
// Returns the joined path (unresolved, so messages show the name the user knows); a path that
// does not exist is returned too, for the caller's own "missing" message.
//
// With `file_may_link_out`, only the folders on the way must stay inside `root`: the file itself
// may be a symbolic link anywhere (weights kept on another disk, linked into the model folder by
// its owner). The name still cannot climb out (no "..", not absolute), and RegularFile still
// refuses what the link leads to unless it is a regular file.
std::string resolve_inside(const std::string& root, const std::string& name,
                           const std::string& where, bool file_may_link_out = false);

}  // namespace tformers::io
