// Interpreter of the chat-template engine: statements, expressions, filters, tests and the
// methods of strings, arrays and objects, with the semantics of Python Jinja2 in the sandboxed
// environment Transformers' apply_chat_template builds.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include <unicode/uchar.h>
#include <unicode/utf8.h>

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
  auto given = [](const Value& v) { return v.type != Type::kUndefined && v.type != Type::kNull; };
  int64_t len = int64_t(n);
  int64_t step = given(step_v) ? step_v.as_int() : 1;
  if (step == 0) fail("ValueError: slice step cannot be zero");
  int64_t start, stop;
  auto clamp = [&](int64_t i, int64_t lo, int64_t hi) {
    if (i < 0) i = i < -len ? lo : len + i;
    return std::clamp(i, lo, hi);
  };
  if (step > 0) {
    start = given(start_v) ? clamp(start_v.as_int(), 0, len) : 0;
    stop = given(stop_v) ? clamp(stop_v.as_int(), 0, len) : len;
  } else {
    start = given(start_v) ? clamp(start_v.as_int(), -1, len - 1) : len - 1;
    stop = given(stop_v) ? clamp(stop_v.as_int(), -1, len - 1) : -1;
  }
  std::vector<size_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    out.push_back(size_t(i));
    if (step > 0 ? stop - i <= step : i - stop <= -step) break;  // i += step could overflow
  }
  return out;
}

// String#replace with a global literal pattern, at most `count` times (Python's str.replace).
std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count) {
  if (count == 0) return s;
  int64_t remaining = count < 0 ? INT64_MAX : count;
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

// Python's int(str): optional whitespace and sign, decimal digits (single underscores between
// them); false when the text is not an integer or does not fit in 64 bits.
bool python_int(const std::string& str, int64_t& out) {
  std::string t = trim(str);
  size_t i = 0;
  bool neg = false;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
  if (i == t.size()) return false;
  uint64_t v = 0;
  for (bool digit_before = false; i < t.size(); ++i) {
    if (t[i] == '_' && digit_before && i + 1 < t.size() && isdigit(uint8_t(t[i + 1]))) continue;
    if (!isdigit(uint8_t(t[i]))) return false;
    digit_before = true;
    if (v > (uint64_t(INT64_MAX) + 1 - (t[i] - '0')) / 10) return false;
    v = v * 10 + uint64_t(t[i] - '0');
  }
  if (v > uint64_t(INT64_MAX) + (neg ? 1 : 0)) return false;
  out = neg ? int64_t(0 - v) : int64_t(v);
  return true;
}

// Python's float(str): whitespace, then a decimal or exponent number, inf/infinity or nan.
bool python_float_parse(const std::string& str, double& out) {
  std::string t = trim(str);
  std::string clean;
  for (size_t i = 0; i < t.size(); ++i) {
    bool between =
        i > 0 && isdigit(uint8_t(t[i - 1])) && i + 1 < t.size() && isdigit(uint8_t(t[i + 1]));
    if (t[i] == '_' && between) continue;
    clean.push_back(t[i]);
  }
  std::string lower = to_lower(clean);
  size_t sign = !lower.empty() && (lower[0] == '+' || lower[0] == '-');
  std::string body = lower.substr(sign);
  if (body == "inf" || body == "infinity" || body == "nan") {
    out = body == "nan" ? NAN : INFINITY;
    if (lower[0] == '-') out = -out;
    return true;
  }
  if (body.empty() || body.find_first_not_of("0123456789.e+-") != std::string::npos) return false;
  char* end = nullptr;
  out = std::strtod(clean.c_str(), &end);
  return end == clean.c_str() + clean.size() && !(body[0] == 'e');
}

// Titlecase of the first code point of `cp` (ǆ becomes ǅ, as in Python).
std::string title_char(const std::string& cp) {
  std::string up = to_upper(cp);
  if (code_points(up).size() != 1) return up;
  UChar32 c = 0;
  size_t i = 0;
  U8_NEXT(reinterpret_cast<const uint8_t*>(cp.data()), i, int32_t(cp.size()), c);
  std::string out;
  append_utf8(out, uint32_t(u_totitle(c)));
  return out;
}

// Jinja2's title filter: words begin after runs of whitespace, '-', '(', '{', '[' or '<'; each
// word's first character is titlecased and the rest lowercased.
std::string title_filter(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (const std::string& cp : code_points(s)) {
    bool sep = cp == "-" || cp == "(" || cp == "{" || cp == "[" || cp == "<" || space_at(cp, 0);
    if (sep) {
      out += cp;
      word_start = true;
    } else {
      out += word_start ? title_char(cp) : to_lower(cp);
      word_start = false;
    }
  }
  return out;
}

// Python's str.title(): a cased letter after an uncased character is titlecased, others lowered.
std::string title_method(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (const std::string& cp : code_points(s)) {
    UChar32 c = 0;
    size_t i = 0;
    U8_NEXT(reinterpret_cast<const uint8_t*>(cp.data()), i, int32_t(cp.size()), c);
    bool cased = u_hasBinaryProperty(c, UCHAR_CASED);
    out += !cased ? cp : prev_cased ? to_lower(cp) : title_char(cp);
    prev_cased = cased;
  }
  return out;
}

// Python's str.capitalize(): the first character titlecased, the rest lowercased.
std::string capitalize(const std::string& s) {
  if (s.empty()) return s;
  std::string first = code_points(s).front();
  return title_char(first) + to_lower(s.substr(first.size()));
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

// sorted()'s order; strings case-folded unless case_sensitive (Jinja2's ignore_case).
int compare_values(const Value& a, const Value& b, bool case_sensitive, Sink* sink) {
  if (!case_sensitive && a.type == Type::kString && b.type == Type::kString) {
    return python_compare(Value::from_string(to_lower(a.str)), Value::from_string(to_lower(b.str)),
                          "<", sink);
  }
  return python_compare(a, b, "<", sink);
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
      int64_t idx = 0;  // Jinja2's attribute getter indexes with the integer parts
      if (!python_int(part, idx)) return Value::undefined();
      if (idx < 0) idx += int64_t(v.array->size());
      if (idx < 0 || idx >= int64_t(v.array->size())) return Value::undefined();
      v = (*v.array)[size_t(idx)];
    } else {
      return Value::undefined();
    }
    if (e == std::string::npos) return v;
    b = e + 1;
  }
}

const char* const kFilters =
    "abs, capitalize, count, d, default, dictsort, e, escape, first, float, forceescape, indent, "
    "int, items, join, last, length, list, lower, map, max, min, reject, rejectattr, replace, "
    "reverse, round, safe, select, selectattr, sort, string, sum, title, tojson, trim, unique, "
    "upper, wordcount";
const char* const kTests =
    "boolean, callable, defined, divisibleby, eq, equalto, even, false, float, ge, gt, in, "
    "integer, iterable, le, lower, lt, mapping, ne, none, number, odd, sameas, sequence, string, "
    "true, undefined, upper";

// Transformers' namespace() refuses underscore-prefixed attributes (sandbox escapes).
void check_namespace_name(const std::string& name) {
  if (!name.empty() && name[0] == '_')
    fail(
        "SecurityError: Chat templates cannot store underscore-prefixed attributes on a "
        "namespace, but got '" +
        name + "'. Please rename the attribute.");
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
      // Statements give undefined; `{{ none }}` prints None, as str(None).
      if (v.type != Type::kUndefined) {
        size_t before = out.size();
        if (v.type == Type::kString)
          out += v.str;
        else
          out += text_of(v);
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
        return Value::undefined();
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
        return Value::undefined();
      case Kind::kContinue:
        flow = Flow::kContinue;
        return Value::undefined();
      case Kind::kFilterBlock: {
        Value body = Value::from_string(block(n.body, s));
        return apply_filter(body, *n.x, s);
      }
      case Kind::kInt:
        return Value::from_int(n.integer);
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
        return v ? *v : Value::undefined("'" + n.str + "' is undefined");
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
        Value subject = eval(*n.x, s);
        bool r = run_test(n.str, subject, eval_args(n.args, s));
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
      unpack_into(s, target, rhs, "unpacking in set", "set");
    } else if (target.kind == Kind::kMember) {
      Value obj = eval(*target.x, s);
      if (obj.type != Type::kNamespace)
        fail("TemplateRuntimeError: cannot assign attribute on non-namespace object (" +
             std::string(python_type(obj)) + "); only namespace() objects can be assigned to");
      if (target.flag || target.y->kind != Kind::kIdent)
        fail("namespace attributes are assigned by name (ns.name = ...)");
      check_namespace_name(target.y->str);
      obj.object->set(target.y->str, std::move(rhs));
    } else {
      fail("invalid target of set");
    }
    return Value::undefined();
  }

  // What `for` iterates: a list's items, a dict's keys, a string's characters; nothing for an
  // undefined value (Jinja2's Undefined iterates as empty).
  // Binds a tuple target `a, b` of set or for to the items of v, as Python unpacks: the counts
  // must agree. `what` names the iteration in errors, `where` the statement.
  void unpack_into(Scope& sc, const Node& target, const Value& v, const char* what,
                   const char* where) {
    Array parts = iteration_items(v, what);
    if (parts.size() != target.args.size())
      // Python 3.11's words: the count found only when it is short.
      fail(std::string("ValueError: ") +
           (target.args.size() > parts.size()
                ? "not enough values to unpack (expected " + std::to_string(target.args.size()) +
                      ", got " + std::to_string(parts.size()) + ")"
                : "too many values to unpack (expected " + std::to_string(target.args.size()) +
                      ")"));
    for (size_t i = 0; i < target.args.size(); ++i) {
      if (target.args[i]->kind != Kind::kIdent)
        fail(std::string("can only unpack into names in ") + where);
      sc.set(target.args[i]->str, parts[i]);
    }
  }

  Array iteration_items(const Value& v, const char* what) {
    if (v.is_array()) return *v.array;
    Array out;
    if (v.is_container()) {
      charge_items(v.object->items.size());
      for (const auto& kv : v.object->items) out.push_back(Value::from_string(kv.first));
    } else if (v.type == Type::kString) {
      std::vector<std::string> cps = code_points(v.str);
      charge_items(cps.size());
      for (std::string& cp : cps) out.push_back(Value::from_string(std::move(cp)));
    } else if (v.type != Type::kUndefined) {
      fail(std::string("TypeError: '") + python_type(v) + "' object is not iterable (" + what +
           ")");
    }
    return out;
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
    Array all = iteration_items(iterable, "for loop");
    const Node& var = *n.x;
    auto bind = [&](Scope& sc, const Value& item) {
      if (var.kind == Kind::kIdent) {
        sc.set(var.str, item);
        return;
      }
      unpack_into(sc, var, item, "unpacking in a for loop", "for loop");
    };
    charge_items(all.size());
    std::vector<Value> items;
    for (const Value& item : all) {
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
      int64_t len = int64_t(items.size()), k = int64_t(i);
      loop->set("index", Value::from_int(k + 1));
      loop->set("index0", Value::from_int(k));
      loop->set("revindex", Value::from_int(len - k));
      loop->set("revindex0", Value::from_int(len - k - 1));
      loop->set("first", Value::from_bool(i == 0));
      loop->set("last", Value::from_bool(i + 1 == items.size()));
      loop->set("length", Value::from_int(len));
      loop->set("cycle", Value::from_function([i](std::vector<Value>& args, Interpreter&) {
                  size_t np = positional_count(args);
                  if (np == 0) fail("TypeError: no items for cycling given");
                  return args[i % np];
                }));
      loop->set("depth", Value::from_int(1));
      loop->set("depth0", Value::from_int(0));
      loop->set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
      loop->set("nextitem",
                i + 1 < items.size() ? items[i + 1] : Value::undefined("there is no next item"));
      // Each iteration has its own scope: a `set` in the body lasts for that iteration only,
      // as in Jinja2 (only namespaces carry values across iterations).
      Scope iteration{&scope, {}};
      iteration.set("loop", Value::from_object(std::move(loop)));
      bind(iteration, items[i]);
      out += block(n.body, iteration);
      check_size(out.size());
      Flow f = flow;
      flow = Flow::kNone;
      if (f == Flow::kContinue) continue;
      if (f == Flow::kBreak) break;
      // Jinja2 clears its else flag at the end of the body: continue and break skip it.
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
      if (!have) v = Value::undefined("parameter '" + p.str + "' was not provided");
      scope.set(p.str, v);
    }
    bool wants_kwargs = uses_name(macro.body, "kwargs"),
         wants_varargs = uses_name(macro.body, "varargs");
    if (wants_kwargs) {
      scope.set("kwargs", Value::from_object(kwargs));
    } else if (!kwargs->items.empty()) {
      fail("TypeError: macro " + display + " takes no keyword argument '" + kwargs->items[0].first +
           "'");
    }
    if (wants_varargs) {
      Array rest;
      for (size_t i = macro.args.size(); i < args.size(); ++i) rest.push_back(args[i]);
      scope.set("varargs", Value::from_array(std::move(rest)));
    } else if (args.size() > macro.args.size()) {
      fail("TypeError: macro " + display + " takes not more than " +
           std::to_string(macro.args.size()) + " argument(s)");
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
    return Value::undefined();  // a statement prints nothing
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
      if (fn.type == Type::kUndefined) fail_undefined(fn);
      fail("TypeError: cannot call " + what + ": it is a '" + python_type(fn) +
           "', not a function");
    }
    return invoke(fn, args, s);
  }

  Value eval_member(const Node& n, Scope& s) {
    Value obj = eval(*n.x, s);
    if (obj.type == Type::kUndefined) fail_undefined(obj);  // Jinja2 raises, it does not chain
    if (n.flag) {
      if (n.y->kind == Kind::kSlice) return eval_slice(obj, *n.y, s);
      return item(obj, eval(*n.y, s));
    }
    if (n.y->kind == Kind::kInt) return item(obj, Value::from_int(n.y->integer));
    return attribute(obj, n.y->str);
  }

  [[noreturn]] static void fail_undefined(const Value& v) {
    if (v.str.rfind("SecurityError: ", 0) == 0) fail(v.str);
    fail("UndefinedError: " + (v.str.empty() ? std::string("a value is undefined") : v.str));
  }

  // The immutable sandbox refuses the methods that modify a list or dict.
  static bool mutating_method(const Value& obj, const std::string& name) {
    static const char* const kList[] = {"append", "extend",  "insert", "pop",
                                        "remove", "reverse", "sort",   "clear"};
    static const char* const kDict[] = {"update", "pop", "popitem", "setdefault", "clear"};
    if (obj.type == Type::kArray)
      return std::any_of(std::begin(kList), std::end(kList),
                         [&](const char* m) { return name == m; });
    if (obj.is_object())
      return std::any_of(std::begin(kDict), std::end(kDict),
                         [&](const char* m) { return name == m; });
    return false;
  }

  // Jinja2's names for objects in "has no attribute" messages.
  static std::string object_name(const Value& v) {
    if (v.type == Type::kNull) return "None";
    return std::string(python_type(v)) + " object";
  }

  // obj.name: Jinja2 tries the Python attribute (the methods of str and dict), then the item.
  Value attribute(const Value& obj, const std::string& name) {
    if (obj.is_object()) {
      Value method = object_method(obj, name);
      if (method.type == Type::kFunction) return method;
    }
    if (obj.type == Type::kString) {
      Value method = string_method(obj, name);
      if (method.type == Type::kFunction) return method;
    }
    if (obj.is_container())
      if (const Value* v = obj.object->find(name)) return *v;
    if (mutating_method(obj, name))
      return Value::undefined("SecurityError: access to attribute '" + name + "' of '" +
                              python_type(obj) + "' object is unsafe.");
    return Value::undefined("'" + object_name(obj) + "' has no attribute '" + name + "'");
  }

  // obj[key]: the item first, then (for a string key) the attribute.
  Value item(const Value& obj, const Value& key) {
    if (obj.is_container() && key.type == Type::kString) {
      if (const Value* v = obj.object->find(key.str)) return *v;
      return obj.type == Type::kNamespace
                 ? Value::undefined("'" + object_name(obj) + "' has no attribute '" + key.str + "'")
                 : attribute(obj, key.str);
    }
    if ((obj.is_array() || obj.type == Type::kString) && key.is_integral()) {
      // Negative indexes count from the end, as in Python.
      int64_t i = key.as_int();
      if (obj.is_array()) {
        int64_t n = int64_t(obj.array->size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return (*obj.array)[size_t(i)];
      } else {
        std::vector<std::string> cps = code_points(obj.str);
        int64_t n = int64_t(cps.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value::from_string(cps[size_t(i)]);
      }
    }
    if (key.type == Type::kString) return attribute(obj, key.str);
    Sink k = sink();
    write_repr(k, key);
    return Value::undefined("'" + object_name(obj) + "' has no element " + k.out);
  }

  Value eval_slice(const Value& obj, const Node& sl, Scope& s) {
    Value parts[3];
    const Node* nodes[3] = {sl.x.get(), sl.y.get(), sl.z.get()};
    for (int k = 0; k < 3; ++k) {
      if (nodes[k]) parts[k] = eval(*nodes[k], s);
      if (!parts[k].is_integral() && parts[k].type != Type::kUndefined &&
          parts[k].type != Type::kNull)
        fail("TypeError: slice indices must be integers or None");
    }
    if (obj.is_array()) {
      charge_items(obj.array->size());
      Array out;
      for (size_t i : slice_indices(obj.array->size(), parts[0], parts[1], parts[2]))
        out.push_back((*obj.array)[i]);
      return Value::from_array(std::move(out), obj.type);
    }
    if (obj.type != Type::kString)
      fail(std::string("TypeError: '") + python_type(obj) + "' object is not subscriptable");
    std::vector<std::string> cps = code_points(obj.str);
    std::string out;
    for (size_t i : slice_indices(cps.size(), parts[0], parts[1], parts[2])) out += cps[i];
    new_string(out.size());
    return Value::from_string(std::move(out));
  }

  // A Sink bounded by what the render may still build, counting steps.
  Sink sink() {
    Sink k;
    size_t left = allocated < limits.max_memory_bytes ? limits.max_memory_bytes - allocated : 0;
    k.limit = std::min(limits.max_output_bytes, left);
    k.steps = &steps;
    k.max_steps = limits.max_steps;
    k.max_depth = limits.max_depth;
    return k;
  }
  std::string text_of(const Value& v) {  // str(v), charged
    if (v.type == Type::kString) return v.str;
    Sink k = sink();
    write_str(k, v);
    charge(k.out.size());
    return std::move(k.out);
  }
  bool equal(const Value& a, const Value& b) {
    Sink k = sink();
    return python_equal(a, b, &k);
  }

  // ---------------------------------------------------------------------------------------------
  static Value pair(const std::string& k, const Value& v) {
    return Value::from_array({Value::from_string(k), v}, Type::kTuple);
  }

  Value object_method(const Value& obj, const std::string& name) {
    if (name == "get")
      return Value::from_function([obj](std::vector<Value>& args, Interpreter&) {
        if (positional_count(args) == 0) fail("TypeError: get expected at least 1 argument, got 0");
        if (args[0].type == Type::kString)
          if (const Value* v = obj.object->find(args[0].str)) return *v;
        return positional_count(args) > 1 ? args[1] : Value::null();
      });
    if (name == "items")
      return Value::from_function([obj](std::vector<Value>&, Interpreter& in) {
        in.charge_items(obj.object->items.size());
        Array a;
        for (const auto& kv : obj.object->items) a.push_back(pair(kv.first, kv.second));
        return Value::from_array(std::move(a));
      });
    if (name == "keys")
      return Value::from_function([obj](std::vector<Value>&, Interpreter& in) {
        in.charge_items(obj.object->items.size());
        Array a;
        for (const auto& kv : obj.object->items) a.push_back(Value::from_string(kv.first));
        return Value::from_array(std::move(a));
      });
    if (name == "values")
      return Value::from_function([obj](std::vector<Value>&, Interpreter& in) {
        in.charge_items(obj.object->items.size());
        Array a;
        for (const auto& kv : obj.object->items) a.push_back(kv.second);
        return Value::from_array(std::move(a));
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
          [s](std::vector<Value>&, Interpreter&) { return Value::from_string(title_method(s)); });
    if (name == "capitalize")
      return fn(
          [s](std::vector<Value>&, Interpreter&) { return Value::from_string(capitalize(s)); });
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      bool left = name != "rstrip", right = name != "lstrip";
      return fn([s, left, right](std::vector<Value>& args, Interpreter&) {
        if (positional_count(args) > 0 && args[0].type == Type::kString)
          return Value::from_string(strip_chars(s, args[0].str, left, right));
        return Value::from_string(left && right ? trim(s) : left ? trim_start(s) : trim_end(s));
      });
    }
    if (name == "startswith" || name == "endswith") {
      bool start = name == "startswith";
      return fn([s, start, name](std::vector<Value>& args, Interpreter&) {
        if (positional_count(args) == 0)
          fail("TypeError: " + name + "() takes at least 1 argument");
        auto match = [&](const std::string& p) {
          return p.size() <= s.size() && (start ? s.compare(0, p.size(), p) == 0
                                                : s.compare(s.size() - p.size(), p.size(), p) == 0);
        };
        if (args[0].type == Type::kString) return Value::from_bool(match(args[0].str));
        if (args[0].type == Type::kTuple) {
          for (const Value& p : *args[0].array) {
            if (p.type != Type::kString)
              fail("TypeError: tuple for " + name + " must only contain str");
            if (match(p.str)) return Value::from_bool(true);
          }
          return Value::from_bool(false);
        }
        fail("TypeError: " + name + " first arg must be str or a tuple of str, not " +
             python_type(args[0]));
      });
    }
    if (name == "split" || name == "rsplit")
      return fn([s, name](std::vector<Value>& args, Interpreter& in) {
        size_t np = positional_count(args);
        Value sep = np > 0 ? args[0] : kwargs_get(args, "sep");
        Value maxsplit = np > 1 ? args[1] : kwargs_get(args, "maxsplit");
        if (sep.type == Type::kUndefined) sep = Value::null();
        if (maxsplit.type == Type::kUndefined) maxsplit = Value::from_int(-1);
        if (sep.type != Type::kString && sep.type != Type::kNull)
          fail(std::string("TypeError: must be str or None, not ") + python_type(sep));
        if (!maxsplit.is_integral()) fail("TypeError: maxsplit must be an integer");
        int64_t max = maxsplit.as_int();
        bool reverse = name == "rsplit";
        std::vector<std::string> parts;
        std::string text = s;
        if (sep.type == Type::kNull) {  // runs of whitespace separate, no empty strings
          text = reverse ? trim_end(s) : trim_start(s);
          std::vector<std::string> cps = code_points(text);
          if (reverse) std::reverse(cps.begin(), cps.end());
          size_t i = 0;
          while (i < cps.size()) {
            std::string word;
            if (max >= 0 && int64_t(parts.size()) >= max) {
              for (; i < cps.size(); ++i) word += cps[i];
              parts.push_back(word);
              break;
            }
            while (i < cps.size() && !space_at(cps[i], 0)) word += cps[i++];
            parts.push_back(word);
            while (i < cps.size() && space_at(cps[i], 0)) ++i;
          }
          if (reverse) {
            for (std::string& p : parts) {
              std::vector<std::string> c = code_points(p);
              p.clear();
              for (auto it = c.rbegin(); it != c.rend(); ++it) p += *it;
            }
            std::reverse(parts.begin(), parts.end());
          }
        } else {
          if (sep.str.empty()) fail("ValueError: empty separator");
          if (!reverse) {
            size_t b = 0;
            while (true) {
              size_t e =
                  max >= 0 && int64_t(parts.size()) >= max ? std::string::npos : s.find(sep.str, b);
              if (e == std::string::npos) {
                parts.push_back(s.substr(b));
                break;
              }
              parts.push_back(s.substr(b, e - b));
              b = e + sep.str.size();
            }
          } else {
            size_t e = s.size();
            while (true) {
              size_t b = (max >= 0 && int64_t(parts.size()) >= max) || e < sep.str.size()
                             ? std::string::npos
                             : s.rfind(sep.str, e - sep.str.size());
              if (b == std::string::npos) {
                parts.push_back(s.substr(0, e));
                break;
              }
              parts.push_back(s.substr(b + sep.str.size(), e - b - sep.str.size()));
              e = b;
            }
            std::reverse(parts.begin(), parts.end());
          }
        }
        in.charge_items(parts.size());
        Array out;
        for (std::string& p : parts) out.push_back(Value::from_string(std::move(p)));
        return Value::from_array(std::move(out));
      });
    if (name == "replace")
      return fn([s](std::vector<Value>& args, Interpreter& in) {
        size_t np = positional_count(args);
        if (np < 2)
          fail("TypeError: replace expected at least 2 arguments, got " + std::to_string(np));
        if (args[0].type != Type::kString || args[1].type != Type::kString)
          fail("TypeError: replace() arguments must be str");
        if (np < args.size()) fail("TypeError: str.replace() takes no keyword arguments");
        Value count = np > 2 ? args[2] : Value::undefined();
        if (!count.is_integral() && count.type != Type::kUndefined)
          fail("TypeError: replace() count must be an integer");
        int64_t n = count.is_integral() ? count.as_int() : -1;
        // Bound the result before building it: an empty pattern inserts between every character.
        size_t hits = args[0].str.empty() ? code_point_count(s) + 1 : s.size() / args[0].str.size();
        if (n >= 0) hits = std::min(hits, size_t(n));
        in.new_string(s.size() + hits * args[1].str.size());
        return Value::from_string(replace_all(s, args[0].str, args[1].str, n));
      });
    if (name == "join")
      return fn([s](std::vector<Value>& args, Interpreter& in) {
        if (positional_count(args) != 1) fail("TypeError: join() takes exactly one argument");
        Array parts = in.iteration_items(args[0], "str.join");
        std::string out;
        for (size_t i = 0; i < parts.size(); ++i) {
          if (parts[i].type != Type::kString)
            fail("TypeError: sequence item " + std::to_string(i) + ": expected str instance, " +
                 python_type(parts[i]) + " found");
          if (i) out += s;
          out += parts[i].str;
          in.check_size(out.size());
        }
        in.charge(out.size());
        return Value::from_string(std::move(out));
      });
    return Value::undefined();
  }

  // ---------------------------------------------------------------------------------------------
  Value eval_unary(const Node& n, Scope& s) {
    Value v = eval(*n.x, s);
    if (n.str == "not") return Value::from_bool(!v.truthy());
    bool neg = n.str == "-";
    if (v.type == Type::kFloat) return Value::from_float(neg ? -v.number : v.number);
    if (v.is_integral()) {
      if (neg && v.as_int() == INT64_MIN) overflow();
      return Value::from_int(neg ? -v.as_int() : v.as_int());
    }
    if (v.type == Type::kUndefined) fail_undefined(v);
    fail(std::string("TypeError: bad operand type for unary ") + n.str + ": '" + python_type(v) +
         "'");
  }

  [[noreturn]] static void overflow() {
    fail(
        "OverflowError: integer result outside the 64-bit range the template engine supports "
        "(Python's integers are unbounded; use floats for such magnitudes)");
  }

  static Value int_power(int64_t base, int64_t exp) {
    int64_t result = 1;
    while (exp > 0) {
      if (exp & 1)
        if (__builtin_mul_overflow(result, base, &result)) overflow();
      exp >>= 1;
      if (exp && __builtin_mul_overflow(base, base, &base)) overflow();
    }
    return Value::from_int(result);
  }

  // Python's arithmetic: exact integers (bool counts as int), floats, floor division and modulo
  // taking the sign of the divisor, errors on division by zero.
  Value arithmetic(const std::string& op, const Value& l, const Value& r) {
    if (l.is_integral() && r.is_integral()) {
      int64_t a = l.as_int(), b = r.as_int(), out = 0;
      if (op == "+") {
        if (__builtin_add_overflow(a, b, &out)) overflow();
        return Value::from_int(out);
      }
      if (op == "-") {
        if (__builtin_sub_overflow(a, b, &out)) overflow();
        return Value::from_int(out);
      }
      if (op == "*") {
        if (__builtin_mul_overflow(a, b, &out)) overflow();
        return Value::from_int(out);
      }
      if (op == "/") {
        if (b == 0) fail("ZeroDivisionError: division by zero");
        return Value::from_float(double(a) / double(b));
      }
      if (op == "//" || op == "%") {
        if (b == 0)
          fail(op == "%" ? "ZeroDivisionError: integer modulo by zero"
                         : "ZeroDivisionError: integer division or modulo by zero");
        if (b == -1) {  // INT64_MIN / -1 overflows, and its remainder is undefined in C++
          if (op == "%") return Value::from_int(0);
          if (a == INT64_MIN) overflow();
          return Value::from_int(-a);
        }
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) --q, m += b;
        return Value::from_int(op == "//" ? q : m);
      }
      if (op == "**") {
        if (b >= 0) return int_power(a, b);
        if (a == 0) fail("ZeroDivisionError: 0.0 cannot be raised to a negative power");
        return Value::from_float(std::pow(double(a), double(b)));
      }
    }
    double a = l.as_double(), b = r.as_double();
    if (op == "+") return Value::from_float(a + b);
    if (op == "-") return Value::from_float(a - b);
    if (op == "*") return Value::from_float(a * b);
    if (op == "/") {
      if (b == 0) fail("ZeroDivisionError: float division by zero");
      return Value::from_float(a / b);
    }
    if (op == "//" || op == "%") {
      if (b == 0)
        fail(std::string("ZeroDivisionError: float ") + (op == "%" ? "modulo" : "floor division") +
             " by zero");
      // CPython's float_divmod.
      double mod = std::fmod(a, b), div = (a - mod) / b;
      if (mod != 0) {
        if ((b < 0) != (mod < 0)) mod += b, div -= 1;
      } else {
        mod = std::copysign(0.0, b);
      }
      double floordiv = 0;
      if (div != 0) {
        floordiv = std::floor(div);
        if (div - floordiv > 0.5) floordiv += 1;
      } else {
        floordiv = std::copysign(0.0, a / b);
      }
      return Value::from_float(op == "%" ? mod : floordiv);
    }
    if (op == "**") {
      if (a == 0 && b < 0) fail("ZeroDivisionError: 0.0 cannot be raised to a negative power");
      if (a < 0 && b != std::trunc(b))
        fail("ValueError: a negative number raised to a fractional power is complex");
      double res = std::pow(a, b);
      if (std::isinf(res) && std::isfinite(a) && std::isfinite(b))
        fail("OverflowError: (34, 'Numerical result out of range')");
      return Value::from_float(res);
    }
    fail("unknown operator " + op);
  }

  Value repeat(const Value& seq, const Value& times) {
    int64_t n = std::max<int64_t>(times.as_int(), 0);
    if (seq.type == Type::kString) {
      if (n && seq.str.size() > limits.max_output_bytes / size_t(n)) check_size(SIZE_MAX);
      new_string(seq.str.size() * size_t(n));
      std::string out;
      for (int64_t i = 0; i < n; ++i) out += seq.str;
      return Value::from_string(std::move(out));
    }
    if (n && seq.array->size() > limits.max_loop_iterations / size_t(n))
      fail("list repetition exceeds " + std::to_string(limits.max_loop_iterations) + " items");
    charge_items(seq.array->size() * size_t(n));
    Array out;
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.array->begin(), seq.array->end());
    return Value::from_array(std::move(out), seq.type);
  }

  bool contains(const Value& needle, const Value& hay) {
    if (hay.type == Type::kString) {
      if (needle.type != Type::kString)
        fail(std::string("TypeError: 'in <string>' requires string as left operand, not ") +
             python_type(needle));
      return hay.str.find(needle.str) != std::string::npos;
    }
    if (hay.is_array()) {
      Sink k = sink();
      return std::any_of(hay.array->begin(), hay.array->end(),
                         [&](const Value& e) { return python_equal(e, needle, &k); });
    }
    if (hay.is_object()) return needle.type == Type::kString && hay.object->find(needle.str);
    if (hay.type == Type::kUndefined) return false;  // it iterates as empty
    fail(std::string("TypeError: argument of type '") + python_type(hay) + "' is not iterable");
  }

  static bool is_comparison(const std::string& op) {
    return op == "==" || op == "!=" || op == "<" || op == ">" || op == "<=" || op == ">=" ||
           op == "in" || op == "not in";
  }

  Value eval_binary(const Node& n, Scope& s) {
    const std::string& op = n.str;
    Value l = eval(*n.x, s);
    if (op == "and") return l.truthy() ? eval(*n.y, s) : l;
    if (op == "or") return l.truthy() ? l : eval(*n.y, s);
    // Python chains comparisons: a < b < c is (a < b) and (b < c), b evaluated again (pure).
    if (is_comparison(op) && n.x->kind == Kind::kBinary && !n.x->flag && is_comparison(n.x->str)) {
      if (!l.truthy()) return l;
      l = eval(*n.x->y, s);
    }
    Value r = eval(*n.y, s);
    if (op == "==") return Value::from_bool(equal(l, r));
    if (op == "!=") return Value::from_bool(!equal(l, r));
    if (op == "in") return Value::from_bool(contains(l, r));
    if (op == "not in") return Value::from_bool(!contains(l, r));
    if (op == "~") {  // str() of both; an undefined value is the empty string
      std::string out = text_of(l);
      out += text_of(r);
      new_string(out.size());
      return Value::from_string(std::move(out));
    }
    if (l.type == Type::kUndefined) fail_undefined(l);
    if (r.type == Type::kUndefined) fail_undefined(r);
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      Sink k = sink();
      int c = python_compare(l, r, op.c_str(), &k);
      return Value::from_bool(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    auto numeric = [](const Value& v) { return v.is_number() || v.type == Type::kBool; };
    if (numeric(l) && numeric(r)) return arithmetic(op, l, r);
    if (op == "+") {
      if (l.type == Type::kString && r.type == Type::kString) {
        new_string(l.str.size() + r.str.size());
        return Value::from_string(l.str + r.str);
      }
      if (l.is_array() && l.type == r.type) {
        if (l.array->size() + r.array->size() > limits.max_loop_iterations)
          fail("list concatenation exceeds " + std::to_string(limits.max_loop_iterations) +
               " items");
        charge_items(l.array->size() + r.array->size());
        Array a = *l.array;
        a.insert(a.end(), r.array->begin(), r.array->end());
        return Value::from_array(std::move(a), l.type);
      }
    }
    if (op == "*") {
      bool lseq = l.type == Type::kString || l.is_array(),
           rseq = r.type == Type::kString || r.is_array();
      if (lseq && r.is_integral()) return repeat(l, r);
      if (rseq && l.is_integral()) return repeat(r, l);
    }
    fail("TypeError: unsupported operand type(s) for " + op + ": '" + python_type(l) + "' and '" +
         python_type(r) + "'");
  }

  // ---------------------------------------------------------------------------------------------
  bool run_test(const std::string& name, const Value& v, const std::vector<Value>& args) {
    const Value* arg = args.empty() ? nullptr : &args[0];
    if (name == "boolean") return v.type == Type::kBool;
    if (name == "callable") return v.type == Type::kFunction;
    if (name == "odd" || name == "even") {
      if (!(v.is_number() || v.type == Type::kBool)) fail_type_for_test(name, v);
      // value % 2 == 1 (odd) or == 0 (even): 1.5 is neither.
      Value m = arithmetic("%", v, Value::from_int(2));
      double r = m.type == Type::kInt ? double(m.integer) : m.number;
      return name == "odd" ? r == 1 : r == 0;
    }
    if (name == "divisibleby") {
      if (!arg) fail("TypeError: test 'divisibleby' needs an argument");
      Value m = arithmetic("%", v, *arg);
      return m.type == Type::kInt ? m.integer == 0 : m.number == 0;
    }
    if (name == "false") return v.type == Type::kBool && !v.boolean;
    if (name == "true") return v.type == Type::kBool && v.boolean;
    if (name == "none") return v.type == Type::kNull;
    if (name == "string") return v.type == Type::kString;
    if (name == "number") return v.is_number() || v.type == Type::kBool;  // bool is a Number
    if (name == "integer") return v.type == Type::kInt;
    if (name == "float") return v.type == Type::kFloat;
    if (name == "iterable")
      return v.is_array() || v.is_container() || v.type == Type::kString ||
             v.type == Type::kUndefined;
    if (name == "mapping") return v.is_object();
    if (name == "sequence")
      return v.is_array() || v.is_object() || v.type == Type::kString || v.type == Type::kUndefined;
    if (name == "lower" || name == "upper") {
      // str.islower()/isupper(): some cased character, and none of the other case.
      std::string t = text_of(v);
      bool lower = to_lower(t) == t, upper = to_upper(t) == t;
      return name == "lower" ? lower && !upper : upper && !lower;
    }
    if (name == "defined") return v.type != Type::kUndefined;
    if (name == "undefined") return v.type == Type::kUndefined;
    if (name == "in") {
      if (!arg) fail("TypeError: test 'in' needs an argument");
      return contains(v, *arg);
    }
    if (name == "sameas") {
      if (!arg) fail("TypeError: test 'sameas' needs an argument");
      if (v.type != arg->type) return false;
      if (v.is_array()) return v.array == arg->array;
      if (v.is_container()) return v.object == arg->object;
      return equal(v, *arg);  // None, True, small ints and interned strings are the same object
    }
    static const std::pair<const char*, const char*> kCompare[] = {
        {"eq", "=="}, {"equalto", "=="},    {"==", "=="}, {"ne", "!="}, {"!=", "!="},
        {"lt", "<"},  {"lessthan", "<"},    {"<", "<"},   {"le", "<="}, {"<=", "<="},
        {"gt", ">"},  {"greaterthan", ">"}, {">", ">"},   {"ge", ">="}, {">=", ">="}};
    for (const auto& [test, op] : kCompare) {
      if (name != test) continue;
      if (!arg) fail(std::string("TypeError: test '") + test + "' needs an argument");
      std::string o = op;
      if (o == "==") return equal(v, *arg);
      if (o == "!=") return !equal(v, *arg);
      Sink k = sink();
      int c = python_compare(v, *arg, op, &k);
      return o == "<" ? c < 0 : o == "<=" ? c <= 0 : o == ">" ? c > 0 : c >= 0;
    }
    fail("TemplateAssertionError: no test named '" + name + "' (supported: " + kTests + ")");
  }

  [[noreturn]] void fail_type_for_test(const std::string& name, const Value& v) {
    if (v.type == Type::kUndefined) fail_undefined(v);
    fail(std::string("TypeError: test '") + name + "' on a '" + python_type(v) + "' value");
  }

  // ---------------------------------------------------------------------------------------------
  Value apply_filter(const Value& v, const Node& f, Scope& s) {
    if (f.kind == Kind::kIdent) {
      std::vector<Value> none;
      return filter(v, f.str, none);
    }
    if (f.x->kind != Kind::kIdent) fail("a filter must be a name");
    std::vector<Value> args = eval_args(f.args, s);
    return filter(v, f.x->str, args);
  }

  // Items of what a filter iterates (lists, dict keys, string characters, undefined as empty).
  Array items_of(const Value& v, const std::string& filter_name) {
    return iteration_items(v, ("filter '" + filter_name + "'").c_str());
  }

  // Jinja2's select/reject family: the item (or its attribute) passed to a test, or its truth.
  Array select(const Array& items, bool keep, const Value* attribute,
               const std::vector<Value>& args, size_t first_test_arg) {
    Array out;
    std::string test;
    if (args.size() > first_test_arg) {
      if (args[first_test_arg].type != Type::kString)
        fail("TypeError: a test name must be a string");
      test = args[first_test_arg].str;
    }
    std::vector<Value> test_args;
    for (size_t i = first_test_arg + 1; i < args.size(); ++i) test_args.push_back(args[i]);
    for (const Value& e : items) {
      Value x = attribute ? attribute_path(e, attribute->str) : e;
      bool r = test.empty() ? x.truthy() : run_test(test, x, test_args);
      if (r == keep) out.push_back(e);
    }
    return out;
  }

  JsonOptions json_options(const std::vector<Value>& args) {
    // Transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
    size_t np = positional_count(args);
    auto arg = [&](size_t i, const char* kw) { return np > i ? args[i] : kwargs_get(args, kw); };
    JsonOptions opt;
    Value ascii = arg(0, "ensure_ascii"), indent = arg(1, "indent"), seps = arg(2, "separators"),
          sort = arg(3, "sort_keys");
    opt.ensure_ascii = ascii.truthy();
    opt.sort_keys = sort.truthy();
    if (indent.is_integral()) {  // a negative indent still breaks lines, with no spaces
      opt.indent = int(std::clamp<int64_t>(indent.as_int(), 0, 1 << 20));
    } else if (indent.type == Type::kString) {
      fail("tojson: a string indent is not supported; pass a number of spaces");
    } else if (indent.type != Type::kUndefined && indent.type != Type::kNull) {
      fail("TypeError: tojson: indent must be an integer or None");
    }
    if (seps.is_array()) {
      if (seps.array->size() != 2 || (*seps.array)[0].type != Type::kString ||
          (*seps.array)[1].type != Type::kString)
        fail("tojson: separators must be a pair of strings (item separator, key separator)");
      opt.has_separators = true;
      opt.item_sep = (*seps.array)[0].str;
      opt.key_sep = (*seps.array)[1].str;
    } else if (seps.type != Type::kUndefined && seps.type != Type::kNull) {
      fail("tojson: separators must be a pair of strings (item separator, key separator)");
    }
    return opt;
  }

  Value filter(const Value& v, const std::string& name, std::vector<Value>& args) {
    size_t np = positional_count(args);
    auto arg = [&](size_t i, const char* kw) { return np > i ? args[i] : kwargs_get(args, kw); };
    auto text = [&](const Value& x) { return Value::from_string(text_of(x)); };
    if (name == "tojson") {
      Sink k = sink();
      write_json(k, v, json_options(args));
      charge(k.out.size());
      return Value::from_string(std::move(k.out));
    }
    if (name == "safe" || name == "string") return text(v);
    if (name == "default" || name == "d") {
      Value def = arg(0, "default_value");
      if (def.type == Type::kUndefined && np == 0) def = Value::from_string("");
      bool boolean = arg(1, "boolean").truthy();
      if (v.type == Type::kUndefined || (boolean && !v.truthy())) return def;
      return v;
    }
    if (name == "length" || name == "count") {
      if (v.type == Type::kString) return Value::from_int(int64_t(code_point_count(v.str)));
      if (v.is_array()) return Value::from_int(int64_t(v.array->size()));
      if (v.is_container()) return Value::from_int(int64_t(v.object->items.size()));
      if (v.type == Type::kUndefined) return Value::from_int(0);
      fail(std::string("TypeError: object of type '") + python_type(v) + "' has no len()");
    }
    if (name == "int") {
      Value def = arg(0, "default");
      if (def.type == Type::kUndefined) def = Value::from_int(0);
      if (v.is_integral()) return Value::from_int(v.as_int());
      if (v.type == Type::kUndefined) fail_undefined(v);
      double d = 0;
      if (v.type == Type::kString) {
        int64_t i = 0;
        if (python_int(v.str, i)) return Value::from_int(i);
        if (!python_float_parse(v.str, d)) return def;
      } else if (v.type == Type::kFloat) {
        d = v.number;
      } else {
        return def;
      }
      if (std::isnan(d) || std::isinf(d)) return def;
      if (d >= 9223372036854775808.0 || d < -9223372036854775808.0) overflow();
      return Value::from_int(int64_t(d));  // int() truncates toward zero
    }
    if (name == "float") {
      Value def = arg(0, "default");
      if (def.type == Type::kUndefined) def = Value::from_float(0);
      if (v.is_number() || v.type == Type::kBool) return Value::from_float(v.as_double());
      if (v.type == Type::kUndefined) fail_undefined(v);
      double d = 0;
      if (v.type == Type::kString && python_float_parse(v.str, d)) return Value::from_float(d);
      return def;
    }
    if (name == "abs") {
      if (v.type == Type::kFloat) return Value::from_float(std::fabs(v.number));
      if (v.is_integral()) {
        if (v.as_int() == INT64_MIN) overflow();
        return Value::from_int(std::abs(v.as_int()));
      }
      if (v.type == Type::kUndefined) fail_undefined(v);
      fail(std::string("TypeError: bad operand type for abs(): '") + python_type(v) + "'");
    }
    if (name == "upper") return Value::from_string(to_upper(text_of(v)));
    if (name == "lower") return Value::from_string(to_lower(text_of(v)));
    if (name == "capitalize") return Value::from_string(capitalize(text_of(v)));
    if (name == "title") return Value::from_string(title_filter(text_of(v)));
    if (name == "trim") {
      std::string t = text_of(v);
      Value chars = arg(0, "chars");
      if (chars.type == Type::kString)
        return Value::from_string(strip_chars(t, chars.str, true, true));
      return Value::from_string(trim(t));
    }
    if (name == "replace") {  // do_replace(s, old, new, count=None): count may be a keyword
      Value str = text(v);
      std::vector<Value> positional(args.begin(), args.begin() + np);
      Value count = arg(2, "count");
      if (np < 3 && count.type != Type::kUndefined && count.type != Type::kNull)
        positional.push_back(count);
      Value fn = string_method(str, "replace");
      return (*fn.function)(positional, *this);
    }
    if (name == "indent") {
      Value width = arg(0, "width"), first = arg(1, "first"), blank = arg(2, "blank");
      std::string pad;
      if (width.type == Type::kString)
        pad = width.str;
      else if (width.is_integral())
        pad = std::string(size_t(std::clamp<int64_t>(width.as_int(), 0, 1024)), ' ');
      else if (width.type == Type::kUndefined)
        pad = "    ";
      else
        fail("TypeError: indent: width must be an integer or a string");
      std::string out = indent(text_of(v), pad, first.truthy(), blank.truthy());
      new_string(out.size());
      return Value::from_string(std::move(out));
    }
    if (name == "join") {
      Value sep = arg(0, "d"), attr = arg(1, "attribute");
      if (sep.type == Type::kUndefined) sep = Value::from_string("");
      std::string d = text_of(sep), out;
      Array parts = items_of(v, name);
      for (size_t i = 0; i < parts.size(); ++i) {
        if (i) out += d;
        out += text_of(attr.type == Type::kString ? attribute_path(parts[i], attr.str) : parts[i]);
        check_size(out.size());
      }
      charge(out.size());
      return Value::from_string(std::move(out));
    }
    if (name == "first" || name == "last") {
      Array a = items_of(v, name);
      if (a.empty())
        return Value::undefined(std::string("No ") + name + " item, sequence was empty.");
      return name == "first" ? a.front() : a.back();
    }
    if (name == "list") {
      Array a = items_of(v, name);
      return Value::from_array(std::move(a));
    }
    if (name == "reverse") {
      if (v.type == Type::kString) {
        std::vector<std::string> cps = code_points(v.str);
        std::string out;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
        return Value::from_string(std::move(out));
      }
      Array a = items_of(v, name);
      return Value::from_array(Array(a.rbegin(), a.rend()));
    }
    if (name == "sort") {
      bool reverse = arg(0, "reverse").truthy(), case_sensitive = arg(1, "case_sensitive").truthy();
      Value attr = arg(2, "attribute");
      Array out = items_of(v, name);
      std::string path = attr.type == Type::kString ? attr.str
                         : attr.is_integral()       ? std::to_string(attr.as_int())
                                                    : "";
      auto key = [&](const Value& e) { return path.empty() ? e : attribute_path(e, path); };
      Sink k = sink();
      std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
        int c = compare_values(key(x), key(y), case_sensitive, &k);
        return reverse ? c > 0 : c < 0;
      });
      return Value::from_array(std::move(out));
    }
    if (name == "dictsort") {
      if (!v.is_object()) {
        if (v.type == Type::kUndefined) fail_undefined(v);
        fail("TypeError: dictsort: the value must be a dict");
      }
      bool case_sensitive = arg(0, "case_sensitive").truthy();
      Value by = arg(1, "by");
      bool reverse = arg(2, "reverse").truthy();
      bool by_value = by.type == Type::kString && by.str == "value";
      if (by.type != Type::kUndefined &&
          !(by.type == Type::kString && (by.str == "key" || by_value)))
        fail("FilterArgumentError: You can only sort by either \"key\" or \"value\"");
      Array out;
      for (const auto& e : v.object->items) out.push_back(pair(e.first, e.second));
      Sink k = sink();
      std::stable_sort(out.begin(), out.end(), [&](const Value& a, const Value& b) {
        size_t i = by_value ? 1 : 0;
        int c = compare_values((*a.array)[i], (*b.array)[i], case_sensitive, &k);
        return reverse ? c > 0 : c < 0;
      });
      return Value::from_array(std::move(out));
    }
    if (name == "items") {
      if (v.type == Type::kUndefined) return Value::from_array({});
      if (!v.is_object()) fail("TypeError: Can only get item pairs from a mapping.");
      return (*object_method(v, "items").function)(args, *this);
    }
    if (name == "unique") {
      bool case_sensitive = arg(0, "case_sensitive").truthy();
      Value attr = arg(1, "attribute");
      Array out, seen;
      Sink k = sink();
      for (const Value& e : items_of(v, name)) {
        Value key = attr.type == Type::kString ? attribute_path(e, attr.str) : e;
        if (!case_sensitive && key.type == Type::kString)
          key = Value::from_string(to_lower(key.str));
        if (std::none_of(seen.begin(), seen.end(),
                         [&](const Value& o) { return python_equal(o, key, &k); })) {
          seen.push_back(key);
          out.push_back(e);
        }
      }
      return Value::from_array(std::move(out));
    }
    if (name == "selectattr" || name == "rejectattr") {
      if (np == 0) fail("TypeError: " + name + " needs an attribute name");
      if (args[0].type != Type::kString) fail(name + ": the attribute name must be a string");
      return Value::from_array(select(items_of(v, name), name == "selectattr", &args[0], args, 1));
    }
    if (name == "select" || name == "reject")
      return Value::from_array(select(items_of(v, name), name == "select", nullptr, args, 0));
    if (name == "map") {
      Array items = items_of(v, name), out;
      Value attr = kwargs_get(args, "attribute");
      if (attr.type != Type::kUndefined) {
        if (attr.type != Type::kString && !attr.is_integral())
          fail("map: attribute must be a string");
        std::string path = attr.type == Type::kString ? attr.str : std::to_string(attr.as_int());
        Value def = kwargs_get(args, "default");
        for (const Value& e : items) {
          Value r = attribute_path(e, path);
          out.push_back(r.type == Type::kUndefined && def.type != Type::kUndefined ? def : r);
        }
        return Value::from_array(std::move(out));
      }
      if (np == 0 || args[0].type != Type::kString)
        fail("map: pass a filter name (map('upper')) or attribute='name'");
      std::vector<Value> rest(args.begin() + 1, args.end());
      for (const Value& e : items) {
        std::vector<Value> a = rest;
        out.push_back(filter(e, args[0].str, a));
      }
      return Value::from_array(std::move(out));
    }
    if (name == "sum") {
      Value attr = arg(0, "attribute"), total = arg(1, "start");
      if (total.type == Type::kUndefined) total = Value::from_int(0);
      for (const Value& e : items_of(v, name)) {
        Value x = attr.type == Type::kString ? attribute_path(e, attr.str) : e;
        bool numeric = (x.is_number() || x.type == Type::kBool) &&
                       (total.is_number() || total.type == Type::kBool);
        if (!numeric)
          fail(std::string("TypeError: unsupported operand type(s) for +: '") + python_type(total) +
               "' and '" + python_type(x) + "'");
        total = arithmetic("+", total, x);
      }
      return total;
    }
    if (name == "min" || name == "max") {
      bool case_sensitive = arg(0, "case_sensitive").truthy();
      Value attr = arg(1, "attribute");
      Array a = items_of(v, name);
      if (a.empty()) return Value::undefined("No aggregated item, sequence was empty.");
      Sink k = sink();
      Value best = a[0];
      for (size_t i = 1; i < a.size(); ++i) {
        auto key = [&](const Value& e) {
          return attr.type == Type::kString ? attribute_path(e, attr.str) : e;
        };
        int c = compare_values(key(a[i]), key(best), case_sensitive, &k);
        if (name == "min" ? c < 0 : c > 0) best = a[i];
      }
      return best;
    }
    if (name == "round") {
      Value precision = arg(0, "precision"), method = arg(1, "method");
      int64_t digits = precision.is_integral() ? precision.as_int() : 0;
      std::string how = method.type == Type::kString ? method.str : "common";
      if (how != "common" && how != "floor" && how != "ceil")
        fail("FilterArgumentError: method must be common, ceil or floor");
      if (!(v.is_number() || v.type == Type::kBool)) {
        if (v.type == Type::kUndefined) fail_undefined(v);
        fail(std::string("TypeError: type ") + python_type(v) + " doesn't define __round__ method");
      }
      double x = v.as_double();
      if (!std::isfinite(x)) return Value::from_float(x);
      digits = std::clamp<int64_t>(digits, -308, 308);
      if (how == "common" && v.is_integral()) {  // round(int, n) stays an int
        if (digits >= 0) return Value::from_int(v.as_int());
        double scale = std::pow(10.0, double(-digits));
        return Value::from_int(int64_t(std::nearbyint(x / scale) * scale));
      }
      if (how == "common") {
        if (digits >= 0) {
          // printf rounds the exact binary value half-to-even, as Python's round(x, n) does.
          char buf[512];
          std::snprintf(buf, sizeof buf, "%.*f", int(digits), x);
          return Value::from_float(std::strtod(buf, nullptr));
        }
        double scale = std::pow(10.0, double(-digits));
        return Value::from_float(std::nearbyint(x / scale) * scale);
      }
      double scale = std::pow(10.0, double(digits));
      return Value::from_float((how == "floor" ? std::floor(x * scale) : std::ceil(x * scale)) /
                               scale);
    }
    if (name == "escape" || name == "e" || name == "forceescape") {
      std::string out;
      for (char c : text_of(v)) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out.push_back(c);
        }
      }
      new_string(out.size());
      return Value::from_string(std::move(out));
    }
    if (name == "wordcount") {
      std::string t = text_of(v);
      int64_t words = 0;
      bool in_word = false;
      for (const std::string& cp : code_points(t)) {
        bool w = cp.size() > 1 || std::isalnum(uint8_t(cp[0])) || cp[0] == '_';
        if (w && !in_word) ++words;
        in_word = w;
      }
      return Value::from_int(words);
    }
    fail("TemplateAssertionError: no filter named '" + name + "' (supported: " + kFilters + ")");
  }

  // Jinja2's indent filter: every line after the first (and the first with first=True) gets the
  // padding; blank lines only with blank=True. Lines end at \n, \r\n, \r and the other
  // str.splitlines boundaries.
  static std::string indent(const std::string& s, const std::string& pad, bool first, bool blank) {
    std::vector<std::string> lines;
    std::string line;
    std::vector<std::string> cps = code_points(s);
    for (size_t i = 0; i < cps.size(); ++i) {
      const std::string& c = cps[i];
      bool brk = c == "\n" || c == "\r" || c == "\x0b" || c == "\x0c" || c == "\x1c" ||
                 c == "\x1d" || c == "\x1e" || c == "\xc2\x85" || c == "\xe2\x80\xa8" ||
                 c == "\xe2\x80\xa9";
      if (!brk) {
        line += c;
        continue;
      }
      if (c == "\r" && i + 1 < cps.size() && cps[i + 1] == "\n") ++i;
      lines.push_back(line);
      line.clear();
    }
    lines.push_back(line);  // s + "\n" split: the text after the last break is a line
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) out += '\n';
      bool padded = i == 0 ? first : blank || !lines[i].empty();
      if (padded) out += pad;
      out += lines[i];
    }
    return out;
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
  // dict(*args, **kwargs), which Transformers' namespace() and dict() both build from.
  auto make_dict = [](std::vector<Value>& args, const char* what) {
    auto d = std::make_shared<Object>();
    size_t np = positional_count(args);
    if (np > 1)
      fail(std::string("TypeError: ") + what + " expected at most 1 argument, got " +
           std::to_string(np));
    if (np == 1) {
      const Value& src = args[0];
      if (src.is_container()) {
        for (const auto& kv : src.object->items) d->set(kv.first, kv.second);
      } else if (src.is_array()) {
        for (const Value& pair : *src.array) {
          if (!pair.is_array() || pair.array->size() != 2 || (*pair.array)[0].type != Type::kString)
            fail(std::string("ValueError: ") + what + " expects a dict or (key, value) pairs");
          d->set((*pair.array)[0].str, (*pair.array)[1]);
        }
      } else if (src.type != Type::kUndefined) {
        fail(std::string("TypeError: '") + python_type(src) + "' object is not iterable");
      }
    }
    if (np < args.size())
      for (const auto& kv : args.back().object->items) d->set(kv.first, kv.second);
    return d;
  };
  root.set("namespace", Value::from_function([make_dict](std::vector<Value>& args, Interpreter&) {
             auto ns = make_dict(args, "namespace()");
             for (const auto& kv : ns->items) check_namespace_name(kv.first);
             return Value::from_object(std::move(ns), Type::kNamespace);
           }));
  root.set("dict", Value::from_function([make_dict](std::vector<Value>& args, Interpreter&) {
             return Value::from_object(make_dict(args, "dict()"));
           }));
  root.set("false", Value::from_bool(false));
  root.set("true", Value::from_bool(true));
  root.set("none", Value::null());
  root.set("False", Value::from_bool(false));
  root.set("True", Value::from_bool(true));
  root.set("None", Value::null());
  root.set("raise_exception",
           Value::from_function([](std::vector<Value>& args, Interpreter&) -> Value {
             JinjaError e{args.empty() ? std::string("") : python_str(args[0])};
             e.raised = true;
             throw e;
           }));
  // The sandbox's range(): integers only, and at most 100000 items (its MAX_RANGE).
  root.set("range", Value::from_function([](std::vector<Value>& args, Interpreter& in) {
             size_t np = positional_count(args);
             if (np < args.size()) fail("TypeError: range() takes no keyword arguments");
             if (np == 0 || np > 3)
               fail("TypeError: range expected 1 to 3 arguments, got " + std::to_string(np));
             for (size_t i = 0; i < np; ++i)
               if (!args[i].is_integral())
                 fail(std::string("TypeError: '") + python_type(args[i]) +
                      "' object cannot be interpreted as an integer");
             int64_t start = np > 1 ? args[0].as_int() : 0,
                     stop = np > 1 ? args[1].as_int() : args[0].as_int();
             int64_t step = np > 2 ? args[2].as_int() : 1;
             if (step == 0) fail("ValueError: range() arg 3 must not be zero");
             // The count in floating point: stop - start can overflow int64.
             double count = std::max(0.0, std::ceil((double(stop) - double(start)) / double(step)));
             if (count > 100000)
               fail(
                   "OverflowError: Range too big. The sandbox blocks ranges larger than "
                   "MAX_RANGE (100000).");
             in.charge_items(size_t(count));
             Array out;
             for (int64_t i = 0; i < int64_t(count); ++i)
               out.push_back(Value::from_int(start + i * step));
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
