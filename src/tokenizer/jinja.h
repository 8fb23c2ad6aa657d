// A Jinja subset for Hugging Face chat templates (tokenizer_config.json "chat_template").
//
// The reference is Python Jinja2 as Transformers' apply_chat_template runs it: output is
// byte-identical to it for the templates of the models we target, with Python's values (True,
// None, repr of lists and dicts, exact integers, floor division, Jinja2's Undefined that raises
// when an attribute of it is taken). The environment is the one Transformers builds: sandboxed,
// trim_blocks and lstrip_blocks on, the {% generation %} tag, its tojson, raise_exception(),
// strftime_now() and namespace(). Integers are 64-bit: beyond that is an error, not a float.
// See tests/chat_template/README.md for the supported subset and the differences.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace tformers::jinja {

struct Program;  // parsed template, private to jinja*.cc

// Limits that keep a hostile or broken template from exhausting the stack or memory.
struct Limits {
  int max_depth = 256;                    // nesting of expressions, blocks and macro calls
  size_t max_output_bytes = 64u << 20;    // rendered text, including loop bodies and macros
  size_t max_loop_iterations = 10000000;  // all for-loop iterations of one render
  size_t max_steps = 50000000;            // evaluations of one render (its time budget)
  size_t max_memory_bytes = 256u << 20;   // strings and lists one render builds, in total
  size_t max_stack_bytes = 1u << 20;      // C stack the parser or a render may use (sanitizer
                                          // builds have large frames, so depth alone is no bound)
};

class Template {
 public:
  // Parses the template; throws FormatError "chat template line L, column C: ..." on syntax errors.
  explicit Template(std::string source, Limits limits = {});
  ~Template();
  Template(const Template&);  // cheap: the parsed program is shared and immutable
  Template& operator=(const Template&);
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the variables of `context` (messages, tools, add_generation_prompt, bos_token,
  // eos_token, enable_thinking, ...). Object keys keep the iteration order of the json type:
  // nlohmann::json sorts them, nlohmann::ordered_json keeps the order of the document, which is
  // what `tojson` of tool definitions needs to match Transformers. Runtime errors, including
  // raise_exception("msg"), throw FormatError with the template line and column and the message.
  // Safe to call from several threads at once (each render has its own state).
  std::string render(const nlohmann::json& context) const;
  std::string render(const nlohmann::ordered_json& context) const;

  // strftime_now(format) formats the broken-down time this returns (default: local time now, as
  // Python's datetime.now()). Tests set a fixed time so that goldens are deterministic.
  void set_clock(std::function<std::tm()> now);

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  Limits limits_;
  std::shared_ptr<const Program> program_;
  std::function<std::tm()> now_;
};

}  // namespace tformers::jinja
