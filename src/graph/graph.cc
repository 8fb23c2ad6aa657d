#include "graph/graph.h"

#include <cstring>
#include <sstream>
#include <type_traits>

#include "graph/ops.h"
#include "tformers/error.h"

namespace tformers::graph {

const char* unary_name(UnaryFn fn) {
  static constexpr const char* kNames[] = {"exp",  "log",     "neg",  "sqrt",      "rsqrt",
                                           "tanh", "sigmoid", "silu", "gelu_tanh", "softplus"};
  return kNames[size_t(fn)];
}

const char* binary_name(BinaryFn fn) {
  static constexpr const char* kNames[] = {"add", "sub", "mul", "div", "max", "min"};
  return kNames[size_t(fn)];
}

std::string TensorType::str() const { return std::string(dtype_name(dtype)) + shape_str(shape); }

QuantOperandTypes quant_operand_types(QuantScheme scheme, QuantLayout layout, int64_t N,
                                      int64_t K) {
  const int64_t nb = (K + kQuantBlock - 1) / kQuantBlock;
  if (layout == QuantLayout::kTiles) {
    TF_CHECK(scheme == QuantScheme::kInt4 && N % kInt4Rows == 0, "no int4 tiles of ", N,
             " rows, and no int8 tiles");
    const int64_t g = N / kInt4Rows;
    return {{DType::u8, {g, nb, kInt4Rows * kQuantBlock / 2}}, {DType::f16, {g, nb, kInt4Rows}}};
  }
  if (scheme == QuantScheme::kInt8) return {{DType::i8, {N, K}}, {DType::f32, {N, nb}}};
  if (scheme == QuantScheme::kMxfp4) return {{DType::u8, {N, (K + 1) / 2}}, {DType::u8, {N, nb}}};
  return {{DType::u8, {N, (K + 1) / 2}}, {DType::f16, {N, nb}}};
}

const char* kv_layout_name(KvLayout layout) {
  return layout == KvLayout::kHeadMajor ? "head-major" : "token-major";
}

TensorType kv_cache_type(KvLayout l, DType dtype, int64_t rows, int64_t heads, int64_t positions,
                         int64_t dim) {
  if (l == KvLayout::kHeadMajor) return {dtype, {rows, heads, positions, dim}};
  return {dtype, {rows, positions, heads, dim}};
}

Graph::Graph(DType activation, KvLayout kv) : activation_(activation), kv_layout_(kv) {
  if (!is_float(activation))
    throw InvalidArgumentError(detail::str_cat("graph activation dtype must be a float type, got ",
                                               dtype_name(activation)));
}

std::vector<int> Graph::leaves(Op kind) const {
  std::vector<int> out;
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].op == kind) out.push_back(int(i));
  return out;
}

namespace {

const char* attrs_name(const Attrs& a) {
  return std::visit(
      [](const auto& v) -> const char* {
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::monostate>)
          return "no attributes";
        else
          return v.kName;
      },
      a);
}

}  // namespace

void Node::wrong_attrs(const char* wanted) const {
  throw InternalError(
      detail::str_cat(op_name(op), " node '", name, "' has ", attrs_name(attrs), ", not ", wanted));
}

int experts_bias_operand(const Node& n) {
  int at = 3;
  if (n.op == Op::kLinearIdQuant) at = n.attrs_as<LinearIdAttrs>().quant.has_zero ? 5 : 4;
  return int(n.inputs.size()) > at ? at : -1;
}

AttentionOperands attention_operands(const Node& n) {
  TF_CHECK(n.op == Op::kAttention || n.op == Op::kPagedAttention, op_name(n.op), " node '", n.name,
           "' is not attention");
  const int count = int(n.inputs.size());
  AttentionOperands o;
  if (n.attrs_as<AttentionAttrs>().sinks) o.sinks = count - 1;
  const int at = n.op == Op::kAttention ? 4 : 5;  // the operand after the required ones
  if (at < (o.sinks >= 0 ? o.sinks : count)) o.mask_or_rows = at;
  return o;
}

int Graph::add(Node node) {
  for (int in : node.inputs) TF_CHECK(in >= 0 && in < int(nodes_.size()), "bad input id ", in);
  const OpDef& def = op_def(node.op);
  TF_CHECK(node.attrs.index() == def.attrs, def.name, " node '", node.name, "' has ",
           attrs_name(node.attrs), ", not the op's kind");
  const int count = int(node.inputs.size());
  TF_CHECK(count >= def.min_inputs && (def.max_inputs < 0 || count <= def.max_inputs), def.name,
           " node '", node.name, "' has ", count, " operands");
  // An attention's last operand slot is for its sinks: taken with the flag, free without it.
  if (const auto* a = std::get_if<AttentionAttrs>(&node.attrs))
    TF_CHECK(a->sinks ? count > def.min_inputs : count < def.max_inputs, def.name, " node '",
             node.name, "' has ", count, " operands", a->sinks ? " with" : " without", " sinks");
  if (const auto* c = std::get_if<CustomCallAttrs>(&node.attrs))
    TF_CHECK(c->kernel && !c->kernel->target.empty(), "custom call '", node.name,
             "' names no kernel");
  nodes_.push_back(std::move(node));
  return int(nodes_.size()) - 1;
}

void Graph::mark_output(int id) {
  TF_CHECK(id >= 0 && id < int(nodes_.size()), "bad output id ", id);
  outputs_.push_back(id);
}

namespace {
// FNV-1a over the bytes that define the graph.
struct Hasher {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t n) {
    auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  }
  template <typename T>
  void pod(const T& v) {
    bytes(&v, sizeof v);
  }
  template <typename T>
  void vec(const std::vector<T>& v) {
    pod(v.size());
    if (!v.empty()) bytes(v.data(), v.size() * sizeof(T));
  }
  void str(const std::string& s) {
    pod(s.size());
    bytes(s.data(), s.size());
  }
  // An attribute field: a scalar, a vector of scalars or a string.
  template <typename T>
  void field(const T& v) {
    if constexpr (std::is_same_v<T, std::string>)
      str(v);
    else if constexpr (requires { v.data(); })
      vec(v);
    else
      pod(v);
  }
  void attrs(const Attrs& a) {
    pod(a.index());
    std::visit(
        [&](const auto& v) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(v)>, std::monostate>)
            std::apply([&](const auto&... f) { (field(f), ...); }, v.fields());
        },
        a);
  }
};
}  // namespace

uint64_t Graph::hash() const {
  Hasher h;
  h.pod(activation_);
  h.pod(kv_layout_);
  h.pod(nodes_.size());
  for (const Node& n : nodes_) {
    h.pod(n.op);
    h.vec(n.inputs);
    h.pod(n.type.dtype);
    h.vec(n.type.shape);
    h.str(n.name);
    h.attrs(n.attrs);
  }
  h.vec(outputs_);
  return h.h;
}

namespace {
// The attributes to_string shows: the options that are not the op's default, and the factors of
// scale and softcap, as " {name=value, ...}" (nothing when there are none).
std::string attributes(const Node& n) {
  std::vector<std::string> a;
  auto show = [&](const char* name, auto v) {
    std::ostringstream os;
    os << name << "=" << v;
    a.push_back(os.str());
  };
  // Always the scheme and the layout of quantized operands: they say how to read them.
  auto show_quant = [&](const LinearQuantAttrs& q) {
    a.push_back(q.scheme == QuantScheme::kInt8   ? "int8"
                : q.scheme == QuantScheme::kInt4 ? "int4"
                                                 : "mxfp4");
    a.push_back(q.layout == QuantLayout::kRows ? "rows" : "tiles");
    if (q.has_zero) a.push_back("zero");
  };
  switch (n.op) {
    case Op::kRMSNorm:
      if (n.attrs_as<RMSNormAttrs>().unit_offset) a.push_back("unit_offset");
      break;
    case Op::kRope: {
      const auto& r = n.attrs_as<RopeAttrs>();
      if (r.rotary_dim != n.type.shape[3]) show("rotary_dim", r.rotary_dim);
      if (r.interleaved) a.push_back("interleaved");
      break;
    }
    case Op::kAttention:
    case Op::kPagedAttention: {
      const auto& at = n.attrs_as<AttentionAttrs>();
      if (at.sliding_window) show("sliding_window", at.sliding_window);
      if (at.softcap != 0.0f) show("softcap", at.softcap);
      if (at.sinks) a.push_back("sinks");
      break;
    }
    case Op::kScale:
      show("factor", n.attrs_as<ScaleAttrs>().factor);
      break;
    case Op::kSoftcap:
      show("cap", n.attrs_as<SoftcapAttrs>().cap);
      break;
    case Op::kLinearId:
    case Op::kLinearIdQuant: {
      const auto& e = n.attrs_as<LinearIdAttrs>();
      if (n.op == Op::kLinearIdQuant) show_quant(e.quant);
      if (e.group >= 0) show("group", e.group);
      break;
    }
    case Op::kLinearQuant:
      show_quant(n.attrs_as<LinearQuantAttrs>());
      break;
    case Op::kConstant:
      show("value", n.attrs_as<ConstantAttrs>().value);
      break;
    case Op::kUnary:
      a.push_back(unary_name(n.attrs_as<UnaryAttrs>().fn));
      break;
    case Op::kBinary:
      a.push_back(binary_name(n.attrs_as<BinaryAttrs>().fn));
      break;
    case Op::kReduce: {
      const auto& r = n.attrs_as<ReduceAttrs>();
      a.push_back(r.fn == ReduceFn::kSum ? "sum" : "max");
      show("axis", r.axis);
      break;
    }
    case Op::kConcat:
    case Op::kIota:
    case Op::kCumsum:
      show("axis", n.attrs_as<AxisAttrs>().axis);
      break;
    case Op::kTopK:
      show("k", n.attrs_as<TopKAttrs>().k);
      break;
    case Op::kTranspose: {
      std::string perm;
      for (int64_t p : n.attrs_as<TransposeAttrs>().perm)
        perm += (perm.empty() ? "" : " ") + std::to_string(p);
      show("perm", perm);
      break;
    }
    default:
      break;
  }
  std::string out;
  for (size_t i = 0; i < a.size(); ++i) out += (i ? ", " : " {") + a[i];
  return a.empty() ? out : out + "}";
}
}  // namespace

std::string Graph::to_string() const {
  std::ostringstream os;
  os << "activation: " << dtype_name(activation_);
  if (kv_layout_ != KvLayout::kHeadMajor) os << ", kv cache: " << kv_layout_name(kv_layout_);
  os << "\n";
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    os << "%" << i << " = " << op_name(n.op);
    if (const auto* c = std::get_if<CustomCallAttrs>(&n.attrs))
      os << "[" << c->kernel->target << "]";
    os << "(";
    for (size_t j = 0; j < n.inputs.size(); ++j) os << (j ? ", %" : "%") << n.inputs[j];
    os << ")" << attributes(n) << " -> " << n.type.str();
    if (!n.name.empty()) os << "  # " << n.name;
    os << "\n";
  }
  os << "outputs:";
  for (int o : outputs_) os << " %" << o;
  os << "\n";
  return os.str();
}

}  // namespace tformers::graph
