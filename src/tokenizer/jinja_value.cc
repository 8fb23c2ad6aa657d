// Values of the chat-template engine and the JavaScript conversions @huggingface/jinja applies to
// them (number formatting, JSON.stringify, loose equality, String#trim whitespace).
#include <unicode/locid.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/jinja_internal.h"

namespace tformers::jinja {

const char* type_name(Type t) {
  switch (t) {
    case Type::kUndefined:
      return "UndefinedValue";
    case Type::kNull:
      return "NullValue";
    case Type::kBool:
      return "BooleanValue";
    case Type::kInt:
      return "IntegerValue";
    case Type::kFloat:
      return "FloatValue";
    case Type::kString:
      return "StringValue";
    case Type::kArray:
      return "ArrayValue";
    case Type::kTuple:
      return "TupleValue";
    case Type::kObject:
      return "ObjectValue";
    case Type::kKwargs:
      return "KeywordArgumentsValue";
    case Type::kNamespace:
      return "NamespaceValue";
    case Type::kFunction:
      return "FunctionValue";
  }
  return "?";
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
Value Value::from_int(double x) {
  Value v;
  v.type = Type::kInt;
  v.number = x;
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
    case Type::kFloat:
      return number != 0 && !std::isnan(number);
    case Type::kString:
      return !str.empty();
    case Type::kArray:
    case Type::kTuple:
      return !array->empty();
    case Type::kObject:
    case Type::kKwargs:
      return !object->items.empty();
    case Type::kNamespace:  // a JavaScript Map object is always truthy
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
      return Value::from_int(double(j.template get<int64_t>()));
    case nlohmann::json::value_t::number_unsigned:
      return Value::from_int(double(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float: {
      // JSON.parse cannot tell 2.0 from 2: the JavaScript reference sees an integer.
      double d = j.template get<double>();
      return std::isfinite(d) && d == std::trunc(d) ? Value::from_int(d) : Value::from_float(d);
    }
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

// Number#toString: the shortest digits that round-trip, in fixed notation for exponents in
// [-7, 21) and in exponent notation outside.
std::string js_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == 0) return "0";
  std::string sign = v < 0 ? "-" : "";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, std::fabs(v), std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // d[.ddd]e±x
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int n = std::stoi(sci.substr(e + 1)) + 1;  // value = 0.digits × 10^n
  int k = int(digits.size());
  std::string out;
  if (k <= n && n <= 21) {
    out = digits + std::string(n - k, '0');
  } else if (0 < n && n <= 21) {
    out = digits.substr(0, n) + "." + digits.substr(n);
  } else if (-6 < n && n <= 0) {
    out = "0." + std::string(-n, '0') + digits;
  } else {
    out = digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    out += (n - 1 >= 0 ? "e+" : "e-") + std::to_string(std::abs(n - 1));
  }
  return sign + out;
}

namespace {

std::string float_string(double v) {  // FloatValue#toString: 2.0 stays "2.0"
  if (v == 0 && std::signbit(v)) return "-0.0";
  if (std::isfinite(v) && v == std::trunc(v) && std::fabs(v) < 1e21) {
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return buf;
  }
  return js_number(v);
}

// JSON.stringify of a string: escapes quotes, backslashes and control characters only.
void json_quote(std::string& out, std::string_view s, bool ensure_ascii) {
  static const char* kHex = "0123456789abcdef";
  out.push_back('"');
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = s[i];
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
    }
    if (c < 0x20) {
      out += "\\u00";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    } else if (ensure_ascii && c >= 0x7f) {
      // Escape every UTF-16 unit from U+007F up, surrogate pairs as two escapes.
      uint32_t cp = c;
      size_t len = 1;
      if (c >= 0xF0)
        cp = c & 0x07, len = 4;
      else if (c >= 0xE0)
        cp = c & 0x0F, len = 3;
      else if (c >= 0xC0)
        cp = c & 0x1F, len = 2;
      for (size_t k = 1; k < len && i + k < s.size(); ++k)
        cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
      i += len - 1;
      auto unit = [&](uint32_t u) {
        out += "\\u";
        for (int shift = 12; shift >= 0; shift -= 4) out.push_back(kHex[(u >> shift) & 15]);
      };
      if (cp >= 0x10000) {
        cp -= 0x10000;
        unit(0xD800 + (cp >> 10));
        unit(0xDC00 + (cp & 0x3FF));
      } else {
        unit(cp);
      }
    } else {
      out.push_back(char(c));
    }
  }
  out.push_back('"');
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& opt, int depth, bool undefined_to_null,
                    int max_depth) {
  if (depth > max_depth)
    fail("tojson: value nests deeper than " + std::to_string(max_depth) + " levels");
  std::string item_sep = ", ", key_sep = ": ";
  if (opt.has_separators) {
    item_sep = opt.item_sep;
    key_sep = opt.key_sep;
  } else if (opt.indent) {
    item_sep = ",";
  }
  switch (v.type) {
    case Type::kNull:
      return "null";
    case Type::kUndefined:
      return undefined_to_null ? "null" : "undefined";
    case Type::kInt:
    case Type::kFloat:
      return std::isfinite(v.number) ? js_number(v.number) : "null";
    case Type::kBool:
      return v.boolean ? "true" : "false";
    case Type::kString: {
      std::string out;
      json_quote(out, v.str, opt.ensure_ascii);
      return out;
    }
    case Type::kTuple:  // as in the reference (Python would print a tuple, JSON has none)
      fail("cannot convert a tuple to JSON");
    case Type::kArray:
    case Type::kObject:
    case Type::kKwargs:
    case Type::kNamespace: {
      std::string indent(std::max(opt.indent, 0), ' ');
      std::string base = "\n";
      for (int d = 0; d < depth; ++d) base += indent;
      std::string child = base + indent;
      std::string out;
      if (v.is_array()) {
        const Array& a = *v.array;
        if (opt.indent && !a.empty()) {
          out = "[" + child;
          for (size_t i = 0; i < a.size(); ++i) {
            if (i) out += item_sep + child;
            out += to_json(a[i], opt, depth + 1, undefined_to_null, max_depth);
          }
          return out + base + "]";
        }
        out = "[";
        for (size_t i = 0; i < a.size(); ++i) {
          if (i) out += item_sep;
          out += to_json(a[i], opt, depth + 1, undefined_to_null, max_depth);
        }
        return out + "]";
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& kv : v.object->items) entries.push_back(&kv);
      if (opt.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      out = "{";
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += item_sep;
        if (opt.indent) out += child;
        json_quote(out, entries[i]->first, opt.ensure_ascii);
        out += key_sep;
        out += to_json(entries[i]->second, opt, depth + 1, undefined_to_null, max_depth);
      }
      if (opt.indent && !entries.empty()) out += base;
      return out + "}";
    }
    case Type::kFunction:
      fail("tojson: cannot convert a function to JSON");
  }
  return "";
}

std::string render_value(const Value& v) {
  switch (v.type) {
    case Type::kFloat:
      return float_string(v.number);
    case Type::kArray:
    case Type::kTuple:
    case Type::kObject:
    case Type::kKwargs:
    case Type::kNamespace:
      return to_json(v, {}, 0, false, 1000);
    default:
      return raw_string(v);
  }
}

std::string raw_string(const Value& v) {
  switch (v.type) {
    case Type::kUndefined:
      return "undefined";
    case Type::kNull:
      return "null";
    case Type::kBool:
      return v.boolean ? "true" : "false";
    case Type::kInt:
    case Type::kFloat:
      return js_number(v.number);
    case Type::kString:
      return v.str;
    case Type::kArray:
    case Type::kTuple: {  // Array#toString joins the elements' own strings with ","
      std::string out;
      for (size_t i = 0; i < v.array->size(); ++i) {
        if (i) out += ",";
        const Value& e = (*v.array)[i];
        if (e.type != Type::kUndefined && e.type != Type::kNull) out += render_value(e);
      }
      return out;
    }
    case Type::kObject:
    case Type::kKwargs:
    case Type::kNamespace:
      return "[object Map]";
    case Type::kFunction:
      return "[function]";
  }
  return "";
}

namespace {
double js_to_number(const Value& v) {  // ToNumber for the primitive cases of ==
  if (v.type == Type::kBool) return v.boolean ? 1 : 0;
  if (v.is_number()) return v.number;
  if (v.type == Type::kString) {
    std::string s = trim(v.str);
    if (s.empty()) return 0;
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    return end == s.c_str() + s.size() ? d : NAN;
  }
  return NAN;
}
}  // namespace

bool strict_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.number == b.number;
  if (a.type != b.type) return false;
  switch (a.type) {
    case Type::kUndefined:
    case Type::kNull:
      return true;
    case Type::kBool:
      return a.boolean == b.boolean;
    case Type::kString:
      return a.str == b.str;
    case Type::kArray:
    case Type::kTuple:
      return a.array == b.array;
    case Type::kFunction:
      return a.function == b.function;
    default:
      return a.object == b.object;
  }
}

bool loose_equal(const Value& a, const Value& b) {
  auto nullish = [](const Value& v) { return v.type == Type::kUndefined || v.type == Type::kNull; };
  if (nullish(a) || nullish(b)) return nullish(a) && nullish(b);
  auto primitive = [](const Value& v) {
    return v.type == Type::kBool || v.is_number() || v.type == Type::kString;
  };
  if (a.type == Type::kString && b.type == Type::kString) return a.str == b.str;
  if (primitive(a) && primitive(b)) return js_to_number(a) == js_to_number(b);
  if (primitive(a) != primitive(b)) return false;  // object vs primitive: not mirrored (rare)
  return strict_equal(a, b);
}

// ---------------------------------------------------------------------------------------------
namespace {
uint32_t decode(std::string_view s, size_t i, size_t& len) {
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
bool js_space(uint32_t cp) {
  return cp == 0x09 || cp == 0x0A || cp == 0x0B || cp == 0x0C || cp == 0x0D || cp == 0x20 ||
         cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}
}  // namespace

size_t js_space_at(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  size_t len;
  uint32_t cp = decode(s, i, len);
  return js_space(cp) ? len : 0;
}

size_t js_space_before(std::string_view s, size_t end) {
  if (end == 0) return 0;
  size_t b = end - 1;
  while (b > 0 && end - b < 4 && (uint8_t(s[b]) & 0xC0) == 0x80) --b;
  size_t len;
  uint32_t cp = decode(s, b, len);
  return b + len == end && js_space(cp) ? len : 0;
}

std::string trim_start(std::string_view s) {
  size_t i = 0;
  while (size_t n = js_space_at(s, i)) i += n;
  return std::string(s.substr(i));
}
std::string trim_end(std::string_view s) {
  size_t e = s.size();
  while (size_t n = js_space_before(s, e)) e -= n;
  return std::string(s.substr(0, e));
}
std::string trim(std::string_view s) { return trim_start(trim_end(s)); }

std::vector<std::string> code_points(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    decode(s, i, len);
    out.emplace_back(s.substr(i, len));
    i += len;
  }
  return out;
}

size_t utf16_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    uint32_t cp = decode(s, i, len);
    n += cp >= 0x10000 ? 2 : 1;
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
