#include "tformers/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "tformers/error.h"

namespace tformers {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string Device::str() const {
  return type == "cpu" ? type : type + ":" + std::to_string(index);
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  for (int64_t d : shape)
    if (d < 0)
      throw InvalidArgumentError("Tensor: negative dimension in shape " + shape_str(shape));
  // The byte count is checked before it is computed: a product that wraps would allocate a
  // small buffer that every later write runs past. 2^62 bytes is more than any machine has.
  const uint64_t max_elems = (uint64_t(1) << 62) / std::max<uint64_t>(1, dtype_size(dtype));
  uint64_t elems = 1;
  for (int64_t d : shape) {
    if (d != 0 && elems > max_elems / uint64_t(d))
      throw InvalidArgumentError("Tensor: shape " + shape_str(shape) +
                                 " is too large to allocate (more than 2^62 bytes)");
    elems *= uint64_t(d);
  }
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  size_t bytes = (t.nbytes() + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes ? bytes : 64);
  if (!p) throw Error("Tensor: out of memory allocating " + std::to_string(bytes) + " bytes");
  std::memset(p, 0, bytes);
  t.data_ = p;
  t.owner_ = std::shared_ptr<const void>(p, [](const void* q) { std::free(const_cast<void*>(q)); });
  return t;
}

Tensor Tensor::borrow(Shape shape, DType dtype, void* data, std::shared_ptr<const void> owner) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.data_ = data;
  t.owner_ = std::move(owner);
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  if (shape_numel(shape) != numel())
    throw InvalidArgumentError("reshape: cannot view " + shape_str(shape_) + " as " +
                               shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor t = zeros(shape_, dtype);
  convert(data_, dtype_, t.data_, dtype, size_t(numel()));
  return t;
}

float Tensor::item_f32(int64_t i) const {
  TF_CHECK(i >= 0 && i < numel(), "index ", i, " out of ", shape_str(shape_));
  float f;
  convert(static_cast<const char*>(data_) + i * dtype_size(dtype_), dtype_, &f, DType::f32, 1);
  return f;
}

std::vector<float> Tensor::to_f32_vector() const {
  std::vector<float> v(static_cast<size_t>(numel()));
  convert(data_, dtype_, v.data(), DType::f32, v.size());
  return v;
}

}  // namespace tformers
