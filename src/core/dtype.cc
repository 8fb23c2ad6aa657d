#include "tformers/dtype.h"

#include <cstring>

#include "tformers/error.h"

namespace tformers {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::bf16:
    case DType::f16:
      return 2;
    case DType::i64:
      return 8;
    case DType::i8:
    case DType::u8:
      return 1;
  }
  TF_CHECK(false, "bad dtype ", int(t));
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "float32";
    case DType::bf16:
      return "bfloat16";
    case DType::f16:
      return "float16";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    case DType::i8:
      return "int8";
    case DType::u8:
      return "uint8";
  }
  TF_CHECK(false, "bad dtype ", int(t));
}

std::string_view dtype_short_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::i8:
      return "i8";
    case DType::u8:
      return "u8";
  }
  TF_CHECK(false, "bad dtype ", int(t));
}

DType parse_dtype(std::string_view name) {
  if (name.starts_with("torch.")) name.remove_prefix(6);
  if (name == "float32" || name == "fp32" || name == "f32" || name == "float") return DType::f32;
  if (name == "bfloat16" || name == "bf16") return DType::bf16;
  if (name == "float16" || name == "fp16" || name == "f16" || name == "half") return DType::f16;
  throw InvalidArgumentError(
      detail::str_cat("unknown dtype '", name, "': use one of float32, bfloat16, float16"));
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf/nan
  if (exp == 0) {
    // Zero or subnormal: value = man * 2^-24, exact in f32.
    float v = float(man) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (a < 0x38800000u) {
    // Result is subnormal in f16 (|f| < 2^-14): round |f| / 2^-24 to nearest even integer.
    float scaled = std::bit_cast<float>(a) * 0x1p24f;
    uint32_t q = uint32_t(scaled);
    float rem = scaled - float(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return sign | uint16_t(q);
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
  uint32_t r = a - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | uint16_t(r >> 13);
}

void convert(const void* src, DType st, void* dst, DType dt, size_t n) {
  if (st == dt) {
    std::memcpy(dst, src, n * dtype_size(st));
    return;
  }
  auto load = [&](size_t i) -> float {
    switch (st) {
      case DType::f32:
        return static_cast<const float*>(src)[i];
      case DType::bf16:
        return bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
      case DType::f16:
        return f16_to_f32(static_cast<const uint16_t*>(src)[i]);
      default:
        TF_CHECK(false, "convert: unsupported source dtype ", dtype_name(st));
    }
  };
  switch (dt) {
    case DType::f32:
      for (size_t i = 0; i < n; ++i) static_cast<float*>(dst)[i] = load(i);
      return;
    case DType::bf16:
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(load(i));
      return;
    case DType::f16:
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_f16(load(i));
      return;
    default:
      TF_CHECK(false, "convert: unsupported target dtype ", dtype_name(dt));
  }
}

}  // namespace tformers
