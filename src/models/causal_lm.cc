#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>

#include "backends/compile_cache.h"
#include "backends/registry.h"
#include "core/memory.h"
#include "io/file.h"
#include "io/hub.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "models/causal_lm_impl.h"
#include "models/int4_import.h"
#include "models/model_runner.h"
#include "models/stored_layout.h"
#include "tformers/distributed.h"
#include "tformers/error.h"

namespace tformers {

namespace models {

namespace {
std::map<std::string, std::unique_ptr<Architecture>>& registry() {
  static std::map<std::string, std::unique_ptr<Architecture>> r;
  return r;
}
}  // namespace

void register_architecture(const std::string& name,
                           std::function<std::unique_ptr<Architecture>()> make) {
  registry()[name] = make();
}

const Architecture* find_architecture(const std::string& name) {
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second.get();
}

std::vector<std::string> architecture_names() {
  std::vector<std::string> names;
  for (const auto& [name, arch] : registry()) names.push_back(name);
  return names;
}

}  // namespace models

std::vector<std::string> supported_architectures() { return models::architecture_names(); }

namespace {

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// The architecture named by config.json's "architectures", and its config read by it.
std::unique_ptr<models::ArchConfig> parse_config(const io::Json& j, const std::string& where,
                                                 const models::Architecture*& arch) {
  io::Json arch_list = io::get_required<io::Json>(j, "architectures", where);
  std::vector<std::string> archs;
  if (arch_list.is_array())
    for (const auto& a : arch_list)
      if (a.is_string()) archs.push_back(a.get<std::string>());
  if (archs.empty() || archs.size() != arch_list.size())
    throw FormatError(where +
                      ": field 'architectures' must be a non-empty list of class names "
                      "such as [\"Qwen3ForCausalLM\"]");
  std::string name;
  for (const auto& n : archs)
    if ((arch = models::find_architecture(n))) {
      name = n;
      break;
    }
  if (!arch)
    throw UnsupportedError(where + ": architectures [" + join(archs) +
                           "] has no architecture this build supports; supported: " +
                           join(models::architecture_names()));
  std::unique_ptr<models::ArchConfig> c = arch->config(j, where);
  c->architecture = name;
  c->json = j;
  return c;
}

// How config.json's quantization_config says the linear weights are stored.
struct StoredQuantization {
  // "" (floats), or "int8" / "int4": written by tformers (CausalLM::save_pretrained, `tformers
  // quantize`; docs/quantization.md), or int4 from AWQ or GPTQ (`import` set).
  std::string scheme;
  std::optional<models::Int4Import> import;
};

StoredQuantization stored_quantization(const io::Json& j, const std::string& where) {
  const auto q = io::get_optional<io::Json>(j, "quantization_config", where);
  if (!q) return {};
  const std::string at = where + ": quantization_config";
  if (auto import = models::read_int4_import(*q, at)) return {"int4", import};
  const auto method = io::get_required<std::string>(*q, "quant_method", at);
  // MXFP4 (gpt-oss) quantizes only the experts, which the architecture reads in that form
  // (WeightSpec::stored); the other weights are floats.
  if (method == "mxfp4") return {};
  if (method != "tformers")
    throw UnsupportedError(at + ": quant_method '" + method +
                           "' is not supported; tformers reads \"tformers\" (its own layout, "
                           "written by `tformers quantize`), \"mxfp4\" (gpt-oss's experts), "
                           "\"awq\" and \"gptq\"");
  const auto scheme = io::get_required<std::string>(*q, "scheme", at);
  if (scheme != "int8" && scheme != "int4")
    throw FormatError(at + ": field 'scheme' is '" + scheme + "'; expected \"int8\" or \"int4\"");
  io::get_int_in(*q, "block_size", 32, 32, at);  // the only block size of both schemes
  return {scheme, std::nullopt};
}

}  // namespace

CausalLM AutoModelForCausalLM::from_pretrained(const std::string& path, const LoadOptions& opt) {
  auto impl = std::make_shared<CausalLM::Impl>();
  impl->path = io::resolve_model_path(path, opt.revision);
  impl->verbose = opt.verbose;
  const std::string config_path = (std::filesystem::path(impl->path) / "config.json").string();
  impl->arch_config = parse_config(io::load_json_file(config_path), config_path, impl->arch);
  const models::ArchConfig& c = *impl->arch_config;
  const StoredQuantization stored = stored_quantization(c.json, config_path);
  // AWQ and GPTQ checkpoints keep their float tensors (embeddings, norms, the head) in float16,
  // which the CPU backend reads on a slow path: bfloat16 unless asked otherwise.
  const std::optional<DType> stored_dtype =
      stored.import && c.torch_dtype == DType::f16 ? DType::bf16 : c.torch_dtype;
  impl->dtype = opt.dtype.value_or(stored_dtype.value_or(DType::f32));
  if (!is_float(impl->dtype))
    throw UnsupportedError(std::string("dtype ") + std::string(dtype_name(impl->dtype)) +
                           " is not supported: use float32, bfloat16 or float16");
  impl->backend = &backends::backend_for(opt.device_map, opt.verbose);
  impl->device = impl->backend->name();
  impl->cache_dtype = impl->backend->cache_dtype(impl->dtype);
  if (!opt.quantize.empty() && opt.quantize != "int8" && opt.quantize != "int4")
    throw InvalidArgumentError("quantize '" + opt.quantize +
                               "' is not supported: use \"int8\" or \"int4\" (weight-only, one "
                               "scale per 32 weights) or leave it empty");
  if (!stored.scheme.empty() && !opt.quantize.empty() && opt.quantize != stored.scheme)
    throw InvalidArgumentError("quantize '" + opt.quantize + "': " + config_path +
                               " says the checkpoint is already quantized to " + stored.scheme +
                               " (quantization_config); load it without quantize, or quantize "
                               "its float original");
  impl->quantize = stored.scheme.empty() ? opt.quantize : stored.scheme;
  // Linear weights quantized here (else used as stored: floats, or already quantized).
  const bool quantize = stored.scheme.empty() && !opt.quantize.empty();
  if (opt.load_mode != "copy" && opt.load_mode != "mmap")
    throw InvalidArgumentError("load_mode '" + opt.load_mode +
                               "' is not supported: use \"copy\" (weights in anonymous huge-page "
                               "memory, the default) or \"mmap\" (the checkpoint's mapping)");

  // The weight table, by name. What happens to each weight follows from its role: linear
  // weights are prepared by the backend (quantized when asked), the bias of a quantized linear
  // is f32 as its kernel takes it, everything else is used in the model dtype.
  const std::vector<models::WeightSpec> specs = impl->arch->weights(c);
  std::map<std::string, const models::WeightSpec*> by_name;
  for (const auto& s : specs) by_name[s.name] = &s;
  // Weights: every declared one present with its declared shape, nothing unexpected.
  io::Checkpoint ckpt = io::Checkpoint::open(impl->path);
  auto prefix_of = [](const std::string& weight) {
    return weight.substr(0, weight.size() - std::string(".weight").size());
  };
  // A linear weight stored quantized: int8 or int4 with its scales, as save_pretrained writes
  // them, or AWQ's or GPTQ's qweight with its parts.
  auto stored_quantized = [&](const models::WeightSpec& s) {
    if (stored.scheme.empty() || s.role != models::WeightRole::kLinear) return false;
    if (stored.import) return ckpt.has(prefix_of(s.name) + ".qweight");
    return ckpt.has(s.name) && !is_float(ckpt.info(s.name).dtype);
  };
  auto quantized = [&](const models::WeightSpec& s) {
    const bool multiplied =
        s.role == models::WeightRole::kLinear || s.role == models::WeightRole::kExperts;
    return (quantize && multiplied) || stored_quantized(s);
  };
  auto bias_of_quantized = [&](const models::WeightSpec& s) {
    return s.role == models::WeightRole::kBias && by_name.count(s.linear) &&
           quantized(*by_name.at(s.linear));
  };
  auto bind = [&](const std::string& name, std::shared_ptr<backends::Buffer> buf) {
    impl->weight_types[name] = buf->type();
    impl->weights[name] = std::move(buf);
  };
  // A prepared linear weight: a quantized one's scales and zero points bound beside it as
  // "<name>_scale" and "<name>_zero" ("<prefix>.weight_scale" for a linear's "<prefix>.weight"),
  // and the attributes that read them kept.
  auto bind_prepared = [&](const std::string& name, backends::PreparedWeight pw) {
    bind(name, std::move(pw.weight));
    if (pw.scale) bind(name + "_scale", std::move(pw.scale));
    if (pw.zero) bind(name + "_zero", std::move(pw.zero));
    if (pw.quant) impl->quant_attrs[name] = *pw.quant;
  };
  // Whether `t` lies in the checkpoint's mapping of tensor `source`.
  auto in_mapping = [&](const Tensor& t, const std::string& source) {
    const char* mapped = static_cast<const char*>(ckpt.get(source).raw());
    const char* p = static_cast<const char*>(t.raw());
    return p >= mapped && p < mapped + ckpt.info(source).nbytes;
  };
  // Once the backend has its prepared copy of `w`, a view of the checkpoint's mapping, the mapped
  // pages are released: they stay in the page cache (re-read if touched, as a tied embedding's
  // are under "mmap") but resident memory holds the copy rather than both.
  auto add_prepared = [&](const models::WeightSpec& s, const Tensor& w, const std::string& source) {
    backends::PreparedWeight pw = s.role == models::WeightRole::kExperts
                                      ? impl->backend->prepare_experts(w, opt.quantize)
                                      : impl->backend->prepare_linear(w, opt.quantize);
    if (in_mapping(w, source)) release_pages(w);
    bind_prepared(s.name, std::move(pw));
  };

  // Under "copy" a weight still in the checkpoint's mapping (used as stored, or this rank's rows
  // of it) is copied into anonymous huge-page memory; conversions already made their own.
  // The bytes are read from the file with pread rather than copied out of the mapping: a file
  // that shrank since it was opened is then an IoError naming it and the byte where it ended,
  // instead of a SIGBUS.
  auto resident = [&](const Tensor& t, const std::string& source) {
    if (opt.load_mode != "copy" || !in_mapping(t, source)) return t;
    const io::TensorInfo& info = ckpt.info(source);
    const uint64_t at = info.offset + uint64_t(static_cast<const char*>(t.raw()) -
                                               static_cast<const char*>(ckpt.get(source).raw()));
    const io::RegularFile file(info.file, UINT64_MAX, "safetensors file");
    Tensor copy = resident_read(
        t.shape(), t.dtype(),
        [&](size_t offset, void* dst, size_t n) { file.read_at(at + offset, dst, n); },
        ThreadPool::global());
    release_pages(t);
    return copy;
  };
  // The other tensors of a stored quantized weight "<prefix>.weight": "<prefix>.weight_scale" and
  // "<prefix>.weight_zero" (tformers), "<prefix>.qweight", ".qzeros", ".scales", ".g_idx" (AWQ,
  // GPTQ).
  // A part's suffix, and what takes its place in its weight's name.
  using Part = std::pair<std::string_view, std::string_view>;
  static constexpr Part kOwnParts[] = {{"_scale", ""}, {"_zero", ""}};
  static constexpr Part kImportParts[] = {{".qweight", ".weight"},
                                          {".qzeros", ".weight"},
                                          {".scales", ".weight"},
                                          {".g_idx", ".weight"}};
  auto stored_part = [&](const std::string& name) {
    for (auto [suffix, weight] :
         stored.import ? std::span<const Part>(kImportParts) : std::span<const Part>(kOwnParts))
      if (name.size() > suffix.size() && name.ends_with(suffix)) {
        auto it = by_name.find(name.substr(0, name.size() - suffix.size()) + std::string(weight));
        if (it != by_name.end() && stored_quantized(*it->second)) return true;
      }
    return false;
  };
  // The pieces of the weights that the checkpoint holds in pieces (each expert's projections).
  std::set<std::string> pieces;
  for (const auto& s : specs) {
    if (!ckpt.has(s.name)) pieces.insert(s.stacked_from.begin(), s.stacked_from.end());
    if (models::stored_differently(ckpt, s))
      for (const std::string& source : models::stored_sources(ckpt, s)) pieces.insert(source);
  }
  std::vector<std::string> unexpected;
  for (const auto& name : ckpt.names())
    if (!by_name.count(name) && !impl->arch->ignorable(c, name) && !stored_part(name) &&
        !pieces.count(name))
      unexpected.push_back(name);
  if (!unexpected.empty()) {
    if (unexpected.size() > 5) {
      size_t more = unexpected.size() - 5;
      unexpected.resize(5);
      unexpected.push_back("and " + std::to_string(more) + " more");
    }
    throw FormatError("checkpoint " + impl->path + " has tensors that " + c.architecture +
                      " does not use: " + join(unexpected) +
                      "; is config.json for this checkpoint (num_hidden_layers, attention_bias, "
                      "architectures)?");
  }
  if (opt.distributed_config) {
    // Tensor parallelism: resolve the plan (the weights' default styles under the user's rules)
    // and check it before any weight is read.
    std::vector<distributed::WeightDecl> decls;
    std::map<std::string, std::string> defaults;
    for (const auto& s : specs) {
      decls.push_back({s.name, s.shape});
      if (!s.tp_style.empty())
        defaults[distributed::TpPlan::key_form(distributed::module_of(s.name))] = s.tp_style;
    }
    impl->tp = std::make_shared<distributed::TpModel>(*opt.distributed_config, defaults, decls);
    impl->arch->validate_tp(c, *impl->tp);
    if (!stored.scheme.empty())
      throw UnsupportedError("checkpoint " + impl->path + " is stored quantized (" + stored.scheme +
                             "); loading it with tensor parallelism is not supported yet: load "
                             "its float original with quantize=\"int8\" or \"int4\" under "
                             "tp_size > 1 (each rank quantizes its own slice), or this checkpoint "
                             "in a single process");
  }
  // This rank's part of checkpoint tensor `source` for weight `s` (all of it without tensor
  // parallelism), for the quantizer, which reads f32 or bf16.
  auto quantizer_source = [&](const models::WeightSpec& s, const std::string& source) {
    if (!impl->tp) return ckpt.get(source);
    const DType stored_dtype = ckpt.info(source).dtype;
    return impl->tp->load(ckpt, s.name, source,
                          stored_dtype == DType::bf16 ? stored_dtype : DType::f32);
  };
  // Progress by bytes of checkpoint tensors read; a tied head quantized as its own copy reads
  // its target a second time.
  const std::string stage = quantize ? "quantizing to " + opt.quantize : "loading weights";
  int64_t bytes_total = 0, bytes_done = 0;
  // A tied linear absent from the checkpoint whose target is not prepared the same way (a tied
  // lm_head when quantized: the embedding is gathered as stored) gets its own prepared copy.
  auto prepared_copy = [&](const models::WeightSpec& s) {
    return !ckpt.has(s.name) && !s.tied_to.empty() && quantized(s) &&
           !quantized(*by_name.at(s.tied_to));
  };
  for (const auto& name : ckpt.names())
    if (by_name.count(name) || stored_part(name) || pieces.count(name))
      bytes_total += int64_t(ckpt.info(name).nbytes);
  for (const auto& s : specs)
    if (prepared_copy(s) && ckpt.has(s.tied_to))
      bytes_total += int64_t(ckpt.info(s.tied_to).nbytes);
  // Tables that are only gathered from, a few rows a token (an untied embed_tokens, Gemma 4's
  // per-layer table of 5.6 GB in E4B): "copy" leaves them in the mapping, since the copy's
  // streaming speed buys them nothing; only the rows of the tokens seen become resident. A table
  // that a tied head multiplies as it is is read whole every token, and is copied; a tied head
  // prepared apart (quantized) leaves its table gathered only, and is made from the mapping.
  std::set<std::string> multiplied;
  for (const auto& s : specs)
    if (!s.tied_to.empty() && !ckpt.has(s.name) && !prepared_copy(s)) multiplied.insert(s.tied_to);
  auto gathered_only = [&](const models::WeightSpec& s) {
    return s.role == models::WeightRole::kEmbedding && !multiplied.count(s.name);
  };
  auto advance = [&](const std::string& source) {
    bytes_done += int64_t(ckpt.info(source).nbytes);
    if (opt.progress) opt.progress(stage, bytes_done, bytes_total);
  };
  // An AWQ or GPTQ weight, read into codes and per-block scales and zero points that the backend
  // packs.
  auto add_imported = [&](const models::WeightSpec& s) {
    const std::string prefix = prefix_of(s.name);
    const models::Int4Codes q =
        models::import_int4(ckpt, impl->path, *stored.import, prefix, s.shape[0], s.shape[1]);
    bind_prepared(s.name, impl->backend->prepare_quantized_linear(
                              backends::int4_rows(q.codes, q.scale, q.zero)));
    for (const std::string& part : models::int4_import_parts(ckpt, prefix)) {
      release_pages(ckpt.get(part));
      advance(part);
    }
  };
  // A weight stored quantized by tformers, int8 rows or int4 tiles (graph::QuantLayout) with its
  // scales (and zero points), checked and given to the backend to lay out (the CPU backend
  // takes both as stored).
  auto add_stored = [&](const models::WeightSpec& s) {
    if (stored.import) return add_imported(s);
    const io::TensorInfo& info = ckpt.info(s.name);
    const int64_t N = s.shape[0], K = s.shape[1];
    const bool int4 = info.dtype == DType::u8;
    if (!int4 && info.dtype != DType::i8)
      throw FormatError("tensor '" + s.name + "' in " + info.file + " has dtype " +
                        std::string(dtype_name(info.dtype)) +
                        "; a quantized linear weight is int8 (int8 scheme) or uint8 (int4 tiles)");
    if (int4 && N % graph::kInt4Rows != 0)
      throw FormatError("tensor '" + s.name + "' in " + info.file + " holds int4 tiles, but its " +
                        std::to_string(N) + " rows (config.json) do not divide into tiles of 8");
    const graph::QuantScheme scheme = int4 ? graph::QuantScheme::kInt4 : graph::QuantScheme::kInt8;
    const graph::QuantLayout layout = int4 ? graph::QuantLayout::kTiles : graph::QuantLayout::kRows;
    const graph::QuantOperandTypes types = graph::quant_operand_types(scheme, layout, N, K);
    const std::string what = int4 ? "int4" : "int8";
    auto add = [&](const std::string& name, const graph::TensorType& want) {
      const DType dtype = want.dtype;
      const Shape& shape = want.shape;
      if (!ckpt.has(name))
        throw NotFoundError("checkpoint " + impl->path + " has no tensor '" + name +
                            "', which the " + what + " weight '" + s.name + "' needs (" +
                            std::string(dtype_name(dtype)) + shape_str(shape) + ")");
      const io::TensorInfo& t = ckpt.info(name);
      if (t.dtype != dtype || t.shape != shape)
        throw FormatError("tensor '" + name + "' in " + t.file + " is " +
                          std::string(dtype_name(t.dtype)) + shape_str(t.shape) + "; the " + what +
                          " weight of shape " + shape_str(s.shape) + " needs " +
                          std::string(dtype_name(dtype)) + shape_str(shape) +
                          " (docs/quantization.md)");
      Tensor host = resident(ckpt.get(name), name);
      advance(name);
      return host;
    };
    const std::string prefix = prefix_of(s.name);
    backends::QuantizedLinear q{scheme,
                                layout,
                                N,
                                K,
                                add(s.name, types.weight),
                                add(prefix + ".weight_scale", types.scale)};
    if (ckpt.has(prefix + ".weight_zero")) {
      if (!int4)
        throw FormatError("tensor '" + prefix + ".weight_zero' in " +
                          ckpt.info(prefix + ".weight_zero").file +
                          ": zero points belong to int4 weights, and '" + s.name + "' is int8");
      q.zero = add(prefix + ".weight_zero", {DType::u8, types.scale.shape});
    }
    bind_prepared(s.name, impl->backend->prepare_quantized_linear(q));
  };
  // A weight held in pieces: their rows, in order, copied into one tensor of the model dtype.
  auto stacked = [&](const models::WeightSpec& s) {
    Tensor whole = Tensor::zeros(s.shape, impl->dtype);
    size_t at = 0;
    for (const std::string& piece : s.stacked_from) {
      if (!ckpt.has(piece))
        throw NotFoundError("checkpoint " + impl->path + " has neither tensor '" + s.name +
                            "' nor '" + piece + "', one of the pieces it is made of");
      const io::TensorInfo& info = ckpt.info(piece);
      if (!is_float(info.dtype) || info.shape.empty() || info.shape.back() != s.shape.back() ||
          at + shape_numel(info.shape) * dtype_size(impl->dtype) > whole.nbytes())
        throw FormatError("tensor '" + piece + "' in " + info.file + " is " +
                          std::string(dtype_name(info.dtype)) + shape_str(info.shape) +
                          "; as a piece of '" + s.name + "' " + shape_str(s.shape) +
                          " (config.json) it must be a float tensor of rows of " +
                          std::to_string(s.shape.back()));
      const Tensor rows = ckpt.get(piece).to(impl->dtype);
      std::memcpy(static_cast<char*>(whole.raw()) + at, rows.raw(), rows.nbytes());
      at += rows.nbytes();
      advance(piece);
    }
    if (at != whole.nbytes())
      throw FormatError("the pieces of '" + s.name + "' in " + impl->path + " hold " +
                        std::to_string(at / dtype_size(impl->dtype)) + " values; config.json " +
                        "implies " + shape_str(s.shape));
    return whole;
  };
  // A weight assembled on the host (from pieces, or from another layout): under tensor
  // parallelism this rank's rows of it (its experts), padded as a shard is; then prepared or
  // uploaded.
  auto add_assembled = [&](const models::WeightSpec& s, Tensor whole) {
    if (impl->tp && impl->tp->shard(s.name).dim == 0)
      whole = distributed::shard_rows(impl->tp->shard(s.name), whole);
    if (quantized(s))
      bind_prepared(s.name, impl->backend->prepare_experts(whole, opt.quantize));
    else
      bind(s.name, impl->backend->upload(whole));
  };
  // MXFP4 experts kept as stored: their codes and exponents, this rank's experts of them under
  // tensor parallelism.
  auto add_mxfp4 = [&](const models::WeightSpec& s) {
    models::Mxfp4Rows m = models::read_mxfp4_rows(ckpt, s);
    const bool split = impl->tp && impl->tp->shard(s.name).dim == 0;
    const int64_t E = split ? impl->tp->shard(s.name).local_shape[0] : s.shape[0];
    // This rank's experts' rows of t (E * N, width).
    auto mine = [&](const Tensor& t, const std::string& source) {
      Tensor whole = resident(t, source);
      if (!split) return whole;
      return distributed::shard_rows(impl->tp->shard(s.name),
                                     whole.reshape({s.shape[0], s.shape[1], whole.dim(1)}));
    };
    const std::vector<std::string> sources = models::stored_sources(ckpt, s);
    const Tensor codes = mine(m.codes, sources[0]), scales = mine(m.scales, sources[1]);
    const int64_t rows = E * s.shape[1];
    bind_prepared(s.name, impl->backend->prepare_quantized_experts(
                              {graph::QuantScheme::kMxfp4, graph::QuantLayout::kRows, rows,
                               s.shape[2], codes.reshape({rows, s.shape[2] / 2}),
                               scales.reshape({rows, s.shape[2] / 32})},
                              E));
  };
  for (const auto& s : specs) {
    if (stored_quantized(s)) {
      add_stored(s);
      continue;
    }
    if (models::stored_differently(ckpt, s)) {
      // MXFP4 is already 4.25 bits a weight: quantize leaves it so (as vLLM and llama.cpp do).
      if (models::stored_as_mxfp4(ckpt, s))
        add_mxfp4(s);
      else
        add_assembled(s, models::read_stored(ckpt, s, impl->dtype));
      // Read through the mapping into copies: its pages need not stay resident as well.
      for (const std::string& source : models::stored_sources(ckpt, s)) {
        release_pages(ckpt.get(source));
        advance(source);
      }
      continue;
    }
    if (!ckpt.has(s.name)) {
      if (!s.tied_to.empty()) continue;  // bound below, once its target is loaded
      if (!s.stacked_from.empty()) {
        add_assembled(s, stacked(s));
        continue;
      }
      throw NotFoundError("checkpoint " + impl->path + " has no tensor '" + s.name + "', which " +
                          c.architecture + " requires (shape " + shape_str(s.shape) + ")");
    }
    const io::TensorInfo& info = ckpt.info(s.name);
    if (info.shape != s.shape)
      throw FormatError("tensor '" + s.name + "' in " + info.file + " has shape " +
                        shape_str(info.shape) + " but config.json implies " + shape_str(s.shape));
    if (!is_float(info.dtype))
      throw FormatError("tensor '" + s.name + "' in " + info.file + " has dtype " +
                        std::string(dtype_name(info.dtype)) + "; weights must be floating point");
    if (quantized(s)) {
      add_prepared(s, quantizer_source(s, s.name), s.name);
    } else {
      // Weights in the requested dtype are used straight from the mapping; others converted.
      const DType want = bias_of_quantized(s) ? DType::f32 : impl->dtype;
      Tensor t = impl->tp ? impl->tp->load(ckpt, s.name, s.name, want) : ckpt.get(s.name).to(want);
      if (!gathered_only(s)) t = resident(t, s.name);
      bind(s.name, impl->backend->upload(t));
    }
    advance(s.name);
  }
  for (const auto& s : specs) {
    if (impl->weights.count(s.name) || s.tied_to.empty()) continue;
    const distributed::TpModel* tp = impl->tp.get();
    // Tied, but split differently from its target: this rank's own slice of the target.
    const bool own_slice = tp && (tp->shard(s.name).dim != tp->shard(s.tied_to).dim ||
                                  tp->shard(s.name).ranges != tp->shard(s.tied_to).ranges);
    if (prepared_copy(s)) {
      // The embedding stays as stored for the gather; the head multiplies its own prepared copy.
      add_prepared(s, quantizer_source(s, s.tied_to), s.tied_to);
      advance(s.tied_to);
    } else if (own_slice) {
      bind(s.name, impl->backend->upload(
                       resident(impl->tp->load(ckpt, s.name, s.tied_to, impl->dtype), s.tied_to)));
    } else {
      bind(s.name, impl->weights.at(s.tied_to));
    }
  }
  const auto gen_path = std::filesystem::path(impl->path) / "generation_config.json";
  if (std::filesystem::exists(gen_path))
    impl->generation_config = GenerationConfig::from_file(gen_path.string());
  for (int64_t b = 16; b <= c.max_position_embeddings; b *= 2) impl->prompt_buckets.push_back(b);
  // A shard cut short during the load left zeros where its weights were.
  io::check_mapped_files();
  return models::CausalLMAccess::wrap(impl);
}

graph::Graph CausalLM::Impl::build_graph(const models::StepShape& shape) const {
  // The model's dtype is the graph's activation dtype; backends decide how to compute it.
  graph::GraphBuilder b(dtype, backend->kv_layout());
  models::Params params(b, weight_types, &quant_attrs);
  params.set_tp(tp.get());
  params.overrides = overrides.get();
  arch->build(b, params, *arch_config, shape, cache_dtype);
  return b.finish();
}

CausalLM::Impl::Step& CausalLM::Impl::step(const models::StepShape& shape, bool uncached) {
  if (auto it = steps.find(shape); it != steps.end() && !uncached) {
    ++stats.hits;
    return it->second;
  }
  graph::Graph g = build_graph(shape);
  Step s{.shape = shape};
  if (uncached) {
    s.exe = backend->compile(g);
  } else {
    backends::CompileCache& cc = backends::CompileCache::global();
    bool compiled = false;
    s.exe = cc.get(*backend, g, &compiled);
    ++(compiled ? stats.compiles : stats.hits);
    if (compiled && s.exe->loaded_from_disk()) ++stats.loaded;
    if (compiled && verbose && distributed::is_main_process())
      std::fprintf(stderr, "tformers: %s step batch=%lld tokens=%lld cache=%lld (%zu nodes)%s\n",
                   s.exe->loaded_from_disk() ? "loaded" : "compiled", (long long)shape.batch,
                   (long long)shape.new_tokens, (long long)shape.cache_len, g.nodes().size(),
                   s.exe->loaded_from_disk() ? " from the compile cache" : "");
  }
  for (int id : g.leaves(graph::Op::kParameter))
    s.params.push_back(weights.at(g.node(id).name).get());
  const auto& state_buffers = shape.paged() ? kv_pool : cache;
  for (int id : g.leaves(graph::Op::kState)) s.states.push_back(&state_buffers.at(g.node(id).name));
  if (uncached) return scratch = std::move(s);
  return steps.emplace(shape, std::move(s)).first->second;
}

void CausalLM::Impl::run(Step& s, std::span<const Tensor* const> inputs,
                         std::span<Tensor* const> outputs) {
  std::vector<backends::Buffer*> states;
  states.reserve(s.states.size());
  for (const std::shared_ptr<backends::Buffer>* slot : s.states) states.push_back(slot->get());
  ++cache_writes;
  s.exe->run(s.params, states, inputs, outputs);
  // Under "mmap" the weights are read from the checkpoint's pages at every step: a file cut
  // short since is found here (see io::check_mapped_files), not by a SIGBUS.
  io::check_mapped_files();
}

void CausalLM::Impl::allocate_pool(int64_t blocks, int64_t block_size, int64_t table_blocks,
                                   int64_t state_slots) {
  pool_table_blocks = table_blocks;
  if (recurrent_bytes_per_sequence() == 0) state_slots = 0;
  if (blocks == pool_blocks && block_size == pool_block_size && state_slots == pool_state_slots)
    return;
  TF_CHECK(state_slots > 0 || recurrent_bytes_per_sequence() == 0,
           "a model with linear-attention layers needs recurrent state slots in its pools");
  kv_pool.clear();
  std::erase_if(steps, [](const auto& s) { return s.first.paged(); });  // bound to the old pools
  // A recurrent state slot per sequence a step may hold; never cleared (a sequence's first step
  // zeroes its slot).
  allocate_states(kv_pool, "kv_pool", blocks, block_size, "recurrent_pool", state_slots);
  pool_blocks = blocks;
  pool_block_size = block_size;
  pool_state_slots = state_slots;
}

void CausalLM::Impl::allocate_states(std::map<std::string, std::shared_ptr<backends::Buffer>>& into,
                                     const char* kv, int64_t rows, int64_t positions,
                                     const char* recurrent, int64_t sequences) {
  const std::vector<models::LayerState> layers = arch->states(*arch_config, tp.get());
  for (size_t l = 0; l < layers.size(); ++l) {
    const models::LayerState& st = layers[l];
    const std::string layer = "." + std::to_string(l);
    if (st.recurrent()) {
      into[recurrent + layer + ".conv"] =
          backend->allocate({DType::f32, {sequences, st.conv_width - 1, st.conv_channels}});
      into[recurrent + layer + ".delta"] =
          backend->allocate({DType::f32, {sequences, st.heads, st.key_dim, st.value_dim}});
      continue;
    }
    if (!st.attention()) continue;
    const graph::TensorType t = graph::kv_cache_type(backend->kv_layout(), cache_dtype, rows,
                                                     st.kv_heads, positions, st.head_dim);
    for (const char* part : {".key", ".value"}) into[kv + layer + part] = backend->allocate(t);
  }
}

int64_t CausalLM::Impl::kv_bytes_per_position() const {
  int64_t bytes = 0;
  for (const models::LayerState& l : arch->states(*arch_config, tp.get()))
    if (l.attention()) bytes += 2 * l.kv_heads * l.head_dim * int64_t(dtype_size(cache_dtype));
  return bytes;
}

int64_t CausalLM::Impl::recurrent_bytes_per_sequence() const {
  int64_t bytes = 0;
  for (const models::LayerState& l : arch->states(*arch_config, tp.get()))
    bytes += l.recurrent_bytes();
  return bytes;
}

std::vector<CausalLM::Impl::WeightSpan> CausalLM::Impl::decode_weight_spans() const {
  // By role, not name: the buffers bound to a weight that is not an embedding (quantization
  // scales included), each once; an embedding buffer is among them only as a tied head.
  std::set<std::string> embeddings;
  std::map<std::string, double> shares;  // a weight's buffers (scales too) by name
  for (const models::WeightSpec& s : arch->weights(*arch_config)) {
    if (s.role == models::WeightRole::kEmbedding) embeddings.insert(s.name);
    if (s.read_share != 1)
      for (const char* part : {"", "_scale", "_zero"}) shares[s.name + part] = s.read_share;
  }
  std::map<const backends::Buffer*, double> multiplied;
  for (const auto& [name, buf] : weights)
    if (!embeddings.count(name)) {
      const auto it = shares.find(name);
      multiplied[buf.get()] = it == shares.end() ? 1.0 : it->second;
    }
  std::vector<WeightSpan> spans;
  for (const auto& [buf, share] : multiplied) {
    const int64_t bytes = shape_numel(buf->type().shape) * int64_t(dtype_size(buf->type().dtype));
    spans.push_back({buf->host_data(), int64_t(double(bytes) * share)});
  }
  return spans;
}

void CausalLM::save_pretrained(const std::string& dir) const {
  const Impl& m = *impl_;
  if (m.tp)
    throw UnsupportedError(
        "save_pretrained: this tensor-parallel model holds only its rank's "
        "slices of the weights; load it in one process to save it");
  std::vector<std::pair<std::string, Tensor>> tensors;
  bool mxfp4 = false;
  for (const models::WeightSpec& s : m.arch->weights(*m.arch_config)) {
    const auto& w = m.weights.at(s.name);
    if (!s.tied_to.empty() && m.weights.at(s.tied_to) == w) continue;  // the tie, not a copy
    auto q = m.quant_attrs.find(s.name);
    if (q == m.quant_attrs.end()) {
      // In the float layout of the checkpoint it came from (gpt-oss's experts transposed).
      tensors.emplace_back(s.name, models::to_stored(m.backend->download(*w), s.stored));
      continue;
    }
    if (q->second.scheme == graph::QuantScheme::kMxfp4) {
      // As the checkpoint stored them.
      for (auto& t : models::to_stored_mxfp4(s, m.backend->download(*w),
                                             m.backend->download(*m.weights.at(s.name + "_scale"))))
        tensors.push_back(std::move(t));
      mxfp4 = true;
      continue;
    }
    if (s.role == models::WeightRole::kExperts)
      throw UnsupportedError("save_pretrained: " + s.name +
                             " holds experts quantized at load, which tformers does not store "
                             "yet; save the float model and load it with quantize");
    // A quantized linear in tformers' stored layouts (int8 rows, int4 tiles), its scales and
    // zero points under the names the loader reads them by.
    auto part = [&](const char* suffix) {
      return m.backend->download(*m.weights.at(s.name + suffix));
    };
    backends::QuantizedLinear ql{.scheme = q->second.scheme,
                                 .layout = q->second.layout,
                                 .rows = s.shape[0],
                                 .cols = s.shape[1],
                                 .weight = m.backend->download(*w),
                                 .scale = part("_scale")};
    if (q->second.has_zero) ql.zero = part("_zero");
    if (ql.scheme == graph::QuantScheme::kInt4) ql = backends::to_tiles(ql);
    tensors.emplace_back(s.name, std::move(ql.weight));
    tensors.emplace_back(s.name + "_scale", std::move(ql.scale));
    if (ql.zero) tensors.emplace_back(s.name + "_zero", std::move(*ql.zero));
  }
  if (mxfp4 && !m.quantize.empty())
    throw UnsupportedError("save_pretrained: this model holds MXFP4 experts and " + m.quantize +
                           " linears, which no checkpoint format here stores together; save it "
                           "loaded without quantize (its experts stay MXFP4)");
  std::filesystem::create_directories(dir);
  io::save_safetensors((std::filesystem::path(dir) / "model.safetensors").string(), tensors,
                       {{"format", "pt"}});
  nlohmann::json config = m.arch_config->json;
  config["torch_dtype"] = std::string(dtype_name(m.dtype));
  // Transformers 5 reads "dtype" first; keep the two consistent when the source had it.
  if (config.contains("dtype")) config["dtype"] = config["torch_dtype"];
  if (mxfp4)
    config["quantization_config"] = {{"quant_method", "mxfp4"}};
  else if (m.quantize.empty())
    config.erase("quantization_config");
  else
    config["quantization_config"] = {
        {"quant_method", "tformers"}, {"scheme", m.quantize}, {"block_size", 32}};
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  std::ofstream out(config_path);
  out << config.dump(2) << "\n";
  if (!out.flush()) throw IoError("save_pretrained: cannot write " + config_path);
}

const PretrainedConfig& CausalLM::config() const { return *impl_->arch_config; }
const std::string& CausalLM::device() const { return impl_->device; }
const std::string& CausalLM::folder() const { return impl_->path; }
DType CausalLM::dtype() const { return impl_->dtype; }
int64_t CausalLM::cache_batch() const { return impl_->cache_batch; }
int64_t CausalLM::max_cache_len() const { return impl_->cache_len; }
CompileStats CausalLM::compile_stats() const { return impl_->stats; }
GenerationConfig& CausalLM::generation_config() { return impl_->generation_config; }
void CausalLM::set_prompt_buckets(std::vector<int64_t> buckets) {
  std::sort(buckets.begin(), buckets.end());
  if (!buckets.empty() && buckets.front() <= 0)
    throw InvalidArgumentError("set_prompt_buckets: bucket sizes must be positive");
  impl_->prompt_buckets = std::move(buckets);
}
uint64_t CausalLM::host_to_device_bytes() const {
  return impl_->backend->transfer_stats().host_to_device_bytes;
}
uint64_t CausalLM::device_to_host_bytes() const {
  return impl_->backend->transfer_stats().device_to_host_bytes;
}

void CausalLM::reset_cache(int64_t batch, int64_t max_cache_len) {
  if (batch <= 0 || max_cache_len <= 0)
    throw InvalidArgumentError("reset_cache: batch and max_cache_len must be positive, got " +
                               std::to_string(batch) + " and " + std::to_string(max_cache_len));
  const int64_t positions = impl_->arch_config->max_position_embeddings;
  if (max_cache_len > positions)
    throw InvalidArgumentError("reset_cache: max_cache_len " + std::to_string(max_cache_len) +
                               " is more than the model's " + std::to_string(positions) +
                               " positions (max_position_embeddings)");
  // Checked before allocating, where the cache lives in host memory (an accelerator's
  // allocation fails on its own): an absurd batch or length would otherwise grow the process
  // until the system stops it. As doubles, so the product cannot wrap.
  const double bytes =
      double(batch) * (double(max_cache_len) * double(impl_->kv_bytes_per_position()) +
                       double(impl_->recurrent_bytes_per_sequence()));
  const uint64_t limit = memory_limit_bytes();
  if (impl_->state_on_host() && bytes > double(limit))
    throw ResourceError(
        detail::str_cat("reset_cache: a KV cache of batch ", batch, " x max_cache_len ",
                        max_cache_len, " x ", impl_->kv_bytes_per_position(), " bytes per position",
                        impl_->recurrent_bytes_per_sequence() > 0
                            ? detail::str_cat(" (plus ", impl_->recurrent_bytes_per_sequence(),
                                              " bytes of recurrent state per row)")
                            : std::string(),
                        " needs ", planned_bytes(bytes), " bytes, more than the ", limit,
                        " bytes this process can have (memory, ulimit, cgroup); lower the batch or "
                        "max_cache_len"));
  const models::ExclusiveCall exclusive(*impl_);
  impl_->reset_cache(batch, max_cache_len);
}

void CausalLM::Impl::reset_cache(int64_t batch, int64_t max_cache_len) {
  // Same shape: reuse the buffers. Attention reads only slots below the used length and the
  // mask, so stale values from an earlier call are never seen and need no clearing.
  if (batch == cache_batch && max_cache_len == cache_len) return;
  cache.clear();
  // Static steps' state bindings point at the old slots.
  std::erase_if(steps, [](const auto& s) { return !s.first.paged(); });
  // The recurrent states are never cleared: a step at cache position 0 counts them as zeros.
  allocate_states(cache, "past_key_values", batch, max_cache_len, "recurrent_state", batch);
  // Every key masked until a step's caller sets the mask (ModelRunner::set_attention_mask).
  cache["attention_mask"] = backend->allocate({DType::i32, {batch, max_cache_len}});
  ++cache_writes;
  cache_batch = batch;
  cache_len = max_cache_len;
}

Tensor CausalLM::forward(const ForwardArgs& a) {
  Impl& m = *impl_;
  const models::ExclusiveCall exclusive(m);
  const Tensor& ids = a.input_ids;
  if (ids.ndim() != 2 || ids.dtype() != DType::i32)
    throw InvalidArgumentError("forward: input_ids must be int32 (batch, tokens), got " +
                               std::string(dtype_name(ids.dtype())) + shape_str(ids.shape()));
  const int64_t B = ids.dim(0), T = ids.dim(1);
  if (T == 0) throw InvalidArgumentError("forward: input_ids has no tokens");
  if (m.cache_len == 0 || m.cache_batch != B)
    throw InvalidArgumentError("forward: no static cache for batch " + std::to_string(B) +
                               ": call reset_cache(batch, max_cache_len) first");
  if (a.cache_position < 0 || a.cache_position + T > m.cache_len)
    throw InvalidArgumentError("forward: " + std::to_string(T) + " tokens at cache_position " +
                               std::to_string(a.cache_position) + " do not fit max_cache_len " +
                               std::to_string(m.cache_len));
  const int64_t V = m.arch_config->vocab_size;
  const int32_t* id = ids.data<int32_t>();
  if (const int32_t* bad =
          std::find_if(id, id + ids.numel(), [&](int32_t t) { return t < 0 || t >= V; });
      bad != id + ids.numel())
    throw InvalidArgumentError("forward: input_ids has token id " + std::to_string(*bad) +
                               ", outside the vocabulary [0, " + std::to_string(V) + ")");
  if (a.logits_to_keep < 0 || a.logits_to_keep > T)
    throw InvalidArgumentError("forward: logits_to_keep must be in [0, " + std::to_string(T) +
                               "], got " + std::to_string(a.logits_to_keep));
  Tensor pos = a.position_ids;
  if (!pos.defined() || pos.numel() == 0) {
    pos = Tensor::zeros({B, T}, DType::i32);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        pos.data<int32_t>()[b * T + t] = int32_t(a.cache_position + t);
  }
  Tensor mask = a.attention_mask;
  if (!mask.defined() || mask.numel() == 0) {
    mask = Tensor::zeros({B, m.cache_len}, DType::i32);
    std::fill_n(mask.data<int32_t>(), mask.numel(), 1);
  }
  const int64_t keep = a.logits_to_keep == 0 ? T : a.logits_to_keep;
  Tensor logits = Tensor::zeros({B, keep, m.arch_config->vocab_size}, DType::f32);
  models::ModelRunner runner(*this);
  runner.set_attention_mask(mask);
  runner.run_static(runner.prepare_static(T, keep), ids, pos, a.cache_position, logits);
  return logits;
}

namespace models {

namespace {
// The model's mutex, once it is sure that this thread does not hold it already.
std::mutex& not_held_by_this_thread(CausalLM::Impl& m) {
  if (m.caller.load() == std::this_thread::get_id())
    throw InvalidArgumentError(
        "the model was called again from inside one of its own calls on this thread (from a "
        "token callback or streamer); a model runs one call at a time: use a second model");
  return m.call_mutex;
}
}  // namespace

ExclusiveCall::ExclusiveCall(CausalLM::Impl& model)
    : model_(model), lock_(not_held_by_this_thread(model)) {
  model_.caller = std::this_thread::get_id();
}

ExclusiveCall::~ExclusiveCall() { model_.caller = std::thread::id(); }

void set_layer_overrides(CausalLM& model, std::shared_ptr<const LayerOverrides> overrides) {
  CausalLM::Impl& m = state_of(model);
  m.overrides = std::move(overrides);
  m.steps.clear();
}
bool is_verbose(const CausalLM& model) { return state_of(model).verbose; }

}  // namespace models

}  // namespace tformers
