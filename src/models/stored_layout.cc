#include "models/stored_layout.h"

#include <cmath>
#include <cstring>

#include "tformers/error.h"

namespace tformers::models {

namespace {

// The e2m1 values of the 16 codes: sign bit 3, then two exponent bits and one mantissa bit.
constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

std::string blocks_of(const std::string& name) { return name + "_blocks"; }
std::string scales_of(const std::string& name) { return name + "_scales"; }

[[noreturn]] void bad_tensor(const io::TensorInfo& t, const WeightSpec& s,
                             const std::string& want) {
  throw FormatError("tensor '" + t.name + "' in " + t.file + " is " +
                    std::string(dtype_name(t.dtype)) + shape_str(t.shape) + "; for '" + s.name +
                    "' " + shape_str(s.shape) + " (config.json) it must be " + want);
}

// (..., A, B) -> (..., B, A), any element size.
Tensor swap_last(const Tensor& t) {
  const Shape& in = t.shape();
  const int64_t A = in[in.size() - 2], B = in.back(), outer = t.numel() / (A * B);
  Shape out = in;
  std::swap(out[out.size() - 2], out.back());
  Tensor r = Tensor::zeros(out, t.dtype());
  const size_t e = dtype_size(t.dtype());
  const auto* src = static_cast<const char*>(t.raw());
  auto* dst = static_cast<char*>(r.raw());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t a = 0; a < A; ++a)
      for (int64_t b = 0; b < B; ++b)
        std::memcpy(dst + size_t((o * B + b) * A + a) * e, src + size_t((o * A + a) * B + b) * e,
                    e);
  return r;
}

// Dim 1 of (outer, N, ...) between interleaved halves (a0 b0 a1 b1 ...) and consecutive ones
// (a0 a1 ... b0 b1 ...): `split` goes to the consecutive form, else back.
Tensor regroup_halves(const Tensor& t, bool split) {
  const int64_t outer = t.dim(0), N = t.dim(1), half = N / 2;
  const size_t row = t.nbytes() / size_t(outer * N);
  Tensor r = Tensor::zeros(t.shape(), t.dtype());
  const auto* src = static_cast<const char*>(t.raw());
  auto* dst = static_cast<char*>(r.raw());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t interleaved = n < half ? 2 * n : 2 * (n - half) + 1;
      const int64_t to = split ? n : interleaved, from = split ? interleaved : n;
      std::memcpy(dst + size_t(o * N + to) * row, src + size_t(o * N + from) * row, row);
    }
  return r;
}

// The blocks and scales of `s`, checked against its shape (views of the checkpoint).
std::pair<Tensor, Tensor> checked_mxfp4(const io::Checkpoint& ckpt, const WeightSpec& s) {
  const int64_t E = s.shape[0], N = s.shape[1], K = s.shape[2], G = K / 32;
  const std::string want_blocks = "uint8" + shape_str({E, N, G, 16}),
                    want_scales = "uint8" + shape_str({E, N, G});
  const io::TensorInfo& bi = ckpt.info(blocks_of(s.name));
  if (K % 32 != 0 || bi.dtype != DType::u8 || bi.shape != Shape{E, N, G, 16})
    bad_tensor(bi, s, want_blocks + " (MXFP4 codes of blocks of 32 inputs)");
  if (!ckpt.has(scales_of(s.name)))
    throw NotFoundError("checkpoint has '" + bi.name + "' but no '" + scales_of(s.name) +
                        "', the MXFP4 scales that '" + s.name + "' needs (" + want_scales + ")");
  const io::TensorInfo& si = ckpt.info(scales_of(s.name));
  if (si.dtype != DType::u8 || si.shape != Shape{E, N, G})
    bad_tensor(si, s, want_scales + " (an e8m0 exponent per block of 32 inputs)");
  const Tensor blocks = ckpt.get(bi.name), scales = ckpt.get(si.name);
  const auto* sc = scales.data<uint8_t>();
  for (int64_t i = 0; i < scales.numel(); ++i)
    if (sc[i] == 0xFF)
      throw FormatError("tensor '" + si.name + "' in " + si.file +
                        " holds the e8m0 NaN (0xFF) at index " + std::to_string(i) +
                        "; an MXFP4 scale must be a power of two");
  return {blocks, scales};
}

Tensor read_mxfp4(const io::Checkpoint& ckpt, const WeightSpec& s, DType dtype) {
  const int64_t E = s.shape[0], N = s.shape[1], K = s.shape[2], G = K / 32;
  const auto [blocks, scales] = checked_mxfp4(ckpt, s);
  const auto* sc = scales.data<uint8_t>();
  Tensor out = Tensor::zeros(s.shape, dtype);
  // One expert at a time through float32, so the peak is one expert's floats.
  Tensor expert = Tensor::zeros({N, K}, DType::f32);
  const size_t each = size_t(N * K) * dtype_size(dtype);
  for (int64_t e = 0; e < E; ++e) {
    dequantize_mxfp4(blocks.data<uint8_t>() + e * N * G * 16, sc + e * N * G, N * G,
                     expert.data<float>());
    std::memcpy(static_cast<char*>(out.raw()) + size_t(e) * each, expert.to(dtype).raw(), each);
  }
  return out;
}

}  // namespace

void dequantize_mxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t groups, float* out) {
  for (int64_t g = 0; g < groups; ++g) {
    const float scale = std::ldexp(1.0f, int(scales[g]) - 127);
    for (int i = 0; i < 16; ++i) {
      const uint8_t byte = blocks[g * 16 + i];
      out[g * 32 + 2 * i] = kE2m1[byte & 0xF] * scale;
      out[g * 32 + 2 * i + 1] = kE2m1[byte >> 4] * scale;
    }
  }
}

bool stored_as_mxfp4(const io::Checkpoint& ckpt, const WeightSpec& s) {
  return s.stored.mxfp4 && !ckpt.has(s.name) && ckpt.has(blocks_of(s.name));
}

Mxfp4Rows read_mxfp4_rows(const io::Checkpoint& ckpt, const WeightSpec& s) {
  auto [blocks, scales] = checked_mxfp4(ckpt, s);
  if (s.stored.interleaved) {
    blocks = regroup_halves(blocks, true);
    scales = regroup_halves(scales, true);
  }
  const int64_t rows = s.shape[0] * s.shape[1];
  return {blocks.reshape({rows, s.shape[2] / 2}), scales.reshape({rows, s.shape[2] / 32})};
}

std::vector<std::pair<std::string, Tensor>> to_stored_mxfp4(const WeightSpec& s,
                                                            const Tensor& codes,
                                                            const Tensor& scales) {
  const int64_t E = s.shape[0], N = s.shape[1], G = s.shape[2] / 32;
  Tensor blocks = codes.reshape({E, N, G, 16}), exponents = scales.reshape({E, N, G});
  if (s.stored.interleaved) {
    blocks = regroup_halves(blocks, false);
    exponents = regroup_halves(exponents, false);
  }
  return {{blocks_of(s.name), blocks}, {scales_of(s.name), exponents}};
}

bool stored_differently(const io::Checkpoint& ckpt, const WeightSpec& s) {
  return s.stored.any() && (ckpt.has(s.name) || stored_as_mxfp4(ckpt, s));
}

std::vector<std::string> stored_sources(const io::Checkpoint& ckpt, const WeightSpec& s) {
  if (stored_as_mxfp4(ckpt, s)) return {blocks_of(s.name), scales_of(s.name)};
  return {s.name};
}

Tensor read_stored(const io::Checkpoint& ckpt, const WeightSpec& s, DType dtype) {
  Tensor t;
  if (stored_as_mxfp4(ckpt, s)) {
    t = read_mxfp4(ckpt, s, dtype);
  } else {
    const io::TensorInfo& info = ckpt.info(s.name);
    Shape want = s.shape;
    if (s.stored.transposed) std::swap(want[want.size() - 2], want.back());
    if (!is_float(info.dtype) || info.shape != want)
      bad_tensor(info, s,
                 "a float tensor of shape " + shape_str(want) +
                     (s.stored.transposed ? " (each expert's weight transposed, in by out)" : ""));
    t = ckpt.get(s.name).to(dtype);
    if (s.stored.transposed) t = swap_last(t);
  }
  if (s.stored.interleaved) {
    if (t.dim(1) % 2 != 0)
      throw FormatError("'" + s.name + "' " + shape_str(s.shape) +
                        " holds interleaved gate and up rows, so its dim 1 must be even");
    t = regroup_halves(t, true);
  }
  return t;
}

Tensor to_stored(const Tensor& t, const StoredLayout& l) {
  Tensor r = l.interleaved ? regroup_halves(t, false) : t;
  return l.transposed ? swap_last(r) : r;
}

}  // namespace tformers::models
