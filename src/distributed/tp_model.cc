#include "distributed/tp_model.h"

#include <cstring>
#include <set>

#include "tformers/error.h"

namespace tformers::distributed {

std::string module_of(const std::string& weight) {
  size_t dot = weight.rfind('.');
  return dot == std::string::npos ? weight : weight.substr(0, dot);
}

namespace {
std::vector<std::string> modules_of(const std::vector<WeightDecl>& weights) {
  std::set<std::string> mods;
  for (const auto& w : weights) mods.insert(module_of(w.name));
  return {mods.begin(), mods.end()};
}
// The group `config` asks for, its collective timeout applied first (splitting the world is
// itself a collective).
std::shared_ptr<ProcessGroup> group_for(const DistributedConfig& config) {
  if (config.timeout) set_collective_timeout(*config.timeout);
  return tp_group(config.tp_size.value_or(world_size()));
}

}  // namespace

TpModel::TpModel(const DistributedConfig& config,
                 const std::map<std::string, std::string>& defaults,
                 const std::vector<WeightDecl>& weights)
    : group_(group_for(config)), plan_(defaults, config.tp_plan, modules_of(weights)) {
  init(weights);
}

TpModel::TpModel(std::shared_ptr<ProcessGroup> group,
                 const std::map<std::string, std::string>& defaults,
                 const std::map<std::string, std::string>& user,
                 const std::vector<WeightDecl>& weights)
    : group_(std::move(group)), plan_(defaults, user, modules_of(weights)) {
  init(weights);
}

void TpModel::init(const std::vector<WeightDecl>& weights) {
  for (const auto& w : weights) {
    TpStyle style = plan_.style_of(module_of(w.name));
    WeightShard s = shard_for(style, w.shape, rank(), size());
    if (s.dim >= 0)
      for (int r = 0; r < size(); ++r) {
        WeightShard o = shard_for(style, w.shape, r, size());
        if (o.ranges[0].first == o.ranges[0].second)
          throw InvalidArgumentError(detail::str_cat(
              "tp_plan: '", w.name, "' ", shape_str(w.shape), " split ", style_name(style),
              " over ", size(), " ranks (as torch.chunk) leaves rank ", r,
              " without a slice: use a smaller tp_size or override rule '",
              plan_.rule_of(module_of(w.name)), "' with \"replicate\""));
      }
    shards_[w.name] = std::move(s);
  }
}

const WeightShard& TpModel::shard(const std::string& weight) const {
  auto it = shards_.find(weight);
  TF_CHECK(it != shards_.end(), "no tensor-parallel layout for weight '", weight, "'");
  return it->second;
}

std::string TpModel::rule_for(const std::string& weight) const {
  return plan_.rule_of(module_of(weight));
}

Tensor shard_rows(const WeightShard& s, DType dtype,
                  const std::function<void(int64_t, int64_t, void*)>& copy) {
  TF_CHECK(s.dim == 0, "shard_rows: a split along dim ", s.dim);
  const size_t row = size_t(shape_numel(s.full_shape) / s.full_shape[0]) * dtype_size(dtype);
  Tensor out = Tensor::zeros(s.local_shape, dtype);
  char* dst = static_cast<char*>(out.raw());
  for (auto [b, e] : s.ranges) {
    if (e > b) copy(b, e, dst);
    dst += size_t(s.chunk) * row;
  }
  return out;
}

Tensor shard_rows(const WeightShard& s, const Tensor& whole) {
  TF_CHECK(whole.dim(0) == s.full_shape[0], "shard_rows: ", whole.dim(0), " rows, not ",
           s.full_shape[0]);
  WeightShard rows = s;
  rows.full_shape = whole.shape();
  rows.local_shape = whole.shape();
  rows.local_shape[0] = s.local_shape[0];
  const size_t row = whole.nbytes() / size_t(whole.dim(0));
  return shard_rows(rows, whole.dtype(), [&](int64_t b, int64_t e, void* dst) {
    std::memcpy(dst, static_cast<const char*>(whole.raw()) + size_t(b) * row, size_t(e - b) * row);
  });
}

Tensor TpModel::load(const io::Checkpoint& ckpt, const std::string& weight,
                     const std::string& source, DType dtype) {
  const WeightShard& s = shard(weight);
  const io::TensorInfo& info = ckpt.info(source);
  TF_CHECK(info.shape == s.full_shape, "shape of ", source);
  bytes_full_ += info.nbytes;
  const size_t elem = dtype_size(info.dtype);
  if (s.dim < 0) {
    bytes_read_ += info.nbytes;
    return ckpt.get(source).to(dtype);
  }
  if (s.dim == 0) {
    const int64_t row_elems = shape_numel(s.full_shape) / s.full_shape[0];
    if (s.ranges.size() == 1 && s.ranges[0].second - s.ranges[0].first == s.chunk) {
      auto [b, e] = s.ranges[0];
      bytes_read_ += uint64_t((e - b) * row_elems) * elem;
      return ckpt.get_rows(source, b, e).to(dtype);  // a view of the mapping when dtypes match
    }
    // packed_colwise: the rank's part of each stacked half.
    return shard_rows(s, info.dtype,
                      [&](int64_t b, int64_t e, void* dst) {
                        const Tensor part = ckpt.get_rows(source, b, e);
                        std::memcpy(dst, part.raw(), part.nbytes());
                        bytes_read_ += part.nbytes();
                      })
        .to(dtype);
  }
  // Columns [b, e) of every row into the first e - b of its `chunk`, copied row by row: only
  // these bytes of the mapping are read.
  TF_CHECK(s.dim == 1 && s.full_shape.size() == 2 && s.ranges.size() == 1, "column slice of ",
           source);
  auto [b, e] = s.ranges[0];
  const int64_t rows = s.full_shape[0], cols = s.full_shape[1], w = e - b;
  Tensor full = ckpt.get(source);
  Tensor out = Tensor::zeros(s.local_shape, info.dtype);
  const char* src = static_cast<const char*>(full.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + size_t(r * s.chunk) * elem, src + size_t(r * cols + b) * elem,
                size_t(w) * elem);
  bytes_read_ += uint64_t(rows * w) * elem;
  return out.to(dtype);
}

}  // namespace tformers::distributed
