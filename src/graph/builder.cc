#include "graph/builder.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "tformers/error.h"

namespace tformers::graph {

Value GraphBuilder::add_node(Op op, std::vector<int> inputs, TensorType type, std::string name,
                             Attrs attrs) {
  return graph_.add(
      Node{op, std::move(inputs), std::move(type), std::move(name), std::move(attrs)});
}

Value GraphBuilder::parameter(const std::string& name, TensorType type) {
  return add_node(Op::kParameter, {}, std::move(type), name);
}
Value GraphBuilder::state(const std::string& name, TensorType type) {
  return add_node(Op::kState, {}, std::move(type), name);
}
Value GraphBuilder::input(const std::string& name, TensorType type) {
  return add_node(Op::kInput, {}, std::move(type), name);
}

Value GraphBuilder::embedding(Value table, Value ids, const std::string& name) {
  const TensorType &t = type(table), &i = type(ids);
  TF_CHECK(t.shape.size() == 2 && i.dtype == DType::i32, name, ": ", t.str(), " ", i.str());
  Shape out = i.shape;
  out.push_back(t.shape[1]);
  return add_node(Op::kEmbedding, {table, ids}, {activation(), out}, name,
                  EmbeddingAttrs{t.shape[0]});
}

Value GraphBuilder::embedding_shard(Value table, Value ids, int64_t vocab, int group,
                                    const std::string& name) {
  const TensorType &t = type(table), &i = type(ids);
  TF_CHECK(t.shape.size() == 2 && i.dtype == DType::i32 && group >= 0 && vocab > 0, name, ": ",
           t.str(), " ", i.str(), " of ", vocab, " rows, group ", group);
  Shape out = i.shape;
  out.push_back(t.shape[1]);
  return add_node(Op::kEmbedding, {table, ids}, {activation(), out}, name,
                  EmbeddingAttrs{vocab, group});
}

Value GraphBuilder::linear(Value x, Value w, Value bias, const std::string& name) {
  const TensorType &xt = type(x), &wt = type(w);
  TF_CHECK(wt.shape.size() == 2 && !xt.shape.empty() && xt.shape.back() == wt.shape[1], name,
           ": x ", xt.str(), " w ", wt.str());
  std::vector<int> inputs = {x, w};
  if (bias >= 0) {
    TF_CHECK(type(bias).shape == Shape{wt.shape[0]}, name, ": bias ", type(bias).str());
    inputs.push_back(bias);
  }
  Shape out = xt.shape;
  out.back() = wt.shape[0];
  return add_node(Op::kLinear, std::move(inputs), {activation(), out}, name);
}

Value GraphBuilder::linear_quant(Value x, Value w, Value scale, Value zero, Value bias,
                                 const LinearQuantAttrs& q, const std::string& name) {
  const TensorType &xt = type(x), &wt = type(w), &st = type(scale);
  TF_CHECK(!xt.shape.empty() && q.has_zero == (zero >= 0) &&
               !(q.has_zero && q.scheme != QuantScheme::kInt4),
           name, ": zero point operand and attributes disagree");
  // N from the weight's leading dim (a tile holds kInt4Rows rows), then every operand type from
  // the scheme and layout.
  const bool tiles = q.layout == QuantLayout::kTiles;
  TF_CHECK(!wt.shape.empty() && (!tiles || q.scheme == QuantScheme::kInt4), name, ": w ", wt.str(),
           " is not a quantized weight in this layout");
  const int64_t N = wt.shape[0] * (tiles ? kInt4Rows : 1);
  const QuantOperandTypes want = quant_operand_types(q.scheme, q.layout, N, xt.shape.back());
  TF_CHECK(wt == want.weight && st == want.scale, name, ": x ", xt.str(), " w ", wt.str(),
           " scale ", st.str(), "; expected w ", want.weight.str(), " scale ", want.scale.str());
  std::vector<int> inputs = {x, w, scale};
  if (zero >= 0) {
    TF_CHECK(type(zero) == (TensorType{DType::u8, st.shape}), name, ": zero ", type(zero).str());
    inputs.push_back(zero);
  }
  if (bias >= 0) {
    TF_CHECK(type(bias) == (TensorType{DType::f32, {N}}), name, ": bias ", type(bias).str());
    inputs.push_back(bias);
  }
  Shape out = xt.shape;
  out.back() = N;
  return add_node(Op::kLinearQuant, std::move(inputs), {activation(), out}, name, q);
}

Value GraphBuilder::rms_norm(Value x, Value w, float eps, const std::string& name) {
  return rms_norm(x, w, eps, RMSNormOptions{}, name);
}

Value GraphBuilder::rms_norm(Value x, Value w, float eps, RMSNormOptions o,
                             const std::string& name) {
  const TensorType &xt = type(x), &wt = type(w);
  TF_CHECK(wt.shape == Shape{xt.shape.back()}, name, ": x ", xt.str(), " w ", wt.str());
  return add_node(Op::kRMSNorm, {x, w}, {activation(), xt.shape}, name,
                  RMSNormAttrs{eps, o.unit_offset});
}

Value GraphBuilder::rope(Value x, Value pos, std::vector<float> inv_freq, const std::string& name) {
  return rope(x, pos, std::move(inv_freq), RopeOptions{}, name);
}

Value GraphBuilder::rope(Value x, Value pos, std::vector<float> inv_freq, RopeOptions o,
                         const std::string& name) {
  const TensorType &xt = type(x), &pt = type(pos);
  TF_CHECK(xt.shape.size() == 4 && pt.shape == Shape({xt.shape[0], xt.shape[1]}), name, ": x ",
           xt.str(), " pos ", pt.str());
  const int64_t rotary_dim = o.rotary_dim ? o.rotary_dim : xt.shape[3];
  TF_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= xt.shape[3] &&
               int64_t(inv_freq.size()) * 2 == rotary_dim,
           name, ": rotary_dim ", rotary_dim, " with ", inv_freq.size(), " frequencies, x ",
           xt.str());
  return add_node(Op::kRope, {x, pos}, {activation(), xt.shape}, name,
                  RopeAttrs{std::move(inv_freq), rotary_dim, o.interleaved});
}

Value GraphBuilder::silu_mul(Value gate, Value up, const std::string& name) {
  TF_CHECK(type(gate) == type(up), name);
  return add_node(Op::kSiluMul, {gate, up}, {activation(), type(gate).shape}, name);
}

Value GraphBuilder::gelu_tanh_mul(Value gate, Value up, const std::string& name) {
  TF_CHECK(type(gate) == type(up) && type(gate).dtype == activation(), name, ": ", type(gate).str(),
           " ", type(up).str());
  return add_node(Op::kGeluTanhMul, {gate, up}, type(gate), name);
}

Value GraphBuilder::scale(Value x, float factor, const std::string& name) {
  TF_CHECK(type(x).dtype == activation() && std::isfinite(factor), name, ": ", type(x).str(), " * ",
           factor);
  return add_node(Op::kScale, {x}, type(x), name, ScaleAttrs{factor});
}

Value GraphBuilder::softcap(Value x, float cap, const std::string& name) {
  TF_CHECK(type(x).dtype == activation() && cap > 0.0f && std::isfinite(cap), name, ": ",
           type(x).str(), " cap ", cap);
  return add_node(Op::kSoftcap, {x}, type(x), name, SoftcapAttrs{cap});
}

Value GraphBuilder::add(Value a, Value b, const std::string& name) {
  TF_CHECK(type(a) == type(b), name, ": ", type(a).str(), " + ", type(b).str());
  return add_node(Op::kAdd, {a, b}, {activation(), type(a).shape}, name);
}

Value GraphBuilder::convert(Value x, DType to, const std::string& name) {
  TF_CHECK(is_float(type(x).dtype) && is_float(to), name, ": ", type(x).str(), " to ",
           dtype_name(to));
  if (type(x).dtype == to) return x;
  return add_node(Op::kConvert, {x}, {to, type(x).shape}, name);
}

Value GraphBuilder::reshape(Value x, Shape shape) {
  TF_CHECK(shape_numel(shape) == shape_numel(type(x).shape), type(x).str(), " to ",
           shape_str(shape));
  return add_node(Op::kReshape, {x}, {type(x).dtype, std::move(shape)}, "");
}

Value GraphBuilder::cache_write(Value cache, Value update, Value start, const std::string& name) {
  const TensorType &c = type(cache), &u = type(update);
  const int h = kv_heads_dim(kv_layout()), p = kv_positions_dim(kv_layout());
  TF_CHECK(c.shape.size() == 4 && u.shape.size() == 4 && c.shape[0] == u.shape[0] &&
               c.shape[h] == u.shape[2] && c.shape[3] == u.shape[3] && u.shape[1] <= c.shape[p],
           name, ": cache ", c.str(), " update ", u.str());
  TF_CHECK(type(start).shape.empty() && type(start).dtype == DType::i32, name);
  return add_node(Op::kCacheWrite, {cache, update, start}, c, name);
}

Value GraphBuilder::attention(Value q, Value k_cache, Value v_cache, Value start, Value key_mask,
                              float scale, const std::string& name) {
  return attention(q, k_cache, v_cache, start, key_mask, scale, AttentionOptions{}, name);
}

// The attributes of an attention op with options o after checking them, and its sinks operand
// (if any) appended to its inputs.
AttentionAttrs GraphBuilder::attention_attrs(float scale, const AttentionOptions& o, int64_t Hq,
                                             std::vector<int>& inputs,
                                             const std::string& name) const {
  TF_CHECK(o.sliding_window >= 0 && o.softcap >= 0.0f && std::isfinite(o.softcap), name,
           ": sliding_window ", o.sliding_window, " softcap ", o.softcap);
  if (o.sinks >= 0) {
    const TensorType want{activation(), {Hq}};
    TF_CHECK(type(o.sinks) == want, name, ": sinks ", type(o.sinks).str(), ", not ", want.str());
    inputs.push_back(o.sinks);
  }
  return AttentionAttrs{scale, o.softcap, o.sliding_window, o.sinks >= 0};
}

Value GraphBuilder::attention(Value q, Value k_cache, Value v_cache, Value start, Value key_mask,
                              float scale, AttentionOptions o, const std::string& name) {
  const TensorType &qt = type(q), &kt = type(k_cache);
  const int h = kv_heads_dim(kv_layout()), p = kv_positions_dim(kv_layout());
  TF_CHECK(qt.shape.size() == 4 && kt.shape.size() == 4 && type(v_cache) == kt &&
               qt.shape[0] == kt.shape[0] && qt.shape[3] == kt.shape[3] &&
               qt.shape[2] % kt.shape[h] == 0,
           name, ": q ", qt.str(), " cache ", kt.str());
  std::vector<int> inputs = {q, k_cache, v_cache, start};
  if (key_mask >= 0) {
    TF_CHECK(type(key_mask).shape == Shape({kt.shape[0], kt.shape[p]}), name, ": mask ",
             type(key_mask).str());
    inputs.push_back(key_mask);
  }
  AttentionAttrs attrs = attention_attrs(scale, o, qt.shape[2], inputs, name);
  return add_node(Op::kAttention, std::move(inputs), {activation(), qt.shape}, name,
                  std::move(attrs));
}

// The paged ops' table, positions and optional rows for new tokens (B,T): a table row per batch
// row, or with rows a table of any number of rows.
std::vector<int> GraphBuilder::paged_operands(Value table, Value pos, Value rows, int64_t B,
                                              int64_t T, const std::string& name) const {
  const TensorType &tt = type(table), &pt = type(pos);
  TF_CHECK(tt.dtype == DType::i32 && tt.shape.size() == 2 && tt.shape[0] >= 1 &&
               (rows >= 0 || tt.shape[0] == B),
           name, ": table ", tt.str());
  TF_CHECK(pt.dtype == DType::i32 && pt.shape == Shape({B, T}), name, ": pos ", pt.str());
  if (rows < 0) return {table, pos};
  TF_CHECK(type(rows) == pt, name, ": rows ", type(rows).str());
  return {table, pos, rows};
}

Value GraphBuilder::paged_cache_write(Value pool, Value update, Value table, Value pos,
                                      const std::string& name, Value rows) {
  const TensorType &c = type(pool), &u = type(update);
  TF_CHECK(c.shape.size() == 4 && u.shape.size() == 4 &&
               c.shape[kv_heads_dim(kv_layout())] == u.shape[2] && c.shape[3] == u.shape[3],
           name, ": pool ", c.str(), " update ", u.str());
  std::vector<int> inputs = {pool, update};
  for (int v : paged_operands(table, pos, rows, u.shape[0], u.shape[1], name)) inputs.push_back(v);
  return add_node(Op::kPagedCacheWrite, std::move(inputs), c, name);
}

Value GraphBuilder::paged_attention(Value q, Value k_pool, Value v_pool, Value table, Value pos,
                                    float scale, AttentionOptions o, const std::string& name,
                                    Value rows) {
  const TensorType &qt = type(q), &kt = type(k_pool);
  TF_CHECK(qt.shape.size() == 4 && kt.shape.size() == 4 && type(v_pool) == kt &&
               qt.shape[3] == kt.shape[3] && qt.shape[2] % kt.shape[kv_heads_dim(kv_layout())] == 0,
           name, ": q ", qt.str(), " pool ", kt.str());
  std::vector<int> inputs = {q, k_pool, v_pool};
  for (int v : paged_operands(table, pos, rows, qt.shape[0], qt.shape[1], name))
    inputs.push_back(v);
  AttentionAttrs attrs = attention_attrs(scale, o, qt.shape[2], inputs, name);
  return add_node(Op::kPagedAttention, std::move(inputs), {activation(), qt.shape}, name,
                  std::move(attrs));
}

Value GraphBuilder::take_last(Value x, int64_t n) {
  const TensorType& xt = type(x);
  TF_CHECK(xt.shape.size() == 3 && n >= 1 && n <= xt.shape[1], xt.str(), " last ", n);
  return add_node(Op::kTakeLast, {x}, {xt.dtype, {xt.shape[0], n, xt.shape[2]}}, "",
                  TakeLastAttrs{n});
}

Value GraphBuilder::custom_call(std::shared_ptr<const CustomCall> call, std::vector<Value> inputs,
                                TensorType out, std::vector<float> floats,
                                const std::string& name) {
  return add_node(Op::kCustomCall, std::move(inputs), std::move(out), name,
                  CustomCallAttrs{std::move(call), std::move(floats)});
}

Value GraphBuilder::all_reduce(Value x, Value bias, int group, const std::string& name) {
  const TensorType& xt = type(x);
  TF_CHECK(!xt.shape.empty(), name, ": ", xt.str());
  std::vector<int> inputs = {x};
  if (bias >= 0) {
    TF_CHECK(type(bias).shape == Shape{xt.shape.back()}, name, ": bias ", type(bias).str());
    inputs.push_back(bias);
  }
  return add_node(Op::kAllReduce, std::move(inputs), xt, name, AllReduceAttrs{group});
}

Value GraphBuilder::all_gather(Value x, int ranks, int group, const std::string& name) {
  const TensorType& xt = type(x);
  TF_CHECK(!xt.shape.empty() && ranks >= 1, name, ": ", xt.str(), " over ", ranks, " ranks");
  Shape out = xt.shape;
  out.back() *= ranks;
  return add_node(Op::kAllGather, {x}, {xt.dtype, out}, name, AllGatherAttrs{group, ranks});
}

Value GraphBuilder::slice_last(Value x, int64_t begin, int64_t end, const std::string& name) {
  const TensorType& xt = type(x);
  TF_CHECK(!xt.shape.empty() && 0 <= begin && begin < end && end <= xt.shape.back(), name, ": ",
           xt.str(), " [", begin, ", ", end, ")");
  Shape out = xt.shape;
  out.back() = end - begin;
  return add_node(Op::kSlice, {x}, {xt.dtype, out}, name, SliceAttrs{begin, end});
}

Value GraphBuilder::shard_last(Value x, int64_t width, int group, const std::string& name) {
  const TensorType& xt = type(x);
  TF_CHECK(!xt.shape.empty() && width > 0 && group >= 0, name, ": ", xt.str(), " pieces of ",
           width);
  Shape out = xt.shape;
  out.back() = width;
  return add_node(Op::kSlice, {x}, {xt.dtype, out}, name, SliceAttrs{0, width, group});
}

// ---- Primitives ----

namespace {
// NumPy's broadcast of two shapes (right-aligned, a dim of 1 stretches); false when they clash.
bool broadcast_shapes(const Shape& a, const Shape& b, Shape& out) {
  const size_t r = std::max(a.size(), b.size());
  out.assign(r, 1);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) return false;
    out[i] = da == 1 ? db : da;
  }
  return true;
}
}  // namespace

DType GraphBuilder::elementwise_dtype(std::initializer_list<Value> operands,
                                      const std::string& name) const {
  const bool floats = is_float(type(*operands.begin()).dtype);
  for (Value v : operands)
    TF_CHECK(floats ? is_float(type(v).dtype) : type(v).dtype == DType::i32, name, ": operands ",
             type(v).str(), " and ", type(*operands.begin()).str(),
             " are not all float or all int32");
  return floats ? activation() : DType::i32;
}

Value GraphBuilder::constant(double value, TensorType type, const std::string& name) {
  TF_CHECK(std::isfinite(value) && (is_float(type.dtype) || type.dtype == DType::i32), name,
           ": constant ", value, " of ", type.str());
  TF_CHECK(type.dtype == DType::i32 ? value == std::trunc(value) && std::abs(value) < 0x1p31
                                    : std::abs(value) <= double(FLT_MAX),
           name, ": constant ", value, " out of ", type.str(), "'s range");
  return add_node(Op::kConstant, {}, std::move(type), name, ConstantAttrs{value});
}

Value GraphBuilder::unary(UnaryFn fn, Value x, const std::string& name) {
  TF_CHECK(is_float(type(x).dtype), name, ": ", unary_name(fn), " of ", type(x).str());
  return add_node(Op::kUnary, {x}, {activation(), type(x).shape}, name, UnaryAttrs{fn});
}

Value GraphBuilder::binary(BinaryFn fn, Value a, Value b, const std::string& name) {
  Shape out;
  TF_CHECK(broadcast_shapes(type(a).shape, type(b).shape, out), name, ": ", binary_name(fn), " of ",
           type(a).str(), " and ", type(b).str());
  return add_node(Op::kBinary, {a, b}, {elementwise_dtype({a, b}, name), out}, name,
                  BinaryAttrs{fn});
}

Value GraphBuilder::select(Value pred, Value a, Value b, const std::string& name) {
  Shape ab, out;
  TF_CHECK(type(pred).dtype == DType::i32 && broadcast_shapes(type(a).shape, type(b).shape, ab) &&
               broadcast_shapes(type(pred).shape, ab, out),
           name, ": select ", type(pred).str(), " ? ", type(a).str(), " : ", type(b).str());
  return add_node(Op::kSelect, {pred, a, b}, {elementwise_dtype({a, b}, name), out}, name);
}

Value GraphBuilder::reduce(ReduceFn fn, Value x, int64_t axis, const std::string& name) {
  Shape out = type(x).shape;
  TF_CHECK(is_float(type(x).dtype) && axis >= 0 && axis < int64_t(out.size()), name, ": reduce ",
           type(x).str(), " over ", axis);
  out[size_t(axis)] = 1;
  return add_node(Op::kReduce, {x}, {activation(), out}, name, ReduceAttrs{fn, axis});
}

Value GraphBuilder::softmax(Value x, const std::string& name) {
  TF_CHECK(is_float(type(x).dtype) && !type(x).shape.empty(), name, ": softmax of ", type(x).str());
  return add_node(Op::kSoftmax, {x}, {activation(), type(x).shape}, name);
}

Value GraphBuilder::top_k(Value x, int64_t k, const std::string& name) {
  Shape out = type(x).shape;
  TF_CHECK(is_float(type(x).dtype) && !out.empty() && k >= 1 && k <= out.back(), name, ": top ", k,
           " of ", type(x).str());
  out.back() = k;
  return add_node(Op::kTopK, {x}, {DType::i32, out}, name, TopKAttrs{k});
}

Value GraphBuilder::take_along(Value x, Value idx, const std::string& name) {
  const TensorType &xt = type(x), &it = type(idx);
  TF_CHECK(it.dtype == DType::i32 && !xt.shape.empty() && it.shape.size() == xt.shape.size() &&
               std::equal(xt.shape.begin(), xt.shape.end() - 1, it.shape.begin()),
           name, ": take ", it.str(), " along ", xt.str());
  return add_node(Op::kTakeAlong, {x, idx}, {xt.dtype, it.shape}, name);
}

Value GraphBuilder::scatter_add(Value base, Value idx, Value src, const std::string& name) {
  const TensorType &bt = type(base), &it = type(idx);
  TF_CHECK(it.dtype == DType::i32 && type(src).shape == it.shape && !bt.shape.empty() &&
               it.shape.size() == bt.shape.size() &&
               std::equal(bt.shape.begin(), bt.shape.end() - 1, it.shape.begin()),
           name, ": scatter ", type(src).str(), " at ", it.str(), " into ", bt.str());
  return add_node(Op::kScatterAdd, {base, idx, src},
                  {elementwise_dtype({base, src}, name), bt.shape}, name);
}

Value GraphBuilder::concat(const std::vector<Value>& parts, int64_t axis, const std::string& name) {
  TF_CHECK(!parts.empty(), name, ": concat of nothing");
  Shape out = type(parts[0]).shape;
  TF_CHECK(axis >= 0 && axis < int64_t(out.size()), name, ": concat along ", axis);
  for (size_t i = 1; i < parts.size(); ++i) {
    const TensorType& t = type(parts[i]);
    Shape same = t.shape;
    TF_CHECK(t.dtype == type(parts[0]).dtype && same.size() == out.size(), name, ": concat ",
             t.str(), " to ", type(parts[0]).str());
    same[size_t(axis)] = out[size_t(axis)];
    TF_CHECK(same == out, name, ": concat ", t.str(), " to ", type(parts[0]).str());
    out[size_t(axis)] += t.shape[size_t(axis)];
  }
  return add_node(Op::kConcat, parts, {type(parts[0]).dtype, out}, name, AxisAttrs{axis});
}

Value GraphBuilder::transpose(Value x, std::vector<int64_t> perm, const std::string& name) {
  const Shape& in = type(x).shape;
  std::vector<bool> seen(in.size());
  Shape out;
  TF_CHECK(perm.size() == in.size(), name, ": transpose ", type(x).str(), " by ", perm.size(),
           " dims");
  for (int64_t p : perm) {
    TF_CHECK(p >= 0 && p < int64_t(in.size()) && !seen[size_t(p)], name, ": bad permutation");
    seen[size_t(p)] = true;
    out.push_back(in[size_t(p)]);
  }
  return add_node(Op::kTranspose, {x}, {type(x).dtype, out}, name, TransposeAttrs{std::move(perm)});
}

Value GraphBuilder::broadcast(Value x, Shape shape, const std::string& name) {
  Shape out;
  TF_CHECK(broadcast_shapes(type(x).shape, shape, out) && out == shape, name, ": broadcast ",
           type(x).str(), " to ", shape_str(shape));
  return add_node(Op::kBroadcast, {x}, {type(x).dtype, std::move(shape)}, name);
}

Value GraphBuilder::iota(TensorType type, int64_t axis, const std::string& name) {
  TF_CHECK((type.dtype == DType::i32 || is_float(type.dtype)) && axis >= 0 &&
               axis < int64_t(type.shape.size()),
           name, ": iota ", type.str(), " along ", axis);
  return add_node(Op::kIota, {}, std::move(type), name, AxisAttrs{axis});
}

Value GraphBuilder::cumsum(Value x, int64_t axis, const std::string& name) {
  TF_CHECK(axis >= 0 && axis < int64_t(type(x).shape.size()), name, ": cumsum ", type(x).str(),
           " along ", axis);
  return add_node(Op::kCumsum, {x}, {elementwise_dtype({x}, name), type(x).shape}, name,
                  AxisAttrs{axis});
}

Value GraphBuilder::matmul(Value a, Value b, const std::string& name) {
  const Shape &as = type(a).shape, &bs = type(b).shape;
  const size_t r = as.size();
  TF_CHECK(r >= 2 && bs.size() == r && std::equal(as.begin(), as.end() - 2, bs.begin()) &&
               as[r - 1] == bs[r - 2],
           name, ": matmul ", type(a).str(), " by ", type(b).str());
  Shape out = as;
  out.back() = bs.back();
  return add_node(Op::kMatMul, {a, b}, {elementwise_dtype({a, b}, name), out}, name);
}

void GraphBuilder::check_recurrent_operands(Value state, const Shape& want, Value start,
                                            Value key_mask, int64_t B,
                                            const std::string& name) const {
  TF_CHECK(type(state) == TensorType({DType::f32, want}), name, ": state ", type(state).str(),
           ", not ", TensorType({DType::f32, want}).str());
  TF_CHECK(type(start).shape.empty() && type(start).dtype == DType::i32, name, ": start");
  const TensorType& m = type(key_mask);
  TF_CHECK(m.dtype == DType::i32 && m.shape.size() == 2 && m.shape[0] == B, name, ": mask ",
           m.str());
}

void GraphBuilder::check_paged_recurrent_operands(Value pool, const Shape& each, Value slots,
                                                  Value pos, int64_t B, int64_t T,
                                                  const std::string& name) const {
  const TensorType& p = type(pool);
  TF_CHECK(p.dtype == DType::f32 && p.shape.size() == each.size() + 1 && p.shape[0] >= 1 &&
               std::equal(each.begin(), each.end(), p.shape.begin() + 1),
           name, ": pool ", p.str());
  TF_CHECK(type(slots) == TensorType({DType::i32, {B, 2}}), name, ": slots ", type(slots).str());
  TF_CHECK(type(pos) == TensorType({DType::i32, {B, T}}), name, ": pos ", type(pos).str());
}

Shape GraphBuilder::conv_state_shape(Value x, Value w, const std::string& name) const {
  const TensorType &xt = type(x), &wt = type(w);
  TF_CHECK(is_float(xt.dtype) && xt.shape.size() == 3 && is_float(wt.dtype) &&
               wt.shape.size() == 2 && wt.shape[0] == xt.shape[2] && wt.shape[1] >= 2,
           name, ": x ", xt.str(), " w ", wt.str());
  return {wt.shape[1] - 1, xt.shape[2]};
}

Shape GraphBuilder::delta_state_shape(Value q, Value k, Value v, Value g, Value beta,
                                      const std::string& name) const {
  const Shape &qs = type(q).shape, &vs = type(v).shape;
  TF_CHECK(qs.size() == 4 && type(k).shape == qs && vs.size() == 4 && vs[0] == qs[0] &&
               vs[1] == qs[1] && vs[2] % qs[2] == 0,
           name, ": q ", type(q).str(), " k ", type(k).str(), " v ", type(v).str());
  const Shape gate{vs[0], vs[1], vs[2]};
  TF_CHECK(type(g).shape == gate && type(beta).shape == gate, name, ": g ", type(g).str(), " beta ",
           type(beta).str());
  for (Value f : {q, k, v, g, beta}) TF_CHECK(is_float(type(f).dtype), name, ": float operands");
  return {vs[2], qs[3], vs[3]};
}

namespace {

Shape with_rows(int64_t rows, const Shape& each) {
  Shape s{rows};
  s.insert(s.end(), each.begin(), each.end());
  return s;
}

}  // namespace

Value GraphBuilder::causal_conv1d(Value x, Value w, Value state, Value start, Value key_mask,
                                  const std::string& name) {
  const Shape& xs = type(x).shape;
  const Shape each = conv_state_shape(x, w, name);
  check_recurrent_operands(state, with_rows(xs[0], each), start, key_mask, xs[0], name);
  return add_node(Op::kCausalConv1d, {x, w, state, start, key_mask}, {activation(), xs}, name);
}

Value GraphBuilder::gated_delta_rule(Value q, Value k, Value v, Value g, Value beta, Value state,
                                     Value start, Value key_mask, const std::string& name) {
  const Shape& vs = type(v).shape;
  const Shape each = delta_state_shape(q, k, v, g, beta, name);
  check_recurrent_operands(state, with_rows(vs[0], each), start, key_mask, vs[0], name);
  return add_node(Op::kGatedDeltaRule, {q, k, v, g, beta, state, start, key_mask},
                  {activation(), vs}, name);
}

Value GraphBuilder::paged_causal_conv1d(Value x, Value w, Value pool, Value slots, Value pos,
                                        const std::string& name) {
  const Shape& xs = type(x).shape;
  check_paged_recurrent_operands(pool, conv_state_shape(x, w, name), slots, pos, xs[0], xs[1],
                                 name);
  return add_node(Op::kPagedCausalConv1d, {x, w, pool, slots, pos}, {activation(), xs}, name);
}

Value GraphBuilder::paged_gated_delta_rule(Value q, Value k, Value v, Value g, Value beta,
                                           Value pool, Value slots, Value pos,
                                           const std::string& name) {
  const Shape& vs = type(v).shape;
  check_paged_recurrent_operands(pool, delta_state_shape(q, k, v, g, beta, name), slots, pos, vs[0],
                                 vs[1], name);
  return add_node(Op::kPagedGatedDeltaRule, {q, k, v, g, beta, pool, slots, pos},
                  {activation(), vs}, name);
}

namespace {

// The result shape (..., k, N) of experts of K inputs and N outputs (weights `wt`) over x and idx:
// x (..., K) goes through each of its row's experts; x (..., k, K), one input per slot.
Shape experts_out(const TensorType& xt, const TensorType& it, const TensorType& wt, int64_t K,
                  int64_t N, const std::string& name) {
  const bool per_slot = xt.shape.size() == it.shape.size() + 1;
  const size_t rows = it.shape.size() - (per_slot ? 0 : 1);
  TF_CHECK(is_float(xt.dtype) && !xt.shape.empty() && xt.shape.back() == K &&
               it.dtype == DType::i32 && !it.shape.empty() && xt.shape.size() >= rows + 1 &&
               std::equal(it.shape.begin(), it.shape.begin() + ptrdiff_t(rows), xt.shape.begin()) &&
               (per_slot || xt.shape.size() == it.shape.size()),
           name, ": x ", xt.str(), " experts ", wt.str(), " idx ", it.str());
  Shape out = it.shape;
  out.push_back(N);
  return out;
}

}  // namespace

Value GraphBuilder::linear_id(Value x, Value w, Value idx, const std::string& name, int group,
                              Value bias) {
  const TensorType& wt = type(w);
  TF_CHECK(is_float(wt.dtype) && wt.shape.size() == 3, name, ": experts ", wt.str());
  const Shape out = experts_out(type(x), type(idx), wt, wt.shape[2], wt.shape[1], name);
  std::vector<int> inputs = {x, w, idx};
  add_experts_bias(inputs, bias, wt.shape[0], wt.shape[1], name);
  return add_node(Op::kLinearId, std::move(inputs), {activation(), out}, name,
                  LinearIdAttrs{group, {}});
}

void GraphBuilder::add_experts_bias(std::vector<int>& inputs, Value bias, int64_t E, int64_t N,
                                    const std::string& name) const {
  if (bias < 0) return;
  const TensorType& bt = type(bias);
  TF_CHECK(is_float(bt.dtype) && bt.shape == (Shape{E, N}), name, ": experts' bias ", bt.str(),
           "; expected (", E, ", ", N, ")");
  inputs.push_back(bias);
}

Value GraphBuilder::linear_id_quant(Value x, Value w, Value idx, Value scale, Value zero,
                                    const LinearQuantAttrs& q, const std::string& name, int group,
                                    Value bias) {
  const TensorType &wt = type(w), &st = type(scale);
  TF_CHECK(wt.shape.size() >= 2 && st.shape.size() >= 2 && wt.shape[0] == st.shape[0] &&
               q.has_zero == (zero >= 0) && !(q.has_zero && q.scheme != QuantScheme::kInt4),
           name, ": experts ", wt.str(), " scale ", st.str(), " and the attributes disagree");
  // Each expert's operands are a kLinearQuant's (N from the weight's second dim).
  const bool tiles = q.layout == QuantLayout::kTiles;
  const int64_t E = wt.shape[0], N = wt.shape[1] * (tiles ? kInt4Rows : 1);
  const int64_t K = type(x).shape.empty() ? 0 : type(x).shape.back();
  TF_CHECK(!tiles || q.scheme == QuantScheme::kInt4, name, ": no int8 tiles");
  QuantOperandTypes want = quant_operand_types(q.scheme, q.layout, N, K);
  want.weight.shape.insert(want.weight.shape.begin(), E);
  want.scale.shape.insert(want.scale.shape.begin(), E);
  TF_CHECK(wt == want.weight && st == want.scale, name, ": experts ", wt.str(), " scale ", st.str(),
           "; expected ", want.weight.str(), " and ", want.scale.str());
  std::vector<int> inputs = {x, w, idx, scale};
  if (zero >= 0) {
    TF_CHECK(type(zero) == (TensorType{DType::u8, st.shape}), name, ": zero ", type(zero).str());
    inputs.push_back(zero);
  }
  const Shape out = experts_out(type(x), type(idx), wt, K, N, name);
  add_experts_bias(inputs, bias, E, N, name);
  return add_node(Op::kLinearIdQuant, std::move(inputs), {activation(), out}, name,
                  LinearIdAttrs{group, q});
}

}  // namespace tformers::graph
