// The AVX-512 BF16 target's kernels (kernels_target_avx512bf16.cc, which is the AVX-512 file with
// the vdpbf16ps prefill path on) built over scalar stand-ins of their AVX-512 intrinsics
// (avx512_emulation.h) and the AVX2 the shared x86 code needs, as one more table for the
// op-consistency tests of test_kernels.cc: the AVX-512 code's index and lane logic is then
// checked on any AVX2 machine, not only on one with AVX-512. Its table function is renamed so
// that it cannot stand in for the library's own.
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

// What the kernels include comes first, out of the region: only their own code is AVX2 code, not
// an inline function the rest of the binary may share.

// The stand-ins take and return AVX2 vectors, so they are AVX2 code too.
TFORMERS_AVX2_BEGIN
#include "ops/avx512_emulation.h"
#define avx512bf16_kernels emulated_avx512bf16_kernels
#include "backends/cpu/kernels_target_avx512bf16.cc"
#undef avx512bf16_kernels
TFORMERS_AVX2_END
