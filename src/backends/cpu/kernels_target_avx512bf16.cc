// AVX-512 BF16 kernels: the AVX-512 kernels compiled with -mavx512bf16 -mavx512vnni, plus the
// vdpbf16ps prefill path for bf16 weights (enabled by TF_AVX512_BF16). Sharing one source keeps
// the two targets identical everywhere else, so a fix to one cannot miss the other.
#define TF_AVX512_BF16 1
#include "backends/cpu/kernels_target_avx512.cc"
