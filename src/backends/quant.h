// Weight-only quantized linears as formats hold them, before a backend lays them out: what a
// tformers checkpoint stores (int8 rows, int4 tiles), what AWQ and GPTQ imports give (int4 rows
// with zero points) and what the host quantizer makes. Backend::prepare_quantized_linear takes
// any of them and keeps the layout it computes with (graph::QuantLayout); these helpers convert.
#pragma once

#include <optional>

#include "graph/graph.h"
#include "tformers/tensor.h"

namespace tformers::backends {

// A linear weight of `rows` outputs by `cols` inputs in one of the layouts of graph.h
// (graph::QuantLayout): weight, scale and zero hold the operand types of Op::kLinearQuant.
struct QuantizedLinear {
  graph::QuantScheme scheme = graph::QuantScheme::kInt8;
  graph::QuantLayout layout = graph::QuantLayout::kRows;
  int64_t rows = 0, cols = 0;
  Tensor weight, scale;
  std::optional<Tensor> zero;  // int4 from a format with zero points

  graph::LinearQuantAttrs attrs() const { return {scheme, layout, zero.has_value()}; }
};

// w (N,K), f32, bf16 or f16, quantized on the host: "int8" to int8 rows; "int4" to int4 tiles
// (the CPU quantizer's own output), or to int8 rows where N does not divide into tiles of 8 (no
// projection of a released model; a vocabulary such as 32001), as llama.cpp falls back to
// another type for a tensor its format cannot hold. UnsupportedError for another scheme.
QuantizedLinear quantize_on_host(const Tensor& w, const std::string& scheme);

// An int4 weight from one code in [0, 15] per byte, codes u8 (N,K), with scale f16 and zero u8
// (N, ceil(K / 32)) (zero absent: 8), in the kRows layout (two codes a byte).
QuantizedLinear int4_rows(const Tensor& codes, Tensor scale, std::optional<Tensor> zero);

// The same weight in the other layout (a copy; `q` itself when it is already there).
// to_tiles: UnsupportedError for int8, which has no tiles, and for N not a multiple of 8.
QuantizedLinear to_rows(const QuantizedLinear& q);
QuantizedLinear to_tiles(const QuantizedLinear& q);

}  // namespace tformers::backends
