// The AMX target's kernels (kernels_target_amx.cc: the AVX-512 BF16 file with bf16 linears on
// AMX tiles) built over stand-ins of their tile instructions and AVX-512 intrinsics
// (amx_emulation.h, avx512_emulation.h), as one more table for the op-consistency tests of
// test_kernels.cc: the AMX linear's blocking, packing, padding and stores are then checked on any
// AVX2 machine, not only on one with AMX. Its table function is renamed so that it cannot stand
// in for the library's own.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "backends/cpu/kernels.h"
#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "ops/avx2_region.h"
#include "tformers/dtype.h"

// As avx512_emulated.cc: the stand-ins and the kernel code are AVX2 code, nothing else.
TFORMERS_AVX2_BEGIN
#include "ops/amx_emulation.h"
#include "ops/avx512_emulation.h"
#define amx_kernels emulated_amx_kernels
#include "backends/cpu/kernels_target_amx.cc"
#undef amx_kernels
TFORMERS_AVX2_END
