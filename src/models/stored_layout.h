// Weights a checkpoint lays out other than as tformers holds them (WeightSpec::stored): gpt-oss's
// experts transposed, with gate and up rows interleaved, or in MXFP4. They are read into the
// weight's own shape at load, and written back in the checkpoint's float layout by
// save_pretrained.
#pragma once

#include <string>
#include <vector>

#include "io/safetensors.h"
#include "models/architecture.h"
#include "tformers/tensor.h"

namespace tformers::models {

// Whether the checkpoint holds `s` in a layout other than its own: its StoredLayout says how.
bool stored_differently(const io::Checkpoint& ckpt, const WeightSpec& s);

// The checkpoint tensors that hold `s`: "<name>", or "<name>_blocks" and "<name>_scales" when it
// is stored as MXFP4 (s.stored.mxfp4 and no float tensor of its name).
std::vector<std::string> stored_sources(const io::Checkpoint& ckpt, const WeightSpec& s);

// Whether the checkpoint holds `s` as MXFP4 blocks and scales.
bool stored_as_mxfp4(const io::Checkpoint& ckpt, const WeightSpec& s);

// MXFP4 experts (E, N, K) as stored, checked as read_stored checks them and with their rows
// de-interleaved as it would: codes u8 (E * N, K / 2) and exponents u8 (E * N, K / 32), the
// operands of graph::QuantScheme::kMxfp4 rows, expert after expert.
struct Mxfp4Rows {
  Tensor codes, scales;
};
Mxfp4Rows read_mxfp4_rows(const io::Checkpoint& ckpt, const WeightSpec& s);

// The inverse, for save_pretrained: "<name>_blocks" and "<name>_scales" as the checkpoint holds
// them.
std::vector<std::pair<std::string, Tensor>> to_stored_mxfp4(const WeightSpec& s,
                                                            const Tensor& codes,
                                                            const Tensor& scales);

// `s` read from the checkpoint in s.shape and `dtype`: transposed back, its halves
// de-interleaved, MXFP4 dequantized exactly. FormatError naming the tensor and file for a shape
// or dtype that does not fit config.json, or an MXFP4 scale that is NaN (0xFF).
Tensor read_stored(const io::Checkpoint& ckpt, const WeightSpec& s, DType dtype);

// `t` (in the weight's shape) in the float layout `l` describes, for save_pretrained.
Tensor to_stored(const Tensor& t, const StoredLayout& l);

// MXFP4: `groups` groups of 32 values, each 16 bytes of e2m1 codes (value 2i in the low nibble
// of byte i, 2i + 1 in the high one) and one e8m0 scale, 2^(scale - 127).
void dequantize_mxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t groups, float* out);

}  // namespace tformers::models
