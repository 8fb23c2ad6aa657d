// TFORMERS_TEST_ASAN is 1 in a build under AddressSanitizer, whichever compiler made it: GCC
// defines __SANITIZE_ADDRESS__, clang (the asan preset's) answers __has_feature instead. Tests
// that bound memory by RSS relax there (the quarantine keeps freed memory) and slow ones skip.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define TFORMERS_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TFORMERS_TEST_ASAN 1
#endif
#endif
#ifndef TFORMERS_TEST_ASAN
#define TFORMERS_TEST_ASAN 0
#endif
