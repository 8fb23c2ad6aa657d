// CPU instruction-set targets, chosen at run time. Kernels are compiled once per target
// (files named *_target_<name>.cc get that target's flags) and the best one the CPU supports is
// used, unless TFORMERS_CPU_TARGET names a lower one (scalar, avx2, avx512, avx512bf16, amx).
#pragma once

#include <string_view>
#include <vector>

namespace tformers::cpu {

// Ordered from least to most capable.
// kAMX is the AVX-512 BF16 target with bf16 linears on AMX tiles (Intel Sapphire Rapids and
// later): it needs the kernel's leave to use the tile state, which detection asks for once.
enum class Target { kScalar = 0, kAVX2 = 1, kAVX512 = 2, kAVX512BF16 = 3, kAMX = 4 };

std::string_view target_name(Target t);
// The best target this CPU supports.
Target detected_target();
// The target kernels use now: detected_target(), lowered by TFORMERS_CPU_TARGET.
Target active_target();
// Forces a target for tests and benchmarks; throws InvalidArgumentError if the CPU lacks it.
void set_active_target(Target t);
// Every target this CPU can run, lowest first (the op-consistency tests loop over these).
std::vector<Target> supported_targets();
// How kernels prefetch the weights they stream once per call (the decode GEMV's rows, the GEMM's
// panels). PREFETCHNTA keeps them out of the caches the activations live in, and on AMD Zen it
// streams best (96 % of a plain read loop against 86 % with T0, one row, one thread). On Intel's
// Xeons it fills L1 only, so the L2 streamer never runs ahead and a later pass over the same rows
// (a decode step of more than 4 rows) reads memory again: on an Ice Lake Xeon, T0 made the
// Qwen3-0.6B decode linears 2.8x faster for 1 row and 2.2x for 16 (bench/RESULTS.md).
enum class WeightPrefetch { kNonTemporal, kT0 };
// kNonTemporal on AMD and Hygon CPUs, kT0 on every other, unless TFORMERS_CPU_PREFETCH says
// "nta" or "t0" (for measuring a CPU); throws InvalidArgumentError for another value.
WeightPrefetch weight_prefetch();
std::string_view weight_prefetch_name(WeightPrefetch p);
// Feature names for `tformers env`: "avx2 fma f16c avx512f ...".
std::string_view feature_string();

}  // namespace tformers::cpu
