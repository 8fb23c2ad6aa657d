// Code between TFORMERS_AVX2_BEGIN and TFORMERS_AVX2_END is compiled for AVX2, FMA and F16C, the
// rest of its file for the baseline, so that a test binary holding AVX2 kernels still starts
// (and skips them) on a CPU without AVX2. GCC says it with its target pragma, clang with an
// attribute applied to every function declared in between.
#pragma once

#if defined(__clang__)
#define TFORMERS_AVX2_BEGIN \
  _Pragma("clang attribute push(__attribute__((target(\"avx2,fma,f16c\"))), apply_to = function)")
#define TFORMERS_AVX2_END _Pragma("clang attribute pop")
#else
#define TFORMERS_AVX2_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,f16c\")")
#define TFORMERS_AVX2_END _Pragma("GCC pop_options")
#endif
