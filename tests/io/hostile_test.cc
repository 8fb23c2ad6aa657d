// Files a stranger's model folder can hold: FIFOs, devices, symlinks out of the folder, and
// safetensors headers that only a lax parser would accept.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "io/file.h"
#include "io/hub.h"
#include "io/io_test_util.h"
#include "io/json.h"
#include "io/safetensors.h"

namespace tformers::io {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::raw_safetensors;
using testing::TempDir;
using testing::write_bytes;

std::string header_error(const std::string& header, const std::string& data = "") {
  TempDir dir;
  std::string p = dir.file("model.safetensors");
  write_bytes(p, raw_safetensors(header, data));
  std::string msg = error_of<FormatError>([&] { SafetensorsFile::open(p); });
  EXPECT_HAS(msg, p);
  return msg;
}

TEST(HostileSafetensors, HeaderFramingFollowsTheFormat) {
  EXPECT_HAS(header_error(std::string("{}\0garbage}", 11)),
             "the JSON header has a NUL byte at file byte 10");
  EXPECT_HAS(header_error("\xEF\xBB\xBF{}"),
             "must start with '{' at file byte 8, found byte 0xEF (a UTF-8 byte-order mark)");
  EXPECT_HAS(header_error(" {}"), "must start with '{' at file byte 8, found byte 0x20");
  EXPECT_HAS(header_error("\n{}"), "found byte 0x0A");
  EXPECT_HAS(header_error("{}\n"),
             "must end with '}' followed only by spaces; found byte 0x0A "
             "at file byte 10");
  EXPECT_HAS(header_error("{}\t  "), "found byte 0x09");
  EXPECT_HAS(header_error("    "), "malformed");
  EXPECT_HAS(header_error(std::string(600, '{') + std::string(600, '}')),
             "JSON nests deeper than 512 levels");
  // Space padding is the one thing allowed after the object.
  TempDir dir;
  write_bytes(dir.file("ok.safetensors"), raw_safetensors("{}      ", ""));
  EXPECT_TRUE(SafetensorsFile::open(dir.file("ok.safetensors"))->tensors().empty());
}

TEST(HostileSafetensors, FifoAndDeviceAreRejectedWithoutBlocking) {
  TempDir dir;
  std::string fifo = dir.file("model.safetensors");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(error_of<IoError>([&] { Checkpoint::open(dir.path().string()); }),
            fifo + ": is a FIFO, expected a regular safetensors file");
  TempDir dev;
  fs::create_symlink("/dev/zero", dev.file("model.safetensors"));
  // A weight file may link out of its folder, but only to a regular file.
  EXPECT_HAS(error_of<IoError>([&] { Checkpoint::open(dev.path().string()); }),
             "is a character device");
  EXPECT_HAS(error_of<IoError>([&] { SafetensorsFile::open(dev.file("model.safetensors")); }),
             "is a character device");
}

// Weights kept on another disk and linked into the model folder by its owner were refused
// ("resolves to ... outside the folder"). The files themselves may now link anywhere, single
// file and shards alike; the index's names still cannot climb out (the tests below).
TEST(HostileSafetensors, WeightFilesLinkedFromAnotherFolderLoad) {
  TempDir other, model;
  write_bytes(other.file("real.safetensors"), raw_safetensors("{}", ""));
  fs::create_symlink(other.file("real.safetensors"), model.file("model.safetensors"));
  EXPECT_TRUE(Checkpoint::open(model.path().string()).names().empty());
  TempDir sharded;
  fs::create_symlink(other.file("real.safetensors"), sharded.file("s1.safetensors"));
  write_bytes(sharded.file("model.safetensors.index.json"),
              R"({"weight_map": {"w": "s1.safetensors"}})");
  // Followed: the shard is read (and lacks the index's tensor), rather than refused as a link.
  EXPECT_HAS(error_of<FormatError>([&] { Checkpoint::open(sharded.path().string()); }),
             "has no such tensor");
}

TEST(HostileSafetensors, ShardThroughASymlinkedFolderIsRefused) {
  TempDir dir;
  fs::create_directory_symlink("/etc", dir.path() / "etclink");
  std::string index = dir.file("model.safetensors.index.json");
  write_bytes(index, R"({"weight_map": {"w": "etclink/passwd"}})");
  EXPECT_EQ(error_of<FormatError>([&] { Checkpoint::open(dir.path().string()); }),
            index +
                ": weight_map[\"w\"]: \"etclink/passwd\" resolves to /etc/passwd through a "
                "symbolic link, outside the folder " +
                fs::canonical(dir.path()).string() + "; refusing to read it");
  write_bytes(index, R"({"weight_map": {"w": "../x.safetensors"}})");
  EXPECT_HAS(error_of<FormatError>([&] { Checkpoint::open(dir.path().string()); }),
             "weight_map[\"w\"]: \"../x.safetensors\" is not a file name inside the folder");
}

TEST(HostileSafetensors, HubCacheBlobLinksAreAllowed) {
  // models--org--m/snapshots/REV/model.safetensors -> ../../blobs/HASH, as huggingface_hub lays
  // it out; a shard in a subfolder links three levels up.
  TempDir cache;
  fs::path repo = cache.path() / "models--org--m";
  fs::create_directories(repo / "blobs");
  fs::create_directories(repo / "snapshots" / "rev" / "sub");
  write_bytes((repo / "blobs" / "h1").string(), raw_safetensors("{}", ""));
  fs::create_symlink("../../../blobs/h1", repo / "snapshots" / "rev" / "sub" / "s1.safetensors");
  std::string snap = (repo / "snapshots" / "rev").string();
  write_bytes(snap + "/model.safetensors.index.json",
              R"({"weight_map": {"w": "sub/s1.safetensors"}})");
  // The shard is empty, so the index's tensor is not in it: that error, not a symlink refusal,
  // shows the link was followed.
  EXPECT_HAS(error_of<FormatError>([&] { Checkpoint::open(snap); }), "has no such tensor");
  EXPECT_EQ(resolve_inside(snap, "sub/s1.safetensors", "x"), snap + "/sub/s1.safetensors");
}

TEST(HostileHub, OversizedRefFileIsNotReadWhole) {
  TempDir cache;
  fs::path repo = cache.path() / "models--org--m";
  fs::create_directories(repo / "snapshots");
  write_bytes((repo / "refs" / "main").string(), std::string(5000, 'a'));
  setenv("HF_HUB_CACHE", cache.path().c_str(), 1);
  EXPECT_EQ(error_of<FormatError>([&] { resolve_model_path("org/m"); }),
            (repo / "refs" / "main").string() +
                ": Hub ref file is 5000 bytes, over the limit of 4096 bytes for this kind of file");
  unsetenv("HF_HUB_CACHE");
}

}  // namespace
}  // namespace tformers::io
