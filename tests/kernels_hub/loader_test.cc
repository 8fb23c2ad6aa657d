// get_kernel: resolution from the cache, verification against the lock, loading, two versions
// side by side, and every kind of broken package refused with a clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backends/cpu/kernels.h"
#include "hub_test_util.h"
#include "kernels_hub/package.h"
#include "tformers/error.h"
#include "tformers/kernels.h"

namespace tformers {
namespace {

using testing::cache_options;
using testing::install_package;
using testing::make_fixture_package;
using testing::pin;
using testing::TempDir;
using testing::write_text;
namespace fs = std::filesystem;

const std::string kRepo = "tformers-community/fused-norms";

// The error text of `fn`, which must throw E.
template <class E, class F>
std::string error_of(F fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

void serial_for(void*, int64_t n, int64_t, void (*body)(void*, int64_t, int64_t), void* arg) {
  body(arg, 0, n);
}

// Runs a loaded RMSNorm through the C ABI on random data and returns the largest relative
// difference from the scalar reference.
double rms_norm_error(const Kernel& k) {
  const int64_t M = 5, D = 67;  // odd sizes reach the vector loops' tails
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> x(M * D), w(D), y(M * D), ref(M * D);
  for (auto& v : x) v = nd(rng);
  for (auto& v : w) v = nd(rng);
  cpu::ref::rms_norm(x.data(), w.data(), DType::f32, ref.data(), M, D, 1e-6f);
  const int64_t xs[] = {M, D}, ws[] = {D};
  TfKernelTensor in[2] = {{x.data(), TF_KERNEL_F32, 2, xs}, {w.data(), TF_KERNEL_F32, 1, ws}};
  TfKernelTensor out = {y.data(), TF_KERNEL_F32, 2, xs};
  float eps = 1e-6f;
  char err[256] = {0};
  TfKernelCall call = {in, 2, &out, &eps, 1, nullptr, 0, serial_for, nullptr, err, sizeof err};
  EXPECT_EQ(kernels_hub::KernelAccess::impl(k)->entries.at("RMSNorm").fn(&call), 0) << err;
  double e = 0;
  for (int64_t i = 0; i < M * D; ++i)
    e = std::max(e, double(std::fabs(y[i] - ref[i])) / (std::fabs(ref[i]) + 1e-3));
  return e;
}

class Loader : public ::testing::Test {
 protected:
  void SetUp() override {
    snap1_ = install_package(cache_.path(), kRepo, 1, "1111aaaa", testing::fused_norms(1));
    opt_ = cache_options(cache_);
  }
  fs::path picked_library(const Kernel& k) {
    for (const auto& e : fs::directory_iterator(fs::path(k.path()) / "build" / k.variant()))
      return e.path();
    return {};
  }
  TempDir cache_;
  fs::path snap1_;
  KernelOptions opt_;
};

TEST_F(Loader, PinnedPackageLoadsTheBestVariantAndComputes) {
  pin(opt_, kRepo, 1);
  Kernel k = get_kernel(kRepo, 1, opt_);
  EXPECT_TRUE(k.pinned());
  EXPECT_EQ(k.revision(), "1111aaaa");
  EXPECT_EQ(k.package_version(), "1.0.0");
  EXPECT_EQ(k.license(), "Apache-2.0");
  EXPECT_EQ(k.layers(), (std::vector<std::string>{"RMSNorm", "SiLUAndMul"}));
  EXPECT_EQ(k.schema("RMSNorm"), "x:f32,weight:f32|bf16;eps:f32->y:f32");
  auto checks = check_variants(snap1_.string(), KernelPlatform::current());
  EXPECT_EQ(k.variant(), checks.front().name);
  EXPECT_LT(rms_norm_error(k), 1e-5);
  EXPECT_THROW(k.schema("Attention"), NotFoundError);
}

TEST_F(Loader, ChangedByteInTheLibraryIsRefused) {
  pin(opt_, kRepo, 1);
  fs::path lib = picked_library(get_kernel(kRepo, 1, opt_));
  {
    std::fstream f(lib, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(4096);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x01;
    f.seekp(4096);
    f.write(&c, 1);
  }
  std::string e = error_of<FormatError>([&] { get_kernel(kRepo, 1, opt_); });
  EXPECT_CONTAINS(e, lib.filename().string());
  EXPECT_CONTAINS(e, "refusing to load it");
  auto problems = verify_lock(LockFile::load(opt_.lock_file), opt_);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_CONTAINS(problems[0], "has sha256");
}

TEST_F(Loader, ChangedManifestOrExtraFileOrOtherRevisionIsRefused) {
  pin(opt_, kRepo, 1);
  const std::string manifest = (snap1_ / "manifest.json").string();
  std::string text;
  {
    std::ifstream in(manifest);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  write_text(manifest, text + " ");
  EXPECT_CONTAINS(error_of<FormatError>([&] { get_kernel(kRepo, 1, opt_); }), "manifest.json");
  write_text(manifest, text);
  EXPECT_NO_THROW(get_kernel(kRepo, 1, opt_));

  Kernel k = get_kernel(kRepo, 1, opt_);
  fs::path extra = fs::path(k.path()) / "build" / k.variant() / "extra.txt";
  write_text(extra, "x");
  EXPECT_CONTAINS(error_of<FormatError>([&] { get_kernel(kRepo, 1, opt_); }), "not pinned");
  fs::remove(extra);

  install_package(cache_.path(), kRepo, 1, "2222bbbb", testing::fused_norms(1));
  EXPECT_CONTAINS(error_of<FormatError>([&] { get_kernel(kRepo, 1, opt_); }),
                  "pins revision 1111aaaa but the cache has 2222bbbb");
}

TEST_F(Loader, UnpinnedPackageNeedsExplicitOptIn) {
  std::string e = error_of<InvalidArgumentError>([&] { get_kernel(kRepo, 1, opt_); });
  EXPECT_CONTAINS(e, "is not pinned");
  EXPECT_CONTAINS(e, "tformers kernels lock " + kRepo + "@v1");
  opt_.allow_unpinned = true;
  Kernel k = get_kernel(kRepo, 1, opt_);
  EXPECT_FALSE(k.pinned());
  EXPECT_LT(rms_norm_error(k), 1e-5);
}

TEST_F(Loader, TwoVersionsLoadSideBySide) {
  install_package(cache_.path(), kRepo, 2, "3333cccc", testing::fused_norms(2));
  pin(opt_, kRepo, 1);
  pin(opt_, kRepo, 2);
  Kernel v1 = get_kernel(kRepo, 1, opt_);
  Kernel v2 = get_kernel(kRepo, 2, opt_);
  EXPECT_EQ(v1.package_version(), "1.0.0");
  EXPECT_EQ(v2.package_version(), "2.0.0");
  EXPECT_FALSE(v1.has_layer("RotaryEmbedding"));
  EXPECT_TRUE(v2.has_layer("RotaryEmbedding"));
  EXPECT_TRUE(v2.has_layer("Attention"));
  // Separate copies of the code, both usable at once.
  EXPECT_NE(kernels_hub::KernelAccess::impl(v1)->entries.at("RMSNorm").fn,
            kernels_hub::KernelAccess::impl(v2)->entries.at("RMSNorm").fn);
  EXPECT_LT(rms_norm_error(v1), 1e-5);
  EXPECT_LT(rms_norm_error(v2), 1e-5);
  // The same version loaded twice is two independent loads too.
  Kernel again = get_kernel(kRepo, 1, opt_);
  EXPECT_LT(rms_norm_error(again), 1e-5);
}

TEST_F(Loader, LocalOverrideForDevelopment) {
  TempDir dev;
  fs::copy(testing::fused_norms(2), dev.path(), fs::copy_options::recursive);
  opt_.local_overrides[kRepo] = dev.str();
  ResolvedPackage r = resolve_kernel_package(kRepo, 2, opt_);
  EXPECT_EQ(r.path, dev.str());
  EXPECT_EQ(r.revision, "local");
  EXPECT_THROW(get_kernel(kRepo, 2, opt_), InvalidArgumentError);  // unpinned
  pin(opt_, kRepo, 2);
  Kernel k = get_kernel(kRepo, 2, opt_);
  EXPECT_EQ(k.revision(), "local");
  EXPECT_TRUE(k.pinned());
  // A manifest whose major version is not the one asked for.
  EXPECT_CONTAINS(error_of<FormatError>([&] { lock_kernel(kRepo, 1, opt_); }),
                  "is not major version 1");
}

// The same through the environment: cache path, per-repo override, unpinned opt-in.
TEST_F(Loader, EnvironmentVariables) {
  TempDir dev;
  fs::copy(testing::fused_norms(2), dev.path(), fs::copy_options::recursive);
  KernelOptions o;
  o.lock_file = (dev.path() / "absent.lock").string();
  ::setenv("TFORMERS_KERNELS_PATH", ("/nonexistent:" + cache_.str()).c_str(), 1);
  ::setenv("TFORMERS_LOCAL_KERNELS", ("other/pkg=/x:" + kRepo + "=" + dev.str()).c_str(), 1);
  ::setenv("TFORMERS_KERNELS_ALLOW_UNPINNED", "1", 1);
  EXPECT_EQ(resolve_kernel_package(kRepo, 1, o).path, dev.str());
  EXPECT_EQ(get_kernel(kRepo, 2, o).revision(), "local");
  ::unsetenv("TFORMERS_LOCAL_KERNELS");
  EXPECT_EQ(get_kernel(kRepo, 1, o).revision(), "1111aaaa");  // from the second cache root
  ::unsetenv("TFORMERS_KERNELS_ALLOW_UNPINNED");
  EXPECT_THROW(get_kernel(kRepo, 1, o), InvalidArgumentError);
  ::unsetenv("TFORMERS_KERNELS_PATH");
}

TEST_F(Loader, MissingPackagesSayWhereTheyWereLookedFor) {
  std::string e = error_of<NotFoundError>([&] { get_kernel("someone/missing", 1, opt_); });
  EXPECT_CONTAINS(e, "kernels--someone--missing");
  EXPECT_CONTAINS(e, "TFORMERS_KERNELS_PATH");
  e = error_of<NotFoundError>([&] { get_kernel(kRepo, 7, opt_); });
  EXPECT_CONTAINS(e, "refs there: v1");
  EXPECT_THROW(get_kernel("no-slash", 1, opt_), InvalidArgumentError);
  EXPECT_THROW(get_kernel("../evil/x", 1, opt_), InvalidArgumentError);
  EXPECT_THROW(get_kernel(kRepo, 0, opt_), InvalidArgumentError);
}

TEST_F(Loader, NoFittingVariantListsEveryVariantWithItsReason) {
  TempDir pkg;
  make_fixture_package(pkg.path(), "good", testing::kFixtureManifest, "cabi1-cpu-aarch64-linux");
  make_fixture_package(pkg.path(), "good", testing::kFixtureManifest, "cabi2-cpu-x86_64-linux");
  opt_.local_overrides["test/fixture"] = pkg.str();
  opt_.allow_unpinned = true;
  std::string e = error_of<UnsupportedError>([&] { get_kernel("test/fixture", 1, opt_); });
  EXPECT_CONTAINS(e, "has no variant");
  EXPECT_CONTAINS(e, "cabi1-cpu-aarch64-linux: built for aarch64");
  EXPECT_CONTAINS(e, "cabi2-cpu-x86_64-linux: built for C ABI version 2");
}

// Each broken package is a FormatError that names the problem, never a crash.
class BadPackage : public ::testing::Test {
 protected:
  std::string load_error(const std::string& kind,
                         const std::string& manifest = testing::kFixtureManifest) {
    make_fixture_package(pkg_.path(), kind, manifest);
    KernelOptions o;
    o.cache_dirs = {pkg_.str()};
    o.local_overrides["test/fixture"] = pkg_.str();
    o.allow_unpinned = true;
    o.lock_file = (pkg_.path() / "none.lock").string();
    return error_of<FormatError>([&] { get_kernel("test/fixture", 1, o); });
  }
  TempDir pkg_;
};

TEST_F(BadPackage, GoodFixtureLoads) {
  make_fixture_package(pkg_.path(), "good");
  KernelOptions o;
  o.local_overrides["test/fixture"] = pkg_.str();
  o.allow_unpinned = true;
  o.lock_file = (pkg_.path() / "none.lock").string();
  Kernel k = get_kernel("test/fixture", 1, o);
  EXPECT_LT(rms_norm_error(k), 1e-5);
}

TEST_F(BadPackage, LibraryWithoutEntryPoint) {
  EXPECT_CONTAINS(load_error("no_entry"),
                  "does not export the entry point 'tformers_kernel_table'");
}

TEST_F(BadPackage, WrongAbiVersion) {
  EXPECT_CONTAINS(load_error("bad_abi"), "built against kernel C ABI version 99");
}

TEST_F(BadPackage, LibrarySchemaDiffersFromManifest) {
  std::string e = load_error("schema_mismatch");
  EXPECT_CONTAINS(e, "layer RMSNorm has schema \"x:f32,weight:f32|bf16;eps:f32->y:f32\"");
  EXPECT_CONTAINS(e, "out of step");
}

TEST_F(BadPackage, ManifestSchemaDoesNotMatchTheLayer) {
  std::string renamed = testing::kFixtureManifest;
  renamed.replace(renamed.find("weight:f32"), 10, "w:f32");
  std::string e = load_error("good", renamed);
  EXPECT_CONTAINS(e, "layers.RMSNorm: the schema does not match the layer");
  EXPECT_CONTAINS(e, "argument 1 is 'w', expected 'weight'");

  std::string dtype = testing::kFixtureManifest;
  dtype.replace(dtype.find("x:f32"), 5, "x:f16");
  EXPECT_CONTAINS(load_error("good", dtype), "accepts f16, which tformers never passes");

  std::string missing = testing::kFixtureManifest;
  missing.replace(missing.find("\"attributes\": [\"eps:f32\"],"), 26, "");
  EXPECT_CONTAINS(load_error("good", missing), "attributes () do not match the contract's (eps)");

  std::string unknown = testing::kFixtureManifest;
  unknown.replace(unknown.find("\"RMSNorm\""), 9, "\"LayerNorm\"");
  EXPECT_CONTAINS(load_error("good", unknown), "'LayerNorm' is not a layer tformers can replace");

  EXPECT_CONTAINS(load_error("good", "{\"name\": \"fixture\""), "malformed JSON");
  EXPECT_CONTAINS(load_error("good",
                             "{\"name\": \"fixture\", \"version\": \"x\", \"license\": "
                             "\"MIT\", \"backends\": [\"cpu\"], \"layers\": {}}"),
                  "must start with a major version");
}

TEST_F(BadPackage, FileThatIsNotASharedLibrary) {
  make_fixture_package(pkg_.path(), "good");
  write_text(pkg_.path() / "build" / "cabi1-cpu-x86_64-linux" / "libfixture_good.so",
             "\x7f"
             "ELF but not really");
  KernelOptions o;
  o.local_overrides["test/fixture"] = pkg_.str();
  o.allow_unpinned = true;
  o.lock_file = (pkg_.path() / "none.lock").string();
  EXPECT_CONTAINS(error_of<FormatError>([&] { get_kernel("test/fixture", 1, o); }),
                  "is not a loadable shared library");
}

TEST_F(BadPackage, TruncatedLibraryIsRefusedBeforeDlopen) {
  // dlopen maps the segments the headers name; past the end of a cut file the first touch of a
  // page ended the process with SIGBUS.
  make_fixture_package(pkg_.path(), "good");
  const fs::path lib = pkg_.path() / "build" / "cabi1-cpu-x86_64-linux" / "libfixture_good.so";
  fs::resize_file(lib, fs::file_size(lib) / 2);
  KernelOptions o;
  o.local_overrides["test/fixture"] = pkg_.str();
  o.allow_unpinned = true;
  o.lock_file = (pkg_.path() / "none.lock").string();
  const std::string e = error_of<FormatError>([&] { get_kernel("test/fixture", 1, o); });
  EXPECT_CONTAINS(e, lib.string());
  EXPECT_CONTAINS(e, "truncated");
}

TEST(LockFileFormat, RoundTripAndMalformedInput) {
  TempDir dir;
  LockEntry e;
  e.repo_id = "a/b";
  e.version = 2;
  e.revision = "r1";
  e.manifest_sha256 = std::string(64, 'a');
  e.variants["cabi1-cpu-x86_64-linux"]["build/cabi1-cpu-x86_64-linux/lib.so"] =
      std::string(64, 'b');
  LockFile lock;
  lock.upsert(e);
  const std::string path = (dir.path() / "kernels.lock").string();
  lock.save(path);
  LockFile back = LockFile::load(path);
  ASSERT_NE(back.find("a/b", 2), nullptr);
  EXPECT_EQ(back.find("a/b", 2)->variants, e.variants);
  EXPECT_EQ(back.find("a/b", 1), nullptr);

  write_text(path, R"({"lock_version": 1, "kernels": [{"repo_id": "a/b", "version": 1,
    "revision": "r", "manifest_sha256": "xyz", "variants": {}}]})");
  EXPECT_CONTAINS(error_of<FormatError>([&] { LockFile::load(path); }),
                  "kernels[0].manifest_sha256 must be 64 lower-case hex digits");
  write_text(path, R"({"lock_version": 1, "kernels": [{"repo_id": "a/b", "version": 1,
    "revision": "r", "manifest_sha256": ")" +
                       std::string(64, 'a') + R"(", "variants": {"v": {"../../etc/passwd": ")" +
                       std::string(64, 'a') + R"("}}}]})");
  EXPECT_CONTAINS(error_of<FormatError>([&] { LockFile::load(path); }), "is not inside build/v/");
  write_text(path, "{\"lock_version\": 3, \"kernels\": []}");
  EXPECT_CONTAINS(error_of<FormatError>([&] { LockFile::load(path); }), "lock_version 3");
  EXPECT_THROW(LockFile::load((dir.path() / "absent.lock").string()), NotFoundError);
}

}  // namespace
}  // namespace tformers
