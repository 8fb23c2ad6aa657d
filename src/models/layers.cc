#include "models/layers.h"

#include <cmath>
#include <numbers>

#include "distributed/tp_model.h"
#include "kernels_hub/kernelize.h"
#include "tformers/error.h"

namespace tformers::models {

using graph::GraphBuilder;
using graph::TensorType;
using graph::Value;

Value Params::operator()(const std::string& name) {
  if (auto it = nodes_.find(name); it != nodes_.end()) return it->second;
  auto t = types_.find(name);
  TF_CHECK(t != types_.end(), "model code asked for weight '", name, "' that is not declared");
  return nodes_[name] = b_.parameter(name, t->second);
}

std::vector<WeightSpec> decoder_weights(const ModelConfig& c, const DecoderOptions& o) {
  const int64_t h = c.hidden_size, d = c.head_dim, q = c.num_attention_heads * d,
                kv = c.num_key_value_heads * d, f = c.intermediate_size;
  std::vector<WeightSpec> w;
  w.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string a = "model.layers." + std::to_string(l) + ".self_attn.";
    const std::string m = "model.layers." + std::to_string(l) + ".mlp.";
    const std::string n = "model.layers." + std::to_string(l) + ".";
    w.push_back({n + "input_layernorm.weight", {h}});
    w.push_back({a + "q_proj.weight", {q, h}});
    w.push_back({a + "k_proj.weight", {kv, h}});
    w.push_back({a + "v_proj.weight", {kv, h}});
    w.push_back({a + "o_proj.weight", {h, q}});
    if (c.attention_bias) {
      w.push_back({a + "q_proj.bias", {q}});
      w.push_back({a + "k_proj.bias", {kv}});
      w.push_back({a + "v_proj.bias", {kv}});
      w.push_back({a + "o_proj.bias", {h}});
    }
    if (o.qk_norm) {
      w.push_back({a + "q_norm.weight", {d}});
      w.push_back({a + "k_norm.weight", {d}});
    }
    w.push_back({n + "post_attention_layernorm.weight", {h}});
    w.push_back({m + "gate_proj.weight", {f, h}});
    w.push_back({m + "up_proj.weight", {f, h}});
    w.push_back({m + "down_proj.weight", {h, f}});
    if (c.mlp_bias) {
      w.push_back({m + "gate_proj.bias", {f}});
      w.push_back({m + "up_proj.bias", {f}});
      w.push_back({m + "down_proj.bias", {h}});
    }
  }
  w.push_back({"model.norm.weight", {h}});
  WeightSpec head{"lm_head.weight", {c.vocab_size, h}};
  if (c.tie_word_embeddings) {
    head.required = false;
    head.tied_to = "model.embed_tokens.weight";
  }
  w.push_back(head);
  return w;
}

Value linear(GraphBuilder& b, Params& p, Value x, const std::string& prefix) {
  Value bias = p.has(prefix + ".bias") ? p(prefix + ".bias") : -1;
  if (p.has(prefix + ".weight_scale"))  // quantized at load (LoadOptions::quantize)
    return b.linear_int8(x, p(prefix + ".weight"), p(prefix + ".weight_scale"), bias, prefix);
  using distributed::TpStyle;
  const distributed::TpModel* tp = p.tp();
  if (!tp) return b.linear(x, p(prefix + ".weight"), bias, prefix);
  const distributed::WeightShard& w = tp->shard(prefix + ".weight");
  switch (w.style) {
    case TpStyle::kRowwiseSplitInput: {
      // A replicated input: this rank multiplies its own columns of it.
      auto [begin, end] =
          w.ranges.empty() ? std::pair<int64_t, int64_t>{0, w.full_shape[1]} : w.ranges[0];
      x = b.slice_last(x, begin, end, prefix + ".split_input");
      [[fallthrough]];
    }
    case TpStyle::kRowwise: {
      // Partial sums over this rank's input features; the bias is added once, after the sum.
      Value partial = b.linear(x, p(prefix + ".weight"), -1, prefix);
      return b.all_reduce(partial, bias, tp->group_id(), prefix + ".all_reduce");
    }
    case TpStyle::kColwiseGatherOutput: {
      Value y = b.linear(x, p(prefix + ".weight"), bias, prefix);
      return b.all_gather(y, distributed::chunk_sizes(w.full_shape[0], tp->size()), tp->group_id(),
                          prefix + ".all_gather");
    }
    default:  // colwise keeps its output sharded; replicated weights need no communication
      return b.linear(x, p(prefix + ".weight"), bias, prefix);
  }
}

namespace {

// A hub kernel for `layer` when the model was kernelized and one takes these inputs in this
// mode (inputs and floats in the layer contract's order, kernels_hub/package.cc), else the
// built-in op.
template <class Builtin>
Value layer_op(GraphBuilder& b, const Params& p, const StepShape& s, const char* layer,
               std::vector<Value> inputs, TensorType out, std::vector<float> floats,
               const std::string& name, Builtin builtin) {
  if (p.kernels) {
    std::vector<TensorType> types;
    for (Value v : inputs) types.push_back(b.type(v));
    auto mode = s.new_tokens == 1 ? kernels_hub::Mode::kDecode : kernels_hub::Mode::kPrefill;
    if (auto call = p.kernels->find(layer, mode, types, name))
      return b.custom_call(std::move(call), std::move(inputs), std::move(out), std::move(floats),
                           name);
  }
  return builtin();
}

Value rms_norm(GraphBuilder& b, const Params& p, const StepShape& s, Value x, Value w, float eps,
               const std::string& name) {
  return layer_op(b, p, s, "RMSNorm", {x, w}, {DType::f32, b.type(x).shape}, {eps}, name,
                  [&] { return b.rms_norm(x, w, eps, name); });
}

Value rope(GraphBuilder& b, const Params& p, const StepShape& s, Value x, Value pos,
           const std::vector<float>& inv_freq, const std::string& name) {
  return layer_op(b, p, s, "RotaryEmbedding", {x, pos}, {DType::f32, b.type(x).shape}, inv_freq,
                  name, [&] { return b.rope(x, pos, inv_freq, name); });
}

// The token embedding, split over the vocabulary under embedding_rowwise.
Value embed(GraphBuilder& b, Params& p, Value ids, const std::string& name) {
  const std::string w = name + ".weight";
  const distributed::TpModel* tp = p.tp();
  if (!tp || tp->shard(w).style != distributed::TpStyle::kEmbeddingRowwise || tp->size() == 1)
    return b.embedding(p(w), ids, name);
  const distributed::WeightShard& s = tp->shard(w);
  Value part = b.embedding_shard(p(w), ids, s.ranges[0].first, s.full_shape[0], name);
  return b.all_reduce(part, -1, tp->group_id(), name + ".all_reduce");
}
}  // namespace

void build_decoder(GraphBuilder& b, Params& p, const ModelConfig& c, const StepShape& s,
                   DType cache_dtype, const DecoderOptions& o) {
  const int64_t B = s.batch, T = s.new_tokens, S = s.cache_len, D = c.head_dim;
  const float eps = float(c.rms_norm_eps), scale = float(1.0 / std::sqrt(double(D)));

  Value ids = b.input("input_ids", {DType::i32, {B, T}});
  Value pos = b.input("position_ids", {DType::i32, {B, T}});
  Value start = b.input("cache_position", {DType::i32, {}});
  Value mask = b.input("attention_mask", {DType::i32, {B, S}});

  Value h = embed(b, p, ids, "model.embed_tokens");  // (B,T,H)
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string n = "model.layers." + std::to_string(l) + ".";
    const std::string a = n + "self_attn.";
    Value x = rms_norm(b, p, s, h, p(n + "input_layernorm.weight"), eps, n + "input_layernorm");
    // Head counts follow the projections' outputs: a rank of a tensor-parallel model holds
    // only its heads.
    Value q = linear(b, p, x, a + "q_proj"), k = linear(b, p, x, a + "k_proj"),
          v = linear(b, p, x, a + "v_proj");
    const int64_t Hq = b.type(q).shape.back() / D, Hkv = b.type(k).shape.back() / D;
    q = b.reshape(q, {B, T, Hq, D});
    k = b.reshape(k, {B, T, Hkv, D});
    v = b.reshape(v, {B, T, Hkv, D});
    if (o.qk_norm) {
      q = rms_norm(b, p, s, q, p(a + "q_norm.weight"), eps, a + "q_norm");
      k = rms_norm(b, p, s, k, p(a + "k_norm.weight"), eps, a + "k_norm");
    }
    q = rope(b, p, s, q, pos, c.inv_freq, a + "rope_q");
    k = rope(b, p, s, k, pos, c.inv_freq, a + "rope_k");
    const std::string cache = "past_key_values." + std::to_string(l);
    Value kc = b.cache_write(b.state(cache + ".key", {cache_dtype, {B, Hkv, S, D}}), k, start,
                             cache + ".key");
    Value vc = b.cache_write(b.state(cache + ".value", {cache_dtype, {B, Hkv, S, D}}), v, start,
                             cache + ".value");
    Value att = layer_op(b, p, s, "Attention", {q, kc, vc, start, mask},
                         {DType::f32, b.type(q).shape}, {scale}, a + "attention", [&] {
                           return b.attention(q, kc, vc, start, mask, scale, a + "attention");
                         });
    // att (B,T,Hq,D)
    h = b.add(h, linear(b, p, b.reshape(att, {B, T, Hq * D}), a + "o_proj"), n + "residual_attn");

    x = rms_norm(b, p, s, h, p(n + "post_attention_layernorm.weight"), eps,
                 n + "post_attention_layernorm");
    Value gate = linear(b, p, x, n + "mlp.gate_proj");
    Value up = linear(b, p, x, n + "mlp.up_proj");
    Value act = layer_op(b, p, s, "SiLUAndMul", {gate, up}, b.type(gate), {}, n + "mlp.act",
                         [&] { return b.silu_mul(gate, up, n + "mlp.act"); });
    Value mlp = linear(b, p, act, n + "mlp.down_proj");
    h = b.add(h, mlp, n + "residual_mlp");
  }
  // Only the kept positions go through the final norm and lm_head: (B,keep,H).
  if (s.logits_to_keep > 0 && s.logits_to_keep < T) h = b.take_last(h, s.logits_to_keep);
  h = rms_norm(b, p, s, h, p("model.norm.weight"), eps, "model.norm");
  // A tied lm_head is bound to embed_tokens' buffer (or its own slice of it when the plan splits
  // the two differently).
  b.output(linear(b, p, h, "lm_head"));
}

std::vector<float> rope_inv_freq(const io::Json& config, double theta, int64_t head_dim,
                                 const std::string& where) {
  // As Transformers: inv_freq[i] = 1 / theta^(2i / head_dim), in float32.
  std::vector<float> inv(size_t(head_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i)
    inv[i] = float(1.0 / std::pow(theta, double(float(2 * i) / float(head_dim))));

  auto it = config.find("rope_scaling");
  if (it == config.end() || it->is_null()) return inv;
  const io::Json& rs = *it;
  const std::string w = where + ": rope_scaling";
  if (!rs.is_object()) throw FormatError(w + " must be an object or null");
  std::string type = rs.contains("rope_type") ? io::get_required<std::string>(rs, "rope_type", w)
                                              : io::get_or<std::string>(rs, "type", "default", w);
  if (type == "default") return inv;
  double factor = io::get_required<double>(rs, "factor", w);
  if (!(factor > 0)) throw FormatError(w + ".factor must be positive");
  if (type == "linear") {
    for (float& f : inv) f = float(f / factor);
    return inv;
  }
  if (type == "llama3") {
    double low = io::get_required<double>(rs, "low_freq_factor", w);
    double high = io::get_required<double>(rs, "high_freq_factor", w);
    double old_len = io::get_required<double>(rs, "original_max_position_embeddings", w);
    if (!(high > low)) throw FormatError(w + ": high_freq_factor must exceed low_freq_factor");
    const double low_wavelen = old_len / low, high_wavelen = old_len / high;
    for (float& f : inv) {
      double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f = float(f / factor);
      } else if (wavelen >= high_wavelen) {
        double smooth = (old_len / wavelen - low) / (high - low);
        f = float((1 - smooth) * f / factor + smooth * f);
      }
    }
    return inv;
  }
  throw UnsupportedError(w + ".rope_type '" + type +
                         "' is not supported: supported types are default, linear and llama3");
}

}  // namespace tformers::models
