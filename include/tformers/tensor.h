// A host tensor: shape (outermost first, as in PyTorch), dtype, device and shared storage.
// Storage may own its bytes or borrow them from a mapping (mmap'd safetensors) kept alive by an
// owner handle, so weights used as stored are never copied.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tformers/dtype.h"

namespace tformers {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3, 4]"
int64_t shape_numel(const Shape& s);

struct Device {
  std::string type = "cpu";  // "cpu", "tpu", "cuda"
  int index = 0;
  std::string str() const;  // "cpu", "cuda:1"
  bool operator==(const Device&) const = default;
};

class Tensor {
 public:
  Tensor() = default;
  // Allocates zero-filled, 64-byte aligned storage.
  static Tensor zeros(Shape shape, DType dtype);
  // Wraps external bytes; `owner` keeps them alive (for example an mmap).
  static Tensor borrow(Shape shape, DType dtype, void* data, std::shared_ptr<const void> owner);
  template <typename T>
  static Tensor from_vector(Shape shape, DType dtype, const std::vector<T>& values);

  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? i + shape_.size() : i); }
  int ndim() const { return int(shape_.size()); }
  DType dtype() const { return dtype_; }
  const Device& device() const { return device_; }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr || numel() == 0; }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  template <typename T>
  T* data() {
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(data_);
  }

  // Same bytes, another shape with the same element count.
  Tensor reshape(Shape shape) const;
  // A converted copy (or this tensor when the dtype already matches).
  Tensor to(DType dtype) const;
  // Element i as float, whatever the floating dtype; for tests and debugging.
  float item_f32(int64_t i) const;
  std::vector<float> to_f32_vector() const;

 private:
  Shape shape_;
  DType dtype_ = DType::f32;
  Device device_;
  void* data_ = nullptr;
  std::shared_ptr<const void> owner_;
};

template <typename T>
Tensor Tensor::from_vector(Shape shape, DType dtype, const std::vector<T>& values) {
  Tensor t = zeros(std::move(shape), dtype);
  if (size_t(t.numel()) != values.size() || sizeof(T) != dtype_size(dtype))
    throw std::invalid_argument("Tensor::from_vector: size or element type mismatch");
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

}  // namespace tformers
