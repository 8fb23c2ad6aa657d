// The AVX-512 BF16 target's kernels (kernels_target_avx512bf16.cc, which is the AVX-512 file with
// the vdpbf16ps prefill path on) built over scalar stand-ins of their AVX-512 intrinsics
// (avx512_emulation.h) and the AVX2 the shared x86 code needs, as one more table for the
// op-consistency tests of test_kernels.cc: the AVX-512 code's index and lane logic is then
// checked on any AVX2 machine, not only on one with AVX-512. Its table function is renamed so
// that it cannot stand in for the library's own.
#include "ops/avx512_emulation.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define avx512bf16_kernels emulated_avx512bf16_kernels
#include "backends/cpu/kernels_target_avx512bf16.cc"
#undef avx512bf16_kernels
#pragma GCC pop_options
