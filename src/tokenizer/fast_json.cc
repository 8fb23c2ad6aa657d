#include "tokenizer/fast_json.h"

#include <charconv>

#include "tformers/error.h"
#include "tokenizer/unicode.h"

namespace tformers::tokenizer_detail {
namespace {

class Parser {
 public:
  Parser(std::string_view text, const std::string& where, TokenizerJson& out)
      : s_(text), where_(where), out_(out) {}

  void parse_document() {
    skip_ws();
    out_.doc = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected text after the JSON value");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw FormatError(detail::str_cat(where_, ": malformed JSON at line ", line, ", column ", col,
                                      " (byte ", pos_, "): ", what));
  }
  [[noreturn]] void fail_type(const std::string& path, const std::string& what) const {
    throw FormatError(detail::str_cat(where_, ": ", path, " ", what));
  }

  void skip_ws() {
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
        ++pos_;
      } else {
        break;
      }
    }
  }
  void expect(char c) {
    skip_ws();
    if (pos_ >= s_.size() || s_[pos_] != c) fail(detail::str_cat("expected '", c, "'"));
    ++pos_;
  }
  bool peek_is(char c) {
    skip_ws();
    return pos_ < s_.size() && s_[pos_] == c;
  }

  unsigned parse_hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        v |= c - 'A' + 10;
      } else {
        --pos_;
        fail("invalid hex digit in \\u escape");
      }
    }
    return v;
  }

  void parse_string_into(std::string& out) {
    skip_ws();
    if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string");
    ++pos_;
    out.clear();
    while (true) {
      size_t start = pos_;
      while (pos_ < s_.size() && s_[pos_] != '"' && s_[pos_] != '\\' &&
             static_cast<unsigned char>(s_[pos_]) >= 0x20) {
        ++pos_;
      }
      out.append(s_.data() + start, pos_ - start);
      if (pos_ >= s_.size()) fail("unterminated string");
      char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        break;
      }
      if (c != '\\') fail("control character in string");
      ++pos_;
      if (pos_ >= s_.size()) fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"':
          out.push_back('"');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '/':
          out.push_back('/');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          char32_t cp = parse_hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (pos_ + 6 <= s_.size() && s_[pos_] == '\\' && s_[pos_ + 1] == 'u') {
              pos_ += 2;
              unsigned lo = parse_hex4();
              if (lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
              } else {
                fail("invalid UTF-16 surrogate pair in \\u escape");
              }
            } else {
              fail("lone UTF-16 surrogate in \\u escape");
            }
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("lone UTF-16 surrogate in \\u escape");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --pos_;
          fail("invalid escape in string");
      }
    }
  }

  // A string as a view into the text when it has no escapes (almost every token), else decoded
  // into the arena.
  std::string_view parse_string_view() {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == '"') {
      size_t start = pos_ + 1;
      size_t k = start;
      while (k < s_.size() && s_[k] != '"' && s_[k] != '\\' &&
             static_cast<unsigned char>(s_[k]) >= 0x20) {
        ++k;
      }
      if (k < s_.size() && s_[k] == '"') {
        pos_ = k + 1;
        return s_.substr(start, k - start);
      }
    }
    out_.arena.emplace_back();
    parse_string_into(out_.arena.back());
    return out_.arena.back();
  }

  nlohmann::json parse_number() {
    size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    bool is_float = false;
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c >= '0' && c <= '9') {
        ++pos_;
      } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
        is_float = true;
        ++pos_;
      } else {
        break;
      }
    }
    const char* b = s_.data() + start;
    const char* e = s_.data() + pos_;
    if (!is_float) {
      int64_t v;
      auto r = std::from_chars(b, e, v);
      if (r.ec == std::errc() && r.ptr == e) return v;
      uint64_t u;
      r = std::from_chars(b, e, u);
      if (r.ec == std::errc() && r.ptr == e) return u;
    }
    double d;
    auto r = std::from_chars(b, e, d);
    if (r.ec != std::errc() || r.ptr != e) {
      pos_ = start;
      fail("invalid number");
    }
    return d;
  }

  bool path_is(const char* a, const char* b) const {
    return path_.size() == 2 && path_[0] == a && path_[1] == b;
  }
  std::string path_string() const {
    std::string p;
    for (size_t i = 0; i < path_.size(); ++i) p += (i ? "." : "") + path_[i];
    return p;
  }

  nlohmann::json parse_value(int depth) {
    if (depth > 512) fail("nesting deeper than 512 levels");
    skip_ws();
    if (pos_ >= s_.size()) fail("unexpected end of input");
    char c = s_[pos_];
    if (c == '{') {
      if (path_is("model", "vocab")) {
        parse_vocab();
        return nlohmann::json();
      }
      ++pos_;
      nlohmann::json obj = nlohmann::json::object();
      if (peek_is('}')) {
        ++pos_;
        return obj;
      }
      std::string key;
      while (true) {
        parse_string_into(key);
        expect(':');
        path_.push_back(key);
        nlohmann::json v = parse_value(depth + 1);
        path_.pop_back();
        if (!(path_.size() == 1 && path_[0] == "model" &&
              ((key == "vocab" && out_.has_vocab) || (key == "merges" && out_.has_merges)))) {
          obj[key] = std::move(v);
        }
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        expect('}');
        return obj;
      }
    }
    if (c == '[') {
      if (path_is("model", "merges")) {
        parse_merges();
        return nlohmann::json();
      }
      ++pos_;
      nlohmann::json arr = nlohmann::json::array();
      if (peek_is(']')) {
        ++pos_;
        return arr;
      }
      while (true) {
        path_.push_back("[]");
        arr.push_back(parse_value(depth + 1));
        path_.pop_back();
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        expect(']');
        return arr;
      }
    }
    if (c == '"') {
      std::string str;
      parse_string_into(str);
      return str;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    if (s_.compare(pos_, 4, "true") == 0) {
      pos_ += 4;
      return true;
    }
    if (s_.compare(pos_, 5, "false") == 0) {
      pos_ += 5;
      return false;
    }
    if (s_.compare(pos_, 4, "null") == 0) {
      pos_ += 4;
      return nullptr;
    }
    fail("expected a JSON value");
  }

  void parse_vocab() {
    out_.has_vocab = true;
    ++pos_;
    if (peek_is('}')) {
      ++pos_;
      return;
    }
    while (true) {
      std::string_view key = parse_string_view();
      expect(':');
      skip_ws();
      size_t start = pos_;
      while (pos_ < s_.size() && ((s_[pos_] >= '0' && s_[pos_] <= '9') || s_[pos_] == '-')) ++pos_;
      int64_t id;
      auto r = std::from_chars(s_.data() + start, s_.data() + pos_, id);
      if (r.ec != std::errc() || r.ptr != s_.data() + pos_ || start == pos_) {
        pos_ = start;
        fail_type(detail::str_cat("model.vocab[\"", key, "\"]"), "must be an integer token id");
      }
      out_.vocab.emplace_back(key, id);
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      return;
    }
  }

  void parse_merges() {
    out_.has_merges = true;
    ++pos_;
    if (peek_is(']')) {
      ++pos_;
      return;
    }
    while (true) {
      skip_ws();
      size_t index = out_.merges.size();
      auto bad_pair = [&]() {
        fail_type(detail::str_cat("model.merges[", index, "]"),
                  "must be a string \"left right\" or a pair of strings [\"left\", \"right\"]");
      };
      if (pos_ < s_.size() && s_[pos_] == '"') {
        // Legacy form "left right": exactly one space (tokens never hold a raw space).
        std::string_view a = parse_string_view();
        size_t sp = a.find(' ');
        if (sp == std::string_view::npos || a.find(' ', sp + 1) != std::string_view::npos) {
          fail_type(
              detail::str_cat("model.merges[", index, "]"),
              detail::str_cat("must be \"left right\" with exactly one space, got \"", a, "\""));
        }
        out_.merges.emplace_back(a.substr(0, sp), a.substr(sp + 1));
      } else if (pos_ < s_.size() && s_[pos_] == '[') {
        ++pos_;
        if (!peek_is('"')) bad_pair();
        std::string_view a = parse_string_view();
        expect(',');
        if (!peek_is('"')) bad_pair();
        std::string_view b = parse_string_view();
        if (!peek_is(']')) bad_pair();
        ++pos_;
        out_.merges.emplace_back(a, b);
      } else {
        bad_pair();
      }
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return;
    }
  }

  std::string_view s_;
  const std::string& where_;
  TokenizerJson& out_;
  size_t pos_ = 0;
  std::vector<std::string> path_;
};

}  // namespace

TokenizerJson parse_tokenizer_json(std::string_view text, const std::string& where) {
  TokenizerJson out;
  Parser p(text, where, out);
  p.parse_document();
  return out;
}

}  // namespace tformers::tokenizer_detail
