// Variant selection: which build/<variant>/ folders fit a platform, in which order, and why the
// others are rejected.
#include <gtest/gtest.h>

#include "core/cpu_features.h"
#include "hub_test_util.h"
#include "tformers/error.h"
#include "tformers/kernels.h"

namespace tformers {
namespace {

using testing::TempDir;
using testing::write_text;

// A package whose variant folders each hold a (never loaded) library file, except the ones
// listed in `empty`.
void make_variants(const TempDir& dir, const std::vector<std::string>& names,
                   const std::vector<std::string>& empty = {}) {
  for (const auto& n : names) {
    std::filesystem::create_directories(dir.path() / "build" / n);
    if (std::find(empty.begin(), empty.end(), n) == empty.end())
      write_text(dir.path() / "build" / n / "libk.so", "not loaded by check_variants");
  }
}

KernelPlatform platform(const std::string& cpu) {
  return KernelPlatform{"linux", "x86_64", cpu, {"cpu"}};
}

const VariantCheck& find(const std::vector<VariantCheck>& v, const std::string& name) {
  for (const auto& c : v)
    if (c.name == name) return c;
  throw std::runtime_error("variant " + name + " not listed");
}

const std::vector<std::string> kAll = {"cabi1-cpu-x86_64-avx512bf16-linux",
                                       "cabi1-cpu-x86_64-avx2-linux",
                                       "cabi1-cpu-x86_64-linux",
                                       "cabi1-cpu-x86_64-avx512-linux",
                                       "cabi2-cpu-x86_64-avx2-linux",
                                       "cabi1-cuda-x86_64-linux",
                                       "cabi1-cpu-aarch64-linux",
                                       "cabi1-cpu-x86_64-darwin",
                                       "cabi1-cpu-x86_64-sve-linux",
                                       "torch27-cxx11-cpu-x86_64-linux",
                                       "cabiX-cpu-x86_64-linux"};

TEST(Variants, Avx2MachinePicksAvx2AndSaysWhyEachOtherIsRejected) {
  TempDir dir;
  make_variants(dir, kAll, {"cabi1-cpu-x86_64-avx512-linux"});
  auto v = check_variants(dir.str(), platform("avx2"));
  ASSERT_EQ(v.size(), kAll.size());
  EXPECT_EQ(v[0].name, "cabi1-cpu-x86_64-avx2-linux");
  EXPECT_TRUE(v[0].compatible);
  EXPECT_EQ(v[1].name, "cabi1-cpu-x86_64-linux");
  EXPECT_TRUE(v[1].compatible);
  for (size_t i = 2; i < v.size(); ++i) EXPECT_FALSE(v[i].compatible) << v[i].name;

  EXPECT_NE(find(v, "cabi1-cpu-x86_64-avx512bf16-linux").reason.find("needs avx512bf16"),
            std::string::npos);
  EXPECT_NE(find(v, "cabi1-cpu-x86_64-avx512-linux").reason.find("needs avx512"),
            std::string::npos);
  EXPECT_NE(find(v, "cabi2-cpu-x86_64-avx2-linux").reason.find("C ABI version 2"),
            std::string::npos);
  EXPECT_NE(find(v, "cabi1-cuda-x86_64-linux").reason.find("backend 'cuda'"), std::string::npos);
  EXPECT_NE(find(v, "cabi1-cpu-aarch64-linux").reason.find("built for aarch64"), std::string::npos);
  EXPECT_NE(find(v, "cabi1-cpu-x86_64-darwin").reason.find("built for darwin"), std::string::npos);
  EXPECT_NE(find(v, "cabi1-cpu-x86_64-sve-linux").reason.find("unknown CPU feature set 'sve'"),
            std::string::npos);
  EXPECT_NE(find(v, "torch27-cxx11-cpu-x86_64-linux").reason.find("does not read cabi"),
            std::string::npos);
  EXPECT_NE(find(v, "cabiX-cpu-x86_64-linux").reason.find("is not cabi<N>"), std::string::npos);
}

TEST(Variants, MoreCapableCpuPrefersTheMostCapableVariant) {
  TempDir dir;
  make_variants(dir, kAll, {"cabi1-cpu-x86_64-avx512-linux"});
  auto v = check_variants(dir.str(), platform("avx512bf16"));
  EXPECT_EQ(v[0].name, "cabi1-cpu-x86_64-avx512bf16-linux");
  EXPECT_EQ(v[1].name, "cabi1-cpu-x86_64-avx2-linux");
  EXPECT_EQ(v[2].name, "cabi1-cpu-x86_64-linux");
  EXPECT_FALSE(v[3].compatible);
  // Fits the CPU but holds no library.
  EXPECT_NE(find(v, "cabi1-cpu-x86_64-avx512-linux").reason.find("no shared library"),
            std::string::npos);

  auto scalar = check_variants(dir.str(), platform("scalar"));
  EXPECT_EQ(scalar[0].name, "cabi1-cpu-x86_64-linux");
  EXPECT_FALSE(scalar[1].compatible);
}

TEST(Variants, ManifestBackendsLimitTheChoice) {
  TempDir dir;
  make_variants(dir, {"cabi1-cpu-x86_64-linux"});
  KernelPlatform p = platform("avx2");
  auto v = check_variants(dir.str(), p, {"cuda"});
  ASSERT_EQ(v.size(), 1u);
  EXPECT_FALSE(v[0].compatible);
  EXPECT_NE(v[0].reason.find("not among the manifest's backends"), std::string::npos);
}

TEST(Variants, TwoLibrariesInOneVariantAreRejected) {
  TempDir dir;
  make_variants(dir, {"cabi1-cpu-x86_64-linux"});
  write_text(dir.path() / "build" / "cabi1-cpu-x86_64-linux" / "libother.so", "x");
  auto v = check_variants(dir.str(), platform("avx2"));
  EXPECT_FALSE(v[0].compatible);
  EXPECT_NE(v[0].reason.find("2 shared libraries"), std::string::npos);
}

TEST(Variants, PackageWithoutBuildFolderIsNotFound) {
  TempDir dir;
  EXPECT_THROW(check_variants(dir.str(), platform("avx2")), NotFoundError);
}

// The project's own package on this machine: the most capable variant the CPU runs is picked
// and the others are rejected with the CPU target named. On the development machine (AVX2, no
// AVX-512) that is avx2, with avx512bf16 rejected.
TEST(Variants, BuiltFusedNormsPackageOnThisMachine) {
  auto v = check_variants(testing::fused_norms(1).string(), KernelPlatform::current());
  ASSERT_EQ(v.size(), 3u);
  const cpu::Target t = cpu::active_target();
  const std::string best = t >= cpu::Target::kAVX512BF16 ? "cabi1-cpu-x86_64-avx512bf16-linux"
                           : t >= cpu::Target::kAVX2     ? "cabi1-cpu-x86_64-avx2-linux"
                                                         : "cabi1-cpu-x86_64-linux";
  EXPECT_EQ(v[0].name, best);
  EXPECT_TRUE(v[0].compatible);
  if (t < cpu::Target::kAVX512BF16) {
    const VariantCheck& r = find(v, "cabi1-cpu-x86_64-avx512bf16-linux");
    EXPECT_FALSE(r.compatible);
    EXPECT_NE(r.reason.find("needs avx512bf16"), std::string::npos) << r.reason;
  }
}

}  // namespace
}  // namespace tformers
