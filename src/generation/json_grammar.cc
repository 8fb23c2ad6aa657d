#include "generation/json_grammar.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "tokenizer/unicode.h"

namespace tformers::generation {

using Kind = JsonGrammar::Kind;
using Node = JsonGrammar::Node;
using Trie = JsonGrammar::Trie;
using Frame = JsonMatcher::Frame;
using State = JsonMatcher::State;

SchemaError::SchemaError(const std::string& path, const std::string& keyword,
                         const std::string& message)
    : InvalidArgumentError(message), path_(path), keyword_(keyword) {}

int32_t Trie::child(int32_t node, uint8_t byte) const {
  for (const auto& [b, c] : nodes[size_t(node)].children) {
    if (b == byte) return c;
    if (b > byte) break;
  }
  return -1;
}

void Trie::insert(std::string_view bytes, int32_t value, bool track_below) {
  int32_t at = 0;
  if (track_below) nodes[0].below.push_back(value);
  for (unsigned char c : bytes) {
    int32_t next = child(at, c);
    if (next < 0) {
      next = int32_t(nodes.size());
      nodes.emplace_back();
      auto& kids = nodes[size_t(at)].children;
      kids.insert(std::lower_bound(kids.begin(), kids.end(), std::pair<uint8_t, int32_t>(c, -1)),
                  {c, next});
    }
    at = next;
    if (track_below) nodes[size_t(at)].below.push_back(value);
  }
  if (nodes[size_t(at)].terminal < 0) nodes[size_t(at)].terminal = value;
}

namespace {

constexpr int64_t kUnbounded = INT64_MAX;
constexpr int32_t kInfiniteDepth = INT32_MAX / 2;

// Frame kinds and phases.
enum : uint8_t { kValue, kObj, kArr, kStr, kNum, kLit };
enum : uint8_t { kObjOpen, kObjKey, kObjColon, kObjValue, kObjAfter, kObjNeedKey };
enum : uint8_t { kArrOpen, kArrItem, kArrAfter, kArrNeedItem };
enum : uint8_t { kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };

std::string pointer_token(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

std::string shown(const OrderedJson& v) {
  std::string s = v.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

bool is_annotation(const std::string& k) {
  static const std::set<std::string> kAnnotations = {
      "title",    "description", "default",  "examples",  "$schema", "$id",
      "$comment", "deprecated",  "readOnly", "writeOnly", "$anchor", "$dynamicAnchor",
  };
  return kAnnotations.count(k) || k.rfind("x-", 0) == 0;
}

const char* kSupported =
    "type, properties, required, additionalProperties, items, prefixItems, minItems, maxItems, "
    "minLength, maxLength, enum, const, anyOf, oneOf, allOf (of one schema), $ref, $defs, "
    "definitions, and annotations such as title and description";

}  // namespace

// Builds a JsonGrammar from a schema document, in passes: the schema tree into nodes (a $ref's
// target compiled once, so recursive schemas become cycles), enum and const values checked
// against the keywords beside them, unions flattened, and the nesting depth each node needs.
class SchemaCompiler {
 public:
  SchemaCompiler(const OrderedJson& doc, const JsonGrammarLimits& limits)
      : doc_(doc), limits_(limits), g_(std::make_shared<JsonGrammar>()) {
    g_->max_value_depth_ = int32_t(std::clamp<int64_t>(limits.max_value_depth, 1, 255));
  }

  std::shared_ptr<JsonGrammar> run() {
    g_->root_ = compile(doc_, "#", 0);
    finish();
    return g_;
  }

  std::shared_ptr<JsonGrammar> run_any_object() {
    Node o;
    o.kind = Kind::kObject;
    o.additional = any_value();
    g_->root_ = add(std::move(o), "#");
    finish();
    return g_;
  }

 private:
  struct PendingEnum {
    int32_t node, rest;
    std::vector<OrderedJson> values;
    std::string path;
  };

  [[noreturn]] void fail(const std::string& path, const std::string& keyword,
                         const std::string& what) {
    throw SchemaError(path, keyword, path + ": " + what);
  }

  Node& at(int32_t i) { return g_->nodes_[size_t(i)]; }

  int32_t add(Node n, const std::string& path) {
    if (int64_t(g_->nodes_.size()) >= limits_.max_nodes)
      fail(path, "",
           "the schema is too large: more than " + std::to_string(limits_.max_nodes) +
               " subschemas");
    g_->nodes_.push_back(std::move(n));
    return int32_t(g_->nodes_.size() - 1);
  }

  int32_t add_trie() {
    g_->tries_.emplace_back();
    return int32_t(g_->tries_.size() - 1);
  }

  void count_bytes(size_t n, const std::string& path) {
    literal_bytes_ += int64_t(n);
    if (literal_bytes_ > limits_.max_literal_bytes)
      fail(path, "",
           "the schema's property names and enum values are over " +
               std::to_string(limits_.max_literal_bytes) + " bytes together");
  }

  // The one node of "any JSON value".
  int32_t any_value() {
    if (any_ >= 0) return any_;
    any_ = add(Node{}, "#");  // a union, filled below
    Node o;
    o.kind = Kind::kObject;
    o.additional = any_;
    Node a;
    a.kind = Kind::kArray;
    a.items = any_;
    Node s;
    s.kind = Kind::kString;
    Node num;
    num.kind = Kind::kNumber;
    const int32_t lit = literal_node({"true", "false", "null"}, "#");
    std::vector<int32_t> alts = {add(std::move(o), "#"), add(std::move(a), "#"),
                                 add(std::move(s), "#"), add(std::move(num), "#"), lit};
    at(any_).alts = std::move(alts);
    return any_;
  }

  int32_t literal_node(const std::vector<std::string>& texts, const std::string& path) {
    Node n;
    n.kind = Kind::kLiteral;
    n.trie = add_trie();
    for (size_t i = 0; i < texts.size(); ++i) {
      count_bytes(texts[i].size(), path);
      g_->tries_[size_t(n.trie)].insert(texts[i], int32_t(i), false);
    }
    return add(std::move(n), path);
  }

  int32_t union_node(std::vector<int32_t> alts, const std::string& path) {
    if (alts.size() == 1) return alts[0];
    Node n;
    n.alts = std::move(alts);
    return add(std::move(n), path);
  }

  static int64_t count_of(const OrderedJson& v) {
    if (v.is_number_unsigned()) return int64_t(std::min<uint64_t>(v.get<uint64_t>(), kUnbounded));
    if (v.is_number_integer()) return v.get<int64_t>();
    const double d = v.get<double>();
    return d >= 9e18 ? kUnbounded : int64_t(d);
  }

  int64_t nonnegative(const OrderedJson& s, const std::string& key, const std::string& path) {
    const OrderedJson& v = s.at(key);
    const bool integral =
        v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                  v.get<double>() == std::floor(v.get<double>()));
    if (!integral || count_of(v) < 0)
      fail(path, key, key + " must be a non-negative integer, got " + shown(v));
    return count_of(v);
  }

  // The node of the schema at `ref` ("#/$defs/Item"), compiled once.
  int32_t resolve_ref(const OrderedJson& ref, const std::string& path, int depth) {
    if (!ref.is_string()) fail(path, "$ref", "$ref must be a string, got " + shown(ref));
    const std::string r = ref.get<std::string>();
    if (r.empty() || r[0] != '#')
      fail(path, "$ref",
           "$ref \"" + r +
               "\" is not supported: only references within the schema, such as "
               "\"#/$defs/Name\", are");
    if (auto it = refs_.find(r); it != refs_.end()) return it->second;
    // The fragment is a JSON pointer, percent-encoded as a URI fragment.
    std::string pointer;
    for (size_t i = 1; i < r.size(); ++i) {
      if (r[i] == '%' && i + 2 < r.size() && std::isxdigit((unsigned char)r[i + 1]) &&
          std::isxdigit((unsigned char)r[i + 2])) {
        pointer += char(std::stoi(r.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        pointer += r[i];
      }
    }
    if (!pointer.empty() && pointer[0] != '/')
      fail(path, "$ref",
           "$ref \"" + r +
               "\" is not supported: only JSON pointers (\"#/$defs/Name\") are, not "
               "anchors");
    const OrderedJson* target = &doc_;
    std::string target_path = "#";
    for (size_t i = 1; i <= pointer.size();) {
      size_t j = pointer.find('/', i);
      if (j == std::string::npos) j = pointer.size();
      std::string token;
      for (size_t k = i; k < j; ++k) {
        if (pointer[k] == '~' && k + 1 < j && (pointer[k + 1] == '0' || pointer[k + 1] == '1')) {
          token += pointer[k + 1] == '0' ? '~' : '/';
          ++k;
        } else {
          token += pointer[k];
        }
      }
      if (target->is_object() && target->contains(token)) {
        target = &(*target)[token];
      } else if (target->is_array() && !token.empty() && token.size() < 10 &&
                 std::all_of(token.begin(), token.end(), ::isdigit) &&
                 std::stoull(token) < target->size()) {
        target = &(*target)[std::stoull(token)];
      } else {
        fail(path, "$ref", "$ref \"" + r + "\" does not resolve within the schema");
      }
      target_path += "/" + pointer_token(token);
      i = j + 1;
      if (j == pointer.size()) break;
    }
    // A placeholder union first, so that a reference back to it (recursion) finds it.
    const int32_t placeholder = add(Node{}, target_path);
    refs_[r] = placeholder;
    const int32_t compiled = compile(*target, target_path, depth + 1);
    at(placeholder).alts = {compiled};
    return placeholder;
  }

  int32_t compile(const OrderedJson& s, const std::string& path, int depth) {
    if (depth > limits_.max_schema_depth)
      fail(path, "",
           "the schema nests deeper than " + std::to_string(limits_.max_schema_depth) + " levels");
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_value();
      fail(path, "false", "the schema false matches no value, so nothing can be generated");
    }
    if (!s.is_object()) fail(path, "", "a schema must be an object or a boolean, got " + shown(s));

    static const std::set<std::string> kKeywords = {
        "type",  "enum",        "const",    "properties", "required",  "additionalProperties",
        "items", "prefixItems", "minItems", "maxItems",   "minLength", "maxLength",
        "anyOf", "oneOf",       "allOf",    "$ref"};
    std::vector<std::string> constraints;
    for (const auto& [k, v] : s.items()) {
      if (is_annotation(k)) continue;
      if (k == "$defs" || k == "definitions") {
        if (!v.is_object()) fail(path, k, k + " must be an object of schemas");
        continue;
      }
      if (!kKeywords.count(k))
        fail(path + "/" + pointer_token(k), k,
             "keyword \"" + k + "\" is not supported (supported: " + kSupported + ")");
      constraints.push_back(k);
    }

    for (const char* composite : {"$ref", "anyOf", "oneOf", "allOf"}) {
      if (!s.contains(composite)) continue;
      for (const std::string& other : constraints)
        if (other != composite)
          fail(path, other,
               "\"" + other + "\" beside \"" + composite +
                   "\" is not supported; move it into the referenced or alternative schemas");
      const OrderedJson& v = s.at(composite);
      const std::string where = path + "/" + composite;
      if (std::string(composite) == "$ref") return resolve_ref(v, path, depth);
      if (!v.is_array() || v.empty())
        fail(path, composite, std::string(composite) + " must be a non-empty list of schemas");
      if (std::string(composite) == "allOf") {
        if (v.size() != 1)
          fail(path, "allOf",
               "allOf of more than one schema is not supported (an allOf of one schema is)");
        return compile(v[0], where + "/0", depth + 1);
      }
      std::vector<int32_t> alts;
      for (size_t i = 0; i < v.size(); ++i)
        alts.push_back(compile(v[i], where + "/" + std::to_string(i), depth + 1));
      return union_node(std::move(alts), path);
    }

    // The types allowed, and a node for each.
    std::set<std::string> types;
    if (s.contains("type")) {
      const OrderedJson& t = s.at("type");
      std::vector<OrderedJson> names;
      if (t.is_string())
        names.push_back(t);
      else if (t.is_array() && !t.empty())
        names.assign(t.begin(), t.end());
      else
        fail(path, "type", "type must be a type name or a non-empty list of them");
      static const std::set<std::string> kTypes = {"object",  "array",   "string", "number",
                                                   "integer", "boolean", "null"};
      for (const OrderedJson& n : names) {
        if (!n.is_string() || !kTypes.count(n.get<std::string>()))
          fail(path, "type",
               "type " + shown(n) +
                   " is not one of object, array, string, number, integer, boolean, null");
        types.insert(n.get<std::string>());
      }
      if (types.count("number")) types.erase("integer");
    }
    const bool any_type = types.empty();
    const bool has_constraints =
        std::any_of(constraints.begin(), constraints.end(),
                    [](const std::string& k) { return k != "enum" && k != "const"; });
    auto wants = [&](const char* t) { return any_type || types.count(t) > 0; };

    int32_t rest = -1;
    if (any_type && !has_constraints) {
      rest = any_value();
    } else {
      std::vector<int32_t> alts;
      if (wants("object")) alts.push_back(object_node(s, path, depth));
      if (wants("array")) alts.push_back(array_node(s, path, depth));
      if (wants("string")) alts.push_back(string_node(s, path));
      if (wants("number") || types.count("integer")) {
        Node n;
        n.kind = wants("number") ? Kind::kNumber : Kind::kInteger;
        alts.push_back(add(std::move(n), path));
      }
      if (wants("boolean")) alts.push_back(literal_node({"true", "false"}, path));
      if (wants("null")) alts.push_back(literal_node({"null"}, path));
      rest = union_node(std::move(alts), path);
    }

    if (!s.contains("enum") && !s.contains("const")) return rest;
    std::vector<OrderedJson> values;
    if (s.contains("enum")) {
      const OrderedJson& e = s.at("enum");
      if (!e.is_array() || e.empty()) fail(path, "enum", "enum must be a non-empty list");
      values.assign(e.begin(), e.end());
    }
    if (s.contains("const")) {
      const OrderedJson& c = s.at("const");
      if (s.contains("enum"))
        std::erase_if(values, [&](const OrderedJson& v) { return v != c; });
      else
        values.push_back(c);
    }
    for (const OrderedJson& v : values) count_bytes(v.dump().size(), path);
    const int32_t node = add(Node{}, path);
    pending_.push_back({node, rest, std::move(values), path});
    return node;
  }

  int32_t object_node(const OrderedJson& s, const std::string& path, int depth) {
    Node n;
    n.kind = Kind::kObject;
    if (s.contains("properties")) {
      const OrderedJson& props = s.at("properties");
      if (!props.is_object()) fail(path, "properties", "properties must be an object of schemas");
      for (const auto& [name, sub] : props.items()) {
        count_bytes(name.size(), path);
        n.props.push_back(
            {name, compile(sub, path + "/properties/" + pointer_token(name), depth + 1), false});
      }
    }
    if (s.contains("required")) {
      const OrderedJson& req = s.at("required");
      if (!req.is_array()) fail(path, "required", "required must be a list of property names");
      for (const OrderedJson& r : req) {
        if (!r.is_string())
          fail(path, "required", "required must hold property names, got " + shown(r));
        auto it = std::find_if(n.props.begin(), n.props.end(),
                               [&](const auto& p) { return p.name == r.get<std::string>(); });
        if (it == n.props.end())
          fail(path, "required",
               "required names \"" + r.get<std::string>() +
                   "\", which properties does not declare; only declared properties are "
                   "generated");
        it->required = true;
      }
    }
    if (s.contains("additionalProperties")) {
      const OrderedJson& ap = s.at("additionalProperties");
      if (!ap.is_boolean() && !ap.is_object())
        fail(path, "additionalProperties", "additionalProperties must be a boolean or a schema");
      // With properties no other property is generated; without them it is the map's values.
      if (ap.is_object()) {
        const int32_t values = compile(ap, path + "/additionalProperties", depth + 1);
        if (n.props.empty()) n.additional = values;
      } else if (n.props.empty() && ap.get<bool>()) {
        n.additional = any_value();
      }
    } else if (n.props.empty()) {
      n.additional = any_value();
    }
    if (!n.props.empty()) {
      n.trie = add_trie();
      for (size_t i = 0; i < n.props.size(); ++i)
        g_->tries_[size_t(n.trie)].insert(n.props[i].name, int32_t(i), true);
      n.next_required.assign(n.props.size() + 1, int32_t(n.props.size()));
      for (size_t i = n.props.size(); i-- > 0;)
        n.next_required[i] = n.props[i].required ? int32_t(i) : n.next_required[i + 1];
    }
    return add(std::move(n), path);
  }

  int32_t array_node(const OrderedJson& s, const std::string& path, int depth) {
    Node n;
    n.kind = Kind::kArray;
    if (s.contains("prefixItems")) {
      const OrderedJson& p = s.at("prefixItems");
      if (!p.is_array()) fail(path, "prefixItems", "prefixItems must be a list of schemas");
      for (size_t i = 0; i < p.size(); ++i)
        n.prefix.push_back(compile(p[i], path + "/prefixItems/" + std::to_string(i), depth + 1));
    }
    n.items = -2;
    if (s.contains("items")) {
      const OrderedJson& it = s.at("items");
      if (it.is_array())
        fail(path, "items",
             "a list of schemas in items (draft 7's tuples) is not supported; use prefixItems");
      if (it.is_boolean())
        n.items = it.get<bool>() ? any_value() : -1;
      else
        n.items = compile(it, path + "/items", depth + 1);
    }
    if (n.items == -2) n.items = any_value();
    if (s.contains("minItems")) n.min_items = nonnegative(s, "minItems", path);
    if (s.contains("maxItems")) n.max_items = nonnegative(s, "maxItems", path);
    if (n.items < 0) n.max_items = std::min<int64_t>(n.max_items, int64_t(n.prefix.size()));
    if (n.min_items > n.max_items)
      fail(path, "minItems",
           "no array fits: minItems " + std::to_string(n.min_items) + " is above the most items " +
               "allowed (" + std::to_string(n.max_items) + ")");
    return add(std::move(n), path);
  }

  int32_t string_node(const OrderedJson& s, const std::string& path) {
    Node n;
    n.kind = Kind::kString;
    if (s.contains("minLength")) n.min_length = nonnegative(s, "minLength", path);
    if (s.contains("maxLength")) n.max_length = nonnegative(s, "maxLength", path);
    if (n.min_length > n.max_length)
      fail(path, "minLength", "no string fits: minLength is above maxLength");
    return add(std::move(n), path);
  }

  // The node that generates exactly `v` (strings with any allowed escapes).
  int32_t const_node(const OrderedJson& v, const std::string& path) {
    Node n;
    if (v.is_object()) {
      n.kind = Kind::kObject;
      for (const auto& [k, sub] : v.items()) n.props.push_back({k, const_node(sub, path), true});
      if (!n.props.empty()) {
        n.trie = add_trie();
        for (size_t i = 0; i < n.props.size(); ++i)
          g_->tries_[size_t(n.trie)].insert(n.props[i].name, int32_t(i), true);
        n.next_required.resize(n.props.size() + 1);
        for (size_t i = 0; i <= n.props.size(); ++i) n.next_required[i] = int32_t(i);
      }
      return add(std::move(n), path);
    }
    if (v.is_array()) {
      n.kind = Kind::kArray;
      for (const OrderedJson& item : v) n.prefix.push_back(const_node(item, path));
      n.items = -1;
      n.min_items = n.max_items = int64_t(v.size());
      return add(std::move(n), path);
    }
    if (v.is_string()) return string_values({v.get<std::string>()}, path);
    return literal_node({v.dump()}, path);
  }

  int32_t string_values(const std::vector<std::string>& values, const std::string& path) {
    Node n;
    n.kind = Kind::kString;
    n.trie = add_trie();
    for (size_t i = 0; i < values.size(); ++i)
      g_->tries_[size_t(n.trie)].insert(values[i], int32_t(i), false);
    return add(std::move(n), path);
  }

  // Whether `v` is a value the node generates (JSON Schema's equality for numbers: 1.0 is an
  // integer), used to keep the enum values that the keywords beside enum allow.
  bool matches(int32_t i, const OrderedJson& v, std::set<int32_t>& unions) {
    const Node& n = at(i);
    switch (n.kind) {
      case Kind::kUnion: {
        if (!unions.insert(i).second) return false;  // a cycle of unions matches nothing
        bool any = false;
        for (int32_t a : n.alts)
          if (matches(a, v, unions)) {
            any = true;
            break;
          }
        unions.erase(i);
        return any;
      }
      case Kind::kObject: {
        if (!v.is_object()) return false;
        std::set<int32_t> fresh;
        if (n.props.empty()) {
          if (n.additional < 0) return v.empty();
          for (const auto& [k, sub] : v.items())
            if (!matches(n.additional, sub, fresh)) return false;
          return true;
        }
        size_t next = 0;
        for (const auto& [k, sub] : v.items()) {
          size_t j = next;
          while (j < n.props.size() && n.props[j].name != k) ++j;
          if (j == n.props.size() || size_t(n.next_required[next]) < j) return false;
          if (!matches(n.props[j].node, sub, fresh)) return false;
          next = j + 1;
        }
        return size_t(n.next_required[next]) == n.props.size();
      }
      case Kind::kArray: {
        if (!v.is_array()) return false;
        const int64_t size = int64_t(v.size());
        if (size < n.min_items || size > n.max_items) return false;
        std::set<int32_t> fresh;
        for (size_t k = 0; k < v.size(); ++k) {
          const int32_t item = k < n.prefix.size() ? n.prefix[k] : n.items;
          if (item < 0 || !matches(item, v[k], fresh)) return false;
        }
        return true;
      }
      case Kind::kString: {
        if (!v.is_string()) return false;
        const std::string& s = v.get_ref<const std::string&>();
        int64_t chars = 0;
        for (unsigned char c : s) chars += (c & 0xC0) != 0x80;
        if (chars < n.min_length || chars > n.max_length) return false;
        if (n.trie < 0) return true;
        const Trie& t = g_->tries_[size_t(n.trie)];
        int32_t at = 0;
        for (unsigned char c : s)
          if ((at = t.child(at, c)) < 0) return false;
        return t.nodes[size_t(at)].terminal >= 0;
      }
      case Kind::kNumber:
        return v.is_number();
      case Kind::kInteger:
        return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                         v.get<double>() == std::floor(v.get<double>()));
      case Kind::kLiteral: {
        const Trie& t = g_->tries_[size_t(n.trie)];
        int32_t at = 0;
        for (unsigned char c : v.dump())
          if ((at = t.child(at, c)) < 0) return false;
        return t.nodes[size_t(at)].terminal >= 0;
      }
    }
    return false;
  }

  void finish() {
    // enum and const: the values the keywords beside them allow, inner schemas first (they were
    // queued first).
    for (const PendingEnum& p : pending_) {
      std::vector<OrderedJson> kept;
      for (const OrderedJson& v : p.values) {
        std::set<int32_t> unions;
        if (matches(p.rest, v, unions)) kept.push_back(v);
      }
      if (kept.empty())
        fail(p.path, p.values.size() == 1 ? "const" : "enum",
             "no value of enum or const is allowed by the keywords beside it (type, ...)");
      std::vector<std::string> strings, literals;
      std::vector<int32_t> alts;
      for (const OrderedJson& v : kept) {
        if (v.is_string())
          strings.push_back(v.get<std::string>());
        else if (v.is_object() || v.is_array())
          alts.push_back(const_node(v, p.path));
        else
          literals.push_back(v.dump());
      }
      if (!strings.empty()) alts.push_back(string_values(strings, p.path));
      if (!literals.empty()) alts.push_back(literal_node(literals, p.path));
      at(p.node).alts = std::move(alts);
    }
    // Unions hold concrete nodes only.
    for (size_t i = 0; i < g_->nodes_.size(); ++i) {
      if (at(int32_t(i)).kind != Kind::kUnion) continue;
      std::vector<int32_t> flat;
      std::set<int32_t> seen;
      std::vector<int32_t> todo(at(int32_t(i)).alts.rbegin(), at(int32_t(i)).alts.rend());
      seen.insert(int32_t(i));
      while (!todo.empty()) {
        const int32_t a = todo.back();
        todo.pop_back();
        if (!seen.insert(a).second) continue;
        if (at(a).kind == Kind::kUnion)
          todo.insert(todo.end(), at(a).alts.rbegin(), at(a).alts.rend());
        else
          flat.push_back(a);
      }
      at(int32_t(i)).alts = std::move(flat);
    }
    // The nesting each node needs at least, to a fixed point (recursion without a way out stays
    // infinite).
    for (Node& n : g_->nodes_) n.min_depth = kInfiniteDepth;
    for (bool changed = true; changed;) {
      changed = false;
      for (Node& n : g_->nodes_) {
        int32_t d = kInfiniteDepth;
        auto need = [&](int32_t child) { return child < 0 ? 0 : at(child).min_depth; };
        switch (n.kind) {
          case Kind::kUnion:
            for (int32_t a : n.alts) d = std::min(d, at(a).min_depth);
            break;
          case Kind::kObject: {
            int32_t inner = 0;
            for (const auto& p : n.props)
              if (p.required) inner = std::max(inner, need(p.node));
            d = std::min(kInfiniteDepth, inner + 1);
            break;
          }
          case Kind::kArray: {
            int32_t inner = 0;
            for (int64_t k = 0; k < n.min_items; ++k) {
              const int32_t item = k < int64_t(n.prefix.size()) ? n.prefix[size_t(k)] : n.items;
              inner = std::max(inner, need(item));
              if (k >= int64_t(n.prefix.size())) break;  // the rest are all `items`
            }
            d = std::min(kInfiniteDepth, inner + 1);
            break;
          }
          default:
            d = 0;
        }
        if (d < n.min_depth) {
          n.min_depth = d;
          changed = true;
        }
      }
    }
    const Node& root = at(g_->root_);
    if (root.min_depth >= kInfiniteDepth)
      fail("#", "$ref",
           "the schema has no finite value (a required property or item refers back to itself "
           "with no way out)");
    if (root.min_depth > g_->max_value_depth_)
      fail("#", "",
           "every value of the schema nests objects and arrays deeper than " +
               std::to_string(g_->max_value_depth_) + " levels, the most that is generated");
    // The bytes each value can begin with.
    for (Node& n : g_->nodes_) {
      n.first.reset();
      switch (n.kind) {
        case Kind::kObject:
          n.first['{'] = true;
          break;
        case Kind::kArray:
          n.first['['] = true;
          break;
        case Kind::kString:
          n.first['"'] = true;
          break;
        case Kind::kNumber:
        case Kind::kInteger:
          n.first['-'] = true;
          for (char c = '0'; c <= '9'; ++c) n.first[uint8_t(c)] = true;
          break;
        case Kind::kLiteral:
          for (const auto& [b, c] : g_->tries_[size_t(n.trie)].nodes[0].children) n.first[b] = true;
          break;
        case Kind::kUnion:
          break;
      }
    }
  }

  const OrderedJson& doc_;
  JsonGrammarLimits limits_;
  std::shared_ptr<JsonGrammar> g_;
  std::map<std::string, int32_t> refs_;
  std::vector<PendingEnum> pending_;
  int32_t any_ = -1;
  int64_t literal_bytes_ = 0;
};

std::shared_ptr<const JsonGrammar> JsonGrammar::compile(const OrderedJson& schema,
                                                        const JsonGrammarLimits& limits) {
  return SchemaCompiler(schema, limits).run();
}

std::shared_ptr<const JsonGrammar> JsonGrammar::any_object() {
  static const std::shared_ptr<const JsonGrammar> g =
      SchemaCompiler(OrderedJson::object(), {}).run_any_object();
  return g;
}

// ---------------------------------------------------------------------------------------------
// The matcher

namespace {

// Feeds one byte to a parse stack and emits every stack that results.
class Stepper {
 public:
  Stepper(const JsonGrammar& g, uint8_t c, State& out) : g_(g), c_(c), out_(out) {}

  void feed(std::vector<Frame>& st) {
    if (st.empty()) return;  // nothing follows a whole value
    Frame& f = st.back();
    switch (f.kind) {
      case kValue:
        return value_byte(st);
      case kObj:
        return object_byte(st);
      case kArr:
        return array_byte(st);
      case kStr:
        return string_byte(st);
      case kNum:
        return number_byte(st);
      case kLit:
        return literal_byte(st);
    }
  }

 private:
  void emit(const std::vector<Frame>& st) {
    out_.frames.insert(out_.frames.end(), st.begin(), st.end());
    out_.ends.push_back(uint32_t(out_.frames.size()));
  }

  bool viable(int32_t node, uint8_t depth) const {
    return node >= 0 && int32_t(depth) + g_.node(node).min_depth <= g_.max_value_depth();
  }

  // The top frame is done: it goes, and its parent moves on.
  static void complete(std::vector<Frame>& st) {
    st.pop_back();
    if (st.empty()) return;
    Frame& p = st.back();
    if (p.kind == kObj) {
      p.phase = kObjAfter;
      ++p.a;
    } else if (p.kind == kArr) {
      p.phase = kArrAfter;
      if (p.a < INT32_MAX) ++p.a;
    }
  }

  void value_byte(std::vector<Frame>& st) {
    const int32_t node = st.back().node;
    const uint8_t depth = st.back().depth;
    st.pop_back();
    const Node& n = g_.node(node);
    if (n.kind != Kind::kUnion) {
      if (n.first[c_] && viable(node, depth)) start(st, node, depth);
      return;
    }
    int32_t only = -1, count = 0;
    for (int32_t a : n.alts)
      if (g_.node(a).first[c_] && viable(a, depth)) {
        only = a;
        ++count;
      }
    if (count == 1) return start(st, only, depth);
    for (int32_t a : n.alts)
      if (g_.node(a).first[c_] && viable(a, depth)) {
        std::vector<Frame> copy = st;
        start(copy, a, depth);
      }
  }

  // A value of `node` begins with the byte.
  void start(std::vector<Frame>& st, int32_t node, uint8_t depth) {
    const Node& n = g_.node(node);
    Frame f;
    f.node = node;
    f.depth = depth;
    switch (n.kind) {
      case Kind::kObject:
        f.kind = kObj;
        f.phase = kObjOpen;
        f.depth = uint8_t(depth + 1);
        break;
      case Kind::kArray:
        f.kind = kArr;
        f.phase = kArrOpen;
        f.depth = uint8_t(depth + 1);
        break;
      case Kind::kString:
        f.kind = kStr;
        f.b = n.trie >= 0 ? 0 : -1;
        break;
      case Kind::kNumber:
      case Kind::kInteger:
        f.kind = kNum;
        f.phase = c_ == '-' ? kNumMinus : c_ == '0' ? kNumZero : kNumInt;
        break;
      case Kind::kLiteral: {
        const Trie& t = g_.trie(n.trie);
        f.kind = kLit;
        f.a = t.child(0, c_);
        st.push_back(f);
        const Trie::Node& tn = t.nodes[size_t(f.a)];
        if (tn.terminal >= 0 && tn.children.empty()) complete(st);
        return emit(st);
      }
      case Kind::kUnion:
        return;
    }
    st.push_back(f);
    emit(st);
  }

  // Object properties that may come next from index i: [i, last], those whose values fit.
  bool can_start_key(const Frame& f, const Node& n) const {
    if (n.props.empty()) return viable(n.additional, f.depth);
    for (int32_t j = f.a; j < int32_t(n.props.size()) && j <= n.next_required[size_t(f.a)]; ++j)
      if (viable(n.props[size_t(j)].node, f.depth)) return true;
    return false;
  }

  static bool closable(const Frame& f, const Node& n) {
    return n.props.empty() || size_t(n.next_required[size_t(f.a)]) == n.props.size();
  }

  void object_byte(std::vector<Frame>& st) {
    Frame& f = st.back();
    const Node& n = g_.node(f.node);
    auto start_key = [&] {
      f.phase = kObjKey;
      Frame k;
      k.kind = kStr;
      k.key = 1;
      k.node = f.node;
      k.depth = f.depth;
      k.b = n.props.empty() ? -1 : 0;
      st.push_back(k);
      emit(st);
    };
    switch (f.phase) {
      case kObjOpen:
        if (c_ == '}' && closable(f, n)) {
          complete(st);
          return emit(st);
        }
        if (c_ == '"' && can_start_key(f, n)) return start_key();
        return;
      case kObjNeedKey:
        if (c_ == '"' && can_start_key(f, n)) return start_key();
        return;
      case kObjColon:
        if (c_ != ':') return;
        {
          f.phase = kObjValue;
          Frame v;
          v.kind = kValue;
          v.node = n.props.empty() ? n.additional : n.props[size_t(f.a)].node;
          v.depth = f.depth;
          st.push_back(v);
        }
        return emit(st);
      case kObjAfter:
        if (c_ == ',' && (n.props.empty() || f.a < int32_t(n.props.size())) &&
            can_start_key(f, n)) {
          f.phase = kObjNeedKey;
          return emit(st);
        }
        if (c_ == '}' && closable(f, n)) {
          complete(st);
          return emit(st);
        }
        return;
      default:
        return;
    }
  }

  int32_t item_node(const Node& n, int32_t index) const {
    return index < int32_t(n.prefix.size()) ? n.prefix[size_t(index)] : n.items;
  }

  void array_byte(std::vector<Frame>& st) {
    Frame& f = st.back();
    const Node& n = g_.node(f.node);
    auto start_item = [&] {
      f.phase = kArrItem;
      Frame v;
      v.kind = kValue;
      v.node = item_node(n, f.a);
      v.depth = f.depth;
      st.push_back(v);
      feed(st);  // the byte begins the item
    };
    switch (f.phase) {
      case kArrOpen:
        if (c_ == ']') {
          if (n.min_items == 0) {
            complete(st);
            emit(st);
          }
          return;
        }
        if (n.max_items > 0 && viable(item_node(n, 0), f.depth)) start_item();
        return;
      case kArrAfter:
        if (c_ == ',' && f.a < n.max_items && viable(item_node(n, f.a), f.depth)) {
          f.phase = kArrNeedItem;
          return emit(st);
        }
        if (c_ == ']' && f.a >= n.min_items) {
          complete(st);
          return emit(st);
        }
        return;
      case kArrNeedItem:
        return start_item();
      default:
        return;
    }
  }

  void string_byte(std::vector<Frame>& st) {
    Frame& f = st.back();
    const Node& owner = g_.node(f.node);
    const Trie* t = f.b >= 0 ? &g_.trie(owner.trie) : nullptr;
    int64_t min_len = 0, max_len = kUnbounded;
    if (!f.key) {
      min_len = owner.min_length;
      max_len = owner.max_length;
    }
    // A key's candidates: the properties that may come next (the object frame is below).
    int32_t lo = 0, hi = -1;
    uint8_t obj_depth = 0;
    if (f.key && t) {
      const Frame& obj = st[st.size() - 2];
      lo = obj.a;
      hi = std::min<int32_t>(owner.next_required[size_t(obj.a)], int32_t(owner.props.size()) - 1);
      obj_depth = obj.depth;
    }
    auto candidate = [&](int32_t prop) {
      return prop >= lo && prop <= hi && viable(owner.props[size_t(prop)].node, obj_depth);
    };
    auto ok = [&](int32_t child) {
      if (child < 0) return false;
      if (!f.key) return true;
      const auto& below = t->nodes[size_t(child)].below;
      for (auto it = std::lower_bound(below.begin(), below.end(), lo);
           it != below.end() && *it <= hi; ++it)
        if (candidate(*it)) return true;
      return false;
    };
    // The trie node after a decoded byte (0 without a trie), or -1.
    auto next = [&](uint8_t decoded) -> int32_t {
      if (!t) return 0;
      const int32_t child = t->child(f.b, decoded);
      return ok(child) ? child : -1;
    };
    // Whether some decoded byte in [from, to] can come next.
    auto any_in = [&](uint8_t from, uint8_t to) {
      if (!t) return true;
      for (const auto& [b, child] : t->nodes[size_t(f.b)].children)
        if (b >= from && b <= to && ok(child)) return true;
      return false;
    };
    auto escaped = [&](uint8_t decoded) {
      const int32_t nb = next(decoded);
      if (nb < 0) return;
      if (t) f.b = nb;
      f.esc = 0;
      emit(st);
    };
    const uint8_t c = c_;
    if (!t) {
      switch (JsonMatcher::string_step(f, c, min_len, max_len)) {
        case JsonMatcher::StringStep::kReject:
          return;
        case JsonMatcher::StringStep::kInside:
          return emit(st);
        case JsonMatcher::StringStep::kClose:
          break;
      }
      if (f.key) {
        st.pop_back();
        st.back().phase = kObjColon;
      } else {
        complete(st);
      }
      return emit(st);
    }
    if (f.utf8 > 0) {
      if (c < f.lo || c > f.hi) return;
      const int32_t nb = next(c);
      if (nb < 0) return;
      if (t) f.b = nb;
      --f.utf8;
      f.lo = 0x80;
      f.hi = 0xBF;
      return emit(st);
    }
    switch (f.esc) {
      case 0:
        break;
      case 1:  // after the backslash
        switch (c) {
          case '"':
          case '\\':
            return escaped(c);
          case 'b':
            return escaped(0x08);
          case 'f':
            return escaped(0x0C);
          case 'n':
            return escaped(0x0A);
          case 'r':
            return escaped(0x0D);
          case 't':
            return escaped(0x09);
          case 'u':
            if (!any_in(0x00, 0x1F) && !any_in(0x7F, 0x7F)) return;
            f.esc = 2;
            return emit(st);
          default:
            return;
        }
      case 2:  // \u
      case 3:  // \u0
        if (c != '0') return;
        f.esc = uint8_t(f.esc + 1);
        return emit(st);
      case 4:  // \u00
        if (c == '0' && any_in(0x00, 0x0F))
          f.esc = 5;
        else if (c == '1' && any_in(0x10, 0x1F))
          f.esc = 6;
        else if (c == '7' && any_in(0x7F, 0x7F))
          f.esc = 7;
        else
          return;
        return emit(st);
      case 5:    // \u000
      case 6: {  // \u001
        int h = -1;
        if (c >= '0' && c <= '9') h = c - '0';
        if (c >= 'a' && c <= 'f') h = c - 'a' + 10;
        if (c >= 'A' && c <= 'F') h = c - 'A' + 10;
        if (h < 0) return;
        return escaped(uint8_t((f.esc == 6 ? 0x10 : 0) + h));
      }
      case 7:  // \u007
        if (c == 'f' || c == 'F') return escaped(0x7F);
        return;
      default:
        return;
    }
    if (c == '"') {
      if (f.a < min_len) return;
      int32_t value = -1;
      if (t) {
        value = t->nodes[size_t(f.b)].terminal;
        if (value < 0 || (f.key && !candidate(value))) return;
      }
      if (f.key) {
        st.pop_back();
        Frame& obj = st.back();
        obj.phase = kObjColon;
        if (t) obj.a = value;
        return emit(st);
      }
      complete(st);
      return emit(st);
    }
    if (f.a >= max_len) return;  // every other byte begins a character
    if (c == '\\') {
      if (!any_in('"', '"') && !any_in('\\', '\\') && !any_in(0x00, 0x1F) && !any_in(0x7F, 0x7F))
        return;
      f.esc = 1;
      ++f.a;
      return emit(st);
    }
    if (c < 0x20 || c == 0x7F) return;
    tokenizer_detail::Utf8Lead lead;
    // A continuation byte, or one that never appears in UTF-8.
    if (!tokenizer_detail::utf8_lead(c, lead)) return;
    const int32_t nb = next(c);
    if (nb < 0) return;
    if (t) f.b = nb;
    ++f.a;
    f.utf8 = lead.continuations;
    f.lo = lead.lo;
    f.hi = lead.hi;
    emit(st);
  }

  static bool number_completable(uint8_t phase) {
    return phase == kNumZero || phase == kNumInt || phase == kNumFrac || phase == kNumExp;
  }

  void number_byte(std::vector<Frame>& st) {
    Frame& f = st.back();
    const bool integer = g_.node(f.node).kind == Kind::kInteger;
    const bool digit = c_ >= '0' && c_ <= '9';
    int next = -1;
    switch (f.phase) {
      case kNumMinus:
        if (c_ == '0') next = kNumZero;
        if (c_ >= '1' && c_ <= '9') next = kNumInt;
        break;
      case kNumZero:
      case kNumInt:
        if (digit && f.phase == kNumInt) next = kNumInt;
        if (!integer && c_ == '.') next = kNumDot;
        if (!integer && (c_ == 'e' || c_ == 'E')) next = kNumE;
        break;
      case kNumDot:
        if (digit) next = kNumFrac;
        break;
      case kNumFrac:
        if (digit) next = kNumFrac;
        if (c_ == 'e' || c_ == 'E') next = kNumE;
        break;
      case kNumE:
        if (c_ == '+' || c_ == '-') next = kNumESign;
        if (digit) next = kNumExp;
        break;
      case kNumESign:
      case kNumExp:
        if (digit) next = kNumExp;
        break;
    }
    if (next >= 0) {
      f.phase = uint8_t(next);
      return emit(st);
    }
    // The number ended before this byte, which belongs to what follows it.
    if (!number_completable(f.phase)) return;
    complete(st);
    feed(st);
  }

  void literal_byte(std::vector<Frame>& st) {
    Frame& f = st.back();
    const Trie& t = g_.trie(g_.node(f.node).trie);
    const int32_t child = t.child(f.a, c_);
    if (child >= 0) {
      f.a = child;
      const Trie::Node& tn = t.nodes[size_t(child)];
      if (tn.terminal >= 0 && tn.children.empty()) complete(st);
      return emit(st);
    }
    if (t.nodes[size_t(f.a)].terminal < 0) return;
    complete(st);
    feed(st);
  }

  const JsonGrammar& g_;
  const uint8_t c_;
  State& out_;
};

bool completable_alone(const JsonGrammar& g, const Frame& f) {
  if (f.kind == kNum)
    return f.phase == kNumZero || f.phase == kNumInt || f.phase == kNumFrac || f.phase == kNumExp;
  if (f.kind == kLit) return g.trie(g.node(f.node).trie).nodes[size_t(f.a)].terminal >= 0;
  return false;
}

// Drops repeated stacks (alternatives that met again) and keeps at most kMaxStacks, in place
// (the token mask's walk calls it at every node).
void dedupe(State& s) {
  if (s.ends.size() < 2) return;
  size_t kept = 0;
  uint32_t write = 0, begin = 0;
  for (size_t k = 0; k < s.ends.size(); ++k) {
    const uint32_t end = s.ends[k], len = end - begin;
    bool seen = false;
    uint32_t ob = 0;
    for (size_t j = 0; j < kept && !seen; ++j) {
      const uint32_t oe = s.ends[j];
      seen = oe - ob == len &&
             std::equal(s.frames.begin() + begin, s.frames.begin() + end, s.frames.begin() + ob);
      ob = oe;
    }
    if (!seen && kept < JsonMatcher::kMaxStacks) {
      // Kept stacks only move towards the front, so the copy never overwrites what it reads.
      if (write != begin)
        std::copy(s.frames.begin() + begin, s.frames.begin() + end, s.frames.begin() + write);
      write += len;
      s.ends[kept++] = write;
    }
    begin = end;
  }
  s.ends.resize(kept);
  s.frames.resize(write);
}

}  // namespace

JsonMatcher::StringStep JsonMatcher::string_step(Frame& f, uint8_t c, int64_t min_len,
                                                 int64_t max_len) {
  if (f.utf8 > 0) {
    if (c < f.lo || c > f.hi) return StringStep::kReject;
    --f.utf8;
    f.lo = 0x80;
    f.hi = 0xBF;
    return StringStep::kInside;
  }
  switch (f.esc) {
    case 0:
      break;
    case 1:
      switch (c) {
        case '"':
        case '\\':
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't':
          f.esc = 0;
          return StringStep::kInside;
        case 'u':
          f.esc = 2;
          return StringStep::kInside;
        default:
          return StringStep::kReject;
      }
    case 2:
    case 3:
      if (c != '0') return StringStep::kReject;
      ++f.esc;
      return StringStep::kInside;
    case 4:
      if (c == '0')
        f.esc = 5;
      else if (c == '1')
        f.esc = 6;
      else if (c == '7')
        f.esc = 7;
      else
        return StringStep::kReject;
      return StringStep::kInside;
    case 5:
    case 6:
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
        return StringStep::kReject;
      f.esc = 0;
      return StringStep::kInside;
    case 7:
      if (c != 'f' && c != 'F') return StringStep::kReject;
      f.esc = 0;
      return StringStep::kInside;
    default:
      return StringStep::kReject;
  }
  if (c == '"') return f.a >= min_len ? StringStep::kClose : StringStep::kReject;
  if (f.a >= max_len || c < 0x20 || c == 0x7F) return StringStep::kReject;
  if (c == '\\') {
    f.esc = 1;
    ++f.a;
    return StringStep::kInside;
  }
  tokenizer_detail::Utf8Lead lead;
  if (!tokenizer_detail::utf8_lead(c, lead)) return StringStep::kReject;
  ++f.a;
  f.utf8 = lead.continuations;
  f.lo = lead.lo;
  f.hi = lead.hi;
  return StringStep::kInside;
}

bool JsonMatcher::plain_string(const JsonGrammar& g, const State& s, int64_t& min_len,
                               int64_t& max_len) {
  // Every parse at a string without enum values, each at the same place in it with the same
  // bounds (alternatives that share a string property), so that one frame says where all are.
  uint32_t begin = 0;
  for (size_t k = 0; k < s.ends.size(); ++k) {
    const uint32_t end = s.ends[k];
    if (end == begin) return false;
    const Frame& f = s.frames[end - 1];
    if (f.kind != kStr || f.b >= 0) return false;
    const int64_t lo = f.key ? 0 : g.node(f.node).min_length;
    const int64_t hi = f.key ? kUnbounded : g.node(f.node).max_length;
    if (k == 0) {
      min_len = lo;
      max_len = hi;
    } else {
      const Frame& first = s.frames[s.ends[0] - 1];
      if (lo != min_len || hi != max_len || f.esc != first.esc || f.utf8 != first.utf8 ||
          f.lo != first.lo || f.hi != first.hi || f.a != first.a)
        return false;
    }
    begin = end;
  }
  return !s.ends.empty();
}

void JsonMatcher::set_string_place(State& s, const Frame& place) {
  for (uint32_t end : s.ends) {
    Frame& f = s.frames[end - 1];
    f.esc = place.esc;
    f.utf8 = place.utf8;
    f.lo = place.lo;
    f.hi = place.hi;
    f.a = place.a;
  }
}

void JsonMatcher::step(const JsonGrammar& g, const State& in, uint8_t byte, State& out) {
  out.clear();
  thread_local std::vector<Frame> scratch;
  Stepper stepper(g, byte, out);
  uint32_t begin = 0;
  for (uint32_t end : in.ends) {
    scratch.assign(in.frames.begin() + begin, in.frames.begin() + end);
    stepper.feed(scratch);
    begin = end;
  }
  dedupe(out);
}

bool JsonMatcher::accepting(const JsonGrammar& g, const State& s) {
  uint32_t begin = 0;
  for (uint32_t end : s.ends) {
    if (end == begin) return true;
    if (end - begin == 1 && completable_alone(g, s.frames[begin])) return true;
    begin = end;
  }
  return false;
}

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonGrammar> grammar)
    : grammar_(std::move(grammar)) {
  TF_CHECK(grammar_, "JsonMatcher: no grammar");
  Frame root;
  root.kind = kValue;
  root.node = grammar_->root();
  state_.frames.push_back(root);
  state_.ends.push_back(1);
}

bool JsonMatcher::advance(uint8_t byte) {
  step(*grammar_, state_, byte, next_);
  if (next_.empty()) return false;
  std::swap(state_, next_);
  return true;
}

bool JsonMatcher::advance(std::string_view bytes) {
  State saved = state_;
  for (unsigned char c : bytes)
    if (!advance(c)) {
      state_ = std::move(saved);
      return false;
    }
  return true;
}

bool JsonMatcher::accepting() const { return accepting(*grammar_, state_); }

bool JsonMatcher::finished() const {
  if (state_.empty()) return false;
  uint32_t begin = 0;
  for (uint32_t end : state_.ends) {
    if (end != begin) return false;
    begin = end;
  }
  return true;
}

}  // namespace tformers::generation
