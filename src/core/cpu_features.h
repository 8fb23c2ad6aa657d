// CPU instruction-set targets, chosen at run time. Kernels are compiled once per target
// (files named *_target_<name>.cc get that target's flags) and the best one the CPU supports is
// used, unless TFORMERS_CPU_TARGET names a lower one (scalar, avx2, avx512, avx512bf16).
#pragma once

#include <string_view>
#include <vector>

namespace tformers::cpu {

// Ordered from least to most capable.
enum class Target { kScalar = 0, kAVX2 = 1, kAVX512 = 2, kAVX512BF16 = 3 };

std::string_view target_name(Target t);
// The best target this CPU supports.
Target detected_target();
// The target kernels use now: detected_target(), lowered by TFORMERS_CPU_TARGET.
Target active_target();
// Forces a target for tests and benchmarks; throws InvalidArgumentError if the CPU lacks it.
void set_active_target(Target t);
// Every target this CPU can run, lowest first (the op-consistency tests loop over these).
std::vector<Target> supported_targets();
// Feature names for `tformers env`: "avx2 fma f16c avx512f ...".
std::string_view feature_string();

}  // namespace tformers::cpu
