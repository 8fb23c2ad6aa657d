#include "backends/quant.h"

#include <cstring>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/thread_pool.h"
#include "tformers/error.h"

namespace tformers::backends {

static_assert(graph::kQuantBlock == cpu::kInt8Block && graph::kQuantBlock == cpu::kInt4Block &&
                  graph::kInt4Rows == cpu::kInt4Rows,
              "the graph's quantized layouts are the CPU kernels'");

using graph::QuantLayout;
using graph::QuantScheme;

namespace {
int64_t blocks(int64_t K) { return (K + graph::kQuantBlock - 1) / graph::kQuantBlock; }

// A weight's operands of the graph's types for its scheme and layout, zero-filled.
QuantizedLinear zeros(QuantScheme scheme, QuantLayout layout, int64_t N, int64_t K) {
  const graph::QuantOperandTypes t = graph::quant_operand_types(scheme, layout, N, K);
  return {scheme,
          layout,
          N,
          K,
          Tensor::zeros(t.weight.shape, t.weight.dtype),
          Tensor::zeros(t.scale.shape, t.scale.dtype)};
}

// Input k's 4-bit code in a row of kRows codes, two a byte, the low nibble for even k.
uint8_t row_code(const uint8_t* row, int64_t k) { return (row[k / 2] >> (4 * (k % 2))) & 15; }
void set_row_code(uint8_t* row, int64_t k, uint8_t code) {
  row[k / 2] |= uint8_t(code << (4 * (k % 2)));
}

// A per-(row, block) tensor (scale or zero point) moved between (N, nb) and the tiles'
// (N / 8, nb, 8), element by element; `to_tiles` says which way.
Tensor relay(const Tensor& t, int64_t N, int64_t nb, bool to_tiles) {
  const size_t esize = dtype_size(t.dtype());
  Tensor out = to_tiles ? Tensor::zeros({N / graph::kInt4Rows, nb, graph::kInt4Rows}, t.dtype())
                        : Tensor::zeros({N, nb}, t.dtype());
  const auto* src = static_cast<const char*>(t.raw());
  auto* dst = static_cast<char*>(out.raw());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t row = n * nb + b;
      const int64_t tile =
          ((n / graph::kInt4Rows) * nb + b) * graph::kInt4Rows + n % graph::kInt4Rows;
      const int64_t from = to_tiles ? row : tile, to = to_tiles ? tile : row;
      std::memcpy(dst + to * esize, src + from * esize, esize);
    }
  return out;
}
}  // namespace

QuantizedLinear quantize_on_host(const Tensor& w, const std::string& scheme) {
  TF_CHECK(w.shape().size() == 2, "quantize: weight ", shape_str(w.shape()), " is not (N, K)");
  if (scheme != "int8" && scheme != "int4")
    throw UnsupportedError("quantize '" + scheme + "' is not supported: use \"int8\" or \"int4\"");
  // The quantizers read f32 or bf16.
  const Tensor src = (w.dtype() == DType::f32 || w.dtype() == DType::bf16) ? w : w.to(DType::f32);
  const int64_t N = w.dim(0), K = w.dim(1);
  if (scheme == "int4" && N % graph::kInt4Rows == 0) {
    QuantizedLinear q = zeros(QuantScheme::kInt4, QuantLayout::kTiles, N, K);
    cpu::quantize_int4(src.raw(), src.dtype(), q.weight.data<uint8_t>(), q.scale.data<uint16_t>(),
                       N, K, ThreadPool::global());
    return q;
  }
  QuantizedLinear q = zeros(QuantScheme::kInt8, QuantLayout::kRows, N, K);
  cpu::quantize_int8(src.raw(), src.dtype(), q.weight.data<int8_t>(), q.scale.data<float>(), N, K,
                     ThreadPool::global());
  return q;
}

QuantizedLinear int4_rows(const Tensor& codes, Tensor scale, std::optional<Tensor> zero) {
  const int64_t N = codes.dim(0), K = codes.dim(1);
  TF_CHECK(codes.dtype() == DType::u8 && scale.shape() == Shape({N, blocks(K)}) &&
               scale.dtype() == DType::f16 &&
               (!zero || (zero->shape() == scale.shape() && zero->dtype() == DType::u8)),
           "int4_rows: codes ", shape_str(codes.shape()), " scale ", shape_str(scale.shape()));
  QuantizedLinear r = zeros(QuantScheme::kInt4, QuantLayout::kRows, N, K);
  r.scale = std::move(scale);
  r.zero = std::move(zero);
  const uint8_t* c = codes.data<uint8_t>();
  uint8_t* p = r.weight.data<uint8_t>();
  const int64_t stride = r.weight.dim(1);
  ThreadPool::global().parallel_for(N, [&](int64_t n0, int64_t n1, int) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t k = 0; k < K; ++k) set_row_code(p + n * stride, k, c[n * K + k]);
  });
  return r;
}

QuantizedLinear to_rows(const QuantizedLinear& q) {
  if (q.layout == QuantLayout::kRows) return q;
  const int64_t N = q.rows, K = q.cols, nb = blocks(K);
  QuantizedLinear r = zeros(QuantScheme::kInt4, QuantLayout::kRows, N, K);
  r.scale = relay(q.scale, N, nb, false);
  if (q.zero) r.zero = relay(*q.zero, N, nb, false);
  const uint8_t* tiles = q.weight.data<uint8_t>();
  uint8_t* p = r.weight.data<uint8_t>();
  const int64_t stride = r.weight.dim(1);
  ThreadPool::global().parallel_for(N, [&](int64_t n0, int64_t n1, int) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t k = 0; k < K; ++k)
        set_row_code(p + n * stride, k, cpu::int4_code(tiles, K, n, k));
  });
  return r;
}

QuantizedLinear to_tiles(const QuantizedLinear& q) {
  if (q.layout == QuantLayout::kTiles) return q;
  if (q.scheme != QuantScheme::kInt4) throw UnsupportedError("int8 weights have no tiled layout");
  const int64_t N = q.rows, K = q.cols, nb = blocks(K);
  if (N % graph::kInt4Rows != 0)
    throw UnsupportedError("an int4 weight of " + std::to_string(N) +
                           " rows does not divide into the tiles of 8 rows the CPU kernels "
                           "read; quantize that weight to int8");
  QuantizedLinear t = zeros(QuantScheme::kInt4, QuantLayout::kTiles, N, K);
  t.scale = relay(q.scale, N, nb, true);
  if (q.zero) t.zero = relay(*q.zero, N, nb, true);
  const uint8_t* p = q.weight.data<uint8_t>();
  const int64_t stride = q.weight.dim(1);
  ThreadPool::global().parallel_for(N / graph::kInt4Rows, [&](int64_t g0, int64_t g1, int) {
    std::vector<uint8_t> codes(size_t(graph::kInt4Rows * K));
    for (int64_t g = g0; g < g1; ++g) {
      for (int64_t j = 0; j < graph::kInt4Rows; ++j)
        for (int64_t k = 0; k < K; ++k)
          codes[size_t(j * K + k)] = row_code(p + (g * graph::kInt4Rows + j) * stride, k);
      cpu::pack_int4_tiles(codes.data(), K, K,
                           t.weight.data<uint8_t>() + g * nb * cpu::kInt4TileBytes);
    }
  });
  return t;
}

}  // namespace tformers::backends
