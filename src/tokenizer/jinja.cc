// Chat-template engine: whitespace preprocessing, lexer, parser and the public Template class.
// The grammar and its precedence follow Jinja2's so that templates parse the same way.
#include "tokenizer/jinja.h"

#include <algorithm>
#include <charconv>

#include "tformers/error.h"
#include "tokenizer/jinja_internal.h"

namespace tformers::jinja {

void fail(std::string message) { throw JinjaError{std::move(message)}; }

namespace {

// ---------------------------------------------------------------------------------------------
// Preprocessing: the environment options Transformers uses (trim_blocks, lstrip_blocks, no
// trailing newline) and the {% generation %} tag are applied to the text before lexing, with the
// effect Jinja2's lexer has. Every byte keeps its offset in the original source for error reports.
struct Text {
  std::string s;
  std::vector<uint32_t> at;  // at[i] = offset in the source of s[i]; at[size] = source size

  void push(const Text& from, size_t i) {
    s.push_back(from.s[i]);
    at.push_back(from.at[i]);
  }
};

bool line_start(const std::string& s, size_t i) {
  return i == 0 || s[i - 1] == '\n';  // newlines are normalized to \n first
}

// Length of a {% generation %} / {% endgeneration %} tag at i (0 if none); reports its dashes.
size_t generation_tag(const std::string& s, size_t i, bool& lstrip, bool& rstrip) {
  if (s.compare(i, 2, "{%") != 0) return 0;
  size_t j = i + 2;
  lstrip = j < s.size() && s[j] == '-';
  if (lstrip) ++j;
  while (size_t n = js_space_at(s, j)) j += n;
  if (s.compare(j, 3, "end") == 0 && s.compare(j + 3, 10, "generation") == 0) j += 3;
  if (s.compare(j, 10, "generation") != 0) return 0;
  j += 10;
  while (size_t n = js_space_at(s, j)) j += n;
  rstrip = j < s.size() && s[j] == '-';
  if (rstrip) ++j;
  if (s.compare(j, 2, "%}") != 0) return 0;
  return j + 2 - i;
}

Text preprocess(const std::string& source) {
  // Jinja2's lexer turns every \r\n and \r into \n (its newline_sequence).
  Text t;
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      if (i + 1 < source.size() && source[i + 1] == '\n') continue;  // the \n follows
      t.s.push_back('\n');
    } else {
      t.s.push_back(source[i]);
    }
    t.at.push_back(uint32_t(i));
  }
  t.at.push_back(uint32_t(source.size()));
  if (!t.s.empty() && t.s.back() == '\n') {  // a single trailing newline is dropped
    t.s.pop_back();
    t.at.erase(t.at.end() - 2);
  }
  auto finish = [](Text& u, const Text& from) { u.at.push_back(from.at.back()); };

  // lstrip_blocks: whitespace from a line start up to "{%" or "{#" (not "{{").
  Text a;
  for (size_t i = 0; i < t.s.size();) {
    if (line_start(t.s, i)) {
      size_t j = i;
      // Jinja2 strips any whitespace (\s) between the line start and the tag.
      while (j < t.s.size() && t.s[j] != '\n' && space_at(t.s, j)) j += space_at(t.s, j);
      if (j > i && j + 1 < t.s.size() && t.s[j] == '{' &&
          (t.s[j + 1] == '#' || t.s[j + 1] == '%')) {
        i = j;
        continue;
      }
    }
    a.push(t, i++);
  }
  finish(a, t);

  // trim_blocks: the first newline after "%}" or "#}" goes.
  Text b;
  for (size_t i = 0; i < a.s.size(); ++i) {
    b.push(a, i);
    if (a.s[i] == '}' && i > 0 && (a.s[i - 1] == '%' || a.s[i - 1] == '#') && i + 1 < a.s.size() &&
        a.s[i + 1] == '\n') {
      ++i;
    }
  }
  finish(b, a);

  // {% generation %} marks assistant text for return_assistant_tokens_mask; it renders nothing.
  // The whitespace around it is kept unless the tag's dashes strip it.
  Text c;
  for (size_t i = 0; i < b.s.size();) {
    size_t j = i;
    while (size_t n = js_space_at(b.s, j)) j += n;
    bool lstrip = false, rstrip = false;
    if (size_t len = generation_tag(b.s, j, lstrip, rstrip)) {
      if (!lstrip) {
        for (size_t k = i; k < j; ++k) c.push(b, k);
      } else {
        // {%- strips all the whitespace before the tag, also what an earlier tag left.
        while (size_t n = space_before(c.s, c.s.size())) {
          c.s.resize(c.s.size() - n);
          c.at.resize(c.at.size() - n);
        }
      }
      size_t k = j + len, m = k;
      while (size_t n = js_space_at(b.s, m)) m += n;
      if (!rstrip)
        for (size_t q = k; q < m; ++q) c.push(b, q);
      i = m;
      continue;
    }
    c.push(b, i++);
  }
  finish(c, b);
  return c;
}

// ---------------------------------------------------------------------------------------------
// Lexer.
enum class Tok {
  kText,
  kNumber,
  kString,
  kIdent,
  kEquals,
  kOpenParen,
  kCloseParen,
  kOpenStatement,
  kCloseStatement,
  kOpenExpression,
  kCloseExpression,
  kOpenBracket,
  kCloseBracket,
  kOpenBrace,
  kCloseBrace,
  kComma,
  kDot,
  kColon,
  kPipe,
  kAdditive,        // + - ~
  kMultiplicative,  // * / // %
  kPower,           // **
  kComparison,      // < > <= >= == !=
  kUnary,           // - + not followed by a number
  kComment,
  kEnd,
};

struct Token {
  Tok type;
  std::string value;
  uint32_t offset;
};

const char* tok_name(Tok t) {
  switch (t) {
    case Tok::kText:
      return "text";
    case Tok::kNumber:
      return "number";
    case Tok::kString:
      return "string";
    case Tok::kIdent:
      return "identifier";
    case Tok::kEquals:
      return "'='";
    case Tok::kOpenParen:
      return "'('";
    case Tok::kCloseParen:
      return "')'";
    case Tok::kOpenStatement:
      return "'{%'";
    case Tok::kCloseStatement:
      return "'%}'";
    case Tok::kOpenExpression:
      return "'{{'";
    case Tok::kCloseExpression:
      return "'}}'";
    case Tok::kOpenBracket:
      return "'['";
    case Tok::kCloseBracket:
      return "']'";
    case Tok::kOpenBrace:
      return "'{'";
    case Tok::kCloseBrace:
      return "'}'";
    case Tok::kComma:
      return "','";
    case Tok::kDot:
      return "'.'";
    case Tok::kColon:
      return "':'";
    case Tok::kPipe:
      return "'|'";
    case Tok::kAdditive:
      return "operator";
    case Tok::kMultiplicative:
      return "operator";
    case Tok::kPower:
      return "'**'";
    case Tok::kComparison:
      return "comparison";
    case Tok::kUnary:
      return "unary operator";
    case Tok::kComment:
      return "comment";
    case Tok::kEnd:
      return "end of template";
  }
  return "?";
}

struct LexError {
  std::string message;
  uint32_t offset;
};

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_word(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

std::vector<Token> tokenize(const Text& t) {
  const std::string& s = t.s;
  std::vector<Token> tokens;
  size_t i = 0;
  auto err = [&](std::string msg, size_t at) -> LexError {
    return LexError{std::move(msg), t.at[std::min(at, s.size())]};
  };
  auto push = [&](Tok type, std::string v, size_t at) {
    tokens.push_back(Token{type, std::move(v), t.at[std::min(at, s.size())]});
  };
  auto strip_trailing = [&] {  // {%- and {{- trim the text before them
    if (!tokens.empty() && tokens.back().type == Tok::kText) {
      std::string& v = tokens.back().value;
      v = trim_end(v);
      if (v.empty()) tokens.pop_back();
    }
  };
  auto skip_space = [&] {
    while (size_t n = js_space_at(s, i)) i += n;
  };
  auto digits = [&] {
    size_t b = i;
    while (i < s.size() && is_digit(s[i])) ++i;
    return s.substr(b, i - b);
  };
  int brace_depth = 0;
  const std::pair<const char*, Tok> table[] = {
      {"{%", Tok::kOpenStatement},  {"%}", Tok::kCloseStatement},
      {"{{", Tok::kOpenExpression}, {"}}", Tok::kCloseExpression},
      {"(", Tok::kOpenParen},       {")", Tok::kCloseParen},
      {"{", Tok::kOpenBrace},       {"}", Tok::kCloseBrace},
      {"[", Tok::kOpenBracket},     {"]", Tok::kCloseBracket},
      {",", Tok::kComma},           {".", Tok::kDot},
      {":", Tok::kColon},           {"|", Tok::kPipe},
      {"<=", Tok::kComparison},     {">=", Tok::kComparison},
      {"==", Tok::kComparison},     {"!=", Tok::kComparison},
      {"<", Tok::kComparison},      {">", Tok::kComparison},
      {"+", Tok::kAdditive},        {"-", Tok::kAdditive},
      {"~", Tok::kAdditive},        {"**", Tok::kPower},
      {"*", Tok::kMultiplicative},  {"//", Tok::kMultiplicative},
      {"/", Tok::kMultiplicative},  {"%", Tok::kMultiplicative},
      {"=", Tok::kEquals},
  };

  while (i < s.size()) {
    Tok last = tokens.empty() ? Tok::kEnd : tokens.back().type;
    if (tokens.empty() || last == Tok::kCloseStatement || last == Tok::kCloseExpression ||
        last == Tok::kComment) {
      size_t b = i;
      while (i < s.size() && !(s[i] == '{' && i + 1 < s.size() &&
                               (s[i + 1] == '%' || s[i + 1] == '{' || s[i + 1] == '#')))
        ++i;
      if (i > b) {
        push(Tok::kText, s.substr(b, i - b), b);
        continue;
      }
    }
    if (s.compare(i, 2, "{#") == 0) {
      size_t b = i;
      i += 2;
      bool strip_before = i < s.size() && s[i] == '-';
      if (strip_before) ++i;
      size_t e = s.find("#}", i);
      if (e == std::string::npos) throw err("comment {# is never closed with #}", b);
      std::string comment = s.substr(i, e - i);
      bool strip_after = !comment.empty() && comment.back() == '-';
      if (strip_before) strip_trailing();
      push(Tok::kComment, comment, b);
      i = e + 2;
      if (strip_after) skip_space();
      continue;
    }
    if (s.compare(i, 3, "{%-") == 0) {
      strip_trailing();
      push(Tok::kOpenStatement, "{%", i);
      i += 3;
      continue;
    }
    if (s.compare(i, 3, "{{-") == 0) {
      strip_trailing();
      push(Tok::kOpenExpression, "{{", i);
      brace_depth = 0;
      i += 3;
      continue;
    }
    skip_space();
    if (i >= s.size()) break;
    if (s.compare(i, 3, "-%}") == 0) {
      push(Tok::kCloseStatement, "%}", i);
      i += 3;
      skip_space();
      continue;
    }
    if (s.compare(i, 3, "-}}") == 0) {
      push(Tok::kCloseExpression, "}}", i);
      i += 3;
      skip_space();
      continue;
    }
    char c = s[i];
    if (c == '-' || c == '+') {
      if (tokens.empty() || last == Tok::kText)
        throw err(std::string("unexpected character '") + c + "'", i);
      bool binary = last == Tok::kIdent || last == Tok::kNumber || last == Tok::kString ||
                    last == Tok::kCloseParen || last == Tok::kCloseBracket;
      if (!binary) {
        size_t b = i++;
        std::string num = digits();
        if (!num.empty() && i + 1 < s.size() && s[i] == '.' && is_digit(s[i + 1])) {
          ++i;
          num += "." + digits();
        }
        push(num.empty() ? Tok::kUnary : Tok::kNumber, std::string(1, c) + num, b);
        continue;
      }
    }
    bool matched = false;
    for (const auto& [seq, type] : table) {
      std::string_view sv(seq);
      if (type == Tok::kCloseExpression && brace_depth > 0) continue;  // "}}" closing a dict
      if (s.compare(i, sv.size(), sv) == 0) {
        push(type, std::string(sv), i);
        if (type == Tok::kOpenExpression) brace_depth = 0;
        if (type == Tok::kOpenBrace) ++brace_depth;
        if (type == Tok::kCloseBrace) --brace_depth;
        i += sv.size();
        matched = true;
        break;
      }
    }
    if (matched) continue;
    if (c == '\'' || c == '"') {
      size_t b = i++;
      std::string str;
      while (true) {
        if (i >= s.size()) throw err("string literal is never closed", b);
        char d = s[i];
        if (d == c) break;
        if (d == '\\') {
          if (++i >= s.size()) throw err("string literal is never closed", b);
          char e = s[i++];
          if (e == 'x' || e == 'u') {
            size_t len = e == 'x' ? 2 : 4;
            std::string hex = s.substr(i, len);
            if (hex.size() != len ||
                hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
              throw err("invalid escape sequence \\" + std::string(1, e) + hex, i - 2);
            uint32_t cp = uint32_t(std::stoul(hex, nullptr, 16));
            // A lone UTF-16 surrogate cannot be written as UTF-8.
            append_utf8(str, (cp >= 0xD800 && cp <= 0xDFFF) ? 0xFFFD : cp);
            i += len;
            continue;
          }
          const char* from = "ntrbfv'\"\\";
          const char* to = "\n\t\r\b\f\v'\"\\";
          const char* p = std::char_traits<char>::find(from, 9, e);
          if (!p) throw err(std::string("unknown escape sequence \\") + e, i - 2);
          str.push_back(to[p - from]);
          continue;
        }
        str.push_back(d);
        ++i;
      }
      ++i;
      push(Tok::kString, std::move(str), b);
      continue;
    }
    if (is_digit(c)) {
      size_t b = i;
      std::string num = digits();
      if (last != Tok::kDot && i + 1 < s.size() && s[i] == '.' && is_digit(s[i + 1])) {
        ++i;
        num += "." + digits();
      }
      // An exponent makes a float, as in Jinja2 (1e3 is 1000.0); the "." marks it a float.
      if (last != Tok::kDot && i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
        if (j < s.size() && is_digit(s[j])) {
          std::string exp = s.substr(i, j - i);
          i = j;
          exp += digits();
          if (num.find('.') == std::string::npos) num += ".0";
          num += exp;
        }
      }
      push(Tok::kNumber, std::move(num), b);
      continue;
    }
    if (is_word(c)) {
      size_t b = i;
      while (i < s.size() && is_word(s[i])) ++i;
      push(Tok::kIdent, s.substr(b, i - b), b);
      continue;
    }
    std::string ch = code_points(std::string_view(s).substr(i, 4)).front();
    throw err("unexpected character '" + ch + "'", i);
  }
  tokens.push_back(Token{Tok::kEnd, "", t.at[s.size()]});
  return tokens;
}

// ---------------------------------------------------------------------------------------------
// Parser: recursive descent with Jinja2's precedence, lowest first:
// ternary, or, and, not, comparison/in, + - ~, * / // %, **, is, |filter, unary sign, call/member.
class Parser {
 public:
  Parser(std::vector<Token> tokens, const Limits& limits)
      : t_(std::move(tokens)), limits_(limits), stack_base_(stack_position()) {}

  std::unique_ptr<Program> program() {
    auto p = std::make_unique<Program>();
    while (peek().type != Tok::kEnd) p->body.push_back(any());
    return p;
  }

 private:
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > p.limits_.max_depth || stack_used(p.stack_base_) > p.limits_.max_stack_bytes)
        throw LexError{
            "template nests deeper than " + std::to_string(p.limits_.max_depth) + " levels",
            p.peek().offset};
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& peek(size_t k = 0) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  bool is(Tok type) const { return peek().type == type; }
  bool is_ident(const char* name, size_t k = 0) const {
    return peek(k).type == Tok::kIdent && peek(k).value == name;
  }
  bool is_statement(std::initializer_list<const char*> names) const {
    if (!is(Tok::kOpenStatement) || peek(1).type != Tok::kIdent) return false;
    for (const char* n : names)
      if (peek(1).value == n) return true;
    return false;
  }
  [[noreturn]] void error(const std::string& msg, const Token& at) const {
    throw LexError{msg, at.offset};
  }
  std::string describe(const Token& tok) const {
    if (tok.type == Tok::kEnd) return "end of template";
    std::string v = tok.value.size() > 20 ? tok.value.substr(0, 20) + "..." : tok.value;
    return std::string(tok_name(tok.type)) + " '" + v + "'";
  }
  const Token& expect(Tok type, const char* what) {
    const Token& tok = peek();
    if (tok.type != type) error(std::string("expected ") + what + ", found " + describe(tok), tok);
    ++pos_;
    return tok;
  }
  void expect_ident(const char* name) {
    if (!is_ident(name))
      error(std::string("expected '") + name + "', found " + describe(peek()), peek());
    ++pos_;
  }
  std::unique_ptr<Node> node(Kind k, uint32_t offset) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->offset = offset;
    return n;
  }
  // Parses statements until one of `ends`; reports the opening tag if the template ends first.
  void block_until(std::vector<std::unique_ptr<Node>>& out, std::initializer_list<const char*> ends,
                   const Token& opener, const char* tag) {
    while (!is_statement(ends)) {
      if (is(Tok::kEnd)) {
        std::string want;
        for (const char* e : ends)
          want += std::string(want.empty() ? "" : " or ") + "{% " + e + " %}";
        error(std::string("template ends inside {% ") + tag + " %}: missing " + want, opener);
      }
      out.push_back(any());
    }
  }

  std::unique_ptr<Node> any() {
    DepthGuard g(*this);
    const Token& tok = peek();
    switch (tok.type) {
      case Tok::kComment: {
        ++pos_;
        return node(Kind::kComment, tok.offset);
      }
      case Tok::kText: {
        auto n = node(Kind::kText, tok.offset);
        n->str = tok.value;
        ++pos_;
        return n;
      }
      case Tok::kOpenStatement:
        return statement();
      case Tok::kOpenExpression: {
        ++pos_;
        auto e = expression();
        expect(Tok::kCloseExpression, "'}}'");
        return e;
      }
      default:
        error("unexpected " + describe(tok), tok);
    }
  }

  std::unique_ptr<Node> statement() {
    const Token& open = expect(Tok::kOpenStatement, "'{%'");
    const Token& name_tok = peek();
    if (name_tok.type != Tok::kIdent)
      error("expected a statement name after {%, found " + describe(name_tok), name_tok);
    const std::string name = name_tok.value;
    ++pos_;
    std::unique_ptr<Node> n;
    if (name == "set") {
      n = node(Kind::kSet, open.offset);
      n->x = sequence(false);
      if (is(Tok::kEquals)) {
        ++pos_;
        n->y = sequence(false);
      } else {
        expect(Tok::kCloseStatement, "'%}' or '='");
        block_until(n->body, {"endset"}, open, "set");
        pos_ += 2;
      }
      expect(Tok::kCloseStatement, "'%}'");
    } else if (name == "if") {
      n = if_statement(open);
      pos_ += 2;  // {% endif
      expect(Tok::kCloseStatement, "'%}'");
    } else if (name == "for") {
      n = node(Kind::kFor, open.offset);
      n->x = sequence(true);
      if (n->x->kind != Kind::kIdent && n->x->kind != Kind::kTuple)
        error("expected a loop variable name after 'for'", name_tok);
      expect_ident("in");
      n->y = expression();
      expect(Tok::kCloseStatement, "'%}'");
      block_until(n->body, {"endfor", "else"}, open, "for");
      if (is_statement({"else"})) {
        pos_ += 2;
        expect(Tok::kCloseStatement, "'%}'");
        block_until(n->alt, {"endfor"}, open, "for");
      }
      pos_ += 2;
      expect(Tok::kCloseStatement, "'%}'");
    } else if (name == "macro") {
      n = node(Kind::kMacro, open.offset);
      const Token& id = peek();
      if (id.type != Tok::kIdent) error("expected a macro name, found " + describe(id), id);
      n->str = id.value;
      ++pos_;
      arguments(n->args, true);
      expect(Tok::kCloseStatement, "'%}'");
      block_until(n->body, {"endmacro"}, open, "macro");
      pos_ += 2;
      expect(Tok::kCloseStatement, "'%}'");
    } else if (name == "call") {
      n = node(Kind::kCallBlock, open.offset);
      if (is(Tok::kOpenParen)) {
        n->flag = true;
        arguments(n->args, true);
      }
      const Token& id = peek();
      if (id.type != Tok::kIdent) error("expected a macro name after 'call'", id);
      ++pos_;
      auto callee = node(Kind::kIdent, id.offset);
      callee->str = id.value;
      auto call = node(Kind::kCall, id.offset);
      call->x = std::move(callee);
      arguments(call->args, false);
      n->x = std::move(call);
      expect(Tok::kCloseStatement, "'%}'");
      block_until(n->body, {"endcall"}, open, "call");
      pos_ += 2;
      expect(Tok::kCloseStatement, "'%}'");
    } else if (name == "break" || name == "continue") {
      n = node(name == "break" ? Kind::kBreak : Kind::kContinue, open.offset);
      expect(Tok::kCloseStatement, "'%}'");
    } else if (name == "filter") {
      n = node(Kind::kFilterBlock, open.offset);
      n->x = filter_name();
      expect(Tok::kCloseStatement, "'%}'");
      block_until(n->body, {"endfilter"}, open, "filter");
      pos_ += 2;
      expect(Tok::kCloseStatement, "'%}'");
    } else {
      error("unknown statement '" + name +
                "' (supported: set, if, elif, else, for, macro, call, filter, break, continue, "
                "generation)",
            name_tok);
    }
    return n;
  }

  std::unique_ptr<Node> if_statement(const Token& open) {
    auto n = node(Kind::kIf, open.offset);
    n->x = expression();
    expect(Tok::kCloseStatement, "'%}'");
    block_until(n->body, {"elif", "else", "endif"}, open, "if");
    if (is_statement({"elif"})) {
      const Token& elif_open = peek();
      pos_ += 2;
      n->alt.push_back(if_statement(elif_open));
    } else if (is_statement({"else"})) {
      pos_ += 2;
      expect(Tok::kCloseStatement, "'%}'");
      block_until(n->alt, {"endif"}, open, "if");
    }
    return n;
  }

  // `a, b` becomes a tuple (set targets, for-loop variables, parenthesized expressions).
  std::unique_ptr<Node> sequence(bool primary_only) {
    uint32_t at = peek().offset;
    auto first = primary_only ? primary() : expression();
    if (!is(Tok::kComma)) return first;
    if (pos_ + 1 < t_.size() && t_[pos_ + 1].type == Tok::kCloseParen) {
      ++pos_;  // (x,): the caller sees the comma before ')' and makes a tuple of one
      return first;
    }
    auto tuple = node(Kind::kTuple, at);
    tuple->args.push_back(std::move(first));
    while (is(Tok::kComma)) {
      ++pos_;
      if (is(Tok::kCloseParen)) break;  // a trailing comma: (1, 2,)
      tuple->args.push_back(primary_only ? primary() : expression());
    }
    return tuple;
  }

  std::unique_ptr<Node> expression() {
    DepthGuard g(*this);
    uint32_t at = peek().offset;
    auto a = logical_or();
    if (is_ident("if")) {
      ++pos_;
      auto test = logical_or();
      if (is_ident("else")) {
        ++pos_;
        auto n = node(Kind::kTernary, at);
        n->x = std::move(test);
        n->y = std::move(a);
        n->z = expression();
        return n;
      }
      auto n = node(Kind::kSelect, at);
      n->x = std::move(a);
      n->y = std::move(test);
      return n;
    }
    return a;
  }

  std::unique_ptr<Node> binary(const Token& op, std::string name, std::unique_ptr<Node> l,
                               std::unique_ptr<Node> r) {
    auto n = node(Kind::kBinary, op.offset);
    n->str = std::move(name);
    n->x = std::move(l);
    n->y = std::move(r);
    return n;
  }

  std::unique_ptr<Node> logical_or() {
    auto l = logical_and();
    while (is_ident("or")) {
      const Token& op = t_[pos_++];
      l = binary(op, "or", std::move(l), logical_and());
    }
    return l;
  }
  std::unique_ptr<Node> logical_and() {
    auto l = logical_not();
    while (is_ident("and")) {
      const Token& op = t_[pos_++];
      l = binary(op, "and", std::move(l), logical_not());
    }
    return l;
  }
  std::unique_ptr<Node> logical_not() {
    if (is_ident("not")) {
      DepthGuard g(*this);
      auto n = node(Kind::kUnary, peek().offset);
      n->str = "not";
      ++pos_;
      n->x = logical_not();
      return n;
    }
    return comparison();
  }
  std::unique_ptr<Node> comparison() {
    auto l = additive();
    while (true) {
      const Token& op = peek();
      std::string name;
      if (is_ident("not") && is_ident("in", 1)) {
        name = "not in";
        pos_ += 2;
      } else if (is_ident("in")) {
        name = "in";
        ++pos_;
      } else if (is(Tok::kComparison)) {
        name = op.value;
        ++pos_;
      } else {
        break;
      }
      l = binary(op, name, std::move(l), additive());
    }
    return l;
  }
  std::unique_ptr<Node> additive() {
    auto l = multiplicative();
    while (is(Tok::kAdditive)) {
      const Token& op = t_[pos_++];
      l = binary(op, op.value, std::move(l), multiplicative());
    }
    return l;
  }
  std::unique_ptr<Node> multiplicative() {
    auto l = power();
    while (is(Tok::kMultiplicative)) {
      const Token& op = t_[pos_++];
      l = binary(op, op.value, std::move(l), power());
    }
    return l;
  }
  std::unique_ptr<Node> power() {
    auto l = test();
    while (is(Tok::kPower)) {
      const Token& op = t_[pos_++];
      l = binary(op, "**", std::move(l), test());
    }
    return l;
  }
  std::unique_ptr<Node> test() {
    auto operand = filter();
    while (is_ident("is")) {
      const Token& is_tok = t_[pos_++];
      if (operand->kind == Kind::kTest)
        error("TemplateSyntaxError: You cannot chain multiple tests with is", is_tok);
      bool negate = is_ident("not");
      if (negate) ++pos_;
      const Token& name = peek();
      // `none`, `true` and `false` are identifiers here too.
      if (name.type != Tok::kIdent)
        error("expected a test name after 'is', found " + describe(name), name);
      ++pos_;
      auto n = node(Kind::kTest, is_tok.offset);
      n->x = std::move(operand);
      n->str = name.value;
      n->flag = negate;
      // Jinja2: arguments in parentheses (`is divisibleby(3)`), or one bare operand
      // (`is sameas false`, `is divisibleby 3`) unless a keyword follows.
      if (is(Tok::kOpenParen)) {
        arguments(n->args, false);
      } else if (is(Tok::kNumber) || is(Tok::kString) || is(Tok::kOpenBracket) ||
                 is(Tok::kOpenBrace) ||
                 (is(Tok::kIdent) && !is_ident("else") && !is_ident("or") && !is_ident("and") &&
                  !is_ident("if") && !is_ident("is") && !is_ident("in") && !is_ident("not"))) {
        n->args.push_back(primary());
      }
      operand = std::move(n);
    }
    return operand;
  }
  std::unique_ptr<Node> filter_name() {
    const Token& name = peek();
    if (name.type != Tok::kIdent) error("expected a filter name, found " + describe(name), name);
    ++pos_;
    auto id = node(Kind::kIdent, name.offset);
    id->str = name.value;
    if (!is(Tok::kOpenParen)) return id;
    auto call = node(Kind::kCall, name.offset);
    call->x = std::move(id);
    arguments(call->args, false);
    return call;
  }
  std::unique_ptr<Node> filter() {
    auto operand = unary_sign();
    while (is(Tok::kPipe)) {
      const Token& pipe = t_[pos_++];
      auto n = node(Kind::kFilter, pipe.offset);
      n->x = std::move(operand);
      n->y = filter_name();
      operand = std::move(n);
    }
    return operand;
  }
  std::unique_ptr<Node> unary_sign() {
    const Token& tok = peek();
    if ((tok.type == Tok::kUnary || tok.type == Tok::kAdditive) &&
        (tok.value == "-" || tok.value == "+")) {
      DepthGuard g(*this);
      ++pos_;
      auto n = node(Kind::kUnary, tok.offset);
      n->str = tok.value;
      n->x = unary_sign();
      return n;
    }
    return call_member();
  }
  std::unique_ptr<Node> call_member() {
    auto e = member(primary());
    while (is(Tok::kOpenParen)) {
      auto call = node(Kind::kCall, e->offset);
      call->x = std::move(e);
      arguments(call->args, false);
      e = member(std::move(call));
    }
    return e;
  }
  void arguments(std::vector<std::unique_ptr<Node>>& out, bool parameters) {
    expect(Tok::kOpenParen, "'('");
    bool saw_keyword = false, saw_spread = false;
    std::vector<std::string> names;
    while (!is(Tok::kCloseParen)) {
      const Token& at = peek();
      if (at.type == Tok::kEnd) error("argument list is never closed with ')'", at);
      bool kw_spread = is(Tok::kPower);
      bool spread = is(Tok::kMultiplicative) && at.value == "*";
      if (parameters && (kw_spread || spread))
        error("argument unpacking is not allowed in parameter declarations", at);
      if (kw_spread) {
        ++pos_;
        auto n = node(Kind::kKwSpread, at.offset);
        n->x = expression();
        out.push_back(std::move(n));
        if (is(Tok::kComma)) ++pos_;
        if (!is(Tok::kCloseParen)) error("'**' must be applied to the last argument", peek());
        break;
      }
      std::unique_ptr<Node> arg;
      if (spread) {
        if (saw_spread) error("only one '*' argument unpacking is allowed", at);
        saw_spread = true;
        ++pos_;
        arg = node(Kind::kSpread, at.offset);
        arg->x = expression();
      } else {
        arg = expression();
        if (is(Tok::kEquals)) {
          ++pos_;
          if (arg->kind != Kind::kIdent)
            error(parameters ? "expected a parameter name before '='"
                             : "expected a keyword name before '='",
                  at);
          auto kw = node(Kind::kKwArg, at.offset);
          kw->str = arg->str;
          kw->x = expression();
          arg = std::move(kw);
        }
        if (parameters) {
          if (arg->kind != Kind::kIdent && arg->kind != Kind::kKwArg)
            error("expected a parameter name", at);
          if (std::find(names.begin(), names.end(), arg->str) != names.end())
            error("duplicate parameter name '" + arg->str + "'", at);
          names.push_back(arg->str);
        }
        if (arg->kind == Kind::kKwArg) {
          saw_keyword = true;
        } else if (saw_keyword) {
          error(parameters ? "a parameter without default follows one with a default"
                           : "positional argument follows keyword argument",
                at);
        } else if (saw_spread) {
          error("positional argument follows '*' unpacking", at);
        }
      }
      out.push_back(std::move(arg));
      if (is(Tok::kComma)) ++pos_;
    }
    ++pos_;  // ')'
  }
  std::unique_ptr<Node> member(std::unique_ptr<Node> object) {
    while (is(Tok::kDot) || is(Tok::kOpenBracket)) {
      const Token& op = t_[pos_++];
      auto n = node(Kind::kMember, op.offset);
      n->x = std::move(object);
      if (op.type == Tok::kOpenBracket) {
        n->flag = true;
        n->y = subscript(op);
        expect(Tok::kCloseBracket, "']'");
      } else {
        const Token& p = peek();
        n->y = primary();
        if (n->y->kind != Kind::kIdent && n->y->kind != Kind::kInt)
          error("expected an attribute name after '.'", p);
      }
      object = std::move(n);
    }
    return object;
  }
  // Parses what is inside [...]: an index or a slice start:stop:step.
  std::unique_ptr<Node> subscript(const Token& open) {
    std::vector<std::unique_ptr<Node>> parts;
    bool slice = false;
    while (!is(Tok::kCloseBracket)) {
      if (is(Tok::kEnd)) error("'[' is never closed with ']'", open);
      if (is(Tok::kColon)) {
        parts.push_back(nullptr);
        ++pos_;
        slice = true;
      } else {
        parts.push_back(expression());
        if (is(Tok::kColon)) {
          ++pos_;
          slice = true;
        }
      }
    }
    if (parts.empty()) error("expected an index or a slice inside []", open);
    if (!slice) return std::move(parts[0]);
    if (parts.size() > 3) error("a slice takes at most 3 parts (start:stop:step)", open);
    auto n = node(Kind::kSlice, open.offset);
    parts.resize(3);
    n->x = std::move(parts[0]);
    n->y = std::move(parts[1]);
    n->z = std::move(parts[2]);
    return n;
  }

  std::unique_ptr<Node> primary() {
    DepthGuard g(*this);
    const Token& tok = peek();
    ++pos_;
    switch (tok.type) {
      case Tok::kNumber: {
        bool is_float = tok.value.find('.') != std::string::npos;
        auto n = node(is_float ? Kind::kFloat : Kind::kInt, tok.offset);
        n->number = std::strtod(tok.value.c_str(), nullptr);
        if (!is_float) {
          // Python's integers are unbounded; this engine's are 64-bit, and says so.
          const char* b = tok.value.data();
          if (*b == '+') ++b;  // the lexer keeps a sign that follows an operator
          auto r = std::from_chars(b, tok.value.data() + tok.value.size(), n->integer);
          if (r.ec != std::errc())
            error("integer literal " + tok.value +
                      " is outside the 64-bit range the template engine supports (write it as a "
                      "float, " +
                      tok.value + ".0, if an approximation will do)",
                  tok);
        }
        return n;
      }
      case Tok::kString: {
        auto n = node(Kind::kString, tok.offset);
        n->str = tok.value;
        while (is(Tok::kString)) n->str += t_[pos_++].value;  // 'a' 'b' concatenates
        return n;
      }
      case Tok::kIdent: {
        auto n = node(Kind::kIdent, tok.offset);
        n->str = tok.value;
        return n;
      }
      case Tok::kOpenParen: {
        if (is(Tok::kCloseParen)) {  // () is the empty tuple
          ++pos_;
          return node(Kind::kTuple, tok.offset);
        }
        auto e = sequence(false);
        if (is(Tok::kCloseParen) && e->kind != Kind::kTuple && t_[pos_ - 1].type == Tok::kComma) {
          auto one = node(Kind::kTuple, tok.offset);  // (x,) is a tuple of one
          one->args.push_back(std::move(e));
          e = std::move(one);
        }
        expect(Tok::kCloseParen, "')'");
        if (e->kind == Kind::kBinary) e->flag = true;  // parenthesized: (a < b) < c is no chain
        return e;
      }
      case Tok::kOpenBracket: {
        auto n = node(Kind::kArray, tok.offset);
        while (!is(Tok::kCloseBracket)) {
          if (is(Tok::kEnd)) error("'[' is never closed with ']'", tok);
          n->args.push_back(expression());
          if (is(Tok::kComma)) ++pos_;
        }
        ++pos_;
        return n;
      }
      case Tok::kOpenBrace: {
        auto n = node(Kind::kObject, tok.offset);
        while (!is(Tok::kCloseBrace)) {
          if (is(Tok::kEnd)) error("'{' is never closed with '}'", tok);
          n->args.push_back(expression());
          expect(Tok::kColon, "':' between key and value");
          n->body.push_back(expression());
          if (is(Tok::kComma)) ++pos_;
        }
        ++pos_;
        return n;
      }
      default:
        --pos_;
        error("unexpected " + describe(tok), tok);
    }
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
  int depth_ = 0;
  const Limits& limits_;
  uintptr_t stack_base_;
};

}  // namespace

std::unique_ptr<Program> parse_template(const std::string& source, const Limits& limits) {
  Text text = preprocess(source);
  return Parser(tokenize(text), limits).program();
}

// ---------------------------------------------------------------------------------------------
namespace {

std::string where(const std::string& source, int64_t offset) {
  if (offset < 0) return "chat template";
  size_t end = std::min(size_t(offset), source.size());
  size_t line = 1, line_begin = 0;
  for (size_t i = 0; i < end; ++i)
    if (source[i] == '\n') {
      ++line;
      line_begin = i + 1;
    }
  size_t column = 1;
  for (size_t i = line_begin; i < end; ++i)
    if ((uint8_t(source[i]) & 0xC0) != 0x80) ++column;  // count characters, not bytes
  return "chat template line " + std::to_string(line) + ", column " + std::to_string(column);
}

template <typename Json>
std::string render_json(const Template& t, const Program& program, const Json& context,
                        const Limits& limits, const std::function<std::tm()>& now) {
  if (!context.is_object() && !context.is_null())
    throw InvalidArgumentError("chat template context must be a JSON object of variables, got " +
                               std::string(context.type_name()));
  try {
    std::vector<std::pair<std::string, Value>> globals;
    if (context.is_object())
      for (auto it = context.begin(); it != context.end(); ++it)
        globals.emplace_back(it.key(), value_from_json(it.value(), limits.max_depth));
    return run_program(program, std::move(globals), limits, now);
  } catch (const JinjaError& e) {
    if (e.raised)
      throw FormatError(where(t.source(), e.offset) + ": raise_exception: " + e.message);
    throw FormatError(where(t.source(), e.offset) + ": " + e.message);
  }
}

}  // namespace

Template::Template(std::string source, Limits limits)
    : source_(std::move(source)), limits_(limits) {
  try {
    program_ = parse_template(source_, limits_);
  } catch (const LexError& e) {
    throw FormatError(where(source_, e.offset) + ": syntax error: " + e.message);
  }
}

Template::~Template() = default;
Template::Template(const Template&) = default;
Template& Template::operator=(const Template&) = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::json& context) const {
  return render_json(*this, *program_, context, limits_, now_);
}
std::string Template::render(const nlohmann::ordered_json& context) const {
  return render_json(*this, *program_, context, limits_, now_);
}

void Template::set_clock(std::function<std::tm()> now) { now_ = std::move(now); }

}  // namespace tformers::jinja
