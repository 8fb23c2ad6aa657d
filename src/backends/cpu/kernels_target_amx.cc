// AMX kernels: the AVX-512 BF16 target's (kernels_target_avx512.cc with TF_AVX512_BF16) with
// every linear of bf16 weights on AMX tiles (TF_AMX): the rest stays one source for the three
// AVX-512 targets.
#define TF_AVX512_BF16 1
#define TF_AMX 1
#include "backends/cpu/kernels_target_avx512.cc"
