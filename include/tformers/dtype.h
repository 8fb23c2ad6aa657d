// Element types and the bf16/f16 conversions (round to nearest, ties to even).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tformers {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, i8, u8 };

size_t dtype_size(DType t);
// Lower-case names as in PyTorch: "float32", "bfloat16", "float16", "int32", "int64", ...
std::string_view dtype_name(DType t);
// Short names, as in MLIR and kernel signatures: "f32", "bf16", "f16", "i32", "i64", "i8", "u8".
std::string_view dtype_short_name(DType t);
// Accepts PyTorch names ("bfloat16", "torch.bfloat16", "bf16", "float32", "fp32", ...).
// Throws InvalidArgumentError listing the accepted names.
DType parse_dtype(std::string_view name);
inline bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// Convenience constants so `{.dtype = tformers::bfloat16}` reads as in Transformers.
inline constexpr DType float32 = DType::f32;
inline constexpr DType bfloat16 = DType::bf16;
inline constexpr DType float16 = DType::f16;

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                         // nearest even
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Bulk conversions used by loaders and kernels' reference paths.
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

}  // namespace tformers
