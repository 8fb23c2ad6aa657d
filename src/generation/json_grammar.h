// Structured output: a JSON schema compiled to a grammar, and a byte-level pushdown matcher that
// says which bytes may come next. token_matcher.h turns it into token masks.
//
// The subset of JSON Schema (docs/serving.md, "Structured output"):
//   type (object, array, string, number, integer, boolean, null, or a list of them; absent: any),
//   properties, required, additionalProperties, items, prefixItems, minItems, maxItems,
//   minLength, maxLength, enum, const, anyOf, oneOf (as anyOf), allOf of one schema, $ref to a
//   local JSON pointer ("#", "#/$defs/Name", "#/definitions/Name", ...), $defs/definitions,
//   and annotations (title, description, default, examples, $schema, $id, $comment, deprecated,
//   readOnly, writeOnly, x-*), which constrain nothing. Any other keyword is a SchemaError naming
//   it and where it is.
//
// What is generated is a subset of what the schema accepts, chosen so that generation is
// deterministic to follow and always terminates at a complete value:
//   - compact JSON: no whitespace anywhere, before, inside or after the value;
//   - an object with `properties` lists them in the schema's order, each at most once, the
//     required ones always; no other property is generated, whatever additionalProperties says
//     (OpenAI's strict mode sets it to false anyway). An object schema without `properties` is a
//     map: any keys, each value matching additionalProperties (any value when absent or true;
//     false allows only {});
//   - strings: raw UTF-8 (valid, no surrogates or overlong forms), printable ASCII but '"' and
//     '\\', and the escapes \" \\ \b \f \n \r \t and \u00XX for control characters and DEL
//     (\u0000-\u001f, \u007f); no \/ and no other \u escapes, so decoded text is the raw text;
//   - numbers: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?; integers without fraction or
//     exponent;
//   - enum and const values are matched as compact JSON in their key order; strings among them
//     may use any of the allowed escapes for the same value;
//   - objects and arrays nest at most max_value_depth (32) levels; a schema whose values must
//     nest deeper, or forever, is refused;
//   - anyOf and oneOf alternatives are followed together while more than one fits the bytes so
//     far (a oneOf value that fits two alternatives is not refused).
// These are also llguidance's JSON rules with whitespace_flexible false, which the tests
// compare the token masks against (tests/generation/test_json_grammar_oracle.cc).
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tformers/error.h"

namespace tformers::generation {

using OrderedJson = nlohmann::ordered_json;

// A schema that cannot be compiled: a keyword that is not supported (keyword() names it), a
// malformed value, a $ref that does not resolve, a limit. The message names the keyword and its
// place in the schema as a JSON pointer ("#/properties/name").
class SchemaError : public InvalidArgumentError {
 public:
  SchemaError(const std::string& path, const std::string& keyword, const std::string& message);
  const std::string& path() const { return path_; }
  const std::string& keyword() const { return keyword_; }

 private:
  std::string path_, keyword_;
};

struct JsonGrammarLimits {
  int64_t max_nodes = 10000;            // compiled subschemas (a $ref target counts once)
  int64_t max_schema_depth = 32;        // subschemas nested in the schema document
  int64_t max_value_depth = 32;         // objects and arrays nested in the generated value
  int64_t max_literal_bytes = 1 << 20;  // property names, enum and const values together
};

// A compiled schema: immutable, shared by every sequence that follows it.
class JsonGrammar {
 public:
  // SchemaError when `schema` (a JSON object or a boolean) is outside the subset above.
  static std::shared_ptr<const JsonGrammar> compile(const OrderedJson& schema,
                                                    const JsonGrammarLimits& limits = {});
  // Any JSON object (OpenAI's response_format {"type": "json_object"}).
  static std::shared_ptr<const JsonGrammar> any_object();

  // -- The compiled form, read by the matcher. --
  enum class Kind : uint8_t { kObject, kArray, kString, kNumber, kInteger, kLiteral, kUnion };
  struct Trie {
    struct Node {
      std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
      int32_t terminal = -1;                              // the value's index (a property's), or -1
      std::vector<int32_t> below;  // key tries: the property indices at or below, sorted
    };
    std::vector<Node> nodes{Node{}};
    int32_t child(int32_t node, uint8_t byte) const;
    void insert(std::string_view bytes, int32_t value, bool track_below);
  };
  struct Property {
    std::string name;
    int32_t node = -1;
    bool required = false;
  };
  struct Node {
    Kind kind = Kind::kUnion;
    // kObject: properties in order (their names in `trie`); next_required[i] is the first
    // required index >= i, or props.size(). Without properties, `additional` is the node of every
    // value of a map (-1: only {}).
    std::vector<Property> props;
    std::vector<int32_t> next_required;
    int32_t additional = -1;
    // kArray: item i matches prefix[i], then `items` (-1: no more items).
    std::vector<int32_t> prefix;
    int32_t items = -1;
    int64_t min_items = 0, max_items = INT64_MAX;
    // kString: length bounds in code points.
    int64_t min_length = 0, max_length = INT64_MAX;
    // kString with enum values (the decoded bytes), kLiteral (raw bytes), kObject (the names).
    int32_t trie = -1;
    // kUnion: the alternatives, none of them a union once compiled.
    std::vector<int32_t> alts;
    // The fewest objects and arrays nested in a value of this node (0 for a scalar).
    int32_t min_depth = 0;
    std::bitset<256> first;  // bytes a value can begin with (not for unions)
  };

  int32_t root() const { return root_; }
  const Node& node(int32_t i) const { return nodes_[size_t(i)]; }
  const Trie& trie(int32_t i) const { return tries_[size_t(i)]; }
  int32_t max_value_depth() const { return max_value_depth_; }

 private:
  friend class SchemaCompiler;
  std::vector<Node> nodes_;
  std::vector<Trie> tries_;
  int32_t root_ = -1;
  int32_t max_value_depth_ = 32;
};

// Follows the bytes of one value through a grammar. Every state it can be in has a completion,
// so a byte it accepts never leads to a dead end.
class JsonMatcher {
 public:
  // One frame of a parse stack.
  struct Frame {
    uint8_t kind = 0, phase = 0;
    uint8_t esc = 0;         // string: where in an escape
    uint8_t utf8 = 0;        // string: continuation bytes still due
    uint8_t lo = 0, hi = 0;  // string: the range of the next continuation byte
    uint8_t key = 0;         // string: an object's key (node is the object's)
    uint8_t depth = 0;       // objects and arrays in the stack up to this frame
    int32_t node = -1;
    int32_t a = 0;   // object: next property; array: items; string: characters; literal: trie node
    int32_t b = -1;  // string: trie node (-1: none)
    bool operator==(const Frame&) const = default;
  };
  // Every parse the bytes so far allow (usually one): stack k is frames[ends[k-1], ends[k]).
  struct State {
    std::vector<Frame> frames;
    std::vector<uint32_t> ends;
    size_t stacks() const { return ends.size(); }
    bool empty() const { return ends.empty(); }
    void clear() {
      frames.clear();
      ends.clear();
    }
  };

  explicit JsonMatcher(std::shared_ptr<const JsonGrammar> grammar);

  // Takes the byte if the grammar allows it here (true) or leaves the state as it was (false).
  bool advance(uint8_t byte);
  // All the bytes, or none of them.
  bool advance(std::string_view bytes);
  // The bytes so far are a whole value (it may go on, as "12" may become "123").
  bool accepting() const;
  // A whole value that no byte can extend.
  bool finished() const;
  const State& state() const { return state_; }
  const JsonGrammar& grammar() const { return *grammar_; }

  // The state after `byte` from `in` into `out` (empty when the byte is refused). `out` is
  // overwritten and keeps its capacity, so that the token mask's walk allocates nothing.
  static void step(const JsonGrammar& g, const State& in, uint8_t byte, State& out);
  static bool accepting(const JsonGrammar& g, const State& s);
  // Inside a string without enum values, a byte changes only the string's frame: the token
  // mask's walk follows that frame alone until the string closes. string_step is the byte's
  // effect on it (the grammar's own, shared with step()). plain_string says whether every parse
  // of `s` is at such a string, all at the same place with the same length bounds (returned);
  // set_string_place puts a frame's place in the string (escape, UTF-8, length) into each.
  enum class StringStep { kReject, kInside, kClose };
  static StringStep string_step(Frame& f, uint8_t byte, int64_t min_len, int64_t max_len);
  static bool plain_string(const JsonGrammar& g, const State& s, int64_t& min_len,
                           int64_t& max_len);
  static void set_string_place(State& s, const Frame& place);
  // The most parses followed at once; more (a pathological anyOf) are dropped, which can only
  // narrow what is allowed.
  static constexpr size_t kMaxStacks = 128;

 private:
  std::shared_ptr<const JsonGrammar> grammar_;
  State state_, next_;
};

}  // namespace tformers::generation
