#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/components.h"

#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <iterator>
#include <utility>

#include "tformers/error.h"
#include "tokenizer/unicode.h"

namespace tformers::tokenizer_detail {

// ---------------------------------------------------------------------------------------------
// JSON helpers

const Json& member(const Json& j, const char* key, const std::string& path) {
  if (!j.is_object()) throw FormatError(detail::str_cat(path, " must be an object"));
  auto it = j.find(key);
  if (it == j.end()) {
    throw FormatError(detail::str_cat(path, ".", key, " is missing"));
  }
  return *it;
}

std::string get_string(const Json& j, const char* key, const std::string& path) {
  const Json& v = member(j, key, path);
  if (!v.is_string()) {
    throw FormatError(detail::str_cat(path, ".", key, " must be a string, got ", v.type_name()));
  }
  return v.get<std::string>();
}

bool get_bool(const Json& j, const char* key, const std::string& path, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    throw FormatError(detail::str_cat(path, ".", key, " must be a boolean, got ", it->type_name()));
  }
  return it->get<bool>();
}

static int64_t get_int(const Json& j, const char* key, const std::string& path, int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) {
    throw FormatError(
        detail::str_cat(path, ".", key, " must be an integer, got ", it->type_name()));
  }
  return it->get<int64_t>();
}

std::string component_type(const Json& j, const std::string& path, const char* supported) {
  if (!j.is_object()) {
    throw FormatError(
        detail::str_cat(path, " must be an object with a \"type\", got ", j.type_name()));
  }
  std::string type = get_string(j, "type", path);
  (void)supported;
  return type;
}

[[noreturn]] static void unsupported(const std::string& path, const std::string& kind,
                                     const std::string& type, const char* supported) {
  throw UnsupportedError(detail::str_cat(path, ".type: unsupported ", kind, " type '", type,
                                         "'; supported: ", supported));
}

static const Json& array_member(const Json& j, const char* key, const std::string& path) {
  const Json& v = member(j, key, path);
  if (!v.is_array()) {
    throw FormatError(detail::str_cat(path, ".", key, " must be an array, got ", v.type_name()));
  }
  return v;
}

// A Sequence component: the items of j[key], each built by `make` (an item that builds to
// nothing, such as a null normalizer, is skipped), in order.
template <class Seq, class Make>
std::unique_ptr<Seq> make_sequence(const Json& j, const char* key, const std::string& path,
                                   Make make) {
  auto seq = std::make_unique<Seq>();
  if constexpr (requires(Seq & s) { s.path; }) seq->path = path;  // for growth-budget errors
  const Json& items = array_member(j, key, path);
  for (size_t i = 0; i < items.size(); ++i)
    if (auto item = make(items[i], detail::str_cat(path, ".", key, "[", i, "]")))
      seq->items.push_back(std::move(item));
  return seq;
}

// ---------------------------------------------------------------------------------------------
// Regex

namespace {

// PCRE2 10.42's property tables are Unicode 14; the Rust library's Oniguruma knows the characters
// added since (Unicode 15 and 16: Kawi, Garay, CJK extensions H and I, ...), which PCRE2 takes for
// unassigned. These are, per general category, the ranges to add to \p{X} for the two to agree
// (generated from the reference itself by tools/tokenizer/make_unicode_newer.py).
struct NewerCategory {
  const char* name;
  const char* ranges;
};
constexpr NewerCategory kNewerCategories[] = {
#include "tokenizer/unicode_newer.inc"
};

// The extra class ranges for \p{name}; empty when there are none or the name is not a category.
std::string_view newer_ranges(std::string_view name) {
  for (const auto& c : kNewerCategories)
    if (name == c.name) return c.ranges;
  return {};
}

// \p{name} and, when `newer`, its newer characters, for inside a character class.
std::string property_body(const char* name, bool newer) {
  return detail::str_cat("\\p{", name, "}", newer ? newer_ranges(name) : std::string_view());
}

// All the newer characters as sorted, merged ranges, parsed once from the class text.
const std::vector<std::pair<char32_t, char32_t>>& newer_code_points() {
  static const auto ranges = [] {
    std::vector<std::pair<char32_t, char32_t>> r;
    for (const auto& c : kNewerCategories) {
      if (std::string_view(c.name).size() != 1) continue;  // the major classes hold them all
      std::string_view s = c.ranges;
      auto hex = [&s](size_t& i) {  // reads "\x{HEX}" at s[i]
        size_t close = s.find('}', i);
        auto v = static_cast<char32_t>(
            std::stoul(std::string(s.substr(i + 3, close - i - 3)), nullptr, 16));
        i = close + 1;
        return v;
      };
      for (size_t i = 0; i < s.size();) {
        char32_t lo = hex(i), hi = lo;
        if (i < s.size() && s[i] == '-') {
          ++i;
          hi = hex(i);
        }
        r.emplace_back(lo, hi);
      }
    }
    std::sort(r.begin(), r.end());
    std::vector<std::pair<char32_t, char32_t>> merged;
    for (const auto& x : r) {
      if (!merged.empty() && x.first <= merged.back().second + 1) {
        merged.back().second = std::max(merged.back().second, x.second);
      } else {
        merged.push_back(x);
      }
    }
    return merged;
  }();
  return ranges;
}

// True when text (valid UTF-8) holds a character that PCRE2 10.42 takes for unassigned but the
// reference does not. All of them are at U+0897 or above, so 1- and 2-byte sequences are skipped.
bool has_newer_code_point(std::string_view text) {
  const auto& ranges = newer_code_points();
  for (size_t i = 0; i < text.size();) {
    auto b = static_cast<unsigned char>(text[i]);
    if (b < 0xE0) {
      i += utf8_length(b);
      continue;
    }
    char32_t cp = next_code_point(text, i);
    auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                               [](char32_t c, const auto& r) { return c < r.first; });
    if (it != ranges.begin() && cp <= std::prev(it)->second) return true;
  }
  return false;
}

// Oniguruma's \s (and the Rust library's char::is_whitespace) is the White_Space property:
// \t-\r, space, U+0085 and the Z categories. PCRE2's UCP \s differs on U+0085, so spell it out.
std::string space_class_body(bool newer) { return "\\t-\\r\\x{85}" + property_body("Z", newer); }
// Oniguruma's Unicode \w is Letter | Mark | Number | Connector_Punctuation; PCRE2 10.42's UCP \w
// lacks the marks (so a combining mark after NFKD would split a word).
std::string word_class_body(bool newer) {
  return property_body("L", newer) + property_body("M", newer) + property_body("N", newer) +
         property_body("Pc", newer);
}

// The pattern in PCRE2's syntax with Oniguruma's meaning; `newer` adds the characters newer than
// PCRE2's Unicode tables to the property classes.
std::string rewrite_pattern(const std::string& p, bool newer) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[i + 1];
      if (n == 's') {
        out += in_class ? space_class_body(newer) : "[" + space_class_body(newer) + "]";
        ++i;
        continue;
      }
      if (n == 'w') {
        out += in_class ? word_class_body(newer) : "[" + word_class_body(newer) + "]";
        ++i;
        continue;
      }
      if (n == 'W' && !in_class) {
        out += "[^" + word_class_body(newer) + "]";
        ++i;
        continue;
      }
      if (n == 'S' && !in_class) {
        out += "[^" + space_class_body(newer) + "]";
        ++i;
        continue;
      }
      size_t close = (n == 'p' || n == 'P') && i + 2 < p.size() && p[i + 2] == '{'
                         ? p.find('}', i + 3)
                         : std::string::npos;
      if (close != std::string::npos) {
        std::string name = p.substr(i + 3, close - i - 3);
        std::string_view extra = newer ? newer_ranges(name) : std::string_view();
        // \P{X} inside a class stays as written: a PCRE2 10.42 class cannot subtract the newer
        // characters from its complement.
        if (!extra.empty() && (n == 'p' || !in_class)) {
          std::string body = detail::str_cat("\\p{", name, "}", extra);
          out += in_class ? body : (n == 'p' ? "[" : "[^") + body + "]";
          i = close;
          continue;
        }
      }
      out += c;
      out += n;
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' or '^]' right after '[' is literal.
      if (i + 1 < p.size() && p[i + 1] == '^') {
        out += '^';
        ++i;
      }
      if (i + 1 < p.size() && p[i + 1] == ']') {
        out += ']';
        ++i;
      }
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(16, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

}  // namespace

namespace {

pcre2_code* compile_regex(const std::string& pattern, const std::string& p,
                          const std::string& where) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw FormatError(detail::str_cat(where, ": cannot compile regex \"", pattern,
                                      "\": ", reinterpret_cast<const char*>(msg)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
  return code;
}

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where) {
  std::string plain = rewrite_pattern(pattern, false);
  code_ = compile_regex(pattern, plain, where);
  std::string newer = rewrite_pattern(pattern, true);
  if (newer != plain) {
    try {
      newer_code_ = compile_regex(pattern, newer, where);
    } catch (...) {
      pcre2_code_free(static_cast<pcre2_code*>(code_));
      throw;
    }
  }
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(newer_code_));
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  out.clear();
  auto* code =
      static_cast<pcre2_code*>(newer_code_ && has_newer_code_point(text) ? newer_code_ : code_);
  MatchScratch& s = scratch();
  size_t pos = 0;
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (pos <= text.size()) {
    int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, s.data, s.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      throw InternalError(detail::str_cat("regex match failed at byte ", pos, ": ",
                                          reinterpret_cast<const char*>(msg)));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
    size_t b = ov[0], e = ov[1];
    if (e == b) {
      // Empty match: step over one character so the scan advances.
      if (b >= text.size()) break;
      pos = b + utf8_length(static_cast<unsigned char>(text[b]));
      continue;
    }
    out.emplace_back(b, e);
    pos = e;
  }
}

Pattern::Pattern(const Json& pattern, const std::string& where) {
  if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
    literal_ = pattern["String"].get<std::string>();
    if (literal_.empty()) throw FormatError(where + ".String must not be empty");
  } else if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
    regex_ = std::make_unique<Regex>(pattern["Regex"].get<std::string>(), where + ".Regex");
  } else {
    throw FormatError(where + " must be {\"String\": ...} or {\"Regex\": ...}");
  }
}

void Pattern::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  if (regex_) {
    regex_->find_all(text, out);
    return;
  }
  out.clear();
  size_t pos = 0;
  while ((pos = text.find(literal_, pos)) != std::string_view::npos) {
    out.emplace_back(pos, pos + literal_.size());
    pos += literal_.size();
  }
}

void split_by_matches(std::string_view text, const std::vector<std::pair<size_t, size_t>>& matches,
                      SplitBehavior behavior, bool invert, std::vector<std::string>& out,
                      size_t* first_start) {
  if (first_start) *first_start = std::string::npos;
  // Pieces covering the text: (start, end, is_match).
  struct Piece {
    size_t b, e;
    bool m;
  };
  std::vector<Piece> pieces;
  pieces.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (prev != b) pieces.push_back({prev, b, invert});
    pieces.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != text.size()) pieces.push_back({prev, text.size(), invert});

  auto emit = [&](size_t b, size_t e) {
    if (e <= b) return;
    if (first_start && *first_start == std::string::npos) *first_start = b;
    out.emplace_back(text.substr(b, e - b));
  };
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (auto& p : pieces) {
        if (!p.m) emit(p.b, p.e);
      }
      break;
    case SplitBehavior::kIsolated:
      for (auto& p : pieces) emit(p.b, p.e);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      std::vector<Piece> acc;
      bool previous_match = false;
      for (auto& p : pieces) {
        if (p.m && !previous_match && !acc.empty()) {
          acc.back().e = p.e;
        } else {
          acc.push_back(p);
        }
        previous_match = p.m;
      }
      for (auto& p : acc) emit(p.b, p.e);
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      std::vector<Piece> acc;
      bool previous_match = false;
      for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
        if (it->m && !previous_match && !acc.empty()) {
          acc.back().b = it->b;
        } else {
          acc.push_back(*it);
        }
        previous_match = it->m;
      }
      for (auto it = acc.rbegin(); it != acc.rend(); ++it) emit(it->b, it->e);
      break;
    }
    case SplitBehavior::kContiguous: {
      std::vector<Piece> acc;
      bool previous_match = false;
      for (auto& p : pieces) {
        if (p.m == previous_match && !acc.empty()) {
          acc.back().e = p.e;
        } else {
          acc.push_back(p);
        }
        previous_match = p.m;
      }
      for (auto& p : acc) emit(p.b, p.e);
      break;
    }
  }
}

static SplitBehavior parse_behavior(const Json& j, const std::string& path) {
  std::string b = get_string(j, "behavior", path);
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  throw FormatError(detail::str_cat(path, ".behavior: unknown split behavior '", b,
                                    "'; expected Removed, Isolated, MergedWithPrevious, "
                                    "MergedWithNext or Contiguous"));
}

// Splits every piece by a predicate on code points (Digits, Punctuation, Whitespace...).
template <typename Pred>
static void split_by_predicate(std::vector<std::string>& splits, Pred pred, SplitBehavior behavior,
                               bool& at_input_start) {
  std::vector<std::string> out;
  std::vector<std::pair<size_t, size_t>> matches;
  for (const std::string& s : splits) {
    matches.clear();
    size_t i = 0;
    while (i < s.size()) {
      size_t b = i;
      char32_t cp = next_code_point(s, i);
      if (pred(cp)) matches.emplace_back(b, i);
    }
    size_t first = 0;
    split_by_matches(s, matches, behavior, false, out, &s == &splits[0] ? &first : nullptr);
    if (&s == &splits[0] && first != 0) at_input_start = false;
  }
  splits.swap(out);
}

// ---------------------------------------------------------------------------------------------
// Normalizers

GrowthBudget::GrowthBudget(size_t input)
    : input_bytes(input),
      max_bytes(input > (SIZE_MAX - kGrowthSlack) / kMaxGrowth
                    ? SIZE_MAX
                    : input * kMaxGrowth + kGrowthSlack) {}

void GrowthBudget::check(size_t bytes, const std::string& path) const {
  if (bytes <= max_bytes) return;
  throw FormatError(detail::str_cat(
      path, ": output of ", bytes == SIZE_MAX ? std::string("over 2^64") : std::to_string(bytes),
      " bytes from an input of ", input_bytes, " bytes exceeds the growth budget of ", kMaxGrowth,
      " times the input plus ", kGrowthSlack, " bytes (", max_bytes,
      " bytes); this tokenizer.json component expands text without bound"));
}

namespace {

class SequenceNormalizer : public Normalizer {
 public:
  std::vector<std::unique_ptr<Normalizer>> items;
  std::string path;
  void normalize(std::string& text, const GrowthBudget& budget) const override {
    for (auto& n : items) {
      n->normalize(text, budget);
      budget.check(text.size(), path);
    }
  }
};

class UnicodeNormalizer : public Normalizer {
 public:
  enum Form { kNFC, kNFD, kNFKC, kNFKD };
  explicit UnicodeNormalizer(Form form) {
    UErrorCode status = U_ZERO_ERROR;
    switch (form) {
      case kNFC:
        norm_ = icu::Normalizer2::getNFCInstance(status);
        break;
      case kNFD:
        norm_ = icu::Normalizer2::getNFDInstance(status);
        break;
      case kNFKC:
        norm_ = icu::Normalizer2::getNFKCInstance(status);
        break;
      case kNFKD:
        norm_ = icu::Normalizer2::getNFKDInstance(status);
        break;
    }
    if (U_FAILURE(status)) throw InternalError("ICU normalizer unavailable");
  }
  void normalize(std::string& text, const GrowthBudget&) const override {
    // ASCII is invariant under every normalization form.
    bool ascii = true;
    for (unsigned char c : text) {
      if (c >= 0x80) {
        ascii = false;
        break;
      }
    }
    if (ascii) return;
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
    UErrorCode status = U_ZERO_ERROR;
    if (norm_->isNormalized(u, status) && U_SUCCESS(status)) return;
    status = U_ZERO_ERROR;
    icu::UnicodeString n = norm_->normalize(u, status);
    if (U_FAILURE(status)) throw InternalError("ICU normalization failed");
    text.clear();
    n.toUTF8String(text);
  }

 private:
  const icu::Normalizer2* norm_ = nullptr;
};

// Lowercase mappings ICU 72 (Unicode 15) lacks for characters the Rust library's char::to_lowercase
// knows (Unicode 16 and later), generated from the reference by
// tools/tokenizer/make_unicode_newer.py.
constexpr std::pair<char32_t, char32_t> kNewerLowercase[] = {
#include "tokenizer/unicode_newer_lower.inc"
};

char32_t to_lower(char32_t cp) {
  const auto* end = std::end(kNewerLowercase);
  const auto* it = std::lower_bound(std::begin(kNewerLowercase), end, cp,
                                    [](const auto& m, char32_t c) { return m.first < c; });
  if (it != end && it->first == cp) return it->second;
  return static_cast<char32_t>(u_tolower(static_cast<UChar32>(cp)));
}

class LowercaseNormalizer : public Normalizer {
 public:
  void normalize(std::string& text, const GrowthBudget&) const override {
    std::string out;
    out.reserve(text.size());
    size_t i = 0;
    while (i < text.size()) {
      char32_t cp = next_code_point(text, i);
      if (cp == 0x130) {  // Rust's full lowercase mapping of U+0130
        out += "i\xCC\x87";
        continue;
      }
      append_utf8(out, to_lower(cp));
    }
    text.swap(out);
  }
};

class StripNormalizer : public Normalizer {
 public:
  bool left = true, right = true;
  void normalize(std::string& text, const GrowthBudget&) const override {
    size_t b = 0, e = text.size();
    if (left) {
      while (b < e) {
        size_t i = b;
        if (!is_whitespace(next_code_point(text, i))) break;
        b = i;
      }
    }
    if (right) {
      while (e > b) {
        size_t s = e - 1;
        while (s > b && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
        size_t i = s;
        if (!is_whitespace(next_code_point(text, i))) break;
        e = s;
      }
    }
    text = text.substr(b, e - b);
  }
};

class StripAccentsNormalizer : public Normalizer {
 public:
  void normalize(std::string& text, const GrowthBudget&) const override {
    std::string out;
    size_t i = 0;
    while (i < text.size()) {
      char32_t cp = next_code_point(text, i);
      if (u_charType(static_cast<UChar32>(cp)) != U_NON_SPACING_MARK) append_utf8(out, cp);
    }
    text.swap(out);
  }
};

// `text` with each of the ranges `matches` (in order, not overlapping) replaced by `content`.
void replace_matches(std::string& text, const std::vector<std::pair<size_t, size_t>>& matches,
                     const std::string& content) {
  std::string out;
  out.reserve(text.size() + matches.size() * content.size());
  size_t prev = 0;
  for (auto [b, e] : matches) {
    out.append(text, prev, b - prev);
    out += content;
    prev = e;
  }
  out.append(text, prev, std::string::npos);
  text.swap(out);
}

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(const Json& j, const std::string& path)
      : pattern_(member(j, "pattern", path), path + ".pattern"),
        content_(get_string(j, "content", path)),
        path_(path) {}
  void normalize(std::string& text, const GrowthBudget& budget) const override {
    std::vector<std::pair<size_t, size_t>> m;
    pattern_.find_all(text, m);
    if (m.empty()) return;
    // One step can multiply the text by the content's length: check before building it.
    size_t matched = 0;
    for (auto [b, e] : m) matched += e - b;
    size_t grown;
    if (__builtin_mul_overflow(m.size(), content_.size(), &grown) ||
        __builtin_add_overflow(grown, text.size() - matched, &grown))
      grown = SIZE_MAX;
    budget.check(grown, path_);
    replace_matches(text, m, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
  std::string path_;
};

class PrependNormalizer : public Normalizer {
 public:
  std::string prepend;
  void normalize(std::string& text, const GrowthBudget&) const override {
    if (!text.empty()) text.insert(0, prepend);
  }
};

constexpr const char* kNormalizers =
    "Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Replace, Prepend";

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const Json& j, const std::string& path) {
  if (j.is_null()) return nullptr;
  std::string type = component_type(j, path, kNormalizers);
  if (type == "Sequence")
    return make_sequence<SequenceNormalizer>(j, "normalizers", path, make_normalizer);
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UnicodeNormalizer::kNFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(UnicodeNormalizer::kNFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(UnicodeNormalizer::kNFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(UnicodeNormalizer::kNFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Strip") {
    auto n = std::make_unique<StripNormalizer>();
    n->left = get_bool(j, "strip_left", path, true);
    n->right = get_bool(j, "strip_right", path, true);
    return n;
  }
  if (type == "Replace") return std::make_unique<ReplaceNormalizer>(j, path);
  if (type == "Prepend") {
    auto n = std::make_unique<PrependNormalizer>();
    n->prepend = get_string(j, "prepend", path);
    return n;
  }
  unsupported(path, "normalizer", type, kNormalizers);
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers

namespace {

constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

class SequencePreTokenizer : public PreTokenizer {
 public:
  std::vector<std::unique_ptr<PreTokenizer>> items;
  std::string path;
  void pre_tokenize(std::vector<std::string>& splits, bool& at_input_start,
                    const GrowthBudget& budget) const override {
    for (auto& p : items) {
      p->pre_tokenize(splits, at_input_start, budget);
      size_t bytes = 0;
      for (const auto& s : splits) bytes += s.size();
      budget.check(bytes, path);
    }
  }
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(const Json& j, const std::string& path)
      : pattern_(member(j, "pattern", path), path + ".pattern"),
        behavior_(parse_behavior(j, path)),
        invert_(get_bool(j, "invert", path, false)) {}
  void pre_tokenize(std::vector<std::string>& splits, bool& at_input_start,
                    const GrowthBudget&) const override {
    std::vector<std::string> out;
    out.reserve(splits.size() * 4);
    std::vector<std::pair<size_t, size_t>> m;
    for (const std::string& s : splits) {
      pattern_.find_all(s, m);
      size_t first = 0;
      split_by_matches(s, m, behavior_, invert_, out, &s == &splits[0] ? &first : nullptr);
      if (&s == &splits[0] && first != 0) at_input_start = false;
    }
    splits.swap(out);
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(const Json& j, const std::string& path)
      : add_prefix_space_(get_bool(j, "add_prefix_space", path, true)),
        use_regex_(get_bool(j, "use_regex", path, true)) {
    if (use_regex_) regex_ = std::make_unique<Regex>(kGpt2Pattern, path);
  }
  void pre_tokenize(std::vector<std::string>& splits, bool& at_input_start,
                    const GrowthBudget&) const override {
    std::vector<std::string> pieces;
    std::vector<std::pair<size_t, size_t>> m;
    const auto& table = byte_to_unicode();
    std::vector<std::string> out;
    out.reserve(splits.size());
    for (std::string& s : splits) {
      if (add_prefix_space_ && (s.empty() || s[0] != ' ')) s.insert(0, " ");
      pieces.clear();
      if (use_regex_) {
        regex_->find_all(s, m);
        split_by_matches(s, m, SplitBehavior::kIsolated, false, pieces);
      } else {
        pieces.push_back(std::move(s));
      }
      for (const std::string& p : pieces) {
        std::string mapped;
        mapped.reserve(p.size() * 2);
        for (unsigned char c : p) mapped += table[c];
        out.push_back(std::move(mapped));
      }
    }
    splits.swap(out);
  }

 private:
  bool add_prefix_space_, use_regex_;
  std::unique_ptr<Regex> regex_;
};

// Metaspace's replacement, the character that stands for a space (tokenizers reads it as a
// char): an empty one would match everywhere, and a text would never end being replaced.
std::string metaspace_replacement(const Json& j, const std::string& path) {
  std::string r = get_string(j, "replacement", path);
  if (r.empty())
    throw FormatError(path + ".replacement must be one character, such as \"\u2581\", not empty");
  return r;
}

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(const Json& j, const std::string& path) {
    replacement_ = metaspace_replacement(j, path);
    std::string scheme = "always";
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      scheme = j["prepend_scheme"].get<std::string>();
    } else if (j.contains("add_prefix_space")) {
      scheme = get_bool(j, "add_prefix_space", path, true) ? "always" : "never";
    }
    if (scheme != "always" && scheme != "first" && scheme != "never") {
      throw FormatError(detail::str_cat(path, ".prepend_scheme: unknown value '", scheme,
                                        "'; expected always, first or never"));
    }
    scheme_ = scheme;
    split_ = get_bool(j, "split", path, true);
  }
  void pre_tokenize(std::vector<std::string>& splits, bool& at_input_start,
                    const GrowthBudget&) const override {
    std::vector<std::string> out;
    std::vector<std::pair<size_t, size_t>> m;
    for (size_t k = 0; k < splits.size(); ++k) {
      std::string s;
      for (char c : splits[k]) {
        if (c == ' ') {
          s += replacement_;
        } else {
          s += c;
        }
      }
      bool prepend = scheme_ == "always" || (scheme_ == "first" && k == 0 && at_input_start);
      if (prepend && s.compare(0, replacement_.size(), replacement_) != 0)
        s.insert(0, replacement_);
      if (split_) {
        m.clear();
        size_t pos = 0;
        while ((pos = s.find(replacement_, pos)) != std::string::npos) {
          m.emplace_back(pos, pos + replacement_.size());
          pos += replacement_.size();
        }
        split_by_matches(s, m, SplitBehavior::kMergedWithNext, false, out);
      } else if (!s.empty()) {
        out.push_back(std::move(s));
      }
    }
    splits.swap(out);
  }

 private:
  std::string replacement_, scheme_;
  bool split_ = true;
};

class DigitsPreTokenizer : public PreTokenizer {
 public:
  bool individual = false;
  void pre_tokenize(std::vector<std::string>& splits, bool& at_input_start,
                    const GrowthBudget&) const override {
    // Rust's char::is_numeric: the Nd, Nl and No categories, not only ASCII digits.
    split_by_predicate(splits, is_numeric,
                       individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
                       at_input_start);
  }
};

class PunctuationPreTokenizer : public PreTokenizer {
 public:
  SplitBehavior behavior = SplitBehavior::kIsolated;
  void pre_tokenize(std::vector<std::string>& splits, bool& at_input_start,
                    const GrowthBudget&) const override {
    split_by_predicate(splits, is_punctuation, behavior, at_input_start);
  }
};

class WhitespaceSplitPreTokenizer : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<std::string>& splits, bool& at_input_start,
                    const GrowthBudget&) const override {
    split_by_predicate(splits, is_whitespace, SplitBehavior::kRemoved, at_input_start);
  }
};

class WhitespacePreTokenizer : public PreTokenizer {
 public:
  WhitespacePreTokenizer() : regex_("\\w+|[^\\w\\s]+", "Whitespace") {}
  void pre_tokenize(std::vector<std::string>& splits, bool& at_input_start,
                    const GrowthBudget&) const override {
    std::vector<std::string> out;
    std::vector<std::pair<size_t, size_t>> m;
    for (const std::string& s : splits) {
      regex_.find_all(s, m);
      size_t first = 0;
      split_by_matches(s, m, SplitBehavior::kRemoved, true, out,
                       &s == &splits[0] ? &first : nullptr);
      if (&s == &splits[0] && first != 0) at_input_start = false;
    }
    splits.swap(out);
  }

 private:
  Regex regex_;
};

constexpr const char* kPreTokenizers =
    "Sequence, Split, ByteLevel, Metaspace, Digits, Punctuation, Whitespace, WhitespaceSplit";

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j, const std::string& path) {
  if (j.is_null()) return nullptr;
  std::string type = component_type(j, path, kPreTokenizers);
  if (type == "Sequence")
    return make_sequence<SequencePreTokenizer>(j, "pretokenizers", path, make_pre_tokenizer);
  if (type == "Split") return std::make_unique<SplitPreTokenizer>(j, path);
  if (type == "ByteLevel") return std::make_unique<ByteLevelPreTokenizer>(j, path);
  if (type == "Metaspace") return std::make_unique<MetaspacePreTokenizer>(j, path);
  if (type == "Digits") {
    auto p = std::make_unique<DigitsPreTokenizer>();
    p->individual = get_bool(j, "individual_digits", path, false);
    return p;
  }
  if (type == "Punctuation") {
    auto p = std::make_unique<PunctuationPreTokenizer>();
    if (j.contains("behavior")) p->behavior = parse_behavior(j, path);
    return p;
  }
  if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>();
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplitPreTokenizer>();
  unsupported(path, "pre-tokenizer", type, kPreTokenizers);
}

// ---------------------------------------------------------------------------------------------
// Decoders

namespace {

class SequenceDecoder : public Decoder {
 public:
  std::vector<std::unique_ptr<Decoder>> items;
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& d : items) d->decode_chain(tokens);
  }
  void raw_token(std::string& token) const override {
    for (auto& d : items) d->raw_token(token);
  }
};

class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (std::string& t : tokens) {
      raw_token(t);
      bytes += t;
    }
    tokens.assign(1, repair_utf8(bytes));
  }
  void raw_token(std::string& token) const override {
    std::string bytes;
    for (size_t i = 0; i < token.size();) {
      const int b = unicode_to_byte(next_code_point(token, i));
      if (b < 0) return;  // a token outside the byte alphabet stays as it is
      bytes.push_back(static_cast<char>(b));
    }
    token.swap(bytes);
  }
};

// The byte of a byte-fallback token "<0xXX>", or -1.
int fallback_byte(const std::string& t) {
  if (!(t.size() == 6 && t[0] == '<' && t[1] == '0' && t[2] == 'x' && t[5] == '>')) return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int h = hex(t[3]), l = hex(t[4]);
  return h >= 0 && l >= 0 ? h * 16 + l : -1;
}

class ByteFallbackDecoder : public Decoder {
 public:
  void raw_token(std::string& token) const override {
    if (const int b = fallback_byte(token); b >= 0) token.assign(1, static_cast<char>(b));
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    size_t pending_count = 0;
    auto flush = [&]() {
      if (pending_count == 0) return;
      if (is_valid_utf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t k = 0; k < pending_count; ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
      pending_count = 0;
    };
    for (std::string& t : tokens) {
      const int byte = fallback_byte(t);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
        ++pending_count;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
  void raw_token(std::string&) const override {}
};

class StripDecoder : public Decoder {
 public:
  std::string content;  // one character
  size_t start = 0, stop = 0;
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t k = 0; k < start && t.compare(b, content.size(), content) == 0 && b < e; ++k) {
        b += content.size();
      }
      for (size_t k = 0; k < stop && e >= b + content.size() &&
                         t.compare(e - content.size(), content.size(), content) == 0;
           ++k) {
        e -= content.size();
      }
      t = t.substr(b, e - b);
    }
  }
  // It cuts the ends of the text (after Fuse, in the tokenizers that have it), not of each token.
  void raw_token(std::string&) const override {}
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(const Json& j, const std::string& path)
      : pattern_(member(j, "pattern", path), path + ".pattern"),
        content_(get_string(j, "content", path)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) raw_token(t);
  }
  void raw_token(std::string& t) const override {
    std::vector<std::pair<size_t, size_t>> m;
    pattern_.find_all(t, m);
    if (!m.empty()) replace_matches(t, m, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class MetaspaceDecoder : public Decoder {
 public:
  std::string replacement;
  bool prepend = true;
  // The first token's prefix space is dropped; raw_token is every other step.
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      raw_token(tokens[i]);
      if (i == 0 && prepend && !tokens[i].empty() && tokens[i][0] == ' ') tokens[i].erase(0, 1);
    }
  }
  // Mid-text: the replacement is a space, and no prefix space is dropped.
  void raw_token(std::string& t) const override {
    std::string out;
    for (size_t pos = 0; pos < t.size();) {
      if (t.compare(pos, replacement.size(), replacement) == 0) {
        out += ' ';
        pos += replacement.size();
      } else {
        out += t[pos++];
      }
    }
    t.swap(out);
  }
};

constexpr const char* kDecoders =
    "Sequence, ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace";

}  // namespace

std::unique_ptr<Decoder> make_decoder(const Json& j, const std::string& path) {
  if (j.is_null()) return nullptr;
  std::string type = component_type(j, path, kDecoders);
  if (type == "Sequence") return make_sequence<SequenceDecoder>(j, "decoders", path, make_decoder);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    auto d = std::make_unique<StripDecoder>();
    d->content = get_string(j, "content", path);
    d->start = static_cast<size_t>(get_int(j, "start", path, 0));
    d->stop = static_cast<size_t>(get_int(j, "stop", path, 0));
    return d;
  }
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(j, path);
  if (type == "Metaspace") {
    auto d = std::make_unique<MetaspaceDecoder>();
    d->replacement = metaspace_replacement(j, path);
    std::string scheme = "always";
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      scheme = j["prepend_scheme"].get<std::string>();
    } else if (j.contains("add_prefix_space")) {
      scheme = get_bool(j, "add_prefix_space", path, true) ? "always" : "never";
    }
    d->prepend = scheme != "never";
    return d;
  }
  unsupported(path, "decoder", type, kDecoders);
}

// ---------------------------------------------------------------------------------------------
// Post-processors

namespace {

class PassThroughProcessor : public PostProcessor {
 public:
  size_t added_tokens(bool) const override { return 0; }
  std::vector<int32_t> process(std::vector<int32_t> a, const std::vector<int32_t>* b,
                               bool) const override {
    if (b) a.insert(a.end(), b->begin(), b->end());
    return a;
  }
};

// TemplateProcessing: a list of pieces, each a run of special ids or sequence A / B.
class TemplateProcessor : public PostProcessor {
 public:
  struct Item {
    int sequence = -1;  // 0 = A, 1 = B, -1 = special ids
    std::vector<int32_t> ids;
  };
  std::vector<Item> single, pair;

  size_t added_tokens(bool is_pair) const override {
    size_t n = 0;
    for (auto& it : is_pair ? pair : single) n += it.ids.size();
    return n;
  }
  std::vector<int32_t> process(std::vector<int32_t> a, const std::vector<int32_t>* b,
                               bool add_special_tokens) const override {
    if (!add_special_tokens) {
      if (b) a.insert(a.end(), b->begin(), b->end());
      return a;
    }
    std::vector<int32_t> out;
    out.reserve(a.size() + (b ? b->size() : 0) + 8);
    for (const Item& it : b ? pair : single) {
      if (it.sequence == 0) {
        out.insert(out.end(), a.begin(), a.end());
      } else if (it.sequence == 1) {
        if (b) out.insert(out.end(), b->begin(), b->end());
      } else {
        out.insert(out.end(), it.ids.begin(), it.ids.end());
      }
    }
    return out;
  }
};

class SequenceProcessor : public PostProcessor {
 public:
  std::vector<std::unique_ptr<PostProcessor>> items;
  size_t added_tokens(bool pair) const override {
    size_t n = 0;
    for (auto& p : items) n += p->added_tokens(pair);
    return n;
  }
  std::vector<int32_t> process(std::vector<int32_t> a, const std::vector<int32_t>* b,
                               bool add) const override {
    // Only the first processor joins the pair; the rest see one sequence.
    bool first = true;
    for (auto& p : items) {
      a = p->process(std::move(a), first ? b : nullptr, add);
      first = false;
    }
    return a;
  }
};

std::vector<TemplateProcessor::Item> parse_template(const Json& tpl, const Json& specials,
                                                    const std::string& path) {
  std::vector<TemplateProcessor::Item> items;
  auto special_ids = [&](const std::string& name) {
    if (!specials.is_object() || !specials.contains(name)) {
      throw FormatError(
          detail::str_cat(path, ": special token '", name, "' is not in special_tokens"));
    }
    const Json& ids = member(specials[name], "ids", path + ".special_tokens." + name);
    std::vector<int32_t> out;
    for (auto& v : ids) {
      if (!v.is_number_integer()) {
        throw FormatError(path + ".special_tokens." + name + ".ids must hold integers");
      }
      out.push_back(v.get<int32_t>());
    }
    return out;
  };
  if (tpl.is_string()) {
    // Short form "[CLS] $A [SEP]" as written by some tokenizer.json files.
    std::string s = tpl.get<std::string>();
    size_t pos = 0;
    while (pos < s.size()) {
      size_t e = s.find(' ', pos);
      if (e == std::string::npos) e = s.size();
      std::string piece = s.substr(pos, e - pos);
      pos = e + 1;
      if (piece.empty()) continue;
      std::string name = piece.substr(0, piece.find(':'));
      if (name == "$A" || name == "$" || name == "$0") {
        items.push_back({0, {}});
      } else if (name == "$B" || name == "$1") {
        items.push_back({1, {}});
      } else {
        items.push_back({-1, special_ids(name)});
      }
    }
    return items;
  }
  if (!tpl.is_array()) throw FormatError(path + " must be an array");
  for (size_t i = 0; i < tpl.size(); ++i) {
    const Json& p = tpl[i];
    std::string ipath = detail::str_cat(path, "[", i, "]");
    if (p.contains("Sequence")) {
      std::string id = get_string(p["Sequence"], "id", ipath + ".Sequence");
      items.push_back({id == "B" ? 1 : 0, {}});
    } else if (p.contains("SpecialToken")) {
      items.push_back(
          {-1, special_ids(get_string(p["SpecialToken"], "id", ipath + ".SpecialToken"))});
    } else {
      throw FormatError(ipath + " must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  return items;
}

constexpr const char* kPostProcessors =
    "TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence";

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const Json& j, const std::string& path) {
  if (j.is_null()) return std::make_unique<PassThroughProcessor>();
  std::string type = component_type(j, path, kPostProcessors);
  if (type == "ByteLevel") return std::make_unique<PassThroughProcessor>();
  if (type == "TemplateProcessing") {
    auto p = std::make_unique<TemplateProcessor>();
    const Json& specials = j.contains("special_tokens") ? j["special_tokens"] : Json::object();
    p->single = parse_template(member(j, "single", path), specials, path + ".single");
    p->pair = parse_template(member(j, "pair", path), specials, path + ".pair");
    return p;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto token_id = [&](const char* key) {
      const Json& v = member(j, key, path);
      if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer()) {
        throw FormatError(detail::str_cat(path, ".", key, " must be [token, id]"));
      }
      return v[1].get<int32_t>();
    };
    int32_t cls = token_id("cls"), sep = token_id("sep");
    auto p = std::make_unique<TemplateProcessor>();
    p->single = {{-1, {cls}}, {0, {}}, {-1, {sep}}};
    if (type == "RobertaProcessing") {
      p->pair = {{-1, {cls}}, {0, {}}, {-1, {sep, sep}}, {1, {}}, {-1, {sep}}};
    } else {
      p->pair = {{-1, {cls}}, {0, {}}, {-1, {sep}}, {1, {}}, {-1, {sep}}};
    }
    return p;
  }
  if (type == "Sequence")
    return make_sequence<SequenceProcessor>(j, "processors", path, make_post_processor);
  unsupported(path, "post-processor", type, kPostProcessors);
}

std::unique_ptr<PostProcessor> make_bos_eos_processor(std::vector<int32_t> bos,
                                                      std::vector<int32_t> eos) {
  auto p = std::make_unique<TemplateProcessor>();
  p->single = {{-1, bos}, {0, {}}, {-1, eos}};
  p->pair = {{-1, bos}, {0, {}}, {-1, eos}, {-1, bos}, {1, {}}, {-1, eos}};
  return p;
}

}  // namespace tformers::tokenizer_detail
