// Opening a checkpoint reads headers only: tensor data pages are not touched until a tensor is
// used. Checked with mincore() on a sparse 1 GiB file, whose pages are in no cache until read.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io/io_test_util.h"
#include "io/safetensors.h"

namespace tformers::io {
namespace {

constexpr uint64_t kBig = 1ull << 30;
constexpr uint64_t kProbe = 512ull << 20;  // a page far from the header and any read-ahead

// Whether the file page holding absolute offset `off` is in the page cache.
bool resident(const std::string& path, uint64_t off) {
  int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0);
  size_t page = size_t(sysconf(_SC_PAGESIZE));
  uint64_t at = off / page * page;
  void* p = mmap(nullptr, page, PROT_READ, MAP_PRIVATE, fd, off_t(at));
  ::close(fd);
  EXPECT_NE(p, MAP_FAILED);
  unsigned char vec = 0;
  EXPECT_EQ(mincore(p, page, &vec), 0);
  munmap(p, page);
  return vec & 1;
}

TEST(Lazy, OpenTouchesNoDataPages) {
  testing::TempDir dir;
  std::string path = dir.file("model.safetensors");
  std::string header = R"({"big":{"dtype":"U8","shape":[)" + std::to_string(kBig) +
                       R"(],"data_offsets":[0,)" + std::to_string(kBig) + "]}}";
  header.append((8 - (8 + header.size()) % 8) % 8, ' ');
  testing::write_bytes(path, testing::le64(header.size()) + header);
  uint64_t data_start = 8 + header.size();
  ASSERT_EQ(truncate(path.c_str(), off_t(data_start + kBig)), 0);  // sparse: no disk, no cache

  Checkpoint c = Checkpoint::open(dir.path().string());
  EXPECT_EQ(c.total_bytes(), kBig);
  EXPECT_FALSE(resident(path, data_start + kProbe)) << "open() read tensor data";
  Tensor t = c.get("big");
  EXPECT_FALSE(resident(path, data_start + kProbe)) << "get() read tensor data";
  // Reading through the view brings the page in, which shows the probe can see it.
  EXPECT_EQ(t.data<uint8_t>()[kProbe], 0);
  EXPECT_TRUE(resident(path, data_start + kProbe));
}

}  // namespace
}  // namespace tformers::io
