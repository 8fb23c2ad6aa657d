// Internals of the chat-template engine (jinja.h): values, syntax tree, helpers shared by the
// parser (jinja.cc), the interpreter (jinja_eval.cc) and the value helpers (jinja_value.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/jinja.h"

namespace tformers::jinja {

// ---------------------------------------------------------------------------------------------
// Errors. A JinjaError carries a byte offset into the original template source once known; the
// public entry points turn it into FormatError with line and column.
struct JinjaError {
  std::string message;
  int64_t offset = -1;  // byte offset in the template source, -1 until a node claims it
  bool raised = false;  // from raise_exception(): the message is the template's own
};
[[noreturn]] void fail(std::string message);

// ---------------------------------------------------------------------------------------------
// Values, modelled on the Python objects Jinja2 templates see. Arrays and objects are shared and
// never mutated after construction, except namespaces, whose attributes `{% set ns.x = ... %}`
// assigns.
enum class Type {
  kUndefined,
  kNull,
  kBool,
  kInt,    // a Python int, exact in 64 bits (`integer`); leaving that range is an error
  kFloat,  // a Python float (`number`)
  kString,
  kArray,
  kTuple,
  kObject,
  kKwargs,  // keyword arguments of a call, passed as the last positional argument
  kNamespace,
  kFunction,
};
const char* type_name(Type t);  // "str", "int", ... as Python names the types

struct Value;
struct Interpreter;
using Array = std::vector<Value>;
using Function = std::function<Value(std::vector<Value>& args, Interpreter& in)>;

struct Object {
  std::vector<std::pair<std::string, Value>> items;  // insertion order
  std::unordered_map<std::string, size_t> index;

  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);
};

struct Value {
  Type type = Type::kUndefined;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  std::string str;  // the text of a string; for undefined, why it is undefined (the error)
  std::shared_ptr<const Array> array;
  std::shared_ptr<Object> object;
  std::shared_ptr<const Function> function;

  static Value undefined() { return Value{}; }
  static Value undefined(std::string why);  // "'x' is undefined", raised when it is used
  static Value null();
  static Value from_bool(bool b);
  static Value from_int(int64_t v);
  static Value from_float(double v);
  static Value from_string(std::string s);
  static Value from_array(Array a, Type t = Type::kArray);
  static Value from_object(std::shared_ptr<Object> o, Type t = Type::kObject);
  static Value from_function(Function f);

  bool is_number() const { return type == Type::kInt || type == Type::kFloat; }
  // Python's bool is an int: True + 1 is 2, 1 == True.
  bool is_integral() const { return type == Type::kInt || type == Type::kBool; }
  int64_t as_int() const { return type == Type::kBool ? int64_t(boolean) : integer; }
  double as_double() const { return type == Type::kFloat ? number : double(as_int()); }
  bool is_array() const { return type == Type::kArray || type == Type::kTuple; }
  bool is_object() const { return type == Type::kObject || type == Type::kKwargs; }
  bool is_container() const { return is_object() || type == Type::kNamespace; }
  bool truthy() const;
};

// Throws JinjaError when the value nests deeper than max_depth.
template <typename Json>
Value value_from_json(const Json& j, int max_depth);

// Conversions as Python does them. Each writes into a Sink, which stops a conversion once it
// would exceed `limit` bytes (a list shared a million times over renders far beyond memory) and
// counts `steps` against `max_steps`, so that no conversion is unbounded in time or memory.
struct Sink {
  std::string out;
  size_t limit = SIZE_MAX;
  size_t* steps = nullptr;
  size_t max_steps = SIZE_MAX;
  int max_depth = 1000;

  void grown() const;  // fails once out.size() > limit
  void append(std::string_view s) {
    out += s;
    if (out.size() > limit) grown();
  }
  void push(char c) {
    out.push_back(c);
    if (out.size() > limit) grown();
  }
  void step();  // one value converted or compared
};
std::string python_float(double v);          // repr(float): 2.0, 1e+16, 1e-05, inf, nan
std::string python_str(const Value& v);      // str(value): what {{ x }} prints and `~` joins
void write_str(Sink& sink, const Value& v);  // the same, into a Sink
void write_repr(Sink& sink, const Value& v, int depth = 0);  // repr(value)
struct JsonOptions {  // Transformers' tojson: json.dumps(x, ensure_ascii=False, ...)
  int indent = -1;    // -1: None (one line); 0 and up: newlines, that many spaces per level
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool has_separators = false;
  std::string item_sep, key_sep;
};
void write_json(Sink& sink, const Value& v, const JsonOptions& opt, int depth = 0);
// Python ==, and the ordering of <, sorted() (-1, 0, 1; fails on types Python cannot order).
// `sink` (may be null) counts steps: comparing a list shared with itself many times over is long.
bool python_equal(const Value& a, const Value& b, Sink* sink = nullptr);
int python_compare(const Value& a, const Value& b, const char* op, Sink* sink = nullptr);
const char* python_type(const Value& v);  // "str", "int", "list", "NoneType", ...

// UTF-8 helpers with Python's notion of whitespace (str.isspace, str.strip()).
size_t space_at(std::string_view s, size_t i);        // bytes of a whitespace char at i, or 0
size_t space_before(std::string_view s, size_t end);  // bytes of a whitespace char ending at end
size_t js_space_at(std::string_view s, size_t i);     // JavaScript whitespace (the lexer's)
std::string trim_start(std::string_view s);
std::string trim_end(std::string_view s);
std::string trim(std::string_view s);
std::vector<std::string> code_points(std::string_view s);
size_t code_point_count(std::string_view s);
std::string to_upper(std::string_view s);
std::string to_lower(std::string_view s);
void append_utf8(std::string& out, uint32_t cp);

// ---------------------------------------------------------------------------------------------
// Syntax tree: one node type; the meaning of the child slots depends on the kind.
enum class Kind {
  // statements
  kText,       // str
  kComment,    //
  kSet,        // x = assignee, y = value (or null, then `body` is the block)
  kIf,         // x = test, body, alt
  kFor,        // x = loop variable, y = iterable, body, alt = else block
  kMacro,      // str = name, args = parameters, body
  kCallBlock,  // x = call expression, args = caller parameters, body, flag = has caller args
  kBreak,
  kContinue,
  kFilterBlock,  // x = filter (identifier or call), body
  // expressions
  kInt,       // integer
  kFloat,     // number
  kString,    // str
  kArray,     // args
  kTuple,     // args
  kObject,    // args = keys, body = values
  kIdent,     // str
  kMember,    // x = object, y = property, flag = computed ([...])
  kSlice,     // x, y, z = start, stop, step (each may be null)
  kCall,      // x = callee, args
  kUnary,     // str = operator, x
  kBinary,    // str = operator, x, y, flag = written in parentheses
  kFilter,    // x = operand, y = filter (identifier or call)
  kTest,      // x = operand, str = test name, flag = negated
  kSelect,    // x = value, y = condition (`a if b` without else)
  kTernary,   // x = condition, y = if true, z = if false
  kSpread,    // x  (*args)
  kKwSpread,  // x  (**kwargs)
  kKwArg,     // str = name, x = value
};

struct Node {
  Kind kind;
  uint32_t offset = 0;  // byte offset in the original source
  std::string str;
  double number = 0;
  int64_t integer = 0;
  bool flag = false;
  std::unique_ptr<Node> x, y, z;
  std::vector<std::unique_ptr<Node>> args, body, alt;

  Node() = default;
  ~Node();  // iterative: `1+1+...+1` builds a tree deeper than the stack could unwind
};

struct Program {
  std::vector<std::unique_ptr<Node>> body;
};

std::unique_ptr<Program> parse_template(const std::string& source, const Limits& limits);

// Address of the caller's frame; the distance between two of them is the stack in use.
inline uintptr_t stack_position() { return uintptr_t(__builtin_frame_address(0)); }
inline size_t stack_used(uintptr_t base) {
  uintptr_t now = stack_position();
  return now > base ? now - base : base - now;
}

// Renders a parsed program; defined in jinja_eval.cc.
std::string run_program(const Program& program, std::vector<std::pair<std::string, Value>> globals,
                        const Limits& limits, const std::function<std::tm()>& now);

}  // namespace tformers::jinja
