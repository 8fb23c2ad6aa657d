// The StableHLO rules of the primitives (graph.h): each computes in float32 (or int32) and rounds
// its result to the node's dtype, as the fused ops' rules in lower.cc do.
#include <cmath>
#include <numeric>

#include "backends/pjrt/lowering.h"
#include "distributed/process_group.h"

namespace tformers::backends::pjrt {

namespace {

// The dims of an operand of rank r that NumPy's broadcast places in a result of rank R.
std::vector<int64_t> trailing_dims(int64_t r, int64_t R) {
  std::vector<int64_t> dims(static_cast<size_t>(r));
  std::iota(dims.begin(), dims.end(), R - r);
  return dims;
}

// Each dim of a rank-r value but `skip`.
std::vector<int64_t> dims_but(int64_t r, int64_t skip) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < r; ++d)
    if (d != skip) dims.push_back(d);
  return dims;
}

// A scalar block argument's type.
std::string scalar(const std::string& elem) { return "tensor<" + elem + ">"; }

}  // namespace

Val Lowering::operand_as_out(const Node& n, size_t k) {
  const std::string elem = n.type.dtype == DType::i32 ? "i32" : "f32";
  const Val v = e_.convert(in(n, k), elem);
  return e_.broadcast(v, n.type.shape, trailing_dims(v.rank(), int64_t(n.type.shape.size())));
}

Val Lowering::constant(const Node& n) {
  return e_.splat(n.attrs_as<graph::ConstantAttrs>().value, element(n.type.dtype), n.type.shape);
}

Val Lowering::unary(const Node& n) {
  const Val x = f32(n, 0);
  switch (n.attrs_as<graph::UnaryAttrs>().fn) {
    case graph::UnaryFn::kExp:
      return out(n, e_.unary("exponential", x));
    case graph::UnaryFn::kLog:
      return out(n, e_.unary("log", x));
    case graph::UnaryFn::kNeg:
      return out(n, e_.unary("negate", x));
    case graph::UnaryFn::kSqrt:
      return out(n, e_.unary("sqrt", x));
    case graph::UnaryFn::kRsqrt:
      return out(n, e_.unary("rsqrt", x));
    case graph::UnaryFn::kTanh:
      return out(n, e_.unary("tanh", x));
    case graph::UnaryFn::kSigmoid:
      return out(n, e_.unary("logistic", x));
    case graph::UnaryFn::kSilu:
      return out(n, e_.silu(x));
    case graph::UnaryFn::kGeluTanh:
      return out(n, e_.gelu_tanh(x));
    case graph::UnaryFn::kSoftplus: {  // linear above 20, as PyTorch's threshold
      const Val big = e_.compare("GT", x, e_.splat(20.0f, "f32", x.shape));
      return out(n, e_.select(big, x, e_.unary("log_plus_one", e_.unary("exponential", x))));
    }
  }
  throw InternalError("StableHLO lowering: unary function");
}

Val Lowering::binary(const Node& n) {
  static constexpr const char* kOps[] = {"add",    "subtract", "multiply",
                                         "divide", "maximum",  "minimum"};
  const auto fn = n.attrs_as<graph::BinaryAttrs>().fn;
  return out(n, e_.binary(kOps[size_t(fn)], operand_as_out(n, 0), operand_as_out(n, 1)));
}

Val Lowering::select(const Node& n) {
  const Val p = e_.broadcast(in(n, 0), n.type.shape,
                             trailing_dims(in(n, 0).rank(), int64_t(n.type.shape.size())));
  const Val pred = e_.compare("NE", p, e_.splat(0, "i32", p.shape));
  return out(n, e_.select(pred, operand_as_out(n, 1), operand_as_out(n, 2)));
}

Val Lowering::reduce(const Node& n) {
  const auto& a = n.attrs_as<graph::ReduceAttrs>();
  const bool sum = a.fn == graph::ReduceFn::kSum;
  const Val r = e_.reduce(f32(n, 0), sum ? "add" : "maximum", sum ? 0.0 : -INFINITY, {a.axis});
  return out(n, e_.reshape(r, n.type.shape));
}

Val Lowering::softmax(const Node& n) {
  const Val x = f32(n, 0);
  const int64_t last = x.rank() - 1;
  const std::vector<int64_t> rows = dims_but(x.rank(), last);
  const Val m = e_.broadcast(e_.reduce(x, "maximum", -INFINITY, {last}), x.shape, rows);
  const Val ex = e_.unary("exponential", e_.binary("subtract", x, m));
  const Val sum = e_.broadcast(e_.reduce(ex, "add", 0.0, {last}), x.shape, rows);
  return out(n, e_.binary("divide", ex, sum));
}

// A stable sort of (x, iota) along the last dim, largest first and the lower index first among
// equals, then the first k indices.
Val Lowering::top_k(const Node& n) {
  const Val x = f32(n, 0);
  const int64_t last = x.rank() - 1;
  const Val idx = e_.iota(last, x.shape);
  const std::string f = scalar("f32"), i = scalar("i32"), b = scalar("i1");
  const std::string region =
      str_cat("({\n    ^bb0(%a: ", f, ", %b: ", f, ", %ia: ", i, ", %ib: ", i,
              "):\n      %gt = stablehlo.compare GT, %a, %b, FLOAT : (", f, ", ", f, ") -> ", b,
              "\n      %eq = stablehlo.compare EQ, %a, %b, FLOAT : (", f, ", ", f, ") -> ", b,
              "\n      %lt = stablehlo.compare LT, %ia, %ib, SIGNED : (", i, ", ", i, ") -> ", b,
              "\n      %tie = stablehlo.and %eq, %lt : ", b,
              "\n      %first = stablehlo.or %gt, %tie : ", b,
              "\n      stablehlo.return %first : ", b, "\n    })");
  const std::vector<Val> sorted =
      e_.defs({{"f32", x.shape}, {"i32", x.shape}},
              str_cat("\"stablehlo.sort\"(", x.ssa, ", ", idx.ssa, ") ", region,
                      " {dimension = ", last, " : i64, is_stable = true} : (", x.type(), ", ",
                      idx.type(), ") -> (", x.type(), ", ", idx.type(), ")"));
  return e_.slice(sorted[1], last, 0, n.type.shape.back());
}

// x (..., N) at idx (..., k) as a gather from x flattened, each index clamped into its row as the
// CPU's reference clamps it.
Val Lowering::gather_last(const Val& x, const Val& idx) {
  const int64_t N = x.shape.back(), k = idx.shape.back(), rows = shape_numel(idx.shape) / k;
  const Shape rk = {rows, k};
  Val at = e_.reshape(idx, rk);
  at = e_.binary("minimum", e_.binary("maximum", at, e_.splat(0, "i32", rk)),
                 e_.splat(double(N - 1), "i32", rk));
  at = e_.binary("add", at, e_.binary("multiply", e_.iota(0, rk), e_.splat(double(N), "i32", rk)));
  const Val flat = e_.reshape(x, {rows * N});
  return e_.reshape(e_.gather_rows(flat, e_.reshape(at, {rows * k})), idx.shape);
}

Val Lowering::take_along(const Node& n) { return gather_last(in(n, 0), in(n, 1)); }

// src added into base flattened at each row's offset plus its index; an index outside its row
// goes past the end, where XLA's scatter drops it (as the CPU's reference does).
Val Lowering::scatter_add(const Node& n) {
  const std::string elem = n.type.dtype == DType::i32 ? "i32" : "f32";
  const Val base = e_.convert(in(n, 0), elem), src = e_.convert(in(n, 2), elem);
  const int64_t N = base.shape.back(), k = src.shape.back(), rows = shape_numel(src.shape) / k;
  const Shape rk = {rows, k};
  const Val idx = e_.reshape(in(n, 1), rk);
  const Val inside = e_.binary("and", e_.compare("GE", idx, e_.splat(0, "i32", rk)),
                               e_.compare("LT", idx, e_.splat(double(N), "i32", rk)));
  Val at =
      e_.binary("add", idx, e_.binary("multiply", e_.iota(0, rk), e_.splat(double(N), "i32", rk)));
  at = e_.reshape(e_.select(inside, at, e_.splat(double(rows * N), "i32", rk)), {rows * k, 1});
  const Val flat = e_.reshape(base, {rows * N});
  const Val upd = e_.reshape(src, {rows * k});
  const std::string s = scalar(elem);
  const Val sum = e_.def(
      elem, flat.shape,
      str_cat("\"stablehlo.scatter\"(", flat.ssa, ", ", at.ssa, ", ", upd.ssa,
              ") ({\n    ^bb0(%old: ", s, ", %new: ", s,
              "):\n      %sum = stablehlo.add %old, %new : ", s,
              "\n      stablehlo.return %sum : ", s,
              "\n    }) {scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [], "
              "inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim "
              "= 1>, indices_are_sorted = false, unique_indices = false} : (",
              flat.type(), ", ", at.type(), ", ", upd.type(), ") -> ", flat.type()));
  return out(n, e_.reshape(sum, n.type.shape));
}

Val Lowering::concat(const Node& n) {
  std::vector<Val> parts;
  for (size_t k = 0; k < n.inputs.size(); ++k) parts.push_back(in(n, k));
  return e_.concatenate(parts, n.attrs_as<graph::AxisAttrs>().axis);
}

Val Lowering::transpose(const Node& n) {
  return e_.transpose(in(n, 0), n.attrs_as<graph::TransposeAttrs>().perm);
}

Val Lowering::broadcast(const Node& n) {
  return e_.broadcast(in(n, 0), n.type.shape,
                      trailing_dims(in(n, 0).rank(), int64_t(n.type.shape.size())));
}

Val Lowering::iota(const Node& n) {
  return out(n, e_.iota(n.attrs_as<graph::AxisAttrs>().axis, n.type.shape));
}

// A running sum as a reduce_window whose window reaches back over the whole axis.
Val Lowering::cumsum(const Node& n) {
  const std::string elem = n.type.dtype == DType::i32 ? "i32" : "f32";
  return out(n, e_.cumsum(e_.convert(in(n, 0), elem), n.attrs_as<graph::AxisAttrs>().axis));
}

Val Lowering::matmul(const Node& n) {
  const int64_t r = in(n, 0).rank();
  std::vector<int64_t> batch(size_t(r - 2));
  std::iota(batch.begin(), batch.end(), 0);
  const std::string elem = n.type.dtype == DType::i32 ? "i32" : "f32";
  return out(n, e_.dot(e_.convert(in(n, 0), elem), e_.convert(in(n, 1), elem), batch, batch,
                       {r - 1}, {r - 2}));
}

// Each (row, slot)'s expert weight gathered, (R * k, N, K), and one batched dot with the row's x.
Val Lowering::linear_id(const Node& n) {
  const Val& w = in(n, 1);  // (E, N, K)
  return experts_out(n, in(n, 0), w.shape[0], w.shape[2],
                     [&](const Val& routed) { return e_.gather_rows(w, routed); });
}

// Fewer (row, slot) pairs than experts (a decode step): the routed experts' codes and scales
// gathered, then only those dequantized, so the step reads k experts' codes as the CPU backend
// does and holds k experts' floats. More: every expert dequantized once, then gathered.
Val Lowering::linear_id_quant(const Node& n) {
  const graph::LinearQuantAttrs& q = n.attrs_as<graph::LinearIdAttrs>().quant;
  const Val& w = in(n, 1);  // (E, N, Kb)
  const Val& s = in(n, 3);  // (E, N, nb)
  const int64_t E = w.shape[0], N = w.shape[1], K = in(n, 0).shape.back();
  const bool few = shape_numel(in(n, 2).shape) < E;
  return experts_out(n, in(n, 0), E, K, [&](const Val& routed) {
    const int64_t rk = few ? routed.shape[0] : E;
    auto rows = [&](const Val& v) {
      return e_.reshape(few ? e_.gather_rows(v, routed) : v, {rk * N, v.shape[2]});
    };
    const Val zero = q.has_zero ? rows(in(n, 4)) : Val{};
    const Val all =
        e_.reshape(quant_weight(q, rows(w), rows(s), q.has_zero ? &zero : nullptr, K), {rk, N, K});
    return few ? all : e_.gather_rows(all, routed);
  });
}

const Val* Lowering::experts_bias(const Node& n) {
  const int at = graph::experts_bias_operand(n);
  return at < 0 ? nullptr : &in(n, size_t(at));
}

Val Lowering::experts_out(const Node& n, const Val& x, int64_t E, int64_t K,
                          const std::function<Val(const Val&)>& routed_weights) {
  const Val& idx = in(n, 2);
  const int group = n.attrs_as<graph::LinearIdAttrs>().group;
  const int64_t N = n.type.shape.back(), k = idx.shape.back();
  const int64_t rows = shape_numel(idx.shape) / k, rk = rows * k;
  // This rank's experts start at a constant of its program (as a device's partition id would
  // be); a pair routed to another rank's expert gives a zero row.
  const Val at = e_.with_constant("subtract", e_.reshape(idx, {rk}),
                                  double(distributed::rank_offset(group, E)));
  const Val mine = e_.binary("and", e_.compare("GE", at, e_.splat(0, "i32", {rk})),
                             e_.compare("LT", at, e_.splat(double(E), "i32", {rk})));
  const Val clamped = e_.binary("minimum", e_.binary("maximum", at, e_.splat(0, "i32", {rk})),
                                e_.splat(double(E - 1), "i32", {rk}));
  const Val experts = routed_weights(clamped);  // (rk, N, K)
  const Val* bias = experts_bias(n);
  const bool per_slot = x.rank() == idx.rank() + 1;
  const Val xs =
      per_slot ? e_.reshape(x, {rk, K})
               : e_.reshape(e_.broadcast(e_.reshape(x, {rows, K}), {rows, k, K}, {0, 2}), {rk, K});
  Val y = e_.dot(e_.convert(xs, experts.elem), experts, {0}, {0}, {1}, {2});  // (rk, N)
  if (bias) y = e_.binary("add", y, e_.convert(e_.gather_rows(*bias, clamped), y.elem));
  if (group >= 0) y = e_.select(e_.broadcast(mine, {rk, N}, {0}), y, e_.splat(0, y.elem, {rk, N}));
  return out(n, e_.reshape(y, n.type.shape));
}

}  // namespace tformers::backends::pjrt
