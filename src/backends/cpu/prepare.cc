// Weight preparation for the CPU backend: weight-only int8 and int4 quantization at load.
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "core/thread_pool.h"

namespace tformers::backends {

namespace {
// The weight as f32 or bf16, the dtypes the quantizers read.
Tensor quantizer_input(const Tensor& w) {
  return (w.dtype() == DType::f32 || w.dtype() == DType::bf16) ? w : w.to(DType::f32);
}
}  // namespace

// (N,K) int8 values and (N, ceil(K / 32)) f32 block scales for a float weight (see
// cpu::quantize_int8).
PreparedWeight prepare_int8(Backend& backend, const Tensor& w) {
  Tensor src = quantizer_input(w);
  const int64_t N = w.dim(0), K = w.dim(1);
  Tensor q = Tensor::zeros({N, K}, DType::i8);
  Tensor scale = Tensor::zeros({N, cpu::int8_blocks(K)}, DType::f32);
  cpu::quantize_int8(src.raw(), src.dtype(), q.data<int8_t>(), scale.data<float>(), N, K,
                     ThreadPool::global());
  return {backend.upload(q), backend.upload(scale)};
}

// int4 tiles and their f16 scales (see cpu::quantize_int4). The tiles take rows 8 at a time, so
// a weight whose rows do not divide by 8 (no projection of a released model; a vocabulary such
// as 32001) is quantized to int8 instead, as llama.cpp falls back to another type for a tensor
// whose shape its format cannot hold.
PreparedWeight prepare_int4(Backend& backend, const Tensor& w) {
  const int64_t N = w.dim(0), K = w.dim(1);
  if (N % cpu::kInt4Rows != 0) return prepare_int8(backend, w);
  Tensor src = quantizer_input(w);
  const int64_t groups = N / cpu::kInt4Rows, nb = cpu::int4_blocks(K);
  Tensor q = Tensor::zeros({groups, nb, cpu::kInt4TileBytes}, DType::u8);
  Tensor scale = Tensor::zeros({groups, nb, cpu::kInt4Rows}, DType::f16);
  cpu::quantize_int4(src.raw(), src.dtype(), q.data<uint8_t>(), scale.data<uint16_t>(), N, K,
                     ThreadPool::global());
  return {backend.upload(q), backend.upload(scale)};
}

}  // namespace tformers::backends
