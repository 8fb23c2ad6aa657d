// Weight preparation for the CPU backend: weight-only int8 and int4 quantization at load.
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "core/thread_pool.h"
#include "tformers/error.h"

namespace tformers::backends {

namespace {
// The weight as f32 or bf16, the dtypes the quantizers read.
Tensor quantizer_input(const Tensor& w) {
  return (w.dtype() == DType::f32 || w.dtype() == DType::bf16) ? w : w.to(DType::f32);
}

// (N,K) int8 values and (N, ceil(K / 32)) f32 block scales for a float weight (see
// cpu::quantize_int8).
PreparedWeight prepare_int8(Backend& backend, const Tensor& w) {
  Tensor src = quantizer_input(w);
  const int64_t N = w.dim(0), K = w.dim(1);
  Tensor q = Tensor::zeros({N, K}, DType::i8);
  Tensor scale = Tensor::zeros({N, cpu::int8_blocks(K)}, DType::f32);
  cpu::quantize_int8(src.raw(), src.dtype(), q.data<int8_t>(), scale.data<float>(), N, K,
                     ThreadPool::global());
  return {backend.upload(q), backend.upload(scale), nullptr};
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
  return {backend.upload(q), backend.upload(scale), nullptr};
}

}  // namespace

PreparedWeight QuantizedLayoutBackend::prepare_linear(const Tensor& w,
                                                      const std::string& quantize) {
  if (quantize == "int8") return prepare_int8(*this, w);
  if (quantize == "int4") return prepare_int4(*this, w);
  return Backend::prepare_linear(w, quantize);
}

// The tiles of codes in row order, and the scales and zero points re-laid by row group.
PreparedWeight QuantizedLayoutBackend::prepare_linear_int4(const Tensor& codes, const Tensor& scale,
                                                           const Tensor& zero) {
  const int64_t N = codes.dim(0), K = codes.dim(1), nb = cpu::int4_blocks(K);
  TF_CHECK(N % cpu::kInt4Rows == 0 && codes.dtype() == DType::u8 &&
               scale.shape() == Shape({N, nb}) && scale.dtype() == DType::f16 &&
               zero.shape() == Shape({N, nb}) && zero.dtype() == DType::u8,
           "pack_int4: codes ", shape_str(codes.shape()), " scale ", shape_str(scale.shape()),
           " zero ", shape_str(zero.shape()));
  const int64_t groups = N / cpu::kInt4Rows;
  Tensor tiles = Tensor::zeros({groups, nb, cpu::kInt4TileBytes}, DType::u8);
  Tensor s = Tensor::zeros({groups, nb, cpu::kInt4Rows}, DType::f16);
  Tensor z = Tensor::zeros({groups, nb, cpu::kInt4Rows}, DType::u8);
  ThreadPool::global().parallel_for(groups, [&](int64_t g0, int64_t g1, int) {
    for (int64_t g = g0; g < g1; ++g) {
      cpu::pack_int4_tiles(codes.data<uint8_t>() + g * cpu::kInt4Rows * K, K, K,
                           tiles.data<uint8_t>() + g * nb * cpu::kInt4TileBytes);
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t j = 0; j < cpu::kInt4Rows; ++j) {
          const int64_t from = (g * cpu::kInt4Rows + j) * nb + b, to = (g * nb + b) * 8 + j;
          s.data<uint16_t>()[to] = scale.data<uint16_t>()[from];
          z.data<uint8_t>()[to] = zero.data<uint8_t>()[from];
        }
    }
  });
  return {upload(tiles), upload(s), upload(z)};
}

}  // namespace tformers::backends
