#include "core/cpu_features.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tformers/error.h"

namespace tformers::cpu {

namespace {

#if defined(__x86_64__)
// CPUID directly: clang 14's __builtin_cpu_supports does not know "f16c" (GCC's does).
bool has_f16c() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

// AMX with bf16 tiles that this process may use: CPUID leaf 7 (EDX bit 22 AMX-BF16, bit 24
// AMX-TILE), the OS saving the tile state (XCR0 bits 17 and 18), and Linux's per-process leave
// for the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, since 5.16), without which the first tile
// instruction kills the process.
bool amx_usable() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24)))
    return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return false;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;
#if defined(__linux__)
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#endif

Target detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
  bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  bool bf16 =
      avx512 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vnni");
  if (bf16 && amx_usable()) return Target::kAMX;
  if (bf16) return Target::kAVX512BF16;
  if (avx512) return Target::kAVX512;
  if (avx2) return Target::kAVX2;
#endif
  return Target::kScalar;
}

// The CPUID vendor string ("GenuineIntel", "AuthenticAMD", ...).
std::string vendor() {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return "";
  char s[12];
  std::memcpy(s, &b, 4);
  std::memcpy(s + 4, &d, 4);
  std::memcpy(s + 8, &c, 4);
  return std::string(s, 12);
#else
  return "";
#endif
}

WeightPrefetch detect_prefetch() {
  if (const char* env = std::getenv("TFORMERS_CPU_PREFETCH"); env && *env) {
    const std::string_view s = env;
    for (WeightPrefetch p : {WeightPrefetch::kNonTemporal, WeightPrefetch::kT0})
      if (s == weight_prefetch_name(p)) return p;
    throw InvalidArgumentError(
        detail::str_cat("TFORMERS_CPU_PREFETCH='", s, "' is not a prefetch: use nta or t0"));
  }
  const std::string v = vendor();
  return v == "AuthenticAMD" || v == "HygonGenuine" ? WeightPrefetch::kNonTemporal
                                                    : WeightPrefetch::kT0;
}

Target parse_target(std::string_view s) {
  for (Target t :
       {Target::kScalar, Target::kAVX2, Target::kAVX512, Target::kAVX512BF16, Target::kAMX})
    if (s == target_name(t)) return t;
  throw InvalidArgumentError(detail::str_cat("TFORMERS_CPU_TARGET='", s,
                                             "' is not a target: use scalar, avx2, avx512, "
                                             "avx512bf16 or amx"));
}

std::atomic<int>& active_slot() {
  static std::atomic<int> slot = [] {
    Target t = detect();
    if (const char* env = std::getenv("TFORMERS_CPU_TARGET"); env && *env) {
      Target forced = parse_target(env);
      if (forced < t) t = forced;
    }
    return int(t);
  }();
  return slot;
}

}  // namespace

std::string_view target_name(Target t) {
  switch (t) {
    case Target::kScalar:
      return "scalar";
    case Target::kAVX2:
      return "avx2";
    case Target::kAVX512:
      return "avx512";
    case Target::kAVX512BF16:
      return "avx512bf16";
    case Target::kAMX:
      return "amx";
  }
  return "?";
}

Target detected_target() {
  static const Target t = detect();
  return t;
}

Target active_target() { return Target(active_slot().load(std::memory_order_relaxed)); }

void set_active_target(Target t) {
  if (t > detected_target())
    throw InvalidArgumentError(detail::str_cat(
        "CPU target ", target_name(t),
        " is not supported by this CPU (best: ", target_name(detected_target()), ")"));
  active_slot().store(int(t));
}

std::vector<Target> supported_targets() {
  std::vector<Target> out;
  for (int i = 0; i <= int(detected_target()); ++i) out.push_back(Target(i));
  return out;
}

WeightPrefetch weight_prefetch() {
  static const WeightPrefetch p = detect_prefetch();
  return p;
}

std::string_view weight_prefetch_name(WeightPrefetch p) {
  return p == WeightPrefetch::kNonTemporal ? "nta" : "t0";
}

std::string_view feature_string() {
  static const std::string s = [] {
    std::string out;
#if defined(__x86_64__)
    __builtin_cpu_init();
#define TF_FEATURE(name) \
  if (__builtin_cpu_supports(name)) out += std::string(out.empty() ? "" : " ") + name;
    TF_FEATURE("sse4.2")
    TF_FEATURE("avx")
    TF_FEATURE("avx2")
    TF_FEATURE("fma")
    if (has_f16c()) out += std::string(out.empty() ? "" : " ") + "f16c";
    TF_FEATURE("avx512f")
    TF_FEATURE("avx512bw")
    TF_FEATURE("avx512vl")
    TF_FEATURE("avx512dq")
    TF_FEATURE("avx512vnni")
    TF_FEATURE("avx512bf16")
    if (detected_target() == Target::kAMX) out += " amx-bf16";
#undef TF_FEATURE
#endif
    return out;
  }();
  return s;
}

}  // namespace tformers::cpu
