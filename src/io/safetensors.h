// safetensors checkpoints, memory-mapped. A checkpoint is one model.safetensors or several shards
// listed by model.safetensors.index.json. Every header field and byte range is validated when
// the file is opened; errors (FormatError, NotFoundError) name the file, the tensor and the
// byte offset. Tensors come back as views of the mapping: weights used as stored are never
// copied.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tformers/tensor.h"

namespace tformers::io {

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  std::string file;     // the shard that holds it
  uint64_t offset = 0;  // absolute byte offset of the data in that file
  uint64_t nbytes = 0;
};

// One .safetensors file. Supported dtypes: F32, BF16, F16 (also I32, I64, I8, U8 for
// completeness); anything else is a FormatError naming the tensor and the dtype.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  const std::string& path() const;
  const std::vector<TensorInfo>& tensors() const;  // in header order
  const std::map<std::string, std::string>& metadata() const;
  const TensorInfo* find(const std::string& name) const;
  // A view of the mapped bytes; the file stays mapped while the tensor lives.
  Tensor get(const std::string& name) const;
  // Bytes of one tensor's row range [row_begin, row_end) along dim 0 (for sharded loading).
  Tensor get_rows(const std::string& name, int64_t row_begin, int64_t row_end) const;
  ~SafetensorsFile();

 private:
  SafetensorsFile() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A model folder's weights: model.safetensors, or model.safetensors.index.json and its shards,
// or (when neither exists) every *.safetensors file in the folder.
class Checkpoint {
 public:
  static Checkpoint open(const std::string& dir);
  std::vector<std::string> names() const;  // sorted
  bool has(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // NotFoundError if absent
  Tensor get(const std::string& name) const;
  Tensor get_rows(const std::string& name, int64_t row_begin, int64_t row_end) const;
  uint64_t total_bytes() const;

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> index_;  // tensor name -> files_ index
};

// Writes a single-file safetensors checkpoint (used by tests and benchmarks to make random
// models). Tensors are written in the given order, 8-byte aligned.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace tformers::io
