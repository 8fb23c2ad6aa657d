#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "backends/compile_cache.h"
#include "backends/cpu/kernels.h"
#include "backends/registry.h"
#include "io/hub.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "models/causal_lm_impl.h"
#include "models/layers.h"
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

CompileStats compile_stats() { return backends::CompileCache::global().stats(); }

namespace {

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// Fills the fields every decoder shares, then lets the architecture read its own.
ModelConfig parse_config(const io::Json& j, const std::string& where,
                         const models::Architecture*& arch) {
  ModelConfig c;
  io::Json arch_list = io::get_required<io::Json>(j, "architectures", where);
  std::vector<std::string> archs;
  if (arch_list.is_array())
    for (const auto& a : arch_list)
      if (a.is_string()) archs.push_back(a.get<std::string>());
  if (archs.empty() || archs.size() != arch_list.size())
    throw FormatError(where +
                      ": field 'architectures' must be a non-empty list of class names "
                      "such as [\"Qwen3ForCausalLM\"]");
  for (const auto& name : archs)
    if ((arch = models::find_architecture(name))) {
      c.architecture = name;
      break;
    }
  if (!arch)
    throw UnsupportedError(where + ": architectures [" + join(archs) +
                           "] has no architecture this build supports; supported: " +
                           join(models::architecture_names()));
  c.model_type = io::get_or<std::string>(j, "model_type", "", where);
  c.vocab_size = io::get_required<int64_t>(j, "vocab_size", where);
  c.hidden_size = io::get_required<int64_t>(j, "hidden_size", where);
  c.intermediate_size = io::get_required<int64_t>(j, "intermediate_size", where);
  c.num_hidden_layers = io::get_required<int64_t>(j, "num_hidden_layers", where);
  c.num_attention_heads = io::get_required<int64_t>(j, "num_attention_heads", where);
  c.num_key_value_heads =
      io::get_or<int64_t>(j, "num_key_value_heads", c.num_attention_heads, where);
  c.max_position_embeddings = io::get_or<int64_t>(j, "max_position_embeddings", 2048, where);
  c.rms_norm_eps = io::get_or<double>(j, "rms_norm_eps", 1e-6, where);
  c.rope_theta = io::get_or<double>(j, "rope_theta", 10000.0, where);
  c.tie_word_embeddings = io::get_or<bool>(j, "tie_word_embeddings", false, where);
  c.attention_bias = io::get_or<bool>(j, "attention_bias", false, where);
  if (auto d = io::get_optional<std::string>(j, "torch_dtype", where))
    c.torch_dtype = parse_dtype(*d);
  if (auto a = io::get_optional<std::string>(j, "hidden_act", where); a && *a != "silu")
    throw UnsupportedError(where + ": hidden_act '" + *a + "' is not supported (only silu)");
  for (auto [name, v] : {std::pair{"vocab_size", c.vocab_size},
                         {"hidden_size", c.hidden_size},
                         {"intermediate_size", c.intermediate_size},
                         {"num_hidden_layers", c.num_hidden_layers},
                         {"num_attention_heads", c.num_attention_heads},
                         {"num_key_value_heads", c.num_key_value_heads}})
    if (v <= 0)
      throw FormatError(where + ": " + name + " must be positive, got " + std::to_string(v));
  c.head_dim = c.hidden_size / c.num_attention_heads;
  arch->read_config(j, c, where);
  if (j.contains("head_dim") && !j["head_dim"].is_null())
    c.head_dim = io::get_required<int64_t>(j, "head_dim", where);
  if (c.head_dim <= 0 || c.head_dim % 2)
    throw FormatError(where + ": head_dim must be a positive even number, got " +
                      std::to_string(c.head_dim));
  if (c.num_attention_heads % c.num_key_value_heads)
    throw FormatError(where + ": num_attention_heads (" + std::to_string(c.num_attention_heads) +
                      ") must be a multiple of num_key_value_heads (" +
                      std::to_string(c.num_key_value_heads) + ")");
  c.inv_freq = models::rope_inv_freq(j, c.rope_theta, c.head_dim, where);
  return c;
}

// LoadOptions::quantize = "int8": (N,K) int8 values and (N, ceil(K / 32)) f32 block scales for a
// float weight (see cpu::quantize_int8). The source pages of the mapping are released afterwards
// (they stay in the page cache and are re-read if used again, as the tied embedding's are), so
// resident memory holds the int8 copy rather than both.
std::pair<Tensor, Tensor> quantize_int8(const Tensor& w) {
  Tensor src = (w.dtype() == DType::f32 || w.dtype() == DType::bf16) ? w : w.to(DType::f32);
  const int64_t N = w.dim(0), K = w.dim(1);
  Tensor q = Tensor::zeros({N, K}, DType::i8);
  Tensor scale = Tensor::zeros({N, cpu::int8_blocks(K)}, DType::f32);
  cpu::quantize_int8(src.raw(), src.dtype(), q.data<int8_t>(), scale.data<float>(), N, K,
                     ThreadPool::global());
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (uintptr_t(w.raw()) + page - 1) / page * page;
  const uintptr_t hi = (uintptr_t(w.raw()) + w.nbytes()) / page * page;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
  return {q, scale};
}

}  // namespace

CausalLM AutoModelForCausalLM::from_pretrained(const std::string& path, const LoadOptions& opt) {
  auto impl = std::make_shared<CausalLM::Impl>();
  impl->path = io::resolve_model_path(path, opt.revision);
  impl->verbose = opt.verbose;
  const std::string config_path = (std::filesystem::path(impl->path) / "config.json").string();
  impl->config = parse_config(io::load_json_file(config_path), config_path, impl->arch);
  const ModelConfig& c = impl->config;
  impl->dtype = opt.dtype.value_or(c.torch_dtype.value_or(DType::f32));
  if (impl->dtype != DType::f32 && impl->dtype != DType::bf16)
    throw UnsupportedError(std::string("dtype ") + std::string(dtype_name(impl->dtype)) +
                           " is not supported by the CPU backend: use float32 or bfloat16");
  impl->backend = &backends::backend_for(opt.device_map, opt.verbose);
  if (!opt.quantize.empty() && opt.quantize != "int8")
    throw InvalidArgumentError("quantize '" + opt.quantize +
                               "' is not supported: use \"int8\" (weight-only, one scale per 32 "
                               "weights) or leave it empty");
  const bool int8 = opt.quantize == "int8";
  // Linear weights: every 2-D weight but the token embedding, which is gathered, not multiplied
  // (a tied lm_head is quantized as its own copy below).
  auto quantized = [&](const std::string& name, const Shape& shape) {
    return int8 && shape.size() == 2 && name != "model.embed_tokens.weight";
  };
  std::map<std::string, Shape> spec_shapes;
  for (const auto& s : impl->arch->weights(c)) spec_shapes[s.name] = s.shape;
  auto bias_of_quantized = [&](const std::string& name) {
    const std::string suffix = ".bias";
    if (name.size() <= suffix.size() || name.compare(name.size() - 5, 5, suffix) != 0) return false;
    auto it = spec_shapes.find(name.substr(0, name.size() - 5) + ".weight");
    return it != spec_shapes.end() && quantized(it->first, it->second);
  };
  auto add_quantized = [&](const std::string& name, const Tensor& w) {
    auto [q, scale] = quantize_int8(w);
    const std::string prefix = name.substr(0, name.size() - std::string(".weight").size());
    impl->weights[name] = impl->backend->upload(q);
    impl->weight_types[name] = {DType::i8, q.shape()};
    impl->weights[prefix + ".weight_scale"] = impl->backend->upload(scale);
    impl->weight_types[prefix + ".weight_scale"] = {DType::f32, scale.shape()};
  };

  // Weights: every declared one present with its declared shape, nothing unexpected.
  io::Checkpoint ckpt = io::Checkpoint::open(impl->path);
  std::vector<models::WeightSpec> specs = impl->arch->weights(c);
  std::map<std::string, bool> expected;
  for (const auto& s : specs) expected[s.name] = true;
  std::vector<std::string> unexpected;
  for (const auto& name : ckpt.names())
    if (!expected.count(name) && !impl->arch->ignorable(name)) unexpected.push_back(name);
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
    // Tensor parallelism: resolve the plan and check it before any weight is read.
    std::vector<distributed::WeightDecl> decls;
    for (const auto& s : specs) decls.push_back({s.name, s.shape});
    impl->tp = std::make_shared<distributed::TpModel>(*opt.distributed_config,
                                                      impl->arch->tp_plan(), decls);
    impl->arch->validate_tp(c, *impl->tp);
    if (int8)
      throw UnsupportedError(
          "quantize=\"int8\" with tensor parallelism is not supported yet: load the model in "
          "bfloat16 under tp_size > 1, or quantize in a single process");
  }
  // Progress by bytes of checkpoint tensors read; a tied head quantized as its own copy reads
  // its target a second time.
  const char* stage = int8 ? "quantizing to int8" : "loading weights";
  int64_t bytes_total = 0, bytes_done = 0;
  // A tied lm_head absent from the checkpoint gets its own int8 copy of its (unquantized) target.
  auto quantized_copy = [&](const models::WeightSpec& s) {
    return !ckpt.has(s.name) && !s.tied_to.empty() && quantized(s.name, s.shape) &&
           !quantized(s.tied_to, s.shape);
  };
  for (const auto& s : specs) {
    if (ckpt.has(s.name)) bytes_total += int64_t(ckpt.info(s.name).nbytes);
    if (quantized_copy(s) && ckpt.has(s.tied_to))
      bytes_total += int64_t(ckpt.info(s.tied_to).nbytes);
  }
  auto advance = [&](const std::string& source) {
    bytes_done += int64_t(ckpt.info(source).nbytes);
    if (opt.progress) opt.progress(stage, bytes_done, bytes_total);
  };
  for (const auto& s : specs) {
    std::string source = s.name;
    if (!ckpt.has(source)) {
      if (!s.tied_to.empty()) continue;  // bound below, once its target is loaded
      throw NotFoundError("checkpoint " + impl->path + " has no tensor '" + s.name + "', which " +
                          c.architecture + " requires (shape " + shape_str(s.shape) + ")");
    }
    const io::TensorInfo& info = ckpt.info(source);
    if (info.shape != s.shape)
      throw FormatError("tensor '" + s.name + "' in " + info.file + " has shape " +
                        shape_str(info.shape) + " but config.json implies " + shape_str(s.shape));
    if (!is_float(info.dtype))
      throw FormatError("tensor '" + s.name + "' in " + info.file + " has dtype " +
                        std::string(dtype_name(info.dtype)) + "; weights must be floating point");
    if (quantized(s.name, s.shape)) {
      add_quantized(s.name, ckpt.get(source));
      advance(source);
      continue;
    }
    // Weights in the requested dtype are used straight from the mapping; others are converted.
    // The bias of an int8 linear is f32, as its kernel takes it.
    const DType want = bias_of_quantized(s.name) ? DType::f32 : impl->dtype;
    Tensor t = impl->tp ? impl->tp->load(ckpt, s.name, source, want) : ckpt.get(source).to(want);
    impl->weights[s.name] = impl->backend->upload(t);
    impl->weight_types[s.name] = {want, t.shape()};
    advance(source);
  }
  for (const auto& s : specs)
    if (!impl->weights.count(s.name) && !s.tied_to.empty() && impl->tp &&
        (impl->tp->shard(s.name).dim != impl->tp->shard(s.tied_to).dim ||
         impl->tp->shard(s.name).ranges != impl->tp->shard(s.tied_to).ranges)) {
      // Tied, but split differently from its target: this rank's own slice of the target.
      Tensor t = impl->tp->load(ckpt, s.name, s.tied_to, impl->dtype);
      impl->weights[s.name] = impl->backend->upload(t);
      impl->weight_types[s.name] = {impl->dtype, t.shape()};
    }
  for (const auto& s : specs)
    if (!impl->weights.count(s.name) && quantized_copy(s)) {
      // The embedding stays as stored for the gather; the head multiplies an int8 copy. The
      // pages are re-read from the mapping when the first tokens are embedded.
      add_quantized(s.name, ckpt.get(s.tied_to));
      advance(s.tied_to);
    } else if (!impl->weights.count(s.name) && !s.tied_to.empty()) {
      impl->weights[s.name] = impl->weights.at(s.tied_to);
      impl->weight_types[s.name] = impl->weight_types.at(s.tied_to);
    }
  const auto gen_path = std::filesystem::path(impl->path) / "generation_config.json";
  if (std::filesystem::exists(gen_path))
    impl->generation_config = GenerationConfig::from_file(gen_path.string());
  for (int64_t b = 16; b <= c.max_position_embeddings; b *= 2) impl->prompt_buckets.push_back(b);
  return CausalLM(impl);
}

CausalLM::Impl::Step& CausalLM::Impl::step(const models::StepShape& shape, bool uncached) {
  if (auto it = steps.find(shape); it != steps.end() && !uncached) {
    ++stats.hits;
    return it->second;
  }
  graph::GraphBuilder b;
  models::Params params(b, weight_types);
  params.set_tp(tp.get());
  arch->build(b, params, config, shape, dtype);
  graph::Graph g = b.finish();
  Step s;
  if (uncached) {
    s.exe = backend->compile(g);
  } else {
    backends::CompileCache& cc = backends::CompileCache::global();
    uint64_t before = cc.stats().compiles;
    s.exe = cc.get(*backend, g);
    bool compiled = cc.stats().compiles > before;
    ++(compiled ? stats.compiles : stats.hits);
    if (compiled && verbose && distributed::is_main_process())
      std::fprintf(stderr,
                   "tformers: compiled step batch=%lld tokens=%lld cache=%lld (%zu nodes)\n",
                   (long long)shape.batch, (long long)shape.new_tokens, (long long)shape.cache_len,
                   g.nodes().size());
  }
  for (int id : g.leaves(graph::Op::kParameter))
    s.params.push_back(weights.at(g.node(id).name).get());
  for (int id : g.leaves(graph::Op::kState)) s.states.push_back(cache.at(g.node(id).name).get());
  if (uncached) return scratch = std::move(s);
  return steps.emplace(shape, std::move(s)).first->second;
}

void CausalLM::Impl::run(Step& s, const Tensor& ids, const Tensor& positions, const Tensor& mask,
                         int64_t cache_position, Tensor& logits) {
  Tensor start = Tensor::from_vector<int32_t>({}, DType::i32, {int32_t(cache_position)});
  const Tensor* inputs[] = {&ids, &positions, &start, &mask};
  Tensor* outputs[] = {&logits};
  s.exe->run(s.params, s.states, inputs, outputs);
}

const ModelConfig& CausalLM::config() const { return impl_->config; }
const std::string& CausalLM::device() const {
  static const std::string cpu = "cpu";
  return cpu;
}
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
  Impl& m = *impl_;
  // Same shape: reuse the buffers. Attention reads only slots below the used length and the
  // mask, so stale values from an earlier call are never seen and need no clearing.
  if (batch == m.cache_batch && max_cache_len == m.cache_len) return;
  const ModelConfig& c = m.config;
  m.cache.clear();
  m.steps.clear();  // their state bindings point at the old buffers
  const int64_t kv_heads = m.tp ? m.tp->local_kv_heads : c.num_key_value_heads;
  graph::TensorType t{m.dtype, {batch, kv_heads, max_cache_len, c.head_dim}};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const char* kv : {".key", ".value"})
      m.cache["past_key_values." + std::to_string(l) + kv] = m.backend->allocate(t);
  m.cache_batch = batch;
  m.cache_len = max_cache_len;
}

Tensor CausalLM::forward(const ForwardArgs& a) {
  Impl& m = *impl_;
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
  Tensor logits = Tensor::zeros({B, keep, m.config.vocab_size}, DType::f32);
  Impl::Step& s = m.step({B, T, m.cache_len, keep == T ? 0 : keep});
  m.run(s, ids, pos, mask, a.cache_position, logits);
  return logits;
}

}  // namespace tformers
