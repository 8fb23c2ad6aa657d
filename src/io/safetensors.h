// safetensors checkpoints, memory-mapped. A checkpoint is one model.safetensors or several shards
// listed by model.safetensors.index.json. Every header field and byte range is validated when
// the file is opened; errors (FormatError, NotFoundError) name the file, the tensor and the
// byte offset. Tensors come back as views of the mapping: weights used as stored are never
// copied.
//
// Validation follows the reference implementation (safetensors' Rust core): the header is a JSON
// object of {dtype, shape, data_offsets} entries plus an optional "__metadata__" object of
// strings; names are unique; offsets are relative to the data buffer, hold exactly
// numel * element size bytes, and tile the buffer with no overlap, no hole and nothing after the
// last tensor. Opening reads only the header; data pages are touched when a tensor is used.
//
// Alignment: the format does not align tensors (a header of odd length puts every tensor at an
// odd address). A tensor whose address is not a multiple of its element size is returned as an
// aligned copy instead of a view, so consumers may always assume element alignment. Files that
// save_safetensors (and the Python library) writes are aligned, so this copy never happens
// with them. Views are read-only (the mapping is PROT_READ): never write through them.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tformers/tensor.h"

namespace tformers::io {

// IoError naming the file when a mapped safetensors file was found shorter than its mapping
// (truncated while it was read: the pages past its new end were read as zeros instead of
// ending the process with SIGBUS); nothing otherwise. One atomic load when no file shrank, so
// loads and generation steps call it freely.
void check_mapped_files();

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  std::string file;     // the shard that holds it
  uint64_t offset = 0;  // absolute byte offset of the data in that file
  uint64_t nbytes = 0;
};

// One .safetensors file. Supported dtypes: F32, BF16, F16 (also I32, I64, I8, U8 for
// completeness); anything else (F64, F8_E4M3, an unknown name) is a FormatError naming the
// tensor and the dtype. A missing file is a NotFoundError.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  const std::string& path() const;
  const std::vector<TensorInfo>& tensors() const;  // in header order
  const std::map<std::string, std::string>& metadata() const;
  const TensorInfo* find(const std::string& name) const;
  // A view of the mapped bytes; the file stays mapped while the tensor lives. NotFoundError if
  // absent.
  Tensor get(const std::string& name) const;
  // Bytes of one tensor's row range [row_begin, row_end) along dim 0 (for sharded loading):
  // shape [row_end - row_begin, rest...]. InvalidArgumentError for a range outside [0, dim 0].
  Tensor get_rows(const std::string& name, int64_t row_begin, int64_t row_end) const;
  ~SafetensorsFile();

 private:
  SafetensorsFile() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A model folder's weights: model.safetensors (preferred when both exist, as in Transformers),
// or model.safetensors.index.json {"metadata": ..., "weight_map": {tensor: shard}} and its
// shards. Every shard the index lists must exist (NotFoundError naming the index and the shard),
// every tensor it lists must be in its shard, and no tensor may be in two shards (FormatError).
// Tensors in a shard that the index does not list are still part of the checkpoint (as when
// Transformers loads the shard), so models can report them as unexpected. When neither file
// exists: NotFoundError naming both paths. `dir` may also be a single .safetensors file.
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
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> index_;  // tensor name -> files_ index
};

// Writes a single-file safetensors checkpoint (used by tests and benchmarks to make random
// models), streaming each tensor's bytes to a temporary file renamed into place at the end.
// The data buffer starts 8-byte aligned; tensors are stored by decreasing element size (stable,
// otherwise in the given order) so each one is aligned to its element size without padding,
// which the format forbids. Header order is the storage order.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace tformers::io
