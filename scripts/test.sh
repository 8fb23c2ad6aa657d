#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: the release build, then the bad-input and
# kernel tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
ctest --preset release -j2
cmake --preset asan >/dev/null
cmake --build --preset asan
ctest --preset asan -j2 -L asan
