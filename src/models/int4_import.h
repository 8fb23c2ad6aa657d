// 4-bit checkpoints from other tools, read into tformers' int4 form: AWQ (AutoAWQ's GEMM layout,
// quant_method "awq") and GPTQ (AutoGPTQ / Optimum, quant_method "gptq"). Each quantized linear
// "<prefix>.weight" (N, K) is stored as <prefix>.qweight, .qzeros, .scales (and, for GPTQ, .g_idx)
// with one scale and zero point per group of inputs; it becomes codes (N, K) in row order and one
// scale and zero point per block of 32 inputs (each block inside one group), which the backend
// lays out (Backend::prepare_quantized_linear). docs/quantization.md gives the formats.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "io/json.h"
#include "io/safetensors.h"
#include "tformers/tensor.h"

namespace tformers::models {

// A checked quantization_config of an AWQ or GPTQ checkpoint.
struct Int4Import {
  std::string method;      // "awq" or "gptq"
  int64_t group_size = 0;  // inputs per group; -1 (GPTQ): one group per row
  int zero_offset = 0;     // added to stored zero points: 1 for GPTQ's classic format
  bool desc_act = false;   // GPTQ: inputs quantized out of order, placed by g_idx
};

// quantization_config `q` (at `where`, "config.json: quantization_config") when its quant_method
// is "awq" or "gptq", else nullopt. UnsupportedError naming the field for what cannot load: bits
// other than 4, AWQ layouts other than GEMM or without zero points, GPTQ formats other than
// "gptq" and "gptq_v2", groups that are not a multiple of 32 inputs.
std::optional<Int4Import> read_int4_import(const io::Json& q, const std::string& where);

// The checkpoint tensors that hold the quantized linear "<prefix>.weight": qweight, qzeros,
// scales and, when present, g_idx.
std::vector<std::string> int4_import_parts(const io::Checkpoint& ckpt, const std::string& prefix);

struct Int4Codes {
  Tensor codes;  // u8 (N, K)
  Tensor scale;  // f16 (N, ceil(K / 32))
  Tensor zero;   // u8 (N, ceil(K / 32))
};

// The codes, scales and zero points of linear `prefix` of shape (N, K) in checkpoint `ckpt` (the
// folder `dir`). NotFoundError for a missing tensor and FormatError for a dtype or shape the
// format does not have or g_idx values out of range, naming the tensor and its file;
// UnsupportedError when g_idx puts the inputs of one block of 32 in different groups
// (desc_act's reordering), which one scale per block cannot express.
Int4Codes import_int4(const io::Checkpoint& ckpt, const std::string& dir, const Int4Import& q,
                      const std::string& prefix, int64_t N, int64_t K);

}  // namespace tformers::models
