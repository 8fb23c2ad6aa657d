#include "tokenizer/unicode.h"

#include <algorithm>

#include <unicode/uchar.h>

namespace tformers::tokenizer_detail {

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Length of the valid sequence at s[i], or 0 with `consumed` set to the maximal subpart that has
// to be replaced by one U+FFFD.
size_t valid_sequence_at(std::string_view s, size_t i, size_t& consumed) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  Utf8Lead lead;
  if (!utf8_lead(b(i), lead)) {
    consumed = 1;
    return 0;
  }
  const size_t need = lead.continuations;
  size_t k = 1;
  for (; k <= need; ++k) {
    if (i + k >= s.size()) break;
    unsigned char d = b(i + k);
    unsigned char l = k == 1 ? lead.lo : 0x80, h = k == 1 ? lead.hi : 0xBF;
    if (d < l || d > h) break;
  }
  if (k == need + 1) return need + 1;
  consumed = k;  // the lead byte and the continuation bytes that were still possible
  return 0;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= s.size()) break;
    size_t consumed = 0;
    size_t n = valid_sequence_at(s, i, consumed);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string repair_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    size_t consumed = 0;
    size_t n = valid_sequence_at(s, i, consumed);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += consumed;
    }
  }
  return out;
}

size_t complete_utf8_prefix(std::string_view s) {
  // Walk back over at most 3 continuation bytes to the last lead byte.
  size_t n = s.size();
  size_t k = 0;
  while (k < 4 && k < n && (static_cast<unsigned char>(s[n - 1 - k]) & 0xC0) == 0x80) ++k;
  if (k == n) return n;
  unsigned char lead = static_cast<unsigned char>(s[n - 1 - k]);
  size_t len = utf8_length(lead);
  if (lead >= 0xC0 && len > k + 1) return n - 1 - k;
  return n;
}

namespace {
struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::array<int, 324> from_unicode;  // every mapped code point is below 324
  ByteTables() {
    from_unicode.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      append_utf8(to_unicode[b], cp);
      from_unicode[cp] = b;
    }
  }
};
const ByteTables& tables() {
  static const ByteTables t;
  return t;
}
}  // namespace

const std::array<std::string, 256>& byte_to_unicode() { return tables().to_unicode; }

int unicode_to_byte(char32_t cp) { return cp < 324 ? tables().from_unicode[cp] : -1; }

bool is_whitespace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE);
}

bool is_alphanumeric(char32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
  if (u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_ALPHABETIC)) return true;
  int8_t t = u_charType(static_cast<UChar32>(cp));
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

namespace {

struct CodePointRange {
  char32_t first, last;
};

// The reference's own tables (tools/tokenizer/make_unicode_newer.py): its Digits pre-tokenizer
// uses Rust's char::is_numeric, newer than ICU 72's Unicode 15, and its Punctuation
// pre-tokenizer the unicode_categories crate, older than it; ICU agrees with neither everywhere.
constexpr CodePointRange kNumeric[] = {
#include "tokenizer/unicode_numeric.inc"
};
constexpr CodePointRange kPunctuation[] = {
#include "tokenizer/unicode_punctuation.inc"
};

template <size_t N>
bool in_ranges(const CodePointRange (&table)[N], char32_t cp) {
  const CodePointRange* it = std::upper_bound(
      table, table + N, cp, [](char32_t c, const CodePointRange& r) { return c < r.first; });
  return it != table && cp <= (it - 1)->last;
}

}  // namespace

bool is_numeric(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(kNumeric, cp);
}

bool is_punctuation(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
           (cp >= 123 && cp <= 126);
  }
  return in_ranges(kPunctuation, cp);
}

}  // namespace tformers::tokenizer_detail
