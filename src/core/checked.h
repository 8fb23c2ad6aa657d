// Overflow-checked size arithmetic for values that come from files (shapes, config sizes, counts).
// A product of two config fields can wrap int64_t long before any allocation fails, and the
// wrapped value then passes every later check; these throw instead.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <type_traits>

#include "tformers/error.h"

namespace tformers {

// a * b, or FormatError "WHAT: A * B overflows" naming the operands. `what` says which value was
// being computed and from where ("config.json: num_attention_heads * head_dim").
template <typename T>
T checked_mul(T a, T b, std::string_view what) {
  static_assert(std::is_integral_v<T>);
  T out;
  if (__builtin_mul_overflow(a, b, &out))
    throw FormatError(detail::str_cat(what, ": ", +a, " * ", +b, " overflows"));
  return out;
}

// a + b, or FormatError "WHAT: A + B overflows".
template <typename T>
T checked_add(T a, T b, std::string_view what) {
  static_assert(std::is_integral_v<T>);
  T out;
  if (__builtin_add_overflow(a, b, &out))
    throw FormatError(detail::str_cat(what, ": ", +a, " + ", +b, " overflows"));
  return out;
}

// The product of all factors (1 for none), each step checked as checked_mul.
template <typename T>
T checked_product(std::initializer_list<T> factors, std::string_view what) {
  T out = 1;
  for (T f : factors) out = checked_mul(out, f, what);
  return out;
}

// Converts between integer types, or FormatError "WHAT: V does not fit".
template <typename To, typename From>
To checked_cast(From v, std::string_view what) {
  static_assert(std::is_integral_v<To> && std::is_integral_v<From>);
  To out;
  if (__builtin_add_overflow(v, From(0), &out))
    throw FormatError(detail::str_cat(what, ": ", +v, " does not fit in ", sizeof(To) * 8,
                                      std::is_signed_v<To> ? "-bit signed" : "-bit unsigned",
                                      " integer"));
  return out;
}

}  // namespace tformers
