// Interpreter of the chat-template engine: statements, expressions, filters, tests and the
// methods of strings, arrays and objects, with @huggingface/jinja's semantics.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "tokenizer/jinja_internal.h"

namespace tformers::jinja {

namespace {

struct Scope {
  Scope* parent = nullptr;
  std::unordered_map<std::string, Value> vars;

  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
  void set(const std::string& name, Value v) { vars[name] = std::move(v); }
};

enum class Flow { kNone, kBreak, kContinue };

Value kwargs_get(const std::vector<Value>& args, const char* name) {
  if (!args.empty() && args.back().type == Type::kKwargs)
    if (const Value* v = args.back().object->find(name)) return *v;
  return Value::undefined();
}
// Positional arguments without the trailing keyword-arguments value.
size_t positional_count(const std::vector<Value>& args) {
  return !args.empty() && args.back().type == Type::kKwargs ? args.size() - 1 : args.size();
}

// Python's slice semantics on n items; returns the selected indices.
std::vector<size_t> slice_indices(size_t n, const Value& start_v, const Value& stop_v,
                                  const Value& step_v) {
  double len = double(n);
  double step = step_v.type == Type::kUndefined ? 1 : step_v.number;
  if (step == 0) fail("slice step cannot be zero");
  bool has_start = start_v.type != Type::kUndefined, has_stop = stop_v.type != Type::kUndefined;
  double start, stop;
  if (step > 0) {
    start = has_start ? start_v.number : 0;
    stop = has_stop ? stop_v.number : len;
    start = start < 0 ? std::max(len + start, 0.0) : std::min(start, len);
    stop = stop < 0 ? std::max(len + stop, 0.0) : std::min(stop, len);
  } else {
    start = has_start ? start_v.number : len - 1;
    stop = has_stop ? stop_v.number : -1;
    start = start < 0 ? std::max(len + start, -1.0) : std::min(start, len - 1);
    stop = stop < -1 ? std::max(len + stop, -1.0) : std::min(stop, len - 1);
  }
  std::vector<size_t> out;
  for (double i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(size_t(i));
  return out;
}

// String#replace with a global literal pattern, at most `count` times (Python's str.replace).
std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        double count) {
  if (count == 0) return s;
  double remaining = count < 0 ? INFINITY : count;
  std::string out;
  if (from.empty()) {  // an empty pattern matches between every character and at both ends
    for (const std::string& cp : code_points(s)) {
      if (remaining > 0) out += to, --remaining;
      out += cp;
    }
    if (remaining > 0) out += to;
    return out;
  }
  size_t i = 0;
  while (remaining > 0) {
    size_t j = s.find(from, i);
    if (j == std::string::npos) break;
    out.append(s, i, j - i);
    out += to;
    i = j + from.size();
    --remaining;
  }
  out.append(s, i);
  return out;
}

// parseInt(s, 10) / parseFloat(s); NaN when nothing numeric starts the string.
double parse_int(const std::string& str) {
  std::string s = trim_start(str);
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  size_t b = i;
  double v = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') v = v * 10 + (s[i++] - '0');
  if (i == b) return NAN;
  return neg ? -v : v;
}
double parse_float(const std::string& str) {
  std::string s = trim_start(str);
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  if (s.compare(i, 8, "Infinity") == 0) return s[0] == '-' ? -INFINITY : INFINITY;
  size_t digits = 0;
  while (i < s.size() && isdigit(uint8_t(s[i]))) ++i, ++digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && isdigit(uint8_t(s[i]))) ++i, ++digits;
  }
  if (!digits) return NAN;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    if (j < s.size() && isdigit(uint8_t(s[j]))) {
      while (j < s.size() && isdigit(uint8_t(s[j]))) ++j;
      i = j;
    }
  }
  return std::strtod(s.substr(0, i).c_str(), nullptr);
}

// /\b\w/g uppercased: the first ASCII word character of each word; the rest stays.
std::string title_case(const std::string& s) {
  auto word = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  };
  std::string out = s;
  for (size_t i = 0; i < out.size(); ++i)
    if (word(out[i]) && (i == 0 || !word(s[i - 1])) && out[i] >= 'a' && out[i] <= 'z') out[i] -= 32;
  return out;
}

// Python's str.strip(chars): removes any of the given characters from the ends.
std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  std::vector<std::string> set = code_points(chars);
  std::vector<std::string> cps = code_points(s);
  auto in = [&](const std::string& cp) {
    return std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && in(cps[b])) ++b;
  if (right)
    while (e > b && in(cps[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cps[i];
  return out;
}

int compare_values(const Value& a, const Value& b, bool case_sensitive) {
  auto nullish = [](const Value& v) { return v.type == Type::kNull || v.type == Type::kUndefined; };
  if (nullish(a) || nullish(b)) {
    if (a.type == b.type) return 0;
    fail(std::string("cannot compare ") + type_name(a.type) + " with " + type_name(b.type));
  }
  auto numeric = [](const Value& v) { return v.is_number() || v.type == Type::kBool; };
  auto num = [](const Value& v) { return v.type == Type::kBool ? double(v.boolean) : v.number; };
  if (numeric(a) && numeric(b)) return num(a) < num(b) ? -1 : num(a) > num(b) ? 1 : 0;
  if (a.type != b.type)
    fail(std::string("cannot compare different types: ") + type_name(a.type) + " and " +
         type_name(b.type));
  if (a.type != Type::kString)
    fail(std::string("cannot compare values of type ") + type_name(a.type));
  std::string x = case_sensitive ? a.str : to_lower(a.str);
  std::string y = case_sensitive ? b.str : to_lower(b.str);
  return x < y ? -1 : x > y ? 1 : 0;
}

// Follows a dotted path ("function.name", "items.0") through objects and arrays.
Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t b = 0;
  while (true) {
    size_t e = path.find('.', b);
    std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (v.is_container()) {
      const Value* f = v.object->find(part);
      v = f ? *f : Value::undefined();
    } else if (v.is_array()) {
      double idx = parse_int(part);
      if (std::isnan(idx) || idx < 0 || idx >= double(v.array->size())) return Value::undefined();
      v = (*v.array)[size_t(idx)];
    } else {
      return Value::undefined();
    }
    if (e == std::string::npos) return v;
    b = e + 1;
  }
}

const char* const kFilters =
    "abs, capitalize, default, dictsort, first, float, indent, int, items, join, last, length, "
    "list, lower, map, rejectattr, replace, reverse, safe, selectattr, sort, string, title, "
    "tojson, trim, unique, upper";
const char* const kTests =
    "boolean, callable, defined, eq, equalto, even, false, integer, iterable, lower, mapping, "
    "none, number, odd, sequence, string, true, undefined, upper";

bool is_known_filter(const std::string& name) {
  std::string list = std::string(", ") + kFilters + ",";
  return list.find(", " + name + ",") != std::string::npos || name == "bool" || name == "keys" ||
         name == "values" || name == "get";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
struct Interpreter {
  const Limits& limits;
  const std::function<std::tm()>& now;
  int depth = 0;
  size_t iterations = 0;
  size_t steps = 0;      // evaluations so far, against limits.max_steps
  size_t allocated = 0;  // bytes of strings and arrays built so far, against max_memory_bytes
  Flow flow = Flow::kNone;
  Scope* call_scope = nullptr;  // the caller's scope while a function runs (macros use it)
  uintptr_t stack_base = stack_position();

  struct Depth {
    Interpreter& in;
    explicit Depth(Interpreter& i) : in(i) {
      // Every evaluation is a step: loops nested in loops, or a macro recursing wide rather than
      // deep, stay within each other limit while taking hours.
      if (++in.steps > in.limits.max_steps)
        fail("template exceeds its step budget (max_steps) of " +
             std::to_string(in.limits.max_steps) + " evaluation steps");
      // Macros can recurse; every evaluation level costs stack, so the total is bounded.
      if (++in.depth > in.limits.max_depth * 4 ||
          stack_used(in.stack_base) > in.limits.max_stack_bytes)
        fail("template recursion is deeper than " + std::to_string(in.limits.max_depth * 4) +
             " levels (a macro calling itself without end?)");
    }
    ~Depth() { --in.depth; }
  };

  void check_size(size_t bytes) const {
    if (bytes > limits.max_output_bytes)
      fail("rendered text exceeds " + std::to_string(limits.max_output_bytes) + " bytes");
  }

  // Charges a string or array the render builds. The total, not only each value, is bounded:
  // appending ten-million-item lists or doubling a list thirty times keeps every single value
  // under the other limits while exhausting memory.
  void charge(size_t bytes) {
    allocated += bytes;
    if (allocated > limits.max_memory_bytes)
      fail("template exceeds its memory budget (max_memory_bytes) of " +
           std::to_string(limits.max_memory_bytes) + " bytes of strings and lists built");
  }
  void charge_items(size_t n) { charge(n * sizeof(Value)); }

  // A new string of `bytes` bytes: within the per-value limit, and charged.
  void new_string(size_t bytes) {
    check_size(bytes);
    charge(bytes);
  }

  Value eval(const Node& n, Scope& s) {
    Depth d(*this);
    try {
      return eval_node(n, s);
    } catch (JinjaError& e) {
      if (e.offset < 0) e.offset = n.offset;  // the innermost node names the place
      throw;
    }
  }

  std::string block(const std::vector<std::unique_ptr<Node>>& body, Scope& s) {
    std::string out;
    for (const auto& st : body) {
      Value v = eval(*st, s);
      if (v.type != Type::kNull && v.type != Type::kUndefined) {
        size_t before = out.size();
        if (v.type == Type::kString)
          out += v.str;
        else
          out += render_value(v);
        check_size(out.size());
        charge(out.size() - before);
      }
      if (flow != Flow::kNone) break;
    }
    return out;
  }

  Value eval_node(const Node& n, Scope& s) {
    switch (n.kind) {
      case Kind::kText:
        return Value::from_string(n.str);
      case Kind::kComment:
        return Value::null();
      case Kind::kSet:
        return eval_set(n, s);
      case Kind::kIf:
        return Value::from_string(block(eval(*n.x, s).truthy() ? n.body : n.alt, s));
      case Kind::kFor:
        return eval_for(n, s);
      case Kind::kMacro:
        return eval_macro(n, s);
      case Kind::kCallBlock:
        return eval_call_block(n, s);
      case Kind::kBreak:
        flow = Flow::kBreak;
        return Value::null();
      case Kind::kContinue:
        flow = Flow::kContinue;
        return Value::null();
      case Kind::kFilterBlock: {
        Value body = Value::from_string(block(n.body, s));
        return apply_filter(body, *n.x, s);
      }
      case Kind::kInt:
        return Value::from_int(n.number);
      case Kind::kFloat:
        return Value::from_float(n.number);
      case Kind::kString:
        return Value::from_string(n.str);
      case Kind::kArray:
      case Kind::kTuple: {
        charge_items(n.args.size());
        Array a;
        for (const auto& e : n.args) a.push_back(eval(*e, s));
        return Value::from_array(std::move(a),
                                 n.kind == Kind::kArray ? Type::kArray : Type::kTuple);
      }
      case Kind::kObject: {
        auto o = std::make_shared<Object>();
        for (size_t i = 0; i < n.args.size(); ++i) {
          Value k = eval(*n.args[i], s);
          if (k.type != Type::kString)
            fail(std::string("object keys must be strings, got ") + type_name(k.type));
          o->set(k.str, eval(*n.body[i], s));
        }
        return Value::from_object(std::move(o));
      }
      case Kind::kIdent: {
        const Value* v = s.lookup(n.str);
        return v ? *v : Value::undefined();  // undefined renders as nothing
      }
      case Kind::kMember:
        return eval_member(n, s);
      case Kind::kCall:
        return eval_call(n, s);
      case Kind::kUnary:
        return eval_unary(n, s);
      case Kind::kBinary:
        return eval_binary(n, s);
      case Kind::kFilter:
        return apply_filter(eval(*n.x, s), *n.y, s);
      case Kind::kTest: {
        bool r = run_test(n.str, eval(*n.x, s), nullptr);
        return Value::from_bool(n.flag ? !r : r);
      }
      case Kind::kSelect:
        if (!eval(*n.y, s).truthy()) return Value::undefined();
        return eval(*n.x, s);
      case Kind::kTernary:
        return eval(eval(*n.x, s).truthy() ? *n.y : *n.z, s);
      case Kind::kSlice:
      case Kind::kSpread:
      case Kind::kKwSpread:
      case Kind::kKwArg:
        fail("unexpected expression here");
    }
    fail("unknown node");
  }

  Value eval_set(const Node& n, Scope& s) {
    Value rhs = n.y ? eval(*n.y, s) : Value::from_string(block(n.body, s));
    const Node& target = *n.x;
    if (target.kind == Kind::kIdent) {
      s.set(target.str, std::move(rhs));
    } else if (target.kind == Kind::kTuple) {
      if (!rhs.is_array()) fail(std::string("cannot unpack ") + type_name(rhs.type) + " in set");
      if (rhs.array->size() != target.args.size())
        fail(std::string("too ") + (target.args.size() > rhs.array->size() ? "few" : "many") +
             " items to unpack in set");
      for (size_t i = 0; i < target.args.size(); ++i) {
        if (target.args[i]->kind != Kind::kIdent) fail("can only unpack into names in set");
        s.set(target.args[i]->str, (*rhs.array)[i]);
      }
    } else if (target.kind == Kind::kMember) {
      Value obj = eval(*target.x, s);
      if (obj.type != Type::kNamespace)
        fail("cannot assign an attribute of " + std::string(type_name(obj.type)) +
             "; only namespace() objects can be assigned to");
      if (target.flag || target.y->kind != Kind::kIdent)
        fail("namespace attributes are assigned by name (ns.name = ...)");
      obj.object->set(target.y->str, std::move(rhs));
    } else {
      fail("invalid target of set");
    }
    return Value::null();
  }

  Value eval_for(const Node& n, Scope& outer) {
    Scope scope{&outer, {}};
    const Node* test = nullptr;
    Value iterable;
    if (n.y->kind == Kind::kSelect) {  // for x in items if condition
      iterable = eval(*n.y->x, scope);
      test = n.y->y.get();
    } else {
      iterable = eval(*n.y, scope);
    }
    if (iterable.is_object()) {
      Array keys;
      for (const auto& kv : iterable.object->items) keys.push_back(Value::from_string(kv.first));
      iterable = Value::from_array(std::move(keys));
    }
    if (!iterable.is_array())
      fail(std::string("for loop over ") + type_name(iterable.type) +
           ": expected an array or an object");
    const Node& var = *n.x;
    auto bind = [&](Scope& sc, const Value& item) {
      if (var.kind == Kind::kIdent) {
        sc.set(var.str, item);
        return;
      }
      if (!item.is_array())
        fail(std::string("cannot unpack ") + type_name(item.type) + " in for loop");
      if (item.array->size() != var.args.size())
        fail(std::string("too ") + (var.args.size() > item.array->size() ? "few" : "many") +
             " items to unpack in for loop");
      for (size_t j = 0; j < var.args.size(); ++j) {
        if (var.args[j]->kind != Kind::kIdent) fail("can only unpack into names in for loop");
        sc.set(var.args[j]->str, (*item.array)[j]);
      }
    };
    charge_items(iterable.array->size());
    std::vector<Value> items;
    for (const Value& item : *iterable.array) {
      if (test) {
        Scope probe{&scope, {}};
        bind(probe, item);
        if (!eval(*test, probe).truthy()) continue;
      }
      items.push_back(item);
    }
    std::string out;
    bool none = true;
    for (size_t i = 0; i < items.size(); ++i) {
      if (++iterations > limits.max_loop_iterations)
        fail("template runs more than " + std::to_string(limits.max_loop_iterations) +
             " loop iterations");
      auto loop = std::make_shared<Object>();
      double len = double(items.size());
      loop->set("index", Value::from_int(double(i + 1)));
      loop->set("index0", Value::from_int(double(i)));
      loop->set("revindex", Value::from_int(len - double(i)));
      loop->set("revindex0", Value::from_int(len - double(i) - 1));
      loop->set("first", Value::from_bool(i == 0));
      loop->set("last", Value::from_bool(i + 1 == items.size()));
      loop->set("length", Value::from_int(len));
      loop->set("previtem", i > 0 ? items[i - 1] : Value::undefined());
      loop->set("nextitem", i + 1 < items.size() ? items[i + 1] : Value::undefined());
      scope.set("loop", Value::from_object(std::move(loop)));
      bind(scope, items[i]);
      out += block(n.body, scope);
      check_size(out.size());
      Flow f = flow;
      flow = Flow::kNone;
      if (f == Flow::kContinue) continue;  // like the reference, a continued pass is not counted
      if (f == Flow::kBreak) break;
      none = false;
    }
    if (none) out += block(n.alt, scope);
    return Value::from_string(std::move(out));
  }

  // Binds macro parameters: positional, then keyword, then defaults evaluated in the new scope.
  void bind_parameters(const std::string& display, const Node& macro, std::vector<Value> args,
                       Scope& scope) {
    std::shared_ptr<Object> kwargs = std::make_shared<Object>();
    if (!args.empty() && args.back().type == Type::kKwargs) {
      *kwargs = *args.back().object;
      args.pop_back();
    }
    std::vector<std::pair<std::string, const Node*>> pending;
    for (size_t i = 0; i < macro.args.size(); ++i) {
      const Node& p = *macro.args[i];
      Value v;
      bool have = i < args.size();
      if (have) v = args[i];
      if (!have) {
        if (const Value* kv = kwargs->find(p.str)) {
          v = *kv;
          have = true;
          Object rest;
          for (auto& item : kwargs->items)
            if (item.first != p.str) rest.set(item.first, item.second);
          *kwargs = std::move(rest);
        }
      }
      if (!have && p.kind == Kind::kKwArg) pending.emplace_back(p.str, p.x.get());
      scope.set(p.str, v);
    }
    bool wants_kwargs = uses_name(macro.body, "kwargs"),
         wants_varargs = uses_name(macro.body, "varargs");
    if (wants_kwargs) {
      scope.set("kwargs", Value::from_object(kwargs));
    } else if (!kwargs->items.empty()) {
      fail("macro " + display + " takes no keyword argument '" + kwargs->items[0].first + "'");
    }
    if (wants_varargs) {
      Array rest;
      for (size_t i = macro.args.size(); i < args.size(); ++i) rest.push_back(args[i]);
      scope.set("varargs", Value::from_array(std::move(rest)));
    } else if (args.size() > macro.args.size()) {
      fail("macro " + display + " takes not more than " + std::to_string(macro.args.size()) +
           " argument(s)");
    }
    for (auto& [name, def] : pending) scope.set(name, eval(*def, scope));
  }

  // Whether the macro body mentions `name` (kwargs, varargs); iterative, trees can be deep.
  static bool uses_name(const std::vector<std::unique_ptr<Node>>& nodes, const char* name) {
    std::vector<const Node*> pending;
    for (const auto& n : nodes) pending.push_back(n.get());
    while (!pending.empty()) {
      const Node* n = pending.back();
      pending.pop_back();
      if (!n) continue;
      if (n->kind == Kind::kIdent && n->str == name) return true;
      for (const Node* c : {n->x.get(), n->y.get(), n->z.get()}) pending.push_back(c);
      for (const auto* v : {&n->args, &n->body, &n->alt})
        for (const auto& c : *v) pending.push_back(c.get());
    }
    return false;
  }

  Value eval_macro(const Node& n, Scope& s) {
    const Node* macro = &n;  // the program outlives every render
    s.set(n.str, Value::from_function([macro](std::vector<Value>& args, Interpreter& in) {
            Scope scope{in.call_scope, {}};  // like the reference: the caller's scope is visible
            in.bind_parameters("'" + macro->str + "'", *macro, args, scope);
            return Value::from_string(in.block(macro->body, scope));
          }));
    return Value::null();
  }

  Value eval_call_block(const Node& n, Scope& s) {
    const Node* call_block = &n;
    Scope* defining = &s;
    Value caller =
        Value::from_function([call_block, defining](std::vector<Value>& args, Interpreter& in) {
          Scope scope{defining, {}};
          in.bind_parameters("None", *call_block, args, scope);
          return Value::from_string(in.block(call_block->body, scope));
        });
    std::vector<Value> args = eval_args(n.x->args, s);
    if (args.empty() || args.back().type != Type::kKwargs)
      args.push_back(Value::from_object(std::make_shared<Object>(), Type::kKwargs));
    Value fn = eval(*n.x->x, s);
    if (fn.type != Type::kFunction) fail(std::string("cannot call ") + type_name(fn.type));
    Scope with_caller{&s, {}};
    with_caller.set("caller", caller);
    return invoke(fn, args, with_caller);
  }

  Value invoke(const Value& fn, std::vector<Value>& args, Scope& s) {
    Scope* saved = call_scope;
    call_scope = &s;
    Value r = (*fn.function)(args, *this);
    call_scope = saved;
    return r;
  }

  // Positional values, then one kKwargs value holding the keyword arguments (if any).
  std::vector<Value> eval_args(const std::vector<std::unique_ptr<Node>>& nodes, Scope& s) {
    std::vector<Value> args;
    for (const auto& a : nodes) {
      if (a->kind == Kind::kSpread) {
        Value v = eval(*a->x, s);
        if (!v.is_array()) fail(std::string("cannot unpack ") + type_name(v.type) + " with *");
        for (const Value& e : *v.array) args.push_back(e);
      } else if (a->kind != Kind::kKwArg && a->kind != Kind::kKwSpread) {
        args.push_back(eval(*a, s));
      }
    }
    auto kwargs = std::make_shared<Object>();
    auto add = [&](const std::string& k, Value v) {
      if (kwargs->find(k)) fail("got multiple values for keyword argument '" + k + "'");
      kwargs->set(k, std::move(v));
    };
    for (const auto& a : nodes) {
      if (a->kind == Kind::kKwArg) {
        add(a->str, eval(*a->x, s));
      } else if (a->kind == Kind::kKwSpread) {
        Value v = eval(*a->x, s);
        if (!v.is_object())
          fail(std::string("argument after ** must be a mapping, not ") + type_name(v.type));
        for (const auto& kv : v.object->items) add(kv.first, kv.second);
      }
    }
    if (!kwargs->items.empty())
      args.push_back(Value::from_object(std::move(kwargs), Type::kKwargs));
    return args;
  }

  Value eval_call(const Node& n, Scope& s) {
    std::vector<Value> args = eval_args(n.args, s);
    Value fn = eval(*n.x, s);
    if (fn.type != Type::kFunction) {
      std::string what = n.x->kind == Kind::kIdent ? "'" + n.x->str + "'" : "this value";
      fail("cannot call " + what + ": it is " +
           (fn.type == Type::kUndefined ? std::string("undefined")
                                        : std::string("a ") + type_name(fn.type)) +
           ", not a function");
    }
    return invoke(fn, args, s);
  }

  Value eval_member(const Node& n, Scope& s) {
    Value obj = eval(*n.x, s);
    Value prop;
    if (n.flag) {
      if (n.y->kind == Kind::kSlice) return eval_slice(obj, *n.y, s);
      prop = eval(*n.y, s);
    } else if (n.y->kind == Kind::kInt) {
      prop = Value::from_int(n.y->number);
    } else {
      prop = Value::from_string(n.y->str);
    }
    return member(obj, prop);
  }

  Value member(const Value& obj, const Value& prop) {
    if (obj.is_container()) {
      if (prop.type != Type::kString)
        fail(std::string("cannot index an object with ") + type_name(prop.type) +
             "; keys are strings");
      if (const Value* v = obj.object->find(prop.str)) return *v;
      if (obj.is_object()) return object_method(obj, prop.str);
      return Value::undefined();
    }
    if (obj.is_array() || obj.type == Type::kString) {
      if (prop.type == Type::kInt) {
        // Array#at: negative indexes count from the end.
        if (obj.is_array()) {
          double n = double(obj.array->size()), i = prop.number < 0 ? n + prop.number : prop.number;
          return i >= 0 && i < n ? (*obj.array)[size_t(i)] : Value::undefined();
        }
        std::vector<std::string> cps = code_points(obj.str);
        double n = double(cps.size()), i = prop.number < 0 ? n + prop.number : prop.number;
        return i >= 0 && i < n ? Value::from_string(cps[size_t(i)]) : Value::undefined();
      }
      if (prop.type == Type::kString) {
        if (prop.str == "length")
          return Value::from_int(
              double(obj.is_array() ? obj.array->size() : utf16_length(obj.str)));
        return obj.is_array() ? Value::undefined() : string_method(obj, prop.str);
      }
      fail(std::string("cannot index ") + type_name(obj.type) + " with " + type_name(prop.type));
    }
    if (prop.type != Type::kString)
      fail(std::string("cannot index ") + type_name(obj.type) + " with " + type_name(prop.type));
    return Value::undefined();  // attributes of undefined, none, numbers: undefined, no error
  }

  Value eval_slice(const Value& obj, const Node& sl, Scope& s) {
    if (!obj.is_array() && obj.type != Type::kString)
      fail(std::string("cannot slice ") + type_name(obj.type) + "; only arrays and strings");
    Value parts[3];
    const Node* nodes[3] = {sl.x.get(), sl.y.get(), sl.z.get()};
    for (int k = 0; k < 3; ++k) {
      if (nodes[k]) parts[k] = eval(*nodes[k], s);
      if (parts[k].type != Type::kInt && parts[k].type != Type::kUndefined)
        fail("slice bounds must be integers");
    }
    if (obj.is_array()) {
      charge_items(obj.array->size());
      Array out;
      for (size_t i : slice_indices(obj.array->size(), parts[0], parts[1], parts[2]))
        out.push_back((*obj.array)[i]);
      return Value::from_array(std::move(out));
    }
    std::vector<std::string> cps = code_points(obj.str);
    std::string out;
    for (size_t i : slice_indices(cps.size(), parts[0], parts[1], parts[2])) out += cps[i];
    return Value::from_string(std::move(out));
  }

  // ---------------------------------------------------------------------------------------------
  Value object_method(const Value& obj, const std::string& name) {
    auto items = [obj] {
      Array a;
      for (const auto& kv : obj.object->items)
        a.push_back(Value::from_array({Value::from_string(kv.first), kv.second}));
      return Value::from_array(std::move(a));
    };
    if (name == "get")
      return Value::from_function([obj](std::vector<Value>& args, Interpreter&) {
        if (args.empty() || args[0].type != Type::kString)
          fail("get(key): the key must be a string");
        if (const Value* v = obj.object->find(args[0].str)) return *v;
        return args.size() > 1 ? args[1] : Value::null();
      });
    if (name == "items")
      return Value::from_function([items](std::vector<Value>&, Interpreter&) { return items(); });
    if (name == "keys")
      return Value::from_function([obj](std::vector<Value>&, Interpreter&) {
        Array a;
        for (const auto& kv : obj.object->items) a.push_back(Value::from_string(kv.first));
        return Value::from_array(std::move(a));
      });
    if (name == "values")
      return Value::from_function([obj](std::vector<Value>&, Interpreter&) {
        Array a;
        for (const auto& kv : obj.object->items) a.push_back(kv.second);
        return Value::from_array(std::move(a));
      });
    if (name == "dictsort")
      return Value::from_function([obj](std::vector<Value>& args, Interpreter&) {
        size_t np = positional_count(args);
        Value cs = np > 0 ? args[0] : kwargs_get(args, "case_sensitive");
        Value by = np > 1 ? args[1] : kwargs_get(args, "by");
        Value rev = np > 2 ? args[2] : kwargs_get(args, "reverse");
        bool case_sensitive = cs.type == Type::kBool && cs.boolean;
        bool by_value = by.type == Type::kString && by.str == "value";
        if (by.type == Type::kString && by.str != "key" && by.str != "value")
          fail("dictsort: by must be 'key' or 'value'");
        bool reverse = rev.type == Type::kBool && rev.boolean;
        std::vector<std::pair<Value, Value>> kv;
        for (const auto& e : obj.object->items)
          kv.emplace_back(Value::from_string(e.first), e.second);
        std::stable_sort(kv.begin(), kv.end(), [&](const auto& a, const auto& b) {
          int c = by_value ? compare_values(a.second, b.second, case_sensitive)
                           : compare_values(a.first, b.first, case_sensitive);
          return reverse ? c > 0 : c < 0;
        });
        Array out;
        for (auto& e : kv) out.push_back(Value::from_array({e.first, e.second}));
        return Value::from_array(std::move(out));
      });
    return Value::undefined();
  }

  Value string_method(const Value& str, const std::string& name) {
    const std::string s = str.str;
    auto fn = [](auto f) { return Value::from_function(f); };
    if (name == "upper")
      return fn([s](std::vector<Value>&, Interpreter&) { return Value::from_string(to_upper(s)); });
    if (name == "lower")
      return fn([s](std::vector<Value>&, Interpreter&) { return Value::from_string(to_lower(s)); });
    if (name == "title")
      return fn(
          [s](std::vector<Value>&, Interpreter&) { return Value::from_string(title_case(s)); });
    if (name == "capitalize")
      return fn([s](std::vector<Value>&, Interpreter&) {
        if (s.empty()) return Value::from_string("");
        std::string first = code_points(s).front();
        return Value::from_string(to_upper(first) + s.substr(first.size()));
      });
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      bool left = name != "rstrip", right = name != "lstrip";
      return fn([s, left, right](std::vector<Value>& args, Interpreter&) {
        // With characters, Python's semantics (the reference ignores the argument and strips
        // whitespace); without, JavaScript's String#trim whitespace.
        if (positional_count(args) > 0 && args[0].type == Type::kString)
          return Value::from_string(strip_chars(s, args[0].str, left, right));
        return Value::from_string(left && right ? trim(s) : left ? trim_start(s) : trim_end(s));
      });
    }
    if (name == "startswith" || name == "endswith") {
      bool start = name == "startswith";
      return fn([s, start, name](std::vector<Value>& args, Interpreter&) {
        if (positional_count(args) == 0) fail(name + "() needs an argument");
        auto match = [&](const std::string& p) {
          return p.size() <= s.size() && (start ? s.compare(0, p.size(), p) == 0
                                                : s.compare(s.size() - p.size(), p.size(), p) == 0);
        };
        if (args[0].type == Type::kString) return Value::from_bool(match(args[0].str));
        if (args[0].is_array()) {
          for (const Value& p : *args[0].array) {
            if (p.type != Type::kString) fail(name + "(): tuple elements must be strings");
            if (match(p.str)) return Value::from_bool(true);
          }
          return Value::from_bool(false);
        }
        fail(name + "(): the argument must be a string or a tuple of strings");
      });
    }
    if (name == "split")
      return fn([s](std::vector<Value>& args, Interpreter&) {
        size_t np = positional_count(args);
        Value sep = np > 0 ? args[0] : Value::null();
        Value maxsplit = np > 1 ? args[1] : Value::from_int(-1);
        if (sep.type != Type::kString && sep.type != Type::kNull)
          fail("split(): sep must be a string or none");
        if (maxsplit.type != Type::kInt) fail("split(): maxsplit must be an integer");
        double max = maxsplit.number;
        Array out;
        if (sep.type == Type::kNull) {  // runs of whitespace separate, no empty strings
          std::string text = trim_start(s);
          size_t i = 0;
          while (i < text.size()) {
            size_t b = i;
            while (i < text.size() && !js_space_at(text, i))
              i += code_points(text.substr(i, 4)).front().size();
            if (max != -1 && double(out.size()) >= max) {
              out.push_back(Value::from_string(text.substr(b)));
              break;
            }
            out.push_back(Value::from_string(text.substr(b, i - b)));
            while (size_t n = js_space_at(text, i)) i += n;
          }
        } else {
          if (sep.str.empty()) fail("split(): empty separator");
          size_t b = 0;
          while (true) {
            if (max != -1 && double(out.size()) >= max) {
              out.push_back(Value::from_string(s.substr(b)));
              break;
            }
            size_t e = s.find(sep.str, b);
            if (e == std::string::npos) {
              out.push_back(Value::from_string(s.substr(b)));
              break;
            }
            out.push_back(Value::from_string(s.substr(b, e - b)));
            b = e + sep.str.size();
          }
        }
        return Value::from_array(std::move(out));
      });
    if (name == "replace")
      return fn([s](std::vector<Value>& args, Interpreter& in) {
        size_t np = positional_count(args);
        if (np < 2) fail("replace() needs two arguments");
        if (args[0].type != Type::kString || args[1].type != Type::kString)
          fail("replace(): arguments must be strings");
        Value count = np > 2 ? args[2] : kwargs_get(args, "count");
        if (count.type != Type::kInt && count.type != Type::kNull && count.type != Type::kUndefined)
          fail("replace(): count must be an integer or none");
        std::string r =
            replace_all(s, args[0].str, args[1].str, count.type == Type::kInt ? count.number : -1);
        in.new_string(r.size());
        return Value::from_string(std::move(r));
      });
    return Value::undefined();
  }

  // ---------------------------------------------------------------------------------------------
  Value eval_unary(const Node& n, Scope& s) {
    Value v = eval(*n.x, s);
    if (n.str == "not") return Value::from_bool(!v.truthy());
    double sign = n.str == "-" ? -1 : 1;
    if (v.is_number())
      return v.type == Type::kFloat ? Value::from_float(sign * v.number)
                                    : Value::from_int(sign * v.number);
    if (v.type == Type::kBool) return Value::from_int(sign * double(v.boolean));
    fail("unary " + n.str + " on " + type_name(v.type));
  }

  Value eval_binary(const Node& n, Scope& s) {
    const std::string& op = n.str;
    Value l = eval(*n.x, s);
    if (op == "and") return l.truthy() ? eval(*n.y, s) : l;
    if (op == "or") return l.truthy() ? l : eval(*n.y, s);
    Value r = eval(*n.y, s);
    if (op == "==") return Value::from_bool(loose_equal(l, r));
    if (op == "!=") return Value::from_bool(!loose_equal(l, r));
    bool membership = op == "in" || op == "not in";
    if (l.type == Type::kUndefined || r.type == Type::kUndefined) {
      if (r.type == Type::kUndefined && membership) return Value::from_bool(op == "not in");
      fail("cannot apply '" + op + "' to an undefined value (a missing variable or key?)");
    }
    if (l.type == Type::kNull || r.type == Type::kNull) fail("cannot apply '" + op + "' to none");
    if (op == "~") {
      std::string out = raw_string(l) + raw_string(r);
      new_string(out.size());
      return Value::from_string(std::move(out));
    }
    auto numeric_like = [](const Value& v) { return v.is_number() || v.type == Type::kBool; };
    auto num = [](const Value& v) { return v.type == Type::kBool ? double(v.boolean) : v.number; };
    if (op == "**" && numeric_like(l) && numeric_like(r)) {
      double a = num(l), b = num(r);
      if (a == 0 && b < 0) fail("0.0 cannot be raised to a negative power");
      double res = std::pow(a, b);
      if (!std::isfinite(res)) fail("exponentiation result is not a finite real number");
      bool is_float = l.type == Type::kFloat || r.type == Type::kFloat || b < 0;
      return is_float ? Value::from_float(res) : Value::from_int(res);
    }
    if (l.is_number() && r.is_number()) {
      double a = l.number, b = r.number;
      bool is_float = l.type == Type::kFloat || r.type == Type::kFloat;
      auto make = [&](double v) { return is_float ? Value::from_float(v) : Value::from_int(v); };
      if (op == "+") return make(a + b);
      if (op == "-") return make(a - b);
      if (op == "*") return make(a * b);
      if (op == "/") return Value::from_float(a / b);
      if (op == "//") return make(std::floor(a / b));
      if (op == "%") return make(std::fmod(a, b));  // JavaScript %: the sign of the dividend
      if (op == "<") return Value::from_bool(a < b);
      if (op == ">") return Value::from_bool(a > b);
      if (op == "<=") return Value::from_bool(a <= b);
      if (op == ">=") return Value::from_bool(a >= b);
    } else if (l.is_array() && r.is_array()) {
      if (op == "+") {
        if (l.array->size() + r.array->size() > limits.max_loop_iterations)
          fail("array concatenation exceeds " + std::to_string(limits.max_loop_iterations) +
               " items");
        charge_items(l.array->size() + r.array->size());
        Array a = *l.array;
        a.insert(a.end(), r.array->begin(), r.array->end());
        return Value::from_array(std::move(a));
      }
    } else if (r.is_array()) {
      if (membership) {
        bool found = std::any_of(r.array->begin(), r.array->end(),
                                 [&](const Value& e) { return strict_equal(e, l); });
        return Value::from_bool(op == "in" ? found : !found);
      }
    }
    if ((l.type == Type::kString || r.type == Type::kString) && op == "+") {
      std::string out = raw_string(l) + raw_string(r);
      new_string(out.size());
      return Value::from_string(std::move(out));
    }
    if (l.type == Type::kString && r.type == Type::kString && membership) {
      bool found = r.str.find(l.str) != std::string::npos;
      return Value::from_bool(op == "in" ? found : !found);
    }
    if (l.type == Type::kString && r.is_object() && membership) {
      bool found = r.object->find(l.str) != nullptr;
      return Value::from_bool(op == "in" ? found : !found);
    }
    fail("operator '" + op + "' is not supported between " + type_name(l.type) + " and " +
         type_name(r.type));
  }

  // ---------------------------------------------------------------------------------------------
  bool run_test(const std::string& name, const Value& v, const Value* arg) {
    if (name == "boolean") return v.type == Type::kBool;
    if (name == "callable") return v.type == Type::kFunction;
    if (name == "odd" || name == "even") {
      if (v.type != Type::kInt)
        fail("test '" + name + "' needs an integer, got " + type_name(v.type));
      bool odd = std::fmod(v.number, 2) != 0;
      return name == "odd" ? odd : !odd;
    }
    if (name == "false") return v.type == Type::kBool && !v.boolean;
    if (name == "true") return v.type == Type::kBool && v.boolean;
    if (name == "none") return v.type == Type::kNull;
    if (name == "string") return v.type == Type::kString;
    if (name == "number") return v.is_number();
    if (name == "integer") return v.type == Type::kInt;
    if (name == "iterable") return v.type == Type::kArray || v.type == Type::kString;
    if (name == "mapping") return v.is_object();
    if (name == "sequence") return v.is_array() || v.is_object() || v.type == Type::kString;
    if (name == "lower") return v.type == Type::kString && v.str == to_lower(v.str);
    if (name == "upper") return v.type == Type::kString && v.str == to_upper(v.str);
    if (name == "defined") return v.type != Type::kUndefined;
    if (name == "undefined") return v.type == Type::kUndefined;
    if (name == "equalto" || name == "eq") return arg && strict_equal(v, *arg);
    fail("unknown test '" + name + "' (supported: " + kTests + ")");
  }

  [[noreturn]] void filter_type_error(const std::string& name, const Value& v) {
    if (!is_known_filter(name)) fail("unknown filter '" + name + "' (supported: " + kFilters + ")");
    fail("filter '" + name + "' cannot be applied to " + type_name(v.type));
  }

  Value apply_filter(const Value& v, const Node& f, Scope& s) {
    if (f.kind == Kind::kIdent) return filter_plain(v, f.str);
    const std::string& name = f.x->str;
    if (f.x->kind != Kind::kIdent) fail("a filter must be a name");
    std::vector<Value> args = eval_args(f.args, s);
    size_t np = positional_count(args);
    auto arg = [&](size_t i, const char* kw) { return np > i ? args[i] : kwargs_get(args, kw); };
    if (name == "tojson") {
      JsonOptions opt;
      Value indent = kwargs_get(args, "indent"), ascii = kwargs_get(args, "ensure_ascii");
      Value sort = kwargs_get(args, "sort_keys"), seps = kwargs_get(args, "separators");
      if (indent.type == Type::kInt)
        opt.indent = int(std::clamp(indent.number, 0.0, 64.0));
      else if (indent.type != Type::kUndefined && indent.type != Type::kNull)
        fail("tojson: indent must be an integer");
      if (ascii.type == Type::kBool)
        opt.ensure_ascii = ascii.boolean;
      else if (ascii.type != Type::kUndefined)
        fail("tojson: ensure_ascii must be a boolean");
      if (sort.type == Type::kBool)
        opt.sort_keys = sort.boolean;
      else if (sort.type != Type::kUndefined)
        fail("tojson: sort_keys must be a boolean");
      if (seps.is_array()) {
        if (seps.array->size() != 2 || (*seps.array)[0].type != Type::kString ||
            (*seps.array)[1].type != Type::kString)
          fail("tojson: separators must be a tuple of two strings");
        opt.has_separators = true;
        opt.item_sep = (*seps.array)[0].str;
        opt.key_sep = (*seps.array)[1].str;
      } else if (seps.type != Type::kUndefined && seps.type != Type::kNull) {
        fail("tojson: separators must be a tuple of two strings");
      }
      std::string out = to_json(v, opt, 0, true, limits.max_depth);
      new_string(out.size());
      return Value::from_string(std::move(out));
    }
    if (name == "join") {
      std::vector<std::string> parts;
      if (v.type == Type::kString)
        parts = code_points(v.str);
      else if (v.is_array())
        for (const Value& e : *v.array) parts.push_back(join_part(e));
      else
        filter_type_error(name, v);
      Value sep = arg(0, "separator");
      if (sep.type == Type::kUndefined) sep = Value::from_string("");
      if (sep.type != Type::kString) fail("join: the separator must be a string");
      std::string out;
      for (size_t i = 0; i < parts.size(); ++i) {
        if (i) out += sep.str;
        out += parts[i];
        check_size(out.size());
      }
      charge(out.size());
      return Value::from_string(std::move(out));
    }
    if (name == "int" || name == "float") {
      bool is_int = name == "int";
      Value def = arg(0, "default");
      if (def.type == Type::kUndefined) def = is_int ? Value::from_int(0) : Value::from_float(0);
      if (v.type == Type::kString) {
        double d = is_int ? parse_int(v.str) : parse_float(v.str);
        if (std::isnan(d)) return def;
        return is_int ? Value::from_int(d) : Value::from_float(d);
      }
      if (v.is_number()) return v;
      if (v.type == Type::kBool)
        return is_int ? Value::from_int(v.boolean) : Value::from_float(v.boolean);
      filter_type_error(name, v);
    }
    if (name == "default") {
      Value def = np > 0 ? args[0] : Value::from_string("");
      Value boolean = np > 1 ? args[1] : kwargs_get(args, "boolean");
      if (boolean.type == Type::kUndefined) boolean = Value::from_bool(false);
      if (boolean.type != Type::kBool) fail("default: the boolean flag must be a boolean");
      if (v.type == Type::kUndefined || (boolean.boolean && !v.truthy())) return def;
      return v;
    }
    if (v.is_array()) {
      const Array& a = *v.array;
      if (name == "sort") {
        Value rev = arg(0, "reverse"), cs = arg(1, "case_sensitive"), attr = arg(2, "attribute");
        bool reverse = rev.type == Type::kBool && rev.boolean,
             case_sensitive = cs.type == Type::kBool && cs.boolean;
        if (attr.type != Type::kUndefined && attr.type != Type::kNull &&
            attr.type != Type::kString && attr.type != Type::kInt)
          fail("sort: attribute must be a string or an integer");
        std::string path = attr.type == Type::kString ? attr.str
                           : attr.type == Type::kInt  ? js_number(attr.number)
                                                      : "";
        auto key = [&](const Value& e) { return path.empty() ? e : attribute_path(e, path); };
        Array out = a;
        std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
          int c = compare_values(key(x), key(y), case_sensitive);
          return reverse ? c > 0 : c < 0;
        });
        return Value::from_array(std::move(out));
      }
      if (name == "selectattr" || name == "rejectattr") {
        bool select = name == "selectattr";
        for (const Value& e : a)
          if (!e.is_container()) fail(name + " can only be applied to an array of objects");
        for (const auto& an : f.args)
          if (an->kind != Kind::kString)
            fail("the arguments of " + name + " must be string literals");
        if (np == 0) fail(name + " needs an attribute name");
        Array out;
        for (const Value& e : a) {
          const Value* field = e.object->find(args[0].str);
          bool r = false;
          // The reference drops items whose attribute is missing before testing.
          if (field)
            r = np > 1 ? run_test(args[1].str, *field, np > 2 ? &args[2] : nullptr)
                       : field->truthy();
          if (r == select) out.push_back(e);
        }
        return Value::from_array(std::move(out));
      }
      if (name == "map") {
        Value attr = kwargs_get(args, "attribute");
        if (attr.type == Type::kUndefined) fail("map: only map(attribute=...) is supported");
        if (attr.type != Type::kString) fail("map: attribute must be a string");
        Value def = kwargs_get(args, "default");
        Array out;
        for (const Value& e : a) {
          if (!e.is_container()) fail("map: items must be objects");
          Value r = attribute_path(e, attr.str);
          out.push_back(r.type == Type::kUndefined ? def : r);
        }
        return Value::from_array(std::move(out));
      }
      filter_type_error(name, v);
    }
    if (v.type == Type::kString) {
      if (name == "indent") {
        Value width = arg(0, "width"), first = arg(1, "first"), blank = arg(2, "blank");
        if (width.type == Type::kUndefined) width = Value::from_int(4);
        if (width.type != Type::kInt) fail("indent: width must be an integer");
        return Value::from_string(indent(v.str, size_t(std::clamp(width.number, 0.0, 1024.0)),
                                         first.truthy(), blank.truthy()));
      }
      if (name == "replace") {
        Value fn = string_method(v, "replace");
        return (*fn.function)(args, *this);
      }
      filter_type_error(name, v);
    }
    if (v.is_object()) {
      Value method = object_method(v, name);
      if (method.type == Type::kFunction) return (*method.function)(args, *this);
    }
    filter_type_error(name, v);
  }

  static std::string join_part(const Value& e) {  // Array#join of the raw values
    if (e.type == Type::kUndefined || e.type == Type::kNull) return "";
    return raw_string(e);
  }

  static std::string indent(const std::string& s, size_t width, bool first, bool blank) {
    std::string pad(width, ' '), out;
    size_t b = 0;
    for (size_t line = 0;; ++line) {
      size_t e = s.find('\n', b);
      std::string part = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
      if (!((!first && line == 0) || (!blank && part.empty()))) out += pad;
      out += part;
      if (e == std::string::npos) break;
      out += '\n';
      b = e + 1;
    }
    return out;
  }

  Value filter_plain(const Value& v, const std::string& name) {
    if (name == "safe") return v;
    if (name == "tojson") {
      std::string out = to_json(v, {}, 0, true, limits.max_depth);
      new_string(out.size());
      return Value::from_string(std::move(out));
    }
    if (v.is_array()) {
      const Array& a = *v.array;
      if (name == "list") return v;
      if (name == "first") return a.empty() ? Value::undefined() : a.front();
      if (name == "last") return a.empty() ? Value::undefined() : a.back();
      if (name == "length") return Value::from_int(double(a.size()));
      if (name == "reverse") return Value::from_array(Array(a.rbegin(), a.rend()));
      if (name == "sort") {
        Array out = a;
        std::stable_sort(out.begin(), out.end(), [](const Value& x, const Value& y) {
          return compare_values(x, y, false) < 0;
        });
        return Value::from_array(std::move(out));
      }
      if (name == "join") {
        std::string out;
        for (const Value& e : a) out += join_part(e);
        return Value::from_string(std::move(out));
      }
      if (name == "string") return Value::from_string(to_json(v, {}, 0, false, limits.max_depth));
      if (name == "unique") {
        Array out;
        for (const Value& e : a)
          if (std::none_of(out.begin(), out.end(),
                           [&](const Value& o) { return strict_equal(o, e); }))
            out.push_back(e);
        return Value::from_array(std::move(out));
      }
      filter_type_error(name, v);
    }
    if (v.type == Type::kString) {
      if (name == "length") return Value::from_int(double(utf16_length(v.str)));
      if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
        std::vector<Value> none;
        return (*string_method(v, name).function)(none, *this);
      }
      if (name == "trim") return Value::from_string(trim(v.str));
      if (name == "indent") return Value::from_string(indent(v.str, 4, false, false));
      if (name == "join" || name == "string") return v;
      if (name == "int") {
        double d = parse_int(v.str);
        return Value::from_int(std::isnan(d) ? 0 : d);
      }
      if (name == "float") {
        double d = parse_float(v.str);
        return Value::from_float(std::isnan(d) ? 0 : d);
      }
      filter_type_error(name, v);
    }
    if (v.is_number()) {
      if (name == "abs")
        return v.type == Type::kInt ? Value::from_int(std::fabs(v.number))
                                    : Value::from_float(std::fabs(v.number));
      if (name == "int") return Value::from_int(std::floor(v.number));
      if (name == "float") return Value::from_float(v.number);
      if (name == "string") return Value::from_string(render_value(v));
      filter_type_error(name, v);
    }
    if (v.is_object()) {
      if (name == "items" || name == "length") {
        if (name == "length") return Value::from_int(double(v.object->items.size()));
      }
      Value method = object_method(v, name);
      if (method.type == Type::kFunction) {
        std::vector<Value> none;
        return (*method.function)(none, *this);
      }
      filter_type_error(name, v);
    }
    if (v.type == Type::kBool) {
      if (name == "bool") return v;
      if (name == "int") return Value::from_int(v.boolean);
      if (name == "float") return Value::from_float(v.boolean);
      if (name == "string") return Value::from_string(v.boolean ? "true" : "false");
      filter_type_error(name, v);
    }
    filter_type_error(name, v);
  }
};

namespace {

std::string strftime_string(const std::tm& tm, const std::string& format) {
  if (format.size() > 4096) fail("strftime_now: format is too long");
  std::string buf(format.size() * 8 + 64, '\0');
  // strftime returns 0 for an empty result too; the format always fits in the buffer above.
  size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &tm);
  buf.resize(n);
  return buf;
}

}  // namespace

std::string run_program(const Program& program, std::vector<std::pair<std::string, Value>> globals,
                        const Limits& limits, const std::function<std::tm()>& now) {
  Interpreter in{limits, now};
  Scope root;
  root.set("namespace", Value::from_function([](std::vector<Value>& args, Interpreter&) {
             auto ns = std::make_shared<Object>();
             size_t np = positional_count(args);
             if (np > 1)
               fail("namespace() takes at most 1 positional argument, got " + std::to_string(np));
             if (np == 1) {
               const Value& src = args[0];
               if (src.is_object()) {
                 for (const auto& kv : src.object->items) ns->set(kv.first, kv.second);
               } else if (src.is_array()) {
                 for (const Value& pair : *src.array) {
                   if (!pair.is_array() || pair.array->size() != 2 ||
                       (*pair.array)[0].type != Type::kString)
                     fail("namespace() expects an object or [key, value] pairs");
                   ns->set((*pair.array)[0].str, (*pair.array)[1]);
                 }
               } else {
                 fail(std::string("namespace(): ") + type_name(src.type) + " is not iterable");
               }
             }
             if (np < args.size())
               for (const auto& kv : args.back().object->items) ns->set(kv.first, kv.second);
             return Value::from_object(std::move(ns), Type::kNamespace);
           }));
  root.set("false", Value::from_bool(false));
  root.set("true", Value::from_bool(true));
  root.set("none", Value::null());
  root.set("False", Value::from_bool(false));
  root.set("True", Value::from_bool(true));
  root.set("None", Value::null());
  root.set("raise_exception",
           Value::from_function([](std::vector<Value>& args, Interpreter&) -> Value {
             JinjaError e{args.empty() ? std::string("undefined") : raw_string(args[0])};
             e.raised = true;
             throw e;
           }));
  root.set("range", Value::from_function([](std::vector<Value>& args, Interpreter& in) {
             size_t np = positional_count(args);
             for (size_t i = 0; i < np; ++i)
               if (!args[i].is_number()) fail("range() arguments must be numbers");
             if (np == 0) fail("range() needs at least one argument");
             double start = np > 1 ? args[0].number : 0,
                    stop = np > 1 ? args[1].number : args[0].number;
             double step = np > 2 ? args[2].number : 1;
             if (step == 0) fail("range() step must not be zero");
             double count = std::max(0.0, std::ceil((stop - start) / step));
             if (count > double(in.limits.max_loop_iterations))
               fail("range() of " + js_number(count) + " items exceeds the limit of " +
                    std::to_string(in.limits.max_loop_iterations));
             in.charge_items(size_t(count));
             Array out;
             for (double i = start; step > 0 ? i < stop : i > stop; i += step)
               out.push_back(Value::from_int(i));
             return Value::from_array(std::move(out));
           }));
  root.set("strftime_now", Value::from_function([](std::vector<Value>& args, Interpreter& in) {
             if (args.empty() || args[0].type != Type::kString)
               fail("strftime_now(format): format must be a string");
             std::tm tm{};
             if (in.now) {
               tm = in.now();
             } else {
               std::time_t t = std::time(nullptr);
               localtime_r(&t, &tm);
             }
             return Value::from_string(strftime_string(tm, args[0].str));
           }));
  for (auto& [name, value] : globals) {
    if (root.vars.count(name))
      fail("context variable '" + name + "' clashes with a built-in of the template engine");
    root.set(name, std::move(value));
  }
  std::string out = in.block(program.body, root);
  if (in.flow != Flow::kNone) fail("{% break %} or {% continue %} outside a loop");
  return out;
}

}  // namespace tformers::jinja
