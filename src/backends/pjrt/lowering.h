// The StableHLO writer that the lowering (lower.h) is made of: an emitter of MLIR text one op at a
// time, and the Lowering of a graph whose rule table maps each op of the registry (graph/ops.h)
// to the member function that lowers a node of it. The rules of the fused ops are in lower.cc,
// those of the primitives in lower_primitives.cc.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/pjrt/lower.h"
#include "graph/graph.h"
#include "tformers/error.h"

namespace tformers::backends::pjrt {

using detail::str_cat;
using graph::Node;
using graph::Op;

// MLIR's name of an element type.
inline std::string element(DType t) {
  return t == DType::u8 ? "ui8" : std::string(dtype_short_name(t));
}

inline std::string join(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out;
}

inline std::string tensor_type(const std::string& elem, const Shape& shape) {
  std::string t = "tensor<";
  for (int64_t d : shape) t += std::to_string(d) + "x";
  return t + elem + ">";
}

// A value of the module being written: its SSA name and its type.
struct Val {
  std::string ssa;
  std::string elem;  // "f32", "bf16", "i1", "ui8", ...
  Shape shape;

  std::string type() const { return tensor_type(elem, shape); }
  int64_t rank() const { return int64_t(shape.size()); }
};

inline bool is_float_elem(const std::string& e) { return e == "f32" || e == "bf16" || e == "f16"; }

// A float as MLIR reads it bit-exactly: the hexadecimal bit pattern of its element type.
inline std::string float_literal(float v, const std::string& elem) {
  char buf[16];
  if (elem == "f32") {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    std::snprintf(buf, sizeof buf, "0x%08X", bits);
  } else {
    const uint16_t bits = elem == "bf16" ? f32_to_bf16(v) : f32_to_f16(v);
    std::snprintf(buf, sizeof buf, "0x%04X", unsigned(bits));
  }
  return buf;
}

// Writes the body of @main one op at a time; each method returns the value it defines, with its
// shape worked out here so that every op's type signature is spelled in full.
class Emitter {
 public:
  const std::string& body() const { return body_; }

  Val def(std::string elem, Shape shape, const std::string& rhs) {
    Val v{"%v" + std::to_string(next_++), std::move(elem), std::move(shape)};
    body_ += "    " + v.ssa + " = " + rhs + "\n";
    return v;
  }

  // A constant of any shape: `value` is a double so that integer constants (row offsets, block
  // counts) stay exact.
  Val splat(double value, const std::string& elem, const Shape& shape) {
    const std::string lit =
        is_float_elem(elem) ? float_literal(float(value), elem) : std::to_string(int64_t(value));
    return def(elem, shape,
               str_cat("stablehlo.constant dense<", lit, "> : ", tensor_type(elem, shape)));
  }
  Val floats(const std::vector<float>& values) {  // a 1-d f32 constant
    std::string lit;
    for (size_t i = 0; i < values.size(); ++i)
      lit += (i ? ", " : "") + float_literal(values[i], "f32");
    const Shape shape = {int64_t(values.size())};
    return def("f32", shape,
               str_cat("stablehlo.constant dense<[", lit, "]> : ", tensor_type("f32", shape)));
  }

  // The same bits as another element type of the same width.
  Val bitcast(const Val& a, const std::string& elem) {
    return def(elem, a.shape,
               str_cat("stablehlo.bitcast_convert ", a.ssa, " : (", a.type(), ") -> ",
                       tensor_type(elem, a.shape)));
  }
  Val convert(const Val& a, const std::string& elem) {
    if (a.elem == elem) return a;
    return def(elem, a.shape,
               str_cat("stablehlo.convert ", a.ssa, " : (", a.type(), ") -> ",
                       tensor_type(elem, a.shape)));
  }
  Val unary(const char* op, const Val& a) {
    return def(a.elem, a.shape, str_cat("stablehlo.", op, " ", a.ssa, " : ", a.type()));
  }
  Val binary(const char* op, const Val& a, const Val& b) {
    TF_CHECK(a.type() == b.type(), "StableHLO lowering: ", op, " of ", a.type(), " and ", b.type());
    return def(a.elem, a.shape,
               str_cat("stablehlo.", op, " ", a.ssa, ", ", b.ssa, " : ", a.type()));
  }
  // a op (scalar constant c), in a's type.
  Val with_constant(const char* op, const Val& a, double c) {
    return binary(op, a, splat(c, a.elem, a.shape));
  }
  Val broadcast(const Val& a, const Shape& shape, const std::vector<int64_t>& dims) {
    if (a.shape == shape) return a;
    return def(a.elem, shape,
               str_cat("stablehlo.broadcast_in_dim ", a.ssa, ", dims = [", join(dims), "] : (",
                       a.type(), ") -> ", tensor_type(a.elem, shape)));
  }
  Val reshape(const Val& a, const Shape& shape) {
    if (a.shape == shape) return a;
    return def(a.elem, shape,
               str_cat("stablehlo.reshape ", a.ssa, " : (", a.type(), ") -> ",
                       tensor_type(a.elem, shape)));
  }
  Val transpose(const Val& a, const std::vector<int64_t>& perm) {
    Shape shape;
    for (int64_t p : perm) shape.push_back(a.shape[size_t(p)]);
    return def(a.elem, shape,
               str_cat("stablehlo.transpose ", a.ssa, ", dims = [", join(perm), "] : (", a.type(),
                       ") -> ", tensor_type(a.elem, shape)));
  }
  // a[begin:end] along dimension `dim`, every other dimension whole.
  Val slice(const Val& a, int64_t dim, int64_t begin, int64_t end) {
    std::string ranges;
    Shape shape = a.shape;
    for (int64_t d = 0; d < a.rank(); ++d) {
      const int64_t lo = d == dim ? begin : 0, hi = d == dim ? end : a.shape[size_t(d)];
      ranges += str_cat(d ? ", " : "", lo, ":", hi);
      shape[size_t(d)] = hi - lo;
    }
    return def(a.elem, shape,
               str_cat("stablehlo.slice ", a.ssa, " [", ranges, "] : (", a.type(), ") -> ",
                       tensor_type(a.elem, shape)));
  }
  Val concatenate(const std::vector<Val>& parts, int64_t dim) {
    Shape shape = parts[0].shape;
    shape[size_t(dim)] = 0;
    std::string operands, types;
    for (const Val& p : parts) {
      shape[size_t(dim)] += p.shape[size_t(dim)];
      operands += (operands.empty() ? "" : ", ") + p.ssa;
      types += (types.empty() ? "" : ", ") + p.type();
    }
    return def(parts[0].elem, shape,
               str_cat("stablehlo.concatenate ", operands, ", dim = ", dim, " : (", types, ") -> ",
                       tensor_type(parts[0].elem, shape)));
  }
  Val iota(int64_t dim, const Shape& shape) {
    return def("i32", shape,
               str_cat("stablehlo.iota dim = ", dim, " : ", tensor_type("i32", shape)));
  }
  // a dir b elementwise ("LE", "GT", ...), as i1.
  Val compare(const char* dir, const Val& a, const Val& b) {
    TF_CHECK(a.type() == b.type(), "StableHLO lowering: compare of ", a.type(), " and ", b.type());
    return def("i1", a.shape,
               str_cat("stablehlo.compare ", dir, ", ", a.ssa, ", ", b.ssa, ", ",
                       is_float_elem(a.elem) ? "FLOAT" : "SIGNED", " : (", a.type(), ", ", b.type(),
                       ") -> ", tensor_type("i1", a.shape)));
  }
  Val select(const Val& pred, const Val& a, const Val& b) {
    return def(a.elem, a.shape,
               str_cat("stablehlo.select ", pred.ssa, ", ", a.ssa, ", ", b.ssa, " : ", pred.type(),
                       ", ", a.type()));
  }
  // Reduces `dims` of a with `op` ("add", "maximum") from `init`.
  Val reduce(const Val& a, const char* op, double init, const std::vector<int64_t>& dims) {
    const Val zero = splat(init, a.elem, {});
    Shape shape;
    for (int64_t d = 0; d < a.rank(); ++d)
      if (std::find(dims.begin(), dims.end(), d) == dims.end()) shape.push_back(a.shape[size_t(d)]);
    return def(a.elem, shape,
               str_cat("stablehlo.reduce(", a.ssa, " init: ", zero.ssa, ") applies stablehlo.", op,
                       " across dimensions = [", join(dims), "] : (", a.type(), ", ", zero.type(),
                       ") -> ", tensor_type(a.elem, shape)));
  }
  // A dot_general accumulating in f32: batch dims, then a's free dims, then b's. Operands of
  // different element types (f32 activations, bf16 weights) both widen to f32, which is exact.
  // f32 operands ask for HIGHEST precision: DEFAULT lets a TPU or GPU round them to bf16 or tf32,
  // where the CPU backend multiplies in full f32.
  Val dot(Val a, Val b, const std::vector<int64_t>& batch_a, const std::vector<int64_t>& batch_b,
          const std::vector<int64_t>& contract_a, const std::vector<int64_t>& contract_b) {
    if (a.elem != b.elem) {
      a = convert(a, "f32");
      b = convert(b, "f32");
    }
    Shape shape;
    for (int64_t d : batch_a) shape.push_back(a.shape[size_t(d)]);
    auto free_dims = [&](const Val& x, const std::vector<int64_t>& batch,
                         const std::vector<int64_t>& contract) {
      for (int64_t d = 0; d < x.rank(); ++d)
        if (std::find(batch.begin(), batch.end(), d) == batch.end() &&
            std::find(contract.begin(), contract.end(), d) == contract.end())
          shape.push_back(x.shape[size_t(d)]);
    };
    free_dims(a, batch_a, contract_a);
    free_dims(b, batch_b, contract_b);
    const char* precision = a.elem == "f32" ? "HIGHEST" : "DEFAULT";
    std::string dims;
    if (!batch_a.empty())
      dims = str_cat("batching_dims = [", join(batch_a), "] x [", join(batch_b), "], ");
    return def(
        "f32", shape,
        str_cat("stablehlo.dot_general ", a.ssa, ", ", b.ssa, ", ", dims, "contracting_dims = [",
                join(contract_a), "] x [", join(contract_b), "], precision = [", precision, ", ",
                precision, "] : (", a.type(), ", ", b.type(), ") -> ", tensor_type("f32", shape)));
  }
  // Rows of table (R, ...) at idx (n) (clamped into range, as XLA's gather does): (n, ...).
  Val gather_rows(const Val& table, const Val& idx) {
    const Val at = reshape(idx, {idx.shape[0], 1});
    Shape shape = table.shape;
    shape[0] = idx.shape[0];
    std::vector<int64_t> offset_dims, sizes = {1};
    for (int64_t d = 1; d < table.rank(); ++d) {
      offset_dims.push_back(d);
      sizes.push_back(table.shape[size_t(d)]);
    }
    return def(
        table.elem, shape,
        str_cat("\"stablehlo.gather\"(", table.ssa, ", ", at.ssa,
                ") {dimension_numbers = #stablehlo.gather<offset_dims = [", join(offset_dims),
                "], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = "
                "1>, indices_are_sorted = false, slice_sizes = array<i64: ",
                join(sizes), ">} : (", table.type(), ", ", at.type(), ") -> ",
                tensor_type(table.elem, shape)));
  }
  // operand[starts[d] : starts[d] + sizes[d]] in each dimension d, the starts scalar i32 (clamped
  // into range, as XLA does).
  Val dynamic_slice(const Val& operand, const std::vector<Val>& starts, const Shape& sizes) {
    std::string operands = operand.ssa, types = operand.type();
    for (const Val& s : starts) {
      operands += ", " + s.ssa;
      types += ", " + s.type();
    }
    return def(operand.elem, sizes,
               str_cat("stablehlo.dynamic_slice ", operands, ", sizes = [", join(sizes), "] : (",
                       types, ") -> ", tensor_type(operand.elem, sizes)));
  }
  Val dynamic_update_slice(const Val& operand, const Val& update, const std::vector<Val>& starts) {
    std::string operands = operand.ssa + ", " + update.ssa,
                types = operand.type() + ", " + update.type();
    for (const Val& s : starts) {
      operands += ", " + s.ssa;
      types += ", " + s.type();
    }
    return def(operand.elem, operand.shape,
               str_cat("stablehlo.dynamic_update_slice ", operands, " : (", types, ") -> ",
                       operand.type()));
  }
  // A 4-d operand with update[i] (2-d) written where dim 0 is block[i] and dim `second` (1 or 2)
  // is offset[i], for each row i of at (n, 2) = (block, offset): [block, :, offset, :] for a
  // pool (NB, H, BS, D), [block, offset, :, :] for (NB, BS, H, D). A row whose block is out of
  // range is skipped: XLA drops scatter updates whose window falls outside the operand
  // (StableHLO leaves it to the implementation), and the paged write relies on that for its
  // padding tokens.
  Val scatter_rows(const Val& operand, const Val& at, const Val& update, int second) {
    return replace_at(operand, at, update, "[1, 2]", str_cat("[0, ", second, "]"));
  }

  // operand (R, ...) with row idx[i] made update[i] (n, ...) for each i of idx (n) i32. A row
  // out of range is skipped, as scatter_rows' are; where two updates name the same row, either
  // may win.
  Val set_rows(const Val& operand, const Val& idx, const Val& update) {
    std::vector<int64_t> window;
    for (int64_t d = 1; d < operand.rank(); ++d) window.push_back(d);
    return replace_at(operand, reshape(idx, {idx.shape[0], 1}), update, "[" + join(window) + "]",
                      "[0]");
  }

  // A stablehlo.scatter that replaces the operand's values at `at` (n, index) with update's:
  // `window` its update_window_dims, `dims` both its inserted_window_dims and its
  // scatter_dims_to_operand_dims.
  Val replace_at(const Val& operand, const Val& at, const Val& update, const std::string& window,
                 const std::string& dims) {
    const std::string scalar = "tensor<" + operand.elem + ">";
    return def(
        operand.elem, operand.shape,
        str_cat("\"stablehlo.scatter\"(", operand.ssa, ", ", at.ssa, ", ", update.ssa,
                ") ({\n    ^bb0(%old: ", scalar, ", %new: ", scalar,
                "):\n      stablehlo.return %new : ", scalar,
                "\n    }) {scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = ",
                window, ", inserted_window_dims = ", dims,
                ", scatter_dims_to_operand_dims = ", dims,
                ", index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false} : (",
                operand.type(), ", ", at.type(), ", ", update.type(), ") -> ", operand.type()));
  }
  // The inclusive running sums of a along `axis`, in a's type: a reduce_window whose window
  // reaches back over the whole axis (the form JAX emits for cumsum).
  Val cumsum(const Val& a, int64_t axis) {
    const int64_t len = a.shape[size_t(axis)];
    std::vector<int64_t> window(size_t(a.rank()), 1);
    window[size_t(axis)] = len;
    std::string padding;
    for (int64_t d = 0; d < a.rank(); ++d)
      padding += str_cat(d ? ", " : "", "[", d == axis ? len - 1 : 0, ", 0]");
    const Val zero = splat(0, a.elem, {});
    const std::string s = "tensor<" + a.elem + ">";
    return def(
        a.elem, a.shape,
        str_cat("\"stablehlo.reduce_window\"(", a.ssa, ", ", zero.ssa, ") ({\n    ^bb0(%a: ", s,
                ", %b: ", s, "):\n      %sum = stablehlo.add %a, %b : ", s,
                "\n      stablehlo.return %sum : ", s, "\n    }) {window_dimensions = array<i64: ",
                join(window), ">, padding = dense<[", padding, "]> : tensor<", a.rank(),
                "x2xi64>} : (", a.type(), ", ", zero.type(), ") -> ", a.type()));
  }

  // PyTorch's tanh approximation of gelu: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
  Val gelu_tanh(const Val& x) {
    const Val x3 = binary("multiply", binary("multiply", x, x), x);
    const Val inner =
        with_constant("multiply", binary("add", x, with_constant("multiply", x3, 0.044715f)),
                      0.7978845608028654f);
    return binary("multiply", with_constant("multiply", x, 0.5f),
                  with_constant("add", unary("tanh", inner), 1.0f));
  }
  Val silu(const Val& x) { return binary("multiply", x, unary("logistic", x)); }

  // A stablehlo.while over the values `init`: it runs body while cond holds, each taking the
  // loop's current values (block arguments) and emitting its ops into its own region; cond gives
  // an i1 scalar, body the next values in init's types. Returns the final values. Every value
  // the regions use is carried (none captured from the enclosing body), the form JAX emits.
  using Region = std::function<std::vector<Val>(const std::vector<Val>&)>;
  std::vector<Val> while_loop(const std::vector<Val>& init, const Region& cond,
                              const Region& body) {
    const std::string ssa = "%v" + std::to_string(next_++);
    std::string operands, types;
    for (const Val& v : init) {
      operands += (operands.empty() ? "" : ", ") + v.ssa;
      types += (types.empty() ? "" : ", ") + v.type();
    }
    // One region: its block's arguments (fresh names in the function's numbering, which
    // MLIR's nesting requires unique), its ops, and the return of what `build` gives.
    auto region = [&](const Region& build) {
      std::vector<Val> args;
      std::string params;
      for (const Val& v : init) {
        args.push_back({"%v" + std::to_string(next_++), v.elem, v.shape});
        params += (params.empty() ? "" : ", ") + args.back().ssa + ": " + v.type();
      }
      std::string outer;
      std::swap(outer, body_);
      const std::vector<Val> results = build(args);
      std::string ret, ret_types;
      for (const Val& r : results) {
        ret += (ret.empty() ? "" : ", ") + r.ssa;
        ret_types += (ret_types.empty() ? "" : ", ") + r.type();
      }
      std::string text = str_cat("  ^bb0(", params, "):\n", body_, "      stablehlo.return ", ret,
                                 " : ", ret_types, "\n");
      std::swap(outer, body_);
      return text;
    };
    const std::string c = region(cond), b = region(body);
    body_ += str_cat("    ", ssa, ":", init.size(), " = \"stablehlo.while\"(", operands, ") ({\n",
                     c, "    }, {\n", b, "    }) : (", types, ") -> (", types, ")\n");
    std::vector<Val> out;
    for (size_t i = 0; i < init.size(); ++i)
      out.push_back({str_cat(ssa, "#", i), init[i].elem, init[i].shape});
    return out;
  }

  // An op of several results, "%vN:count = rhs", each result of its (element, shape).
  std::vector<Val> defs(const std::vector<std::pair<std::string, Shape>>& types,
                        const std::string& rhs) {
    const std::string ssa = "%v" + std::to_string(next_++);
    body_ += str_cat("    ", ssa, ":", types.size(), " = ", rhs, "\n");
    std::vector<Val> out;
    for (size_t i = 0; i < types.size(); ++i)
      out.push_back({str_cat(ssa, "#", i), types[i].first, types[i].second});
    return out;
  }

 private:
  std::string body_;
  int next_ = 0;
};

// How a node is named in errors: "%12 all_reduce  # layers.0.mlp.down_proj".
inline std::string node_label(const graph::Graph& g, const Node& n) {
  const int id = int(&n - g.nodes().data());
  std::string s = str_cat("%", id, " ", graph::op_name(n.op));
  if (!n.name.empty()) s += "  # " + n.name;
  return s;
}

class Lowering {
 public:
  explicit Lowering(const graph::Graph& g)
      : g_(g),
        act_(element(g.activation_dtype())),
        head_major_(g.kv_layout() == graph::KvLayout::kHeadMajor) {}
  LoweredModule run();

  // A rule: the member that lowers a node of its op, and whether it takes this node (null: every
  // node of the op); an op without a rule has no StableHLO form.
  struct Rule {
    Val (Lowering::*lower)(const Node& n) = nullptr;
    bool (*accepts)(const Node& n) = nullptr;
  };
  static const Rule& rule(graph::Op op);

 private:
  const Val& in(const Node& n, size_t k) const { return vals_[size_t(n.inputs[k])]; }
  Val f32(const Node& n, size_t k) { return e_.convert(in(n, k), "f32"); }
  // The node's value from its f32 computation, rounded to the node's dtype.
  Val out(const Node& n, const Val& v) { return e_.convert(v, element(n.type.dtype)); }

  // The fused ops (lower.cc).
  Val embedding(const Node& n);
  Val linear(const Node& n);
  Val linear_quant(const Node& n);
  Val linear_out(const Node& n, const Val& x, const Val& w, int bias_at);
  // A kLinearQuant weight w with scales s (and zero points) dequantized to (N, K) in the
  // activation dtype.
  Val quant_weight(const graph::LinearQuantAttrs& q, const Val& w, const Val& s, const Val* zero,
                   int64_t K);
  Val mxfp4_weight(const Val& codes, const Val& s, const std::function<Val(const Val&)>& per_k);
  Val rms_norm(const Node& n);
  Val rope(const Node& n);
  Val silu_mul(const Node& n);
  Val gelu_tanh_mul(const Node& n);
  Val add(const Node& n);
  Val scale(const Node& n);
  Val softcap(const Node& n);
  Val reshape(const Node& n);
  Val convert(const Node& n);
  Val take_last(const Node& n);
  Val slice(const Node& n);
  Val cache_write(const Node& n);
  Val attention(const Node& n);
  Val paged_cache_write(const Node& n);
  Val paged_attention(const Node& n);
  // Attention of q (B,T,Hq,D) over k, v (B,Hkv,S,D) or (B,S,Hkv,D) (the graph's KV layout), query
  // (b,t) at slot qpos[b,t] (i32, B,T) seeing slots j <= qpos within the window where key_valid
  // (B,S) holds (when given), with the node's sinks if it has them; a query that sees no slot
  // gives zeros.
  Val attend(const Node& n, const Val& q, const Val& k, const Val& v, const Val& qpos,
             const Val* key_valid);
  // The unnormalised softmax weights of the scores s (B,Hkv,T,G,S) over the slots `seen` marks,
  // and their sums (B,Hkv,T,G), 1 for a row that sees no slot; with sinks, a query head's sink
  // joins its rows' max and sums.
  std::pair<Val, Val> attention_weights(const Node& n, const Val& s, const Val& seen);
  // The linear-attention ops (graph.h), whose value is their output y and which also write their
  // state operand (graph::side_written_operand): each rule returns y and leaves the state's new
  // value in written_, which run() makes the state's latest value. A static and a paged form
  // share their rule: they differ only in where each batch row's state is and which of its
  // tokens are real, which recurrent_rows works out from the operands after the state's.
  Val causal_conv1d(const Node& n);
  Val gated_delta_rule(const Node& n);
  // The B batch rows of a linear-attention node, as the CPU's recurrent_rows (cpu/rules.cc)
  // reads them.
  struct RecurrentRows {
    // (B, ...) f32: each row's state as the step starts, zeros for a new sequence (and for a
    // paged row without a state slot)
    Val state;
    Val real;  // (B,T) i1: the tokens that are not padding
    // The paged form's: the rows that have a state slot (B) i1, and where each row's new state
    // goes in the pool (B) i32 (past its end for a row that has none, which the write skips).
    std::optional<Val> has_state, slot;
  };
  RecurrentRows recurrent_rows(const Node& n, int64_t T);
  // Leaves in written_ the state operand with each row's new state `next` (B, ...) stored.
  void store_states(const Node& n, const RecurrentRows& rows, const Val& next);
  // Which of the T tokens at slots [start, start + T) key_mask (B,S) marks real, (B,T) i1; a slot
  // at or past S is not (as the CPU's kernels read the mask).
  Val real_tokens(const Val& key_mask, const Val& start, int64_t T);

  // The primitives (lower_primitives.cc).
  Val constant(const Node& n);
  Val unary(const Node& n);
  Val binary(const Node& n);
  Val select(const Node& n);
  Val reduce(const Node& n);
  Val softmax(const Node& n);
  Val top_k(const Node& n);
  Val take_along(const Node& n);
  Val scatter_add(const Node& n);
  Val concat(const Node& n);
  Val transpose(const Node& n);
  Val broadcast(const Node& n);
  Val iota(const Node& n);
  Val cumsum(const Node& n);
  Val matmul(const Node& n);
  Val linear_id(const Node& n);
  Val linear_id_quant(const Node& n);
  // x through the experts w (E, N, K) at idx: kLinearId's result.
  // x (..., K) or a row per slot through the experts idx (operand 2) routed to, of E on this
  // rank: routed_weights(experts (rk) i32, clamped into range) gives their weights (rk, N, K).
  Val experts_out(const Node& n, const Val& x, int64_t E, int64_t K,
                  const std::function<Val(const Val&)>& routed_weights);
  // The experts' bias operand of kLinearId or kLinearIdQuant, or null.
  const Val* experts_bias(const Node& n);
  // Operand k in the node's element type, broadcast to the node's shape.
  Val operand_as_out(const Node& n, size_t k);
  // Rows of x (..., N) at idx (..., k): a gather along the last dim.
  Val gather_last(const Val& x, const Val& idx);

  const graph::Graph& g_;
  std::string act_;
  bool head_major_;  // the graph's KV layout (graph.h)
  Emitter e_;
  std::vector<Val> vals_;
  // The new value of the operand the node being lowered writes beside its own value, set by the
  // rules of the ops that have one (graph::side_written_operand).
  std::optional<Val> written_;
};

}  // namespace tformers::backends::pjrt
