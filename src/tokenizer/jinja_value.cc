// Values of the chat-template engine and the Python conversions Jinja2 applies to them (str(),
// repr(), float formatting, Transformers' json.dumps tojson, ==, ordering, str.isspace).
#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/jinja_internal.h"

namespace tformers::jinja {

const char* type_name(Type t) {
  Value v;
  v.type = t;
  return python_type(v);
}

const Value* Object::find(const std::string& key) const {
  auto it = index.find(key);
  return it == index.end() ? nullptr : &items[it->second].second;
}

void Object::set(const std::string& key, Value value) {
  auto it = index.find(key);
  if (it != index.end()) {
    items[it->second].second = std::move(value);  // a Map keeps the first insertion position
    return;
  }
  index.emplace(key, items.size());
  items.emplace_back(key, std::move(value));
}

Value Value::null() {
  Value v;
  v.type = Type::kNull;
  return v;
}
Value Value::from_bool(bool b) {
  Value v;
  v.type = Type::kBool;
  v.boolean = b;
  return v;
}
Value Value::undefined(std::string why) {
  Value v;
  v.str = std::move(why);
  return v;
}
Value Value::from_int(int64_t x) {
  Value v;
  v.type = Type::kInt;
  v.integer = x;
  return v;
}
Value Value::from_float(double x) {
  Value v;
  v.type = Type::kFloat;
  v.number = x;
  return v;
}
Value Value::from_string(std::string s) {
  Value v;
  v.type = Type::kString;
  v.str = std::move(s);
  return v;
}
Value Value::from_array(Array a, Type t) {
  Value v;
  v.type = t;
  v.array = std::make_shared<const Array>(std::move(a));
  return v;
}
Value Value::from_object(std::shared_ptr<Object> o, Type t) {
  Value v;
  v.type = t;
  v.object = std::move(o);
  return v;
}
Value Value::from_function(Function f) {
  Value v;
  v.type = Type::kFunction;
  v.function = std::make_shared<const Function>(std::move(f));
  return v;
}

bool Value::truthy() const {
  switch (type) {
    case Type::kUndefined:
    case Type::kNull:
      return false;
    case Type::kBool:
      return boolean;
    case Type::kInt:
      return integer != 0;
    case Type::kFloat:
      return number != 0;  // NaN is true in Python
    case Type::kString:
      return !str.empty();
    case Type::kArray:
    case Type::kTuple:
      return !array->empty();
    case Type::kObject:
    case Type::kKwargs:
      return !object->items.empty();
    case Type::kNamespace:  // an object without __len__ or __bool__ is true
    case Type::kFunction:
      return true;
  }
  return false;
}

template <typename Json>
Value value_from_json(const Json& j, int max_depth) {
  if (max_depth < 0) fail("a context value nests too deeply");
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::null();
    case nlohmann::json::value_t::boolean:
      return Value::from_bool(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::from_int(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > uint64_t(INT64_MAX))
        fail("context integer " + std::to_string(u) +
             " is outside the 64-bit range the template engine supports");
      return Value::from_int(int64_t(u));
    }
    case nlohmann::json::value_t::number_float:  // json.loads keeps 2.0 a float, as here
      return Value::from_float(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::from_string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(value_from_json(e, max_depth - 1));
      return Value::from_array(std::move(a));
    }
    case nlohmann::json::value_t::object: {
      auto o = std::make_shared<Object>();
      for (auto it = j.begin(); it != j.end(); ++it)
        o->set(it.key(), value_from_json(it.value(), max_depth - 1));
      return Value::from_object(std::move(o));
    }
    default:
      return Value::undefined();  // binary and discarded values have no template meaning
  }
}
template Value value_from_json(const nlohmann::json&, int);
template Value value_from_json(const nlohmann::ordered_json&, int);

Node::~Node() {
  std::vector<std::unique_ptr<Node>> pending;
  auto take = [&pending](Node& n) {
    for (auto* c : {&n.x, &n.y, &n.z})
      if (*c) pending.push_back(std::move(*c));
    for (auto* v : {&n.args, &n.body, &n.alt}) {
      for (auto& c : *v)
        if (c) pending.push_back(std::move(c));
      v->clear();
    }
  };
  take(*this);
  while (!pending.empty()) {
    std::unique_ptr<Node> n = std::move(pending.back());
    pending.pop_back();
    take(*n);  // n is destroyed here without children
  }
}

void Sink::grown() const {
  fail("a value converts to more than " + std::to_string(limit) +
       " bytes of text (the output or memory budget: max_output_bytes, max_memory_bytes)");
}

void Sink::step() {
  if (steps && ++*steps > max_steps)
    fail("template exceeds its step budget (max_steps) of " + std::to_string(max_steps) +
         " evaluation steps");
}

// repr(float): the shortest digits that round-trip, in fixed notation when the decimal exponent
// is in [-4, 16) (always with a fractional part: 2.0), in exponent notation outside (1e+16).
std::string python_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  std::string sign = v < 0 ? "-" : "";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, std::fabs(v), std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // d[.ddd]e±x
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exp10 = std::stoi(sci.substr(e + 1));  // value = d.ddd × 10^exp10
  int k = int(digits.size());
  std::string out;
  if (exp10 >= 16 || exp10 < -4) {
    out = digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += ebuf;
  } else if (exp10 < 0) {
    out = "0." + std::string(-exp10 - 1, '0') + digits;
  } else if (k <= exp10 + 1) {
    out = digits + std::string(exp10 + 1 - k, '0') + ".0";
  } else {
    out = digits.substr(0, exp10 + 1) + "." + digits.substr(exp10 + 1);
  }
  return sign + out;
}

const char* python_type(const Value& v) {
  switch (v.type) {
    case Type::kUndefined:
      return "Undefined";
    case Type::kNull:
      return "NoneType";
    case Type::kBool:
      return "bool";
    case Type::kInt:
      return "int";
    case Type::kFloat:
      return "float";
    case Type::kString:
      return "str";
    case Type::kArray:
      return "list";
    case Type::kTuple:
      return "tuple";
    case Type::kObject:
    case Type::kKwargs:
      return "dict";
    case Type::kNamespace:
      return "Namespace";
    case Type::kFunction:
      return "function";
  }
  return "?";
}

namespace {

uint32_t decode_at(std::string_view s, size_t i, size_t& len) {
  unsigned char c = s[i];
  len = 1;
  if (c < 0x80) return c;
  uint32_t cp;
  if (c >= 0xF0)
    cp = c & 0x07, len = 4;
  else if (c >= 0xE0)
    cp = c & 0x0F, len = 3;
  else if (c >= 0xC0)
    cp = c & 0x1F, len = 2;
  else
    return 0xFFFD;
  if (i + len > s.size()) {
    len = 1;
    return 0xFFFD;
  }
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
  return cp;
}

// Whether repr() shows the code point as is: Python's str.isprintable (not a control, format,
// surrogate, private-use, unassigned or separator character other than the space).
bool printable(uint32_t cp) {
  if (cp == ' ') return true;
  if (cp < 0x20 || cp == 0x7F) return false;
  if (cp < 0x7F) return true;
  switch (u_charType(UChar32(cp))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_SPACE_SEPARATOR:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
      return false;
    default:
      return true;
  }
}

// repr(str): single quotes unless the text holds a single quote and no double quote.
void repr_string(Sink& sink, std::string_view s) {
  bool squote = s.find('\'') != std::string_view::npos;
  char q = squote && s.find('"') == std::string_view::npos ? '"' : '\'';
  sink.push(q);
  static const char* kHex = "0123456789abcdef";
  for (size_t i = 0; i < s.size();) {
    size_t len;
    uint32_t cp = decode_at(s, i, len);
    if (cp == uint32_t(q) || cp == '\\') {
      sink.push('\\');
      sink.push(char(cp));
    } else if (cp == '\n') {
      sink.append("\\n");
    } else if (cp == '\r') {
      sink.append("\\r");
    } else if (cp == '\t') {
      sink.append("\\t");
    } else if (printable(cp)) {
      sink.append(s.substr(i, len));
    } else {
      int digits = cp < 0x100 ? 2 : cp < 0x10000 ? 4 : 8;
      sink.append(digits == 2 ? "\\x" : digits == 4 ? "\\u" : "\\U");
      for (int shift = (digits - 1) * 4; shift >= 0; shift -= 4)
        sink.push(kHex[(cp >> shift) & 15]);
    }
    i += len;
  }
  sink.push(q);
}

// json.dumps of a string: with ensure_ascii=False only quotes, backslashes and control characters
// are escaped; with ensure_ascii=True everything outside space..~ (surrogate pairs above U+FFFF).
void json_quote(Sink& sink, std::string_view s, bool ensure_ascii) {
  static const char* kHex = "0123456789abcdef";
  sink.push('"');
  auto unit = [&](uint32_t u) {
    sink.append("\\u");
    for (int shift = 12; shift >= 0; shift -= 4) sink.push(kHex[(u >> shift) & 15]);
  };
  for (size_t i = 0; i < s.size();) {
    size_t len;
    uint32_t cp = decode_at(s, i, len);
    switch (cp) {
      case '"':
        sink.append("\\\"");
        break;
      case '\\':
        sink.append("\\\\");
        break;
      case '\b':
        sink.append("\\b");
        break;
      case '\f':
        sink.append("\\f");
        break;
      case '\n':
        sink.append("\\n");
        break;
      case '\r':
        sink.append("\\r");
        break;
      case '\t':
        sink.append("\\t");
        break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp > 0x7E)) {
          if (cp >= 0x10000) {
            unit(0xD800 + ((cp - 0x10000) >> 10));
            unit(0xDC00 + ((cp - 0x10000) & 0x3FF));
          } else {
            unit(cp);
          }
        } else {
          sink.append(s.substr(i, len));
        }
    }
    i += len;
  }
  sink.push('"');
}

void check_depth(const Sink& sink, int depth) {
  if (depth > sink.max_depth)
    fail("a value nests deeper than " + std::to_string(sink.max_depth) + " levels");
}

}  // namespace

void write_repr(Sink& sink, const Value& v, int depth) {
  sink.step();
  check_depth(sink, depth);
  switch (v.type) {
    case Type::kString:
      return repr_string(sink, v.str);
    case Type::kUndefined:
      return sink.append("Undefined");
    case Type::kArray:
    case Type::kTuple: {
      bool tuple = v.type == Type::kTuple;
      sink.push(tuple ? '(' : '[');
      for (size_t i = 0; i < v.array->size(); ++i) {
        if (i) sink.append(", ");
        write_repr(sink, (*v.array)[i], depth + 1);
      }
      if (tuple && v.array->size() == 1) sink.push(',');
      return sink.push(tuple ? ')' : ']');
    }
    case Type::kObject:
    case Type::kKwargs:
    case Type::kNamespace: {
      if (v.type == Type::kNamespace) sink.append("<Namespace ");
      sink.push('{');
      bool first = true;
      for (const auto& [key, value] : v.object->items) {
        if (!first) sink.append(", ");
        first = false;
        repr_string(sink, key);
        sink.append(": ");
        write_repr(sink, value, depth + 1);
      }
      sink.push('}');
      if (v.type == Type::kNamespace) sink.push('>');
      return;
    }
    default:
      return write_str(sink, v);
  }
}

void write_str(Sink& sink, const Value& v) {
  switch (v.type) {
    case Type::kUndefined:
      return;  // str(Undefined) is empty
    case Type::kNull:
      return sink.append("None");
    case Type::kBool:
      return sink.append(v.boolean ? "True" : "False");
    case Type::kInt:
      return sink.append(std::to_string(v.integer));
    case Type::kFloat:
      return sink.append(python_float(v.number));
    case Type::kString:
      return sink.append(v.str);
    case Type::kFunction:
      return sink.append("<function>");
    default:
      return write_repr(sink, v);
  }
}

std::string python_str(const Value& v) {
  if (v.type == Type::kString) return v.str;
  Sink sink;
  write_str(sink, v);
  return std::move(sink.out);
}

void write_json(Sink& sink, const Value& v, const JsonOptions& opt, int depth) {
  sink.step();
  check_depth(sink, depth);
  // json.dumps: ", " and ": " on one line; with an indent, "," ends the line instead.
  std::string_view item_sep = opt.indent >= 0 ? "," : ", ", key_sep = ": ";
  if (opt.has_separators) item_sep = opt.item_sep, key_sep = opt.key_sep;
  auto newline = [&](int level) {
    sink.push('\n');
    for (int i = 0; i < level * opt.indent; ++i) sink.push(' ');
  };
  switch (v.type) {
    case Type::kNull:
      return sink.append("null");
    case Type::kBool:
      return sink.append(v.boolean ? "true" : "false");
    case Type::kInt:
      return sink.append(std::to_string(v.integer));
    case Type::kFloat:  // float.__repr__, and allow_nan's NaN, Infinity, -Infinity
      if (std::isnan(v.number)) return sink.append("NaN");
      if (std::isinf(v.number)) return sink.append(v.number > 0 ? "Infinity" : "-Infinity");
      return sink.append(python_float(v.number));
    case Type::kString:
      return json_quote(sink, v.str, opt.ensure_ascii);
    case Type::kArray:
    case Type::kTuple: {  // a tuple is a JSON array too
      const Array& a = *v.array;
      sink.push('[');
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) sink.append(item_sep);
        if (opt.indent >= 0) newline(depth + 1);
        write_json(sink, a[i], opt, depth + 1);
      }
      if (opt.indent >= 0 && !a.empty()) newline(depth);
      return sink.push(']');
    }
    case Type::kObject:
    case Type::kKwargs: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& kv : v.object->items) entries.push_back(&kv);
      if (opt.sort_keys)  // UTF-8 byte order is code point order, as Python sorts str
        std::sort(entries.begin(), entries.end(),
                  [](auto* a, auto* b) { return a->first < b->first; });
      sink.push('{');
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) sink.append(item_sep);
        if (opt.indent >= 0) newline(depth + 1);
        json_quote(sink, entries[i]->first, opt.ensure_ascii);
        sink.append(key_sep);
        write_json(sink, entries[i]->second, opt, depth + 1);
      }
      if (opt.indent >= 0 && !entries.empty()) newline(depth);
      return sink.push('}');
    }
    default:
      fail(std::string("TypeError: tojson: Object of type ") + python_type(v) +
           " is not JSON serializable");
  }
}

bool python_equal(const Value& a, const Value& b, Sink* sink) {
  if (sink) sink->step();
  bool an = a.is_number() || a.type == Type::kBool, bn = b.is_number() || b.type == Type::kBool;
  if (an && bn) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    // An int and a float compare exactly (2**53 + 1 != 2.0**53), as in Python.
    if (a.type == Type::kFloat && b.type == Type::kFloat) return a.number == b.number;
    const Value& f = a.type == Type::kFloat ? a : b;
    const Value& i = a.type == Type::kFloat ? b : a;
    if (!std::isfinite(f.number) || f.number != std::trunc(f.number)) return false;
    if (f.number < -9.3e18 || f.number > 9.3e18) return false;
    return f.number >= -9223372036854775808.0 && f.number < 9223372036854775808.0 &&
           int64_t(f.number) == i.as_int();
  }
  if (a.type != b.type) {
    bool dicts = a.is_object() && b.is_object();
    if (!dicts) return false;
  }
  switch (a.type) {
    case Type::kUndefined:
    case Type::kNull:
      return true;
    case Type::kString:
      return a.str == b.str;
    case Type::kArray:
    case Type::kTuple: {
      if (a.array == b.array) return true;
      if (a.array->size() != b.array->size()) return false;
      for (size_t i = 0; i < a.array->size(); ++i)
        if (!python_equal((*a.array)[i], (*b.array)[i], sink)) return false;
      return true;
    }
    case Type::kObject:
    case Type::kKwargs: {
      if (a.object == b.object) return true;
      if (a.object->items.size() != b.object->items.size()) return false;
      for (const auto& [key, value] : a.object->items) {
        const Value* other = b.object->find(key);
        if (!other || !python_equal(value, *other, sink)) return false;
      }
      return true;
    }
    case Type::kFunction:
      return a.function == b.function;
    default:
      return a.object == b.object;
  }
}

int python_compare(const Value& a, const Value& b, const char* op, Sink* sink) {
  if (sink) sink->step();
  bool an = a.is_number() || a.type == Type::kBool, bn = b.is_number() || b.type == Type::kBool;
  if (an && bn) {
    if (a.is_integral() && b.is_integral())
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.type == Type::kString && b.type == Type::kString)
    return a.str.compare(b.str) < 0 ? -1 : a.str == b.str ? 0 : 1;
  if (a.type == b.type && a.is_array()) {  // lexicographic, as Python compares sequences
    size_t n = std::min(a.array->size(), b.array->size());
    for (size_t i = 0; i < n; ++i) {
      const Value& x = (*a.array)[i];
      const Value& y = (*b.array)[i];
      if (!python_equal(x, y, sink)) return python_compare(x, y, op, sink);
    }
    return a.array->size() < b.array->size() ? -1 : a.array->size() > b.array->size() ? 1 : 0;
  }
  for (const Value* u : {&a, &b})
    if (u->type == Type::kUndefined)
      fail("UndefinedError: " + (u->str.empty() ? std::string("a value is undefined") : u->str));
  fail(std::string("TypeError: '") + op + "' not supported between instances of '" +
       python_type(a) + "' and '" + python_type(b) + "'");
}

// ---------------------------------------------------------------------------------------------
namespace {
bool js_space(uint32_t cp) {
  return cp == 0x09 || cp == 0x0A || cp == 0x0B || cp == 0x0C || cp == 0x0D || cp == 0x20 ||
         cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}
// str.isspace: JavaScript's set less U+FEFF, plus the separators \x1c-\x1f and U+0085.
bool py_space(uint32_t cp) {
  return (cp >= 0x1C && cp <= 0x1F) || cp == 0x85 || (cp != 0xFEFF && js_space(cp));
}
}  // namespace

size_t js_space_at(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  size_t len;
  uint32_t cp = decode_at(s, i, len);
  return js_space(cp) ? len : 0;
}

size_t space_at(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  size_t len;
  uint32_t cp = decode_at(s, i, len);
  return py_space(cp) ? len : 0;
}

size_t space_before(std::string_view s, size_t end) {
  if (end == 0) return 0;
  size_t b = end - 1;
  while (b > 0 && end - b < 4 && (uint8_t(s[b]) & 0xC0) == 0x80) --b;
  size_t len;
  uint32_t cp = decode_at(s, b, len);
  return b + len == end && py_space(cp) ? len : 0;
}

std::string trim_start(std::string_view s) {
  size_t i = 0;
  while (size_t n = space_at(s, i)) i += n;
  return std::string(s.substr(i));
}
std::string trim_end(std::string_view s) {
  size_t e = s.size();
  while (size_t n = space_before(s, e)) e -= n;
  return std::string(s.substr(0, e));
}
std::string trim(std::string_view s) { return trim_start(trim_end(s)); }

std::vector<std::string> code_points(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    decode_at(s, i, len);
    out.emplace_back(s.substr(i, len));
    i += len;
  }
  return out;
}

size_t code_point_count(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    decode_at(s, i, len);
    ++n;
    i += len;
  }
  return n;
}

namespace {
bool ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return uint8_t(c) < 0x80; });
}
}  // namespace

// String#toUpperCase / toLowerCase: locale-independent full case mapping (ICU root locale).
std::string to_upper(std::string_view s) {
  std::string out;
  if (ascii(s)) {
    out = s;
    for (char& c : out)
      if (c >= 'a' && c <= 'z') c = char(c - 32);
    return out;
  }
  icu::UnicodeString u =
      icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), int32_t(s.size())));
  u.toUpper(icu::Locale::getRoot());
  u.toUTF8String(out);
  return out;
}
std::string to_lower(std::string_view s) {
  std::string out;
  if (ascii(s)) {
    out = s;
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = char(c + 32);
    return out;
  }
  icu::UnicodeString u =
      icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), int32_t(s.size())));
  u.toLower(icu::Locale::getRoot());
  u.toUTF8String(out);
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

}  // namespace tformers::jinja
