/* The C ABI between tformers and a hub kernel package's shared library.
 *
 * A package library exports exactly one entry point,
 *
 *     const TfKernelTable* tformers_kernel_table(void);
 *
 * returning a table that lives as long as the library is loaded. tformers checks
 * table->abi_version against TF_KERNEL_ABI_VERSION before it reads anything else, so a library
 * built against another ABI is refused with a message instead of being called with the wrong
 * layout. Every kernel reports failure through its return value and the error buffer: nothing
 * may throw (or longjmp) across this boundary, so packages written in C++ are compiled with
 * -fno-exceptions and every exported function is noexcept.
 *
 * This header is C (C99) so a package can be written in any language with a C FFI.
 */
#ifndef TFORMERS_KERNEL_ABI_H_
#define TFORMERS_KERNEL_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any change to the structs or calling conventions below. Variant folders carry it
 * in their name ("cabi1-cpu-x86_64-avx2-linux"). */
#define TF_KERNEL_ABI_VERSION 1
#define TF_KERNEL_ENTRY_POINT "tformers_kernel_table"

/* Element types, numbered as tformers::DType. */
enum {
  TF_KERNEL_F32 = 0,
  TF_KERNEL_BF16 = 1,
  TF_KERNEL_F16 = 2,
  TF_KERNEL_I32 = 3,
  TF_KERNEL_I64 = 4,
};

/* A dense, row-major tensor owned by tformers. Shapes are outermost first. */
typedef struct TfKernelTensor {
  void* data;
  int32_t dtype; /* TF_KERNEL_* */
  int32_t ndim;
  const int64_t* shape;
} TfKernelTensor;

/* Runs body(arg, begin, end) over chunks of [0, n) on the host's thread pool and returns when
 * all chunks are done. Chunk boundaries are multiples of grain. body must not throw. */
typedef void (*TfKernelParallelFor)(void* host, int64_t n, int64_t grain,
                                    void (*body)(void* arg, int64_t begin, int64_t end), void* arg);

/* One call of a kernel. inputs follow the layer's argument schema, in order; the output is
 * preallocated with the shape the layer contract gives and never aliases an input. */
typedef struct TfKernelCall {
  const TfKernelTensor* inputs;
  int32_t num_inputs;
  const TfKernelTensor* output;
  const float* float_attrs; /* the schema's float attributes, in order (eps, scale, inv_freq) */
  int32_t num_float_attrs;
  const int64_t* int_attrs;
  int32_t num_int_attrs;
  TfKernelParallelFor parallel_for; /* never null */
  void* host;                       /* first argument of parallel_for */
  char* error;                      /* on failure, a NUL-terminated message (at most error_size) */
  size_t error_size;
} TfKernelCall;

/* Returns 0 on success, non-zero after writing a message into call->error. */
typedef int (*TfKernelFn)(const TfKernelCall* call);

/* Modes a kernel supports (bit mask): prefill (several new tokens per step), decode (one). */
enum { TF_KERNEL_MODE_PREFILL = 1, TF_KERNEL_MODE_DECODE = 2 };

typedef struct TfKernelEntry {
  const char* layer; /* "RMSNorm", "SiLUAndMul", "RotaryEmbedding", "Attention" */
  /* The argument schema, canonical form: inputs ';' attributes '->' output, each argument
   * "name:dtype[|dtype...]", e.g. "x:f32,weight:f32|bf16;eps:f32->y:f32". Must equal the
   * manifest's schema for the layer. */
  const char* schema;
  uint32_t modes; /* TF_KERNEL_MODE_* bits */
  TfKernelFn fn;
} TfKernelEntry;

typedef struct TfKernelTable {
  uint32_t abi_version; /* TF_KERNEL_ABI_VERSION the library was built against; read first */
  uint32_t struct_size; /* sizeof(TfKernelTable) in the library */
  const char* name;     /* package name, as in the manifest */
  const char* version;  /* "1.2.0", as in the manifest */
  uint32_t num_kernels;
  const TfKernelEntry* kernels;
} TfKernelTable;

typedef const TfKernelTable* (*TfKernelTableFn)(void);

#ifdef __cplusplus
}
#endif

#endif /* TFORMERS_KERNEL_ABI_H_ */
