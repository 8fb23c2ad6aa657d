#include "models/int4_import.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "core/thread_pool.h"
#include "tformers/error.h"

namespace tformers::models {

namespace {

constexpr int64_t kBlock = 32;  // inputs per scale in tformers' int4 (graph::kQuantBlock)

// AutoAWQ packs 8 outputs per 32-bit word in this order: nibble i holds output kAwqOrder[i].
constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

uint32_t nibble(int32_t word, int i) { return (uint32_t(word) >> (4 * i)) & 15u; }

}  // namespace

std::optional<Int4Import> read_int4_import(const io::Json& q, const std::string& where) {
  const auto method = io::get_required<std::string>(q, "quant_method", where);
  if (method != "awq" && method != "gptq") return std::nullopt;
  const int64_t bits = io::get_required<int64_t>(q, "bits", where);
  if (bits != 4)
    throw UnsupportedError(where + ": field 'bits' is " + std::to_string(bits) +
                           "; tformers loads 4-bit " + method + " checkpoints");
  Int4Import r{.method = method, .group_size = io::get_required<int64_t>(q, "group_size", where)};
  if (method == "awq") {
    std::string version = io::get_or<std::string>(q, "version", "gemm", where);
    std::transform(version.begin(), version.end(), version.begin(),
                   [](unsigned char c) { return char(std::tolower(c)); });
    if (version != "gemm")
      throw UnsupportedError(where + ": field 'version' is '" + version +
                             "'; tformers reads AWQ's GEMM layout (\"gemm\")");
    if (!io::get_or<bool>(q, "zero_point", true, where))
      throw UnsupportedError(where +
                             ": field 'zero_point' is false; tformers reads AWQ checkpoints with "
                             "zero points (zero_point true)");
    if (r.group_size <= 0)
      throw UnsupportedError(where + ": field 'group_size' is " + std::to_string(r.group_size) +
                             "; AWQ checkpoints have positive groups");
  } else {
    const auto format = io::get_or<std::string>(q, "checkpoint_format", "gptq", where);
    if (format != "gptq" && format != "gptq_v2")
      throw UnsupportedError(where + ": field 'checkpoint_format' is '" + format +
                             "'; tformers reads \"gptq\" and \"gptq_v2\"");
    if (io::get_or<bool>(q, "is_marlin_format", false, where))
      throw UnsupportedError(where +
                             ": field 'is_marlin_format' is true; tformers reads GPTQ's own "
                             "packing, not Marlin's");
    // The classic format stores zero points minus one; v2 stores them as they are.
    r.zero_offset = format == "gptq" ? 1 : 0;
    r.desc_act = io::get_or<bool>(q, "desc_act", false, where);
  }
  if (r.group_size != -1 && (r.group_size <= 0 || r.group_size % kBlock != 0))
    throw UnsupportedError(where + ": field 'group_size' is " + std::to_string(r.group_size) +
                           "; tformers keeps one scale per 32 inputs, so groups must be "
                           "multiples of 32 (or -1, GPTQ's one group per row)");
  return r;
}

std::vector<std::string> int4_import_parts(const io::Checkpoint& ckpt, const std::string& prefix) {
  std::vector<std::string> parts;
  for (const char* p : {".qweight", ".qzeros", ".scales", ".g_idx"})
    if (ckpt.has(prefix + p)) parts.push_back(prefix + p);
  return parts;
}

Int4Codes import_int4(const io::Checkpoint& ckpt, const std::string& dir, const Int4Import& q,
                      const std::string& prefix, int64_t N, int64_t K) {
  const bool awq = q.method == "awq";
  const std::string weight = prefix + ".weight";
  if (N % 8 != 0 || (!awq && K % 8 != 0))
    throw FormatError(q.method + " weight '" + weight + "' of shape " + shape_str({N, K}) +
                      " (config.json): " + q.method + " packs 8 " +
                      (awq ? "outputs" : "inputs and 8 outputs") + " per 32-bit word");
  const int64_t groups = q.group_size == -1 ? 1 : (K + q.group_size - 1) / q.group_size;
  // A part of the checkpoint, checked against what the format says for (N, K).
  auto part = [&](const std::string& suffix, DType dtype, const Shape& shape) {
    const std::string name = prefix + suffix;
    if (!ckpt.has(name))
      throw NotFoundError("checkpoint " + dir + " has no tensor '" + name + "', which the " +
                          q.method + " weight '" + weight + "' needs (" +
                          std::string(dtype_name(dtype)) + shape_str(shape) + ")");
    const io::TensorInfo& t = ckpt.info(name);
    if (t.dtype != dtype || t.shape != shape)
      throw FormatError("tensor '" + name + "' in " + t.file + " is " +
                        std::string(dtype_name(t.dtype)) + shape_str(t.shape) + "; the " +
                        q.method + " weight of shape " + shape_str({N, K}) + " (config.json) " +
                        "with group_size " + std::to_string(q.group_size) + " needs " +
                        std::string(dtype_name(dtype)) + shape_str(shape));
    return ckpt.get(name);
  };
  const Tensor qweight = part(".qweight", DType::i32, awq ? Shape{K, N / 8} : Shape{K / 8, N});
  const Tensor qzeros = part(".qzeros", DType::i32, {groups, N / 8});
  const Tensor scales = part(".scales", DType::f16, {groups, N});

  // The group of each input: g_idx when the checkpoint has it, else consecutive groups.
  std::vector<int64_t> group(size_t(K), 0);
  const bool has_g_idx = !awq && ckpt.has(prefix + ".g_idx");
  if (has_g_idx) {
    const Tensor g_idx = part(".g_idx", DType::i32, {K});
    for (int64_t k = 0; k < K; ++k) {
      const int32_t g = g_idx.data<int32_t>()[k];
      if (g < 0 || g >= groups)
        throw FormatError("tensor '" + prefix + ".g_idx' in " + ckpt.info(prefix + ".g_idx").file +
                          ": input " + std::to_string(k) + " is in group " + std::to_string(g) +
                          ", outside the " + std::to_string(groups) + " groups of '" + prefix +
                          ".scales'");
      group[size_t(k)] = g;
    }
  } else if (q.desc_act) {
    throw NotFoundError("checkpoint " + dir + " has no tensor '" + prefix +
                        ".g_idx', which gptq's desc_act " +
                        "(quantization_config) needs to place the inputs of '" + weight + "'");
  } else if (q.group_size != -1) {
    for (int64_t k = 0; k < K; ++k) group[size_t(k)] = k / q.group_size;
  }
  const int64_t nb = (K + kBlock - 1) / kBlock;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t k = b * kBlock + 1; k < std::min(K, (b + 1) * kBlock); ++k)
      if (group[size_t(k)] != group[size_t(b * kBlock)])
        throw UnsupportedError(
            "tensor '" + prefix + ".g_idx' in " + ckpt.info(prefix + ".g_idx").file +
            " puts inputs " + std::to_string(b * kBlock) + " and " + std::to_string(k) +
            " in different groups (desc_act " + (q.desc_act ? "true" : "false") +
            " in quantization_config reorders the inputs); tformers keeps one scale per 32 "
            "consecutive inputs: use a checkpoint quantized with desc_act false");

  Int4Codes out{Tensor::zeros({N, K}, DType::u8), Tensor::zeros({N, nb}, DType::f16),
                Tensor::zeros({N, nb}, DType::u8)};
  uint8_t* codes = out.codes.data<uint8_t>();
  const int32_t* qw = qweight.data<int32_t>();
  ThreadPool::global().parallel_for(awq ? K : K / 8, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < (awq ? N / 8 : N); ++c) {
        const int32_t word = qw[r * (awq ? N / 8 : N) + c];
        for (int i = 0; i < 8; ++i) {
          if (awq)  // row r is input k, word c holds outputs 8c + order
            codes[(8 * c + kAwqOrder[i]) * K + r] = uint8_t(nibble(word, i));
          else  // row r holds inputs 8r + i of output c
            codes[c * K + 8 * r + i] = uint8_t(nibble(word, i));
        }
      }
  });
  // Zero points of (group, output), then each block's scale and zero point from its group.
  std::vector<uint8_t> zero(size_t(groups * N));
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t c = 0; c < N / 8; ++c)
      for (int i = 0; i < 8; ++i)
        zero[size_t(g * N + 8 * c + (awq ? kAwqOrder[i] : i))] =
            uint8_t(nibble(qzeros.data<int32_t>()[g * (N / 8) + c], i) + q.zero_offset);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t g = group[size_t(b * kBlock)];
      out.scale.data<uint16_t>()[n * nb + b] = scales.data<uint16_t>()[g * N + n];
      out.zero.data<uint8_t>()[n * nb + b] = zero[size_t(g * N + n)];
    }
  return out;
}

}  // namespace tformers::models
