// The persistent compile cache of PJRT devices: entries round-trip and anything that does not
// check out (another key, a torn or flipped byte, a payload the plugin refuses) is never loaded;
// a second `tformers generate --device xla-cpu` compiles nothing and prints the same text.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backends/pjrt/executable_cache.h"
#include "backends/pjrt/plugin_discovery.h"
#include "common/missing_dependency.h"

namespace tformers::backends::pjrt {
namespace {

namespace fs = std::filesystem;

// Every test of this binary, and the commands it starts, keep compiled programs in the build
// folder rather than in the user's cache (unless TFORMERS_COMPILE_CACHE says otherwise).
const bool kCacheInBuildFolder = [] {
  const std::string dir = (fs::path(TFORMERS_CLI).parent_path() / "pjrt-compile-cache").string();
  return ::setenv("TFORMERS_COMPILE_CACHE", dir.c_str(), /*overwrite=*/0) == 0;
}();

class TempFolder {
 public:
  TempFolder()
      : path_(fs::temp_directory_path() / ("tformers_compile_cache_" + std::to_string(::getpid()) +
                                           "_" + std::to_string(count_++))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempFolder() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }

 private:
  static inline int count_ = 0;
  fs::path path_;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(ExecutableCache, AnEntryLoadsUnderItsKeyOnly) {
  ASSERT_TRUE(kCacheInBuildFolder);
  TempFolder dir;
  const ExecutableCache cache(dir.str());
  ASSERT_TRUE(cache.store("key a", std::string("payload\0with a zero", 19)));
  EXPECT_EQ(cache.load("key a"), std::string("payload\0with a zero", 19));
  EXPECT_EQ(cache.load("key b"), std::nullopt);
  // An entry of another key in the file of this one (as a collision of names would put it).
  fs::copy_file(cache.path_of("key a"), cache.path_of("key b"));
  EXPECT_EQ(cache.load("key b"), std::nullopt);
  // Stored again, it replaces the file.
  ASSERT_TRUE(cache.store("key b", "b's"));
  EXPECT_EQ(cache.load("key b"), "b's");
  EXPECT_EQ(cache.load("key a"), std::string("payload\0with a zero", 19));
}

TEST(ExecutableCache, TornOrFlippedEntriesAreNotLoaded) {
  TempFolder dir;
  const ExecutableCache cache(dir.str());
  ASSERT_TRUE(cache.store("key", "the payload"));
  const std::string path = cache.path_of("key"), good = slurp(path);
  for (size_t i = 0; i < good.size(); ++i) {
    std::string flipped = good;
    flipped[i] = char(flipped[i] ^ 0x20);
    write(path, flipped);
    EXPECT_EQ(cache.load("key"), std::nullopt) << "byte " << i << " flipped";
  }
  for (size_t n = 0; n < good.size(); ++n) {
    write(path, good.substr(0, n));
    EXPECT_EQ(cache.load("key"), std::nullopt) << "cut to " << n << " bytes";
  }
  write(path, good + "x");
  EXPECT_EQ(cache.load("key"), std::nullopt);
  write(path, good);
  EXPECT_EQ(cache.load("key"), "the payload");
}

// What the folder holds in place of an entry is checked before a byte is read: a link (to a
// device that never ends, or to a valid entry outside the folder), a FIFO (opening it would wait
// for a writer), a sparse file of a terabyte. Each is a miss, and storing replaces it.
TEST(ExecutableCache, EntriesThatAreNotPlainFilesAreNotRead) {
  TempFolder dir, elsewhere;
  const ExecutableCache cache(dir.str()), other(elsewhere.str());
  ASSERT_TRUE(other.store("key", "outside"));
  const std::string path = cache.path_of("key");
  const std::vector<std::pair<std::string, std::function<bool()>>> impostors = {
      {"a link to /dev/zero", [&] { return ::symlink("/dev/zero", path.c_str()) == 0; }},
      {"a link out of the folder",
       [&] { return ::symlink(other.path_of("key").c_str(), path.c_str()) == 0; }},
      {"a FIFO", [&] { return ::mkfifo(path.c_str(), 0600) == 0; }},
      {"a sparse file of 1 TiB", [&] {
         std::ofstream(path, std::ios::binary).close();
         return ::truncate(path.c_str(), off_t(1) << 40) == 0;
       }}};
  for (const auto& [what, make] : impostors) {
    SCOPED_TRACE(what);
    fs::remove(path);
    ASSERT_TRUE(make());
    EXPECT_EQ(cache.load("key"), std::nullopt);
    ASSERT_TRUE(cache.store("key", "fresh"));
    EXPECT_EQ(cache.load("key"), "fresh");
  }
}

TEST(ExecutableCache, AFolderThatCannotBeMadeIsNoError) {
  TempFolder dir;
  write(dir.str() + "/a-file", "");
  const ExecutableCache cache(dir.str() + "/a-file/cache");
  EXPECT_FALSE(cache.store("key", "payload"));
  EXPECT_EQ(cache.load("key"), std::nullopt);
}

// Sets `name` to `value` for the life of the object (unset when null), then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* was = std::getenv(name);
    if (was) saved_ = was;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { saved_ ? ::setenv(name_, saved_->c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

TEST(ExecutableCache, TheFolderComesFromTheEnvironment) {
  const ScopedEnv keep_cache("TFORMERS_COMPILE_CACHE", nullptr),
      keep_xdg("XDG_CACHE_HOME", nullptr);
  for (const char* off : {"0", "off", "false"}) {
    ::setenv("TFORMERS_COMPILE_CACHE", off, 1);
    EXPECT_EQ(ExecutableCache::default_dir(), "") << off;
  }
  ::setenv("TFORMERS_COMPILE_CACHE", "/some/folder", 1);
  EXPECT_EQ(ExecutableCache::default_dir(), "/some/folder");
  ::unsetenv("TFORMERS_COMPILE_CACHE");
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(ExecutableCache::default_dir(), "/xdg/tformers/pjrt");
}

struct Generated {
  std::string out;  // stdout and stderr
  int status;
};

// `tformers generate` of the shipped model on xla-cpu with its compile cache in `dir`.
Generated generate(const std::string& dir) {
  const std::string cmd = "cd " TFORMERS_SOURCE_DIR " && TFORMERS_COMPILE_CACHE=" + dir +
                          " " TFORMERS_CLI
                          " generate -m models/kjv-fortunes-tiny --prompt 'And the LORD said' -n 8"
                          " --seed 0 --device xla-cpu --verbose 2>&1";
  Generated r{"", -1};
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  r.status = ::pclose(p);
  return r;
}

// The generated text: the line that starts with the prompt.
std::string text_of(const std::string& out) {
  const size_t at = out.find("And the LORD said");
  return at == std::string::npos ? "" : out.substr(at, out.find('\n', at) - at);
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().string());
  return out;
}

TEST(XlaCpuCompileCache, ASecondProcessCompilesNothingAndBadEntriesAreCompiledAgain) {
  if (probe_plugin("xla-cpu").path.empty())
    TF_SKIP_MISSING_DEPENDENCY("XLA's CPU PJRT plugin is missing");
  TempFolder dir;
  const Generated first = generate(dir.str());
  ASSERT_EQ(first.status, 0) << first.out;
  const std::string text = text_of(first.out);
  ASSERT_FALSE(text.empty()) << first.out;
  // A prompt bucket and the decode step.
  EXPECT_NE(first.out.find("compiles 2, cache hits 0"), std::string::npos) << first.out;
  ASSERT_EQ(entries(dir.str()).size(), 2u);

  const Generated second = generate(dir.str());
  EXPECT_NE(second.out.find("compiles 2 (2 loaded from the compile cache)"), std::string::npos)
      << second.out;
  EXPECT_EQ(text_of(second.out), text);

  // A flipped byte in each entry: both compiled again and rewritten.
  for (const std::string& path : entries(dir.str())) {
    std::string bytes = slurp(path);
    bytes[bytes.size() / 2] = char(bytes[bytes.size() / 2] ^ 1);
    write(path, bytes);
  }
  const Generated flipped = generate(dir.str());
  EXPECT_NE(flipped.out.find("compiles 2, cache hits 0"), std::string::npos) << flipped.out;
  EXPECT_EQ(text_of(flipped.out), text);
  EXPECT_NE(
      generate(dir.str()).out.find("compiles 2 (2 loaded from the compile cache), cache hits 0"),
      std::string::npos);

  // Entries that check out but hold what the plugin does not take: reported, compiled, replaced.
  for (const std::string& path : entries(dir.str())) {
    const auto entry = ExecutableCache::read_entry(path);
    ASSERT_TRUE(entry) << path;
    ASSERT_TRUE(ExecutableCache(dir.str()).store(entry->first, "not an executable"));
  }
  const Generated refused = generate(dir.str());
  EXPECT_EQ(refused.status, 0) << refused.out;
  EXPECT_NE(refused.out.find("not loaded, compiling again"), std::string::npos) << refused.out;
  EXPECT_NE(refused.out.find("compiles 2, cache hits 0"), std::string::npos) << refused.out;
  EXPECT_EQ(text_of(refused.out), text);
  EXPECT_NE(
      generate(dir.str()).out.find("compiles 2 (2 loaded from the compile cache), cache hits 0"),
      std::string::npos);

  // Turned off, nothing is kept: were "0" taken as a folder, the second run would load.
  for (int i = 0; i < 2; ++i)
    EXPECT_NE(generate("0").out.find("compiles 2, cache hits 0"), std::string::npos) << "run " << i;
  EXPECT_FALSE(fs::exists(TFORMERS_SOURCE_DIR "/0"));
}

}  // namespace
}  // namespace tformers::backends::pjrt
