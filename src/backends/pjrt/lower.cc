#include "backends/pjrt/lower.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/pjrt/lowering.h"
#include "distributed/process_group.h"
#include "graph/ops.h"
#include "tformers/error.h"

// Values keep the dtypes the graph gives them (the activation dtype for computed values), so
// what a device stores and moves between fused ops is that dtype. Within an op the math runs in
// f32 (elementwise ops, norms, rope, softmax) and dots accumulate in f32, as the CPU backend
// does; XLA fuses the converts into the surrounding ops.
namespace tformers::backends::pjrt {

Val Lowering::embedding(const Node& n) {
  const auto& a = n.attrs_as<graph::EmbeddingAttrs>();
  const Val& table = in(n, 0);  // (V,D)
  const Val& ids = in(n, 1);
  const int64_t count = shape_numel(ids.shape), rows = table.shape[0], d = table.shape[1];
  Val flat = e_.reshape(ids, {count});
  const int64_t row_offset = distributed::rank_offset(a.group, rows);
  const bool shard = row_offset != 0 || rows != a.vocab;
  if (!shard) return out(n, e_.reshape(e_.gather_rows(table, flat), n.type.shape));
  // A vocabulary shard: ids outside [row_offset, row_offset + rows) give zero rows. The rank is
  // a constant of this process's program, as a device's partition id would be.
  const Val local = e_.with_constant("subtract", flat, double(row_offset));
  const Val ok = e_.binary("and", e_.compare("GE", local, e_.splat(0, "i32", {count})),
                           e_.compare("LT", local, e_.splat(double(rows), "i32", {count})));
  const Val looked = e_.gather_rows(table, e_.select(ok, local, e_.splat(0, "i32", {count})));
  const Val zeros = e_.splat(0, table.elem, {count, d});
  const Val kept = e_.select(e_.broadcast(ok, {count, d}, {0}), looked, zeros);
  return out(n, e_.reshape(kept, n.type.shape));
}

// x (..., K) @ w (N, K)^T [+ bias (N)], accumulated in f32; bias_at is the bias's input index.
Val Lowering::linear_out(const Node& n, const Val& x, const Val& w, int bias_at) {
  const int64_t r = x.rank();
  Val y = e_.dot(x, w, {}, {}, {r - 1}, {1});
  if (int(n.inputs.size()) > bias_at)
    y = e_.binary("add", y, e_.broadcast(f32(n, size_t(bias_at)), y.shape, {r - 1}));
  return out(n, y);
}

// A kLinearQuant weight in rows (the layout PjrtBackend prepares) dequantized in the
// activation dtype: scale[n, k / 32] * (code[n,k] - zero), int8 codes with zero 0, or 4-bit
// codes two a byte, the low nibble for even k, with zero 8 where the weight has none.
Val Lowering::quant_weight(const graph::LinearQuantAttrs& q, const Val& w, const Val& s,
                           const Val* zero, int64_t K) {
  // w (N,K) i8, or (N, ceil(K / 2)) u8; s (N,nb)
  const int64_t N = w.shape[0], nb = s.shape[1];
  // A per-(row, block) value for every input, (N,K) f32.
  auto per_k = [&](const Val& v) {
    const Val b = e_.broadcast(e_.convert(v, "f32"), {N, nb, graph::kQuantBlock}, {0, 1});
    return e_.slice(e_.reshape(b, {N, nb * graph::kQuantBlock}), 1, 0, K);
  };
  Val codes = w;
  if (q.scheme != graph::QuantScheme::kInt8) {
    const Shape pairs = {N, w.shape[1], 1};
    const Val bytes = e_.reshape(w, pairs);
    const Val low = e_.binary("and", bytes, e_.splat(15, "ui8", pairs));
    const Val high = e_.binary("shift_right_logical", bytes, e_.splat(4, "ui8", pairs));
    codes = e_.slice(e_.reshape(e_.concatenate({low, high}, 2), {N, 2 * w.shape[1]}), 1, 0, K);
  }
  if (q.scheme == graph::QuantScheme::kMxfp4) return mxfp4_weight(codes, s, per_k);
  codes = e_.convert(codes, "f32");
  if (q.scheme == graph::QuantScheme::kInt4)
    codes = e_.binary("subtract", codes, zero ? per_k(*zero) : e_.splat(8, "f32", {N, K}));
  return e_.convert(e_.binary("multiply", codes, per_k(s)), act_);
}

// MXFP4 codes (N,K) ui8: each code's e2m1 value (sign bit 3, exponent bits 2-1 with bias 1,
// mantissa bit 0) built as float32 bits, elementwise (a table lookup would be a gather, which a
// TPU pads to 128 lanes per looked-up value), times 2^(e - 127) from its block's exponent e, the
// float32 whose exponent bits are e (exact; e = 0 gives 0 where the format means 2^-127, a
// weight of at most 6 * 2^-127).
Val Lowering::mxfp4_weight(const Val& codes, const Val& s,
                           const std::function<Val(const Val&)>& per_k) {
  const Val c = e_.convert(codes, "i32");
  const Shape& shape = c.shape;
  auto k = [&](double v) { return e_.splat(v, "i32", shape); };
  auto bits_of = [&](const char* op, const Val& a, double v) { return e_.binary(op, a, k(v)); };
  const Val sign = bits_of("shift_left", bits_of("shift_right_logical", c, 3), 31);
  const Val exponent = bits_of("and", bits_of("shift_right_logical", c, 1), 3);
  const Val mantissa = bits_of("and", c, 1);
  // Normal: 2^(exponent - 1) (1 + mantissa / 2); subnormal (exponent 0): mantissa / 2.
  const Val normal = e_.binary("or", bits_of("shift_left", bits_of("add", exponent, 126), 23),
                               bits_of("shift_left", mantissa, 22));
  const Val subnormal = bits_of("multiply", mantissa, 0x3F000000);
  const Val magnitude = e_.select(e_.compare("EQ", exponent, k(0)), subnormal, normal);
  const Val values = e_.bitcast(e_.binary("or", sign, magnitude), "f32");
  const Val bits = e_.binary("shift_left", e_.convert(s, "i32"), e_.splat(23, "i32", s.shape));
  return e_.convert(e_.binary("multiply", values, per_k(e_.bitcast(bits, "f32"))), act_);
}

Val Lowering::rms_norm(const Node& n) {
  const auto& a = n.attrs_as<graph::RMSNormAttrs>();
  const Val x = f32(n, 0);
  const int64_t r = x.rank(), d = x.shape.back();
  const Val ss = e_.reduce(e_.binary("multiply", x, x), "add", 0.0f, {r - 1});
  const Val ms = e_.with_constant("add", e_.with_constant("divide", ss, float(d)), a.eps);
  const Val inv = e_.broadcast(e_.unary("rsqrt", ms), x.shape, [&] {
    std::vector<int64_t> dims(size_t(r - 1));
    std::iota(dims.begin(), dims.end(), 0);
    return dims;
  }());
  Val w = f32(n, 1);
  if (a.unit_offset) w = e_.with_constant("add", w, 1.0f);
  const Val y =
      e_.binary("multiply", e_.binary("multiply", x, inv), e_.broadcast(w, x.shape, {r - 1}));
  return out(n, y);
}

Val Lowering::rope(const Node& n) {
  const auto& a = n.attrs_as<graph::RopeAttrs>();
  const Val x = f32(n, 0);  // (B,T,H,D)
  const int64_t B = x.shape[0], T = x.shape[1], H = x.shape[2], D = x.shape[3];
  const int64_t rd = a.rotary_dim, half = rd / 2;
  // The angle pos * inv_freq rounded to f32, as Transformers computes it.
  const Shape angles = {B, T, half};
  const Val pos = e_.broadcast(e_.convert(in(n, 1), "f32"), angles, {0, 1});
  const Val angle = e_.binary("multiply", pos, e_.broadcast(e_.floats(a.inv_freq), angles, {2}));
  // Pairs (a, b) of features, each (B,T,H,half,1): (i, i + half), or (2i, 2i + 1) interleaved.
  const Shape pair = {B, T, H, half, 1};
  const Val cos = e_.broadcast(e_.unary("cosine", angle), pair, {0, 1, 3});
  const Val sin = e_.broadcast(e_.unary("sine", angle), pair, {0, 1, 3});
  const Val rot = e_.slice(x, 3, 0, rd);
  Val x1, x2;
  if (a.interleaved) {
    const Val pairs = e_.reshape(rot, {B, T, H, half, 2});
    x1 = e_.slice(pairs, 4, 0, 1);
    x2 = e_.slice(pairs, 4, 1, 2);
  } else {
    x1 = e_.reshape(e_.slice(rot, 3, 0, half), pair);
    x2 = e_.reshape(e_.slice(rot, 3, half, rd), pair);
  }
  const Val y1 =
      e_.binary("subtract", e_.binary("multiply", x1, cos), e_.binary("multiply", x2, sin));
  const Val y2 = e_.binary("add", e_.binary("multiply", x2, cos), e_.binary("multiply", x1, sin));
  Val y = e_.concatenate({y1, y2}, a.interleaved ? 4 : 3);  // (B,T,H,half,2) or (B,T,H,rd,1)
  y = e_.reshape(y, {B, T, H, rd});
  if (rd < D) y = e_.concatenate({y, e_.slice(x, 3, rd, D)}, 3);
  return out(n, y);
}

Val Lowering::cache_write(const Node& n) {
  const Val& cache = in(n, 0);  // (B,Hkv,S,D) or (B,S,Hkv,D)
  // The new keys (B,T,Hkv,D) are a token-major block as they come.
  const Val update =
      e_.convert(head_major_ ? e_.transpose(in(n, 1), {0, 2, 1, 3}) : in(n, 1), cache.elem);
  // dynamic_update_slice clamps its start into [0, S - T] instead of failing; a start out of
  // range never gets here, since Executable::run (backends/backend.cc) checks it on the host.
  const Val zero = e_.splat(0, "i32", {});
  const Val& start = in(n, 2);
  return e_.dynamic_update_slice(cache, update,
                                 head_major_ ? std::vector<Val>{zero, zero, start, zero}
                                             : std::vector<Val>{zero, start, zero, zero});
}

// For each new token with a position p >= 0, its (Hkv, D) row goes to offset p % BS of block
// table[b, p / BS]. Padding tokens get block NB, out of range, which XLA's scatter skips.
Val Lowering::paged_cache_write(const Node& n) {
  const Val& pool = in(n, 0);    // (NB,Hkv,BS,D) or (NB,BS,Hkv,D)
  const Val& update = in(n, 1);  // (B,T,Hkv,D)
  const Val& table = in(n, 2);   // (B,MB)
  const Val& pos = in(n, 3);     // (B,T)
  const int offset_dim = graph::kv_positions_dim(g_.kv_layout());
  const int64_t NB = pool.shape[0], BS = pool.shape[size_t(offset_dim)];
  const int64_t B = pos.shape[0], T = pos.shape[1], MB = table.shape[1];
  const Shape bt = {B, T};
  const Val padding = e_.compare("LT", pos, e_.splat(0, "i32", bt));
  const Val p = e_.select(padding, e_.splat(0, "i32", bt), pos);
  const Val slot = e_.with_constant("divide", p, double(BS));  // (B,T) index into the table row
  // table[b, slot[b,t]] as a gather of the flattened table at b * MB + slot.
  const Val row = e_.binary("multiply", e_.iota(0, bt), e_.splat(double(MB), "i32", bt));
  const Val flat = e_.reshape(e_.binary("add", row, slot), {B * T});
  Val block = e_.reshape(e_.gather_rows(e_.reshape(table, {B * MB}), flat), bt);
  block = e_.select(padding, e_.splat(double(NB), "i32", bt), block);
  const Val offset = e_.with_constant("remainder", p, double(BS));
  const Val at = e_.concatenate({e_.reshape(block, {B * T, 1}), e_.reshape(offset, {B * T, 1})}, 1);
  const Shape rows = {B * T, update.shape[2], update.shape[3]};
  return e_.scatter_rows(pool, at, e_.convert(e_.reshape(update, rows), pool.elem), offset_dim);
}

// Each sequence's blocks gathered into a static cache (B, Hkv, MB * BS, D) or (B, MB * BS, Hkv,
// D) in table order, and the static attention over it with the positions as query slots.
Val Lowering::paged_attention(const Node& n) {
  const Val& table = in(n, 3);  // (B,MB)
  const int64_t B = table.shape[0], MB = table.shape[1];
  auto unpage = [&](const Val& pool) {
    const Val blocks = e_.gather_rows(pool, e_.reshape(table, {B * MB}));
    if (!head_major_) {  // (B * MB, BS, Hkv, D): the blocks of a row are its slots in order
      const int64_t BS = pool.shape[1], Hkv = pool.shape[2], D = pool.shape[3];
      return e_.reshape(blocks, {B, MB * BS, Hkv, D});
    }
    const int64_t Hkv = pool.shape[1], BS = pool.shape[2], D = pool.shape[3];
    const Val seq = e_.transpose(e_.reshape(blocks, {B, MB, Hkv, BS, D}), {0, 2, 1, 3, 4});
    return e_.reshape(seq, {B, Hkv, MB * BS, D});
  };
  const Val k = unpage(in(n, 1)), v = unpage(in(n, 2));
  return attend(n, in(n, 0), k, v, in(n, 4), nullptr);
}

Val Lowering::attend(const Node& n, const Val& q, const Val& k, const Val& v, const Val& qpos,
                     const Val* key_valid) {
  const auto& a = n.attrs_as<graph::AttentionAttrs>();
  const int64_t B = q.shape[0], T = q.shape[1], Hq = q.shape[2], D = q.shape[3];
  // k and v as the graph's KV layout has them: (B,Hkv,S,D) or (B,S,Hkv,D), contracted in place.
  const int64_t hd = graph::kv_heads_dim(g_.kv_layout());
  const int64_t pd = graph::kv_positions_dim(g_.kv_layout());
  const int64_t Hkv = k.shape[size_t(hd)], S = k.shape[size_t(pd)], G = Hq / Hkv;
  // Query head h reads KV head h / G: q as (B,T,Hkv,G,D), scores (B,Hkv,T,G,S).
  const Val qg = e_.reshape(q, {B, T, Hkv, G, D});
  Val s = e_.dot(qg, k, {0, 2}, {0, hd}, {4}, {3});
  s = e_.with_constant("multiply", s, a.scale);
  if (a.softcap > 0)
    s = e_.with_constant("multiply", e_.unary("tanh", e_.with_constant("divide", s, a.softcap)),
                         a.softcap);
  // Which slots each query sees, (B,T,S).
  const Shape bts = {B, T, S};
  const Val qp = e_.broadcast(qpos, bts, {0, 1});
  const Val j = e_.iota(2, bts);
  Val ok = e_.compare("LE", j, qp);
  if (a.sliding_window > 0)
    ok = e_.binary("and", ok,
                   e_.compare("GT", j, e_.with_constant("subtract", qp, double(a.sliding_window))));
  if (key_valid) ok = e_.binary("and", ok, e_.broadcast(*key_valid, bts, {0, 2}));
  const Val seen = e_.broadcast(ok, s.shape, {0, 2, 4});
  const auto [p, sum] = attention_weights(n, s, seen);
  // p (B,Hkv,T,G,S) in the activation dtype . v -> (B,Hkv,T,G,D), then normalised.
  Val o = e_.dot(e_.convert(p, act_), v, {0, 1}, {0, hd}, {4}, {pd});
  o = e_.binary("divide", o, e_.broadcast(sum, o.shape, {0, 1, 2, 3}));
  o = e_.reshape(e_.transpose(o, {0, 2, 1, 3, 4}), {B, T, Hq, D});
  return out(n, o);
}

std::pair<Val, Val> Lowering::attention_weights(const Node& n, const Val& s, const Val& seen) {
  const Shape rows = {s.shape[0], s.shape[1], s.shape[2], s.shape[3]};  // (B,Hkv,T,G)
  // Unseen slots take the lowest finite score (not -inf, which would make max - max a NaN in a
  // row that sees nothing) and then weight 0, so such a row sums to 0 and gives zeros.
  const Val scores = e_.select(seen, s, e_.splat(-3.4e38f, "f32", s.shape));
  Val mx = e_.reduce(scores, "maximum", -3.4e38f, {4});
  // Query head kvh * G + g's sink (gpt-oss) counts in the max and the sum and weighs no value. A
  // row that sees no slot then sums to exp(0) over zero weights: zeros still.
  std::optional<Val> sink;
  if (const int at = graph::attention_operands(n).sinks; at >= 0) {
    sink = e_.broadcast(e_.reshape(f32(n, size_t(at)), {rows[1], rows[3]}), rows, {1, 3});
    mx = e_.binary("maximum", mx, *sink);
  }
  const Val shifted = e_.binary("subtract", scores, e_.broadcast(mx, s.shape, {0, 1, 2, 3}));
  const Val p = e_.select(seen, e_.unary("exponential", shifted), e_.splat(0, "f32", s.shape));
  Val sum = e_.reduce(p, "add", 0.0f, {4});
  if (sink) sum = e_.binary("add", sum, e_.unary("exponential", e_.binary("subtract", *sink, mx)));
  const Val none = e_.compare("EQ", sum, e_.splat(0, "f32", rows));
  return {p, e_.select(none, e_.splat(1, "f32", rows), sum)};
}

Val Lowering::linear(const Node& n) { return linear_out(n, in(n, 0), in(n, 1), 2); }

Val Lowering::linear_quant(const Node& n) {
  const auto& q = n.attrs_as<graph::LinearQuantAttrs>();
  return linear_out(
      n, e_.convert(in(n, 0), act_),
      quant_weight(q, in(n, 1), in(n, 2), q.has_zero ? &in(n, 3) : nullptr, in(n, 0).shape.back()),
      n.attrs_as<graph::LinearQuantAttrs>().has_zero ? 4 : 3);
}

Val Lowering::silu_mul(const Node& n) {
  return out(n, e_.binary("multiply", e_.silu(f32(n, 0)), f32(n, 1)));
}

Val Lowering::gelu_tanh_mul(const Node& n) {
  return out(n, e_.binary("multiply", e_.gelu_tanh(f32(n, 0)), f32(n, 1)));
}

Val Lowering::add(const Node& n) { return out(n, e_.binary("add", f32(n, 0), f32(n, 1))); }

Val Lowering::scale(const Node& n) {
  return out(n, e_.with_constant("multiply", f32(n, 0), n.attrs_as<graph::ScaleAttrs>().factor));
}

Val Lowering::softcap(const Node& n) {
  const float cap = n.attrs_as<graph::SoftcapAttrs>().cap;
  return out(n, e_.with_constant(
                    "multiply", e_.unary("tanh", e_.with_constant("divide", f32(n, 0), cap)), cap));
}

Val Lowering::reshape(const Node& n) { return e_.reshape(in(n, 0), n.type.shape); }

Val Lowering::convert(const Node& n) { return out(n, in(n, 0)); }

Val Lowering::take_last(const Node& n) {
  const Val& x = in(n, 0);
  return e_.slice(x, 1, x.shape[1] - n.type.shape[1], x.shape[1]);
}

Val Lowering::slice(const Node& n) {
  const auto& a = n.attrs_as<graph::SliceAttrs>();
  const Val& x = in(n, 0);
  const int64_t dim = x.rank() - 1, k = x.shape.back(), w = a.end - a.begin;
  const int64_t begin = a.begin + distributed::rank_offset(a.group, w);
  const int64_t have = std::clamp<int64_t>(k - begin, 0, w);  // the rest is padding
  if (have == w) return e_.slice(x, dim, begin, begin + w);
  Shape pad = n.type.shape;
  pad.back() = w - have;
  const Val zeros = e_.splat(0, x.elem, pad);
  if (have == 0) return zeros;
  return e_.concatenate({e_.slice(x, dim, begin, k), zeros}, dim);
}

Val Lowering::attention(const Node& n) {
  const Val& q = in(n, 0);
  const Shape bt = {q.shape[0], q.shape[1]};
  const Val qpos = e_.binary("add", e_.iota(1, bt), e_.broadcast(in(n, 3), bt, {}));
  const int mask_at = graph::attention_operands(n).mask_or_rows;
  if (mask_at < 0) return attend(n, q, in(n, 1), in(n, 2), qpos, nullptr);
  const Val& mask = in(n, size_t(mask_at));
  const Val valid = e_.compare("NE", mask, e_.splat(0, "i32", mask.shape));
  return attend(n, q, in(n, 1), in(n, 2), qpos, &valid);
}

Val Lowering::real_tokens(const Val& key_mask, const Val& start, int64_t T) {
  const int64_t B = key_mask.shape[0];
  // The mask with T unset slots after it, so that a window reaching past S reads those instead
  // of being clamped back to [S - T, S) by dynamic_slice.
  const Val padded = e_.concatenate({key_mask, e_.splat(0, "i32", {B, T})}, 1);
  const Val window = e_.dynamic_slice(padded, {e_.splat(0, "i32", {}), start}, {B, T});
  return e_.compare("NE", window, e_.splat(0, "i32", {B, T}));
}

// The static form: row b's state is the state's row b, zeros at start == 0, and its tokens are
// real where the key mask says. The paged form: row b's state is the pool's row slots[b] (a
// gather, clamped into range), zeros where the row's first real token is at position 0 or where
// it has no slot, and its tokens are real where their positions are >= 0.
Lowering::RecurrentRows Lowering::recurrent_rows(const Node& n, int64_t T) {
  const size_t at = size_t(graph::side_written_operand(n.op));
  const Val& state = in(n, at);
  RecurrentRows r;
  Val s, fresh;
  if (n.op == Op::kCausalConv1d || n.op == Op::kGatedDeltaRule) {
    const Val& start = in(n, at + 1);
    s = e_.convert(state, "f32");
    fresh = e_.broadcast(e_.compare("EQ", start, e_.splat(0, "i32", {})), {s.shape[0]}, {});
    r.real = real_tokens(in(n, at + 2), start, T);
  } else {
    // Each row reads its state at slots[b, 0] and writes the new one to slots[b, 1].
    const Val &both = in(n, at + 1), &pos = in(n, at + 2);  // (B,2), (B,T)
    const int64_t B = pos.shape[0], N = state.shape[0];
    const Shape bt = {B, T};
    const Val read = e_.reshape(e_.slice(both, 1, 0, 1), {B});
    const Val slots = e_.reshape(e_.slice(both, 1, 1, 2), {B});
    r.real = e_.compare("GE", pos, e_.splat(0, "i32", bt));
    // The position of each row's first real token (-1 for a row of padding).
    const Val t = e_.iota(1, bt);
    const Val first =
        e_.reduce(e_.select(r.real, t, e_.splat(double(T), "i32", bt)), "minimum", double(T), {1});
    const Val at_first = e_.compare("EQ", t, e_.broadcast(first, bt, {0}));
    const Val first_pos =
        e_.reduce(e_.select(at_first, pos, e_.splat(-1, "i32", bt)), "maximum", -1, {1});
    r.has_state = e_.compare("GE", slots, e_.splat(0, "i32", {B}));
    r.slot = e_.select(*r.has_state, slots, e_.splat(double(N), "i32", {B}));
    s = e_.convert(e_.gather_rows(state, read), "f32");
    fresh = e_.binary("or", e_.compare("EQ", first_pos, e_.splat(0, "i32", {B})),
                      e_.unary("not", *r.has_state));
  }
  r.state = e_.select(e_.broadcast(fresh, s.shape, {0}), e_.splat(0, "f32", s.shape), s);
  return r;
}

// The static form's state is the rows' new states; the paged form's pool has them scattered to
// their slots, the rows without one skipped (set_rows).
void Lowering::store_states(const Node& n, const RecurrentRows& rows, const Val& next) {
  const Val& state = in(n, size_t(graph::side_written_operand(n.op)));
  const Val v = e_.convert(next, state.elem);
  written_ = rows.slot ? e_.set_rows(state, *rows.slot, v) : v;
}

// Without a loop, as the CPU kernel's window of the last K-1 real inputs works out: u (B,
// K-1+T, C) holds each row's state, then its real tokens' x in order (padding tokens dropped),
// then zeros. The r-th real token's window is u[r, r+K-1) and its x is u[r+K-1], so its y is
// yc[r] = w[:, K-1] u[r+K-1] + sum_{j<K-1} w[:, j] u[r+j] (the CPU kernel's sum order), K shifted
// slices of u; token t reads yc at its rank, and a padding token gives zeros. The new state is
// u[count, count+K-1), count the row's real tokens.
Val Lowering::causal_conv1d(const Node& n) {
  const Val x = f32(n, 0), w = f32(n, 1);  // (B,T,C), (C,K)
  const int64_t B = x.shape[0], T = x.shape[1], C = x.shape[2], K = w.shape[1], L = K - 1 + T;
  const RecurrentRows rows = recurrent_rows(n, T);
  const Shape bt = {B, T}, bk = {B, K - 1};
  // Row b's tokens as row indices: b * len + i, into a (B * len, ...) flattening.
  auto flat_rows = [&](const Shape& shape, int64_t len, const Val& i) {
    return e_.binary(
        "add", e_.binary("multiply", e_.iota(0, shape), e_.splat(double(len), "i32", shape)), i);
  };
  const Val real = e_.convert(rows.real, "i32");
  const Val count = e_.reduce(real, "add", 0, {1});  // (B)
  // Each token's index among its row's real tokens (B,T) (a padding token's is the last one
  // before it, or -1).
  const Val rank = e_.with_constant("subtract", e_.cumsum(real, 1), 1);
  // The r-th real token of row b goes to u[b, K-1+r]; a padding token past u's end, skipped.
  const Val to =
      e_.select(rows.real, flat_rows(bt, L, e_.with_constant("add", rank, double(K - 1))),
                e_.splat(double(B * L), "i32", bt));
  const Val base =
      e_.reshape(e_.concatenate({rows.state, e_.splat(0, "f32", x.shape)}, 1), {B * L, C});
  const Val u_rows = e_.set_rows(base, e_.reshape(to, {B * T}), e_.reshape(x, {B * T, C}));
  const Val u = e_.reshape(u_rows, {B, L, C});
  auto tap = [&](int64_t j) {
    return e_.broadcast(e_.reshape(e_.slice(w, 1, j, j + 1), {C}), x.shape, {2});
  };
  Val yc = e_.binary("multiply", tap(K - 1), e_.slice(u, 1, K - 1, L));
  for (int64_t j = 0; j + 1 < K; ++j)
    yc = e_.binary("add", yc, e_.binary("multiply", tap(j), e_.slice(u, 1, j, j + T)));
  // Token t's y is yc[rank]; the new state u[count, count + K-1).
  const Val from = flat_rows(bt, T, e_.binary("maximum", rank, e_.splat(0, "i32", bt)));
  const Val y =
      e_.reshape(e_.gather_rows(e_.reshape(yc, {B * T, C}), e_.reshape(from, {B * T})), x.shape);
  const Val last = flat_rows(bk, L, e_.binary("add", e_.broadcast(count, bk, {0}), e_.iota(1, bk)));
  store_states(n, rows,
               e_.reshape(e_.gather_rows(u_rows, e_.reshape(last, {B * (K - 1)})), {B, K - 1, C}));
  return out(n,
             e_.select(e_.broadcast(rows.real, x.shape, {0, 1}), y, e_.splat(0, "f32", x.shape)));
}

// The recurrent form, as the CPU kernel runs it: a stablehlo.while over the T tokens carrying
// the state (B,H,Dk,Dv) and y (B,T,H,Dv), both f32, each step updating every (batch row, value
// head) at once. A chunked form (fla's) would do a long prefill in fewer, larger steps; decode
// (T = 1) is one step either way.
Val Lowering::gated_delta_rule(const Node& n) {
  const Val& v = in(n, 2);  // (B,T,H,Dv)
  const int64_t B = v.shape[0], T = v.shape[1], H = v.shape[2], Dv = v.shape[3];
  const int64_t Hk = in(n, 0).shape[2], Dk = in(n, 0).shape[3], G = H / Hk;
  // q and k (B,T,Hk,Dk) per value head (B,T,H,Dk): head h reads key head h / G.
  auto per_value_head = [&](size_t k) {
    const Val x = e_.reshape(f32(n, k), {B, T, Hk, 1, Dk});
    return e_.reshape(e_.broadcast(x, {B, T, Hk, G, Dk}, {0, 1, 2, 3, 4}), {B, T, H, Dk});
  };
  const RecurrentRows rows = recurrent_rows(n, T);
  const Shape& sh = rows.state.shape;
  // A paged row without a state slot gives zeros, as the CPU kernel's does.
  const Val real = rows.has_state
                       ? e_.binary("and", rows.real, e_.broadcast(*rows.has_state, {B, T}, {0}))
                       : rows.real;
  // The loop's values: the token t, the state, y, then the per-token operands it reads.
  const std::vector<Val> init = {e_.splat(0, "i32", {}),
                                 rows.state,
                                 e_.splat(0, "f32", {B, T, H, Dv}),
                                 per_value_head(0),
                                 per_value_head(1),
                                 f32(n, 2),
                                 e_.unary("exponential", f32(n, 3)),  // the decay (B,T,H)
                                 f32(n, 4),                           // beta (B,T,H)
                                 real};
  auto cond = [&](const std::vector<Val>& a) {
    return std::vector<Val>{e_.compare("LT", a[0], e_.splat(double(T), "i32", {}))};
  };
  auto step = [&](const std::vector<Val>& a) {
    const Val &t = a[0], &s = a[1];
    const Val zero = e_.splat(0, "i32", {});
    // Token t's slice of a (B,T,...) value, without the T dim.
    auto at_t = [&](const Val& x) {
      std::vector<Val> starts(size_t(x.rank()), zero);
      starts[1] = t;
      Shape sizes = x.shape, token = x.shape;
      sizes[1] = 1;
      token.erase(token.begin() + 1);
      return e_.reshape(e_.dynamic_slice(x, starts, sizes), token);
    };
    const Val q = at_t(a[3]), k = at_t(a[4]), vt = at_t(a[5]);  // (B,H,Dk), (B,H,Dk), (B,H,Dv)
    const Val decay = at_t(a[6]), beta = at_t(a[7]);            // (B,H)
    const Val real = at_t(a[8]);                                // (B)
    // Decay the state and read what it holds for k: kv = (decay S)^T k.
    const Val decayed = e_.binary("multiply", s, e_.broadcast(decay, sh, {0, 1}));
    const Val kv = e_.dot(decayed, k, {0, 1}, {0, 1}, {2}, {2});  // (B,H,Dv)
    // delta = beta (v - kv); S += k delta^T; y = S^T q.
    const Val delta =
        e_.binary("multiply", e_.broadcast(beta, kv.shape, {0, 1}), e_.binary("subtract", vt, kv));
    const Val updated = e_.binary(
        "add", decayed,
        e_.binary("multiply", e_.broadcast(k, sh, {0, 1, 2}), e_.broadcast(delta, sh, {0, 1, 3})));
    const Val yt = e_.dot(updated, q, {0, 1}, {0, 1}, {2}, {2});  // (B,H,Dv)
    // A padding token leaves its row's state as it was and gives zeros.
    const Val next = e_.select(e_.broadcast(real, sh, {0}), updated, s);
    const Val shown =
        e_.select(e_.broadcast(real, yt.shape, {0}), yt, e_.splat(0, "f32", yt.shape));
    const Val y =
        e_.dynamic_update_slice(a[2], e_.reshape(shown, {B, 1, H, Dv}), {zero, t, zero, zero});
    std::vector<Val> r = a;
    r[0] = e_.with_constant("add", t, 1);
    r[1] = next;
    r[2] = y;
    return r;
  };
  const std::vector<Val> done = e_.while_loop(init, cond, step);
  store_states(n, rows, done[1]);
  return out(n, done[2]);
}

namespace {

// quant_weight reads rows.
bool rows_layout(const Node& n) {
  const graph::LinearQuantAttrs& q = n.op == Op::kLinearQuant
                                         ? n.attrs_as<graph::LinearQuantAttrs>()
                                         : n.attrs_as<graph::LinearIdAttrs>().quant;
  return q.layout == graph::QuantLayout::kRows;
}
// Several sequences packed into a row (the rows operand) would need each query's own keys
// gathered; the lowering gathers a sequence's blocks per batch row. Attention sinks (an operand
// after the rows) lower either way.
bool one_sequence_per_row(const Node& n) {
  if (n.op == Op::kPagedCacheWrite) return n.inputs.size() == 4;
  return graph::attention_operands(n).mask_or_rows < 0;
}

}  // namespace

// The table, in Op's order. Custom calls and the collectives have no rule: the PJRT backend runs
// collectives on the host between the segments of their graph (split.h).
const Lowering::Rule& Lowering::rule(Op op) {
  using L = Lowering;
  static const Rule kNone{};
  static const std::pair<Op, Rule> kRules[] = {
      {Op::kEmbedding, {&L::embedding}},
      {Op::kLinear, {&L::linear}},
      {Op::kRMSNorm, {&L::rms_norm}},
      {Op::kRope, {&L::rope}},
      {Op::kSiluMul, {&L::silu_mul}},
      {Op::kAdd, {&L::add}},
      {Op::kReshape, {&L::reshape}},
      {Op::kCacheWrite, {&L::cache_write}},
      {Op::kAttention, {&L::attention}},
      {Op::kTakeLast, {&L::take_last}},
      {Op::kSlice, {&L::slice}},
      {Op::kLinearQuant, {&L::linear_quant, rows_layout}},
      {Op::kGeluTanhMul, {&L::gelu_tanh_mul}},
      {Op::kScale, {&L::scale}},
      {Op::kSoftcap, {&L::softcap}},
      {Op::kPagedCacheWrite, {&L::paged_cache_write, one_sequence_per_row}},
      {Op::kPagedAttention, {&L::paged_attention, one_sequence_per_row}},
      {Op::kConvert, {&L::convert}},
      {Op::kConstant, {&L::constant}},
      {Op::kUnary, {&L::unary}},
      {Op::kBinary, {&L::binary}},
      {Op::kSelect, {&L::select}},
      {Op::kReduce, {&L::reduce}},
      {Op::kSoftmax, {&L::softmax}},
      {Op::kTopK, {&L::top_k}},
      {Op::kTakeAlong, {&L::take_along}},
      {Op::kScatterAdd, {&L::scatter_add}},
      {Op::kConcat, {&L::concat}},
      {Op::kTranspose, {&L::transpose}},
      {Op::kBroadcast, {&L::broadcast}},
      {Op::kIota, {&L::iota}},
      {Op::kCumsum, {&L::cumsum}},
      {Op::kMatMul, {&L::matmul}},
      {Op::kLinearId, {&L::linear_id}},
      {Op::kLinearIdQuant, {&L::linear_id_quant, rows_layout}},
      {Op::kCausalConv1d, {&L::causal_conv1d}},
      {Op::kGatedDeltaRule, {&L::gated_delta_rule}},
      {Op::kPagedCausalConv1d, {&L::causal_conv1d}},
      {Op::kPagedGatedDeltaRule, {&L::gated_delta_rule}},
  };
  for (const auto& [o, r] : kRules)
    if (o == op) return r;
  return kNone;
}

LoweredModule Lowering::run() {
  const auto& nodes = g_.nodes();
  for (const Node& n : nodes)
    if (!is_leaf(n.op) && !can_lower(n))
      throw UnsupportedError(str_cat("StableHLO lowering: ", node_label(g_, n),
                                     " has no StableHLO form; a graph with this op needs the CPU "
                                     "backend"));
  vals_.resize(nodes.size());
  // Arguments in binding order: parameters, states, inputs.
  const std::vector<int> states = g_.leaves(Op::kState);
  const std::vector<int> outputs = g_.outputs();
  std::string args;
  int arg = 0;
  for (Op kind : {Op::kParameter, Op::kState, Op::kInput}) {
    const std::vector<int> ids = g_.leaves(kind);
    for (size_t i = 0; i < ids.size(); ++i) {
      const Node& n = nodes[size_t(ids[i])];
      Val& v = vals_[size_t(ids[i])];
      v = {"%arg" + std::to_string(arg++), element(n.type.dtype), n.type.shape};
      args += (args.empty() ? "" : ", ") + v.ssa + ": " + v.type();
      // A state's buffer is donated to its new value, so the cache is updated in place.
      if (kind == Op::kState)
        args += str_cat(" {tf.aliasing_output = ", outputs.size() + i, " : i32}");
    }
  }
  // What each value's bytes are, as the CPU backend aliases them: a reshape's and a cache write's
  // are their first input's (its root's). A write to a root makes `holds[root]` the bytes' latest
  // value: a cache write's value, or the operand a linear-attention op writes beside its own
  // value (graph::side_written_operand), which its rule leaves in written_. The CPU backend
  // writes in place, so a node that reads those bytes after the write sees it; the module's
  // values are immutable, so an operand defined before the latest write of its root is read as
  // that write left it (a reshape of holds). GraphBuilder users read a cache through its write's
  // value, which is current; a state that a linear-attention op writes has no such value, so a
  // later reader (the next step's op in the same graph, an output) is read this way. Each
  // state's result is its latest value.
  std::vector<int> root(nodes.size()), wrote(nodes.size(), -1), as_of(nodes.size(), -1);
  std::vector<Val> holds(nodes.size());
  auto refresh = [&](int j) {  // value j as its bytes are now
    const int r = root[size_t(j)];
    if (wrote[size_t(r)] > as_of[size_t(j)]) {
      vals_[size_t(j)] = e_.reshape(holds[size_t(r)], nodes[size_t(j)].type.shape);
      as_of[size_t(j)] = wrote[size_t(r)];
    }
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    const bool cache_write = n.op == Op::kCacheWrite || n.op == Op::kPagedCacheWrite;
    root[i] = n.op == Op::kReshape || cache_write ? root[size_t(n.inputs[0])] : int(i);
    if (is_leaf(n.op)) continue;
    for (int j : n.inputs) refresh(j);
    vals_[i] = (this->*rule(n.op).lower)(n);
    int target = -1;  // the root this node writes
    if (cache_write) {
      target = root[i];
      holds[size_t(target)] = vals_[i];
    } else if (const int k = graph::side_written_operand(n.op); k >= 0) {
      TF_CHECK(written_, "StableHLO lowering: ", node_label(g_, n), " left no new state");
      target = root[size_t(n.inputs[size_t(k)])];
      holds[size_t(target)] = *written_;
    }
    written_.reset();
    if (target >= 0) wrote[size_t(target)] = int(i);
    as_of[i] = wrote[size_t(root[i])];
  }
  std::vector<Val> results;
  for (int o : outputs) {
    refresh(o);
    results.push_back(vals_[size_t(o)]);
  }
  for (int s : states) {
    refresh(s);
    results.push_back(vals_[size_t(s)]);
  }
  std::string ret, ret_types;
  for (const Val& r : results) {
    ret += (ret.empty() ? "" : ", ") + r.ssa;
    ret_types += (ret_types.empty() ? "" : ", ") + r.type();
  }
  LoweredModule m;
  m.num_outputs = outputs.size();
  m.num_states = states.size();
  m.mlir = str_cat(
      "module @tformers attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} "
      "{\n  func.func public @main(",
      args, ") -> (", ret_types, ") {\n", e_.body(), "    return",
      ret.empty() ? "" : " " + ret + " : " + ret_types, "\n  }\n}\n");
  return m;
}

Capabilities capabilities() {
  return {.kv_layout = graph::KvLayout::kTokenMajor,
          .compute_dtypes = {DType::f32, DType::bf16, DType::f16},
          .packs_sequences = false,
          .batch_invariant = false};
}

bool can_lower(const graph::Node& node) {
  const Lowering::Rule& r = Lowering::rule(node.op);
  return r.lower && (!r.accepts || r.accepts(node));
}

LoweredModule lower(const graph::Graph& graph) {
  const graph::Graph primitive = graph::decompose(graph, can_lower);
  return Lowering(primitive).run();
}

}  // namespace tformers::backends::pjrt
