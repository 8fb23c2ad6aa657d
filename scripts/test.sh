#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: every test on the release build, then again
# under AddressSanitizer + UndefinedBehaviorSanitizer (all areas but the 1.7 MB tokenizer parity
# runs, whose bad-input, invalid-UTF-8 and streaming tests do run there, and the packaging and
# layering checks, which test the build rather than the code), then the concurrency tests under
# ThreadSanitizer (only their binary is built there), and finally a short run of every fuzz
# target (clang, ASan + UBSan) over its seed corpus plus a few thousand mutations.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
# Formatting is part of the suite: every C++ file as .clang-format says.
git ls-files '*.cc' '*.h' | xargs clang-format --dry-run -Werror
echo "clang-format: clean"
ctest --preset release -j2
cmake --preset asan >/dev/null
cmake --build --preset asan
ctest --preset asan -j2 -LE 'tokenizer|packaging|layering'
ctest --preset asan -j2 -L tokenizer -R 'BadInput|Invalid|Stream'
cmake --preset tsan >/dev/null
cmake --build --preset tsan
ctest --preset tsan
scripts/fuzz.sh --smoke 3000
