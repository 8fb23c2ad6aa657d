// Weight preparation for the CPU backend: weight-only int8 quantization at load.
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "core/thread_pool.h"

namespace tformers::backends {

// (N,K) int8 values and (N, ceil(K / 32)) f32 block scales for a float weight (see
// cpu::quantize_int8).
PreparedWeight prepare_int8(Backend& backend, const Tensor& w) {
  Tensor src = (w.dtype() == DType::f32 || w.dtype() == DType::bf16) ? w : w.to(DType::f32);
  const int64_t N = w.dim(0), K = w.dim(1);
  Tensor q = Tensor::zeros({N, K}, DType::i8);
  Tensor scale = Tensor::zeros({N, cpu::int8_blocks(K)}, DType::f32);
  cpu::quantize_int8(src.raw(), src.dtype(), q.data<int8_t>(), scale.data<float>(), N, K,
                     ThreadPool::global());
  return {backend.upload(q), backend.upload(scale)};
}

}  // namespace tformers::backends
