#include "io/json.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "io/file.h"
#include "tformers/error.h"

namespace tformers::io {

namespace {

using detail::str_cat;

// nlohmann reports the number of bytes read when it failed; the offending byte is the last one
// read. Lines and columns are 1-based, as editors show them.
std::pair<size_t, size_t> line_col(std::string_view text, size_t byte) {
  size_t end = std::min(byte == 0 ? 0 : byte - 1, text.size());
  size_t line = 1, col = 1;
  for (size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}

// nlohmann's messages start with "[json.exception.parse_error.101] parse error at line 1, column
// 2: "; we print our own position, so keep only the description.
std::string strip_nlohmann_prefix(const std::string& what) {
  size_t p = what.find(": ");
  if (what.rfind("[json.exception", 0) == 0 && p != std::string::npos) return what.substr(p + 2);
  return what;
}

const char* type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "floating-point number";
    case Json::value_t::string:
      return "string";
    case Json::value_t::array:
      return "array";
    case Json::value_t::object:
      return "object";
    default:
      return "binary";
  }
}

// Containers are described by size only: dumping them could be huge (or deeply nested).
std::string describe(const Json& v) {
  if (v.is_array() || v.is_object()) return str_cat(type_name(v), " of ", v.size(), " elements");
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return str_cat(type_name(v), " ", s);
}

[[noreturn]] void type_error(const std::string& where, const std::string& field,
                             const char* expected, const Json& got) {
  throw FormatError(
      str_cat(where, ": field '", field, "' must be ", expected, ", got ", describe(got)));
}

// Integers may be written as integral floats (4096.0, 1e6) by some exporters; Python would
// accept them, so do we, as long as the value is exact and in range.
template <typename I>
I to_integer(const Json& v, const std::string& where, const std::string& field) {
  constexpr auto lo = std::numeric_limits<I>::min();
  constexpr auto hi = std::numeric_limits<I>::max();
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(hi))
      throw FormatError(str_cat(where, ": field '", field, "' = ", u, " is out of range (max ",
                                int64_t(hi), ")"));
    return I(u);
  }
  if (v.is_number_integer()) {
    int64_t s = v.get<int64_t>();
    if (s < int64_t(lo) || s > int64_t(hi))
      throw FormatError(str_cat(where, ": field '", field, "' = ", s, " is out of range [",
                                int64_t(lo), ", ", int64_t(hi), "]"));
    return I(s);
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && d >= double(lo) && d <= double(hi)) return I(d);
  }
  type_error(where, field, "an integer", v);
}

template <typename T>
T convert_value(const Json& v, const std::string& where, const std::string& field) {
  if constexpr (std::is_same_v<T, Json>) {
    return v;
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) type_error(where, field, "a boolean (true or false)", v);
    return v.get<bool>();
  } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, int>) {
    return to_integer<T>(v, where, field);
  } else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) {
    if (!v.is_number()) type_error(where, field, "a number", v);
    return T(v.get<double>());
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) type_error(where, field, "a string", v);
    return v.get<std::string>();
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    // A single integer counts as a list of one: generation_config.json writes eos_token_id
    // either way.
    if (v.is_number()) return {to_integer<int64_t>(v, where, field)};
    if (!v.is_array()) type_error(where, field, "an integer or a list of integers", v);
    std::vector<int64_t> out;
    out.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      out.push_back(to_integer<int64_t>(v[i], where, str_cat(field, "[", i, "]")));
    return out;
  } else {
    static_assert(sizeof(T) == 0, "get_required: unsupported field type");
  }
}

const Json* lookup(const Json& obj, const std::string& key, const std::string& where) {
  if (!obj.is_object())
    throw FormatError(str_cat(where, ": expected a JSON object, got ", describe(obj)));
  auto it = obj.find(key);
  if (it == obj.end()) return nullptr;
  return &*it;
}

// Builds an ordered_json from nlohmann's parse events, each value moved into its parent when it
// is whole. An object's members are gathered in a vector of their own and moved into the
// ordered map once, when the object ends (the map's pairs hold const keys, so that growing it
// would copy them); a hash table of member numbers finds a repeated key without a scan of the
// keys before it.
class OrderedJsonBuilder {
 public:
  OrderedJsonBuilder(std::string_view text, const std::string& where)
      : text_(text), where_(where) {}

  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(int64_t v) { return put(v); }
  bool number_unsigned(uint64_t v) { return put(v); }
  bool number_float(double v, const std::string&) { return put(v); }
  bool string(std::string& v) { return put(std::move(v)); }
  bool binary(OrderedJson::binary_t& v) { return put(OrderedJson::binary(std::move(v))); }
  bool start_object(size_t) {
    stack_.emplace_back().is_object = true;
    return true;
  }
  bool key(std::string& k) {
    stack_.back().key = std::move(k);
    return true;
  }
  bool end_object() {
    Open& object = stack_.back();
    OrderedJson done = OrderedJson::object();
    auto& map = done.get_ref<OrderedJson::object_t&>();
    map.reserve(object.members.size());
    for (auto& [k, v] : object.members) map.Container::emplace_back(std::move(k), std::move(v));
    stack_.pop_back();
    return put(std::move(done));
  }
  bool start_array(size_t) {
    stack_.emplace_back().is_object = false;
    return true;
  }
  bool end_array() {
    OrderedJson done(std::move(stack_.back().elements));
    stack_.pop_back();
    return put(std::move(done));
  }
  [[noreturn]] bool parse_error(size_t byte, const std::string&, const OrderedJson::exception& e) {
    auto [line, col] = line_col(text_, byte);
    throw FormatError(str_cat(where_, ":", line, ":", col,
                              ": malformed JSON: ", strip_nlohmann_prefix(e.what())));
  }

  OrderedJson take() { return std::move(root_); }

 private:
  struct Open {
    bool is_object = false;
    OrderedJson::array_t elements;                             // an array's
    std::vector<std::pair<std::string, OrderedJson>> members;  // an object's
    std::vector<size_t> hashes;                                // of each member's key
    std::vector<uint32_t> slots;  // member number + 1 (0: empty), by hash, probed linearly
    std::string key;              // the member whose value comes next
  };

  bool put(OrderedJson v) {
    if (stack_.empty())
      root_ = std::move(v);
    else if (Open& parent = stack_.back(); parent.is_object)
      add_member(parent, std::move(v));
    else
      parent.elements.push_back(std::move(v));
    return true;
  }

  static void add_member(Open& object, OrderedJson v) {
    // At most half the slots are taken, so that a probe ends soon.
    if (2 * (object.members.size() + 1) > object.slots.size()) rehash(object);
    const size_t hash = std::hash<std::string>{}(object.key);
    const size_t mask = object.slots.size() - 1;
    size_t slot = hash & mask;
    for (; object.slots[slot] != 0; slot = (slot + 1) & mask) {
      const size_t m = object.slots[slot] - 1;
      if (object.hashes[m] == hash && object.members[m].first == object.key) {
        object.members[m].second = std::move(v);  // a repeated key: its last value, first place
        return;
      }
    }
    object.slots[slot] = uint32_t(object.members.size() + 1);
    object.hashes.push_back(hash);
    object.members.emplace_back(std::move(object.key), std::move(v));
  }

  static void rehash(Open& object) {
    object.slots.assign(std::bit_ceil(std::max<size_t>(8, 4 * (object.members.size() + 1))), 0);
    const size_t mask = object.slots.size() - 1;
    for (size_t m = 0; m < object.members.size(); ++m) {
      size_t slot = object.hashes[m] & mask;
      while (object.slots[slot] != 0) slot = (slot + 1) & mask;
      object.slots[slot] = uint32_t(m + 1);
    }
  }

  std::string_view text_;
  const std::string& where_;
  std::vector<Open> stack_;
  OrderedJson root_;
};

}  // namespace

void check_json_depth(std::string_view text, const std::string& where, size_t max_depth) {
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character cannot end the string
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        auto [line, col] = line_col(text, i + 1);
        throw FormatError(str_cat(where, ":", line, ":", col, ": JSON nests deeper than ",
                                  max_depth, " levels (byte ", i, ")"));
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

Json parse_json(std::string_view text, const std::string& where) {
  check_json_depth(text, where);
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    auto [line, col] = line_col(text, e.byte);
    throw FormatError(
        str_cat(where, ":", line, ":", col, ": malformed JSON: ", strip_nlohmann_prefix(e.what())));
  } catch (const Json::exception& e) {
    throw FormatError(str_cat(where, ": malformed JSON: ", strip_nlohmann_prefix(e.what())));
  }
}

OrderedJson parse_ordered_json(std::string_view text, const std::string& where, size_t max_depth) {
  check_json_depth(text, where, max_depth);
  OrderedJsonBuilder builder(text, where);
  OrderedJson::sax_parse(text.data(), text.data() + text.size(), &builder);
  return builder.take();
}

Json load_json_file(const std::string& path, size_t max_bytes) {
  return parse_json(read_regular_file(path, max_bytes, "JSON file"), path);
}

template <typename T>
T get_required(const Json& obj, const std::string& key, const std::string& where) {
  const Json* v = lookup(obj, key, where);
  if (!v) throw NotFoundError(str_cat(where, ": required field '", key, "' is missing"));
  if constexpr (!std::is_same_v<T, Json>) {
    if (v->is_null()) throw NotFoundError(str_cat(where, ": required field '", key, "' is null"));
  }
  return convert_value<T>(*v, where, key);
}

template <typename T>
T get_or(const Json& obj, const std::string& key, T fallback, const std::string& where) {
  const Json* v = lookup(obj, key, where);
  // null means "not set" in Transformers' configs (rope_scaling: null).
  if (!v || v->is_null()) return fallback;
  return convert_value<T>(*v, where, key);
}

template <typename T>
std::optional<T> get_optional(const Json& obj, const std::string& key, const std::string& where) {
  const Json* v = lookup(obj, key, where);
  if (!v || v->is_null()) return std::nullopt;
  return convert_value<T>(*v, where, key);
}

namespace {

// "WHERE: field 'KEY' = SHOWN is out of range; allowed [LO, HI]", for integer and float bounds.
template <typename B>
[[noreturn]] void out_of_range(const std::string& where, const std::string& key,
                               const std::string& shown, B lo, B hi) {
  throw FormatError(str_cat(where, ": field '", key, "' = ", shown, " is out of range; allowed [",
                            lo, ", ", hi, "]"));
}

int64_t int_in(const Json& v, const std::string& key, int64_t lo, int64_t hi,
               const std::string& where) {
  TF_CHECK(lo <= hi, "empty range for ", key);
  // Unsigned values above int64_t's range are out of any range a caller can pass.
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    out_of_range(where, key, v.dump(), lo, hi);
  // Integral floats beyond int64_t (1e30) are out of range too, not a type mismatch.
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && (d < double(lo) || d > double(hi)))
      out_of_range(where, key, describe(v), lo, hi);
  }
  int64_t x = to_integer<int64_t>(v, where, key);
  if (x < lo || x > hi) out_of_range(where, key, str_cat(x), lo, hi);
  return x;
}

double double_in(const Json& v, const std::string& key, double lo, double hi, bool lo_open,
                 const std::string& where) {
  if (!v.is_number()) type_error(where, key, "a number", v);
  double d = v.get<double>();
  bool ok = std::isfinite(d) && (lo_open ? d > lo : d >= lo) && d <= hi;
  if (!ok) {
    if (lo_open && hi == std::numeric_limits<double>::max())
      throw FormatError(
          str_cat(where, ": field '", key, "' = ", v.dump(), " must be a finite number > ", lo));
    out_of_range(where, key, v.dump(), lo, hi);
  }
  return d;
}

}  // namespace

int64_t get_int_in(const Json& obj, const std::string& key, int64_t lo, int64_t hi,
                   const std::string& where) {
  const Json* v = lookup(obj, key, where);
  if (!v || v->is_null())
    throw NotFoundError(str_cat(where, ": required field '", key, "' is missing"));
  return int_in(*v, key, lo, hi, where);
}

int64_t get_int_in_or(const Json& obj, const std::string& key, int64_t fallback, int64_t lo,
                      int64_t hi, const std::string& where) {
  const Json* v = lookup(obj, key, where);
  if (!v || v->is_null()) return fallback;
  return int_in(*v, key, lo, hi, where);
}

std::optional<int64_t> get_int_in_optional(const Json& obj, const std::string& key, int64_t lo,
                                           int64_t hi, const std::string& where) {
  const Json* v = lookup(obj, key, where);
  if (!v || v->is_null()) return std::nullopt;
  return int_in(*v, key, lo, hi, where);
}

double get_positive_finite(const Json& obj, const std::string& key, const std::string& where) {
  const Json* v = lookup(obj, key, where);
  if (!v || v->is_null())
    throw NotFoundError(str_cat(where, ": required field '", key, "' is missing"));
  return double_in(*v, key, 0.0, std::numeric_limits<double>::max(), true, where);
}

double get_positive_finite_or(const Json& obj, const std::string& key, double fallback,
                              const std::string& where) {
  const Json* v = lookup(obj, key, where);
  if (!v || v->is_null()) return fallback;
  return double_in(*v, key, 0.0, std::numeric_limits<double>::max(), true, where);
}

double get_double_in(const Json& obj, const std::string& key, double lo, double hi,
                     const std::string& where) {
  const Json* v = lookup(obj, key, where);
  if (!v || v->is_null())
    throw NotFoundError(str_cat(where, ": required field '", key, "' is missing"));
  return double_in(*v, key, lo, hi, false, where);
}

double get_double_in_or(const Json& obj, const std::string& key, double fallback, double lo,
                        double hi, const std::string& where) {
  const Json* v = lookup(obj, key, where);
  if (!v || v->is_null()) return fallback;
  return double_in(*v, key, lo, hi, false, where);
}

#define TFORMERS_INSTANTIATE(T)                                                    \
  template T get_required<T>(const Json&, const std::string&, const std::string&); \
  template T get_or<T>(const Json&, const std::string&, T, const std::string&);    \
  template std::optional<T> get_optional<T>(const Json&, const std::string&, const std::string&);
TFORMERS_INSTANTIATE(int64_t)
TFORMERS_INSTANTIATE(int)
TFORMERS_INSTANTIATE(double)
TFORMERS_INSTANTIATE(float)
TFORMERS_INSTANTIATE(bool)
TFORMERS_INSTANTIATE(std::string)
TFORMERS_INSTANTIATE(std::vector<int64_t>)
TFORMERS_INSTANTIATE(Json)
#undef TFORMERS_INSTANTIATE

}  // namespace tformers::io
