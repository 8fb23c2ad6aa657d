// UTF-8 helpers for the tokenizer: decoding, repair of invalid input, the GPT-2 byte<->char map,
// and the character classes the Rust library uses (char::is_whitespace and friends).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace tformers::tokenizer_detail {

// Decodes the code point at s[i] (valid UTF-8 assumed) and advances i.
inline char32_t next_code_point(std::string_view s, size_t& i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  if (c < 0xE0) {
    char32_t cp = ((c & 0x1F) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3F);
    i += 2;
    return cp;
  }
  if (c < 0xF0) {
    char32_t cp = ((c & 0x0F) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3F) << 6) |
                  (static_cast<unsigned char>(s[i + 2]) & 0x3F);
    i += 3;
    return cp;
  }
  char32_t cp = ((c & 0x07) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3F) << 12) |
                ((static_cast<unsigned char>(s[i + 2]) & 0x3F) << 6) |
                (static_cast<unsigned char>(s[i + 3]) & 0x3F);
  i += 4;
  return cp;
}

// Length in bytes of the UTF-8 sequence that starts with byte c (1 for stray bytes).
inline size_t utf8_length(unsigned char c) {
  if (c < 0x80) return 1;
  if (c < 0xC0) return 1;
  if (c < 0xE0) return 2;
  if (c < 0xF0) return 3;
  return 4;
}

void append_utf8(std::string& out, char32_t cp);

// What a well-formed UTF-8 sequence that starts with byte c continues with (Unicode's table
// 3-7: no overlongs, surrogates or code points past U+10FFFF): `continuations` more bytes, the
// first in [lo, hi] and the rest in [0x80, 0xBF]. ASCII needs none. False for a byte that
// cannot start a character (a continuation byte, 0xC0, 0xC1, 0xF5 and above).
struct Utf8Lead {
  uint8_t continuations = 0, lo = 0x80, hi = 0xBF;
};
inline bool utf8_lead(unsigned char c, Utf8Lead& lead) {
  lead = {};
  if (c < 0x80) return true;
  if (c >= 0xC2 && c <= 0xDF) {
    lead.continuations = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    lead.continuations = 2;
    if (c == 0xE0) lead.lo = 0xA0;
    if (c == 0xED) lead.hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    lead.continuations = 3;
    if (c == 0xF0) lead.lo = 0x90;
    if (c == 0xF4) lead.hi = 0x8F;
  } else {
    return false;
  }
  return true;
}

// True when s is well-formed UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
bool is_valid_utf8(std::string_view s);
// Replaces each maximal invalid subpart with U+FFFD (the Unicode / WHATWG practice, the same as
// Python's errors="replace" and JavaScript's TextDecoder).
std::string repair_utf8(std::string_view s);
// Length of the longest prefix of s that ends on a complete character.
size_t complete_utf8_prefix(std::string_view s);

// GPT-2's reversible map from bytes to printable code points, and back.
const std::array<std::string, 256>& byte_to_unicode();
// Returns -1 for code points that are not in the map.
int unicode_to_byte(char32_t cp);

// Rust's char::is_whitespace (the White_Space property).
bool is_whitespace(char32_t cp);
// Rust's char::is_alphanumeric (Alphabetic or Numeric).
bool is_alphanumeric(char32_t cp);
// What the Rust library's Digits pre-tokenizer takes for a digit (char::is_numeric: Nd, Nl, No)
// and its Punctuation pre-tokenizer for punctuation, from tables generated with the reference.
bool is_numeric(char32_t cp);
bool is_punctuation(char32_t cp);

}  // namespace tformers::tokenizer_detail
