#!/usr/bin/env bash
# Installs the build into a fresh prefix, then builds the README's C++ example against it twice,
# as users do: with find_package(tformers) (the consumer sets no C++ standard: the target brings
# it) and with pkg-config. Each runs on the shipped model without LD_LIBRARY_PATH: the first
# through CMake's build rpath, the second through the rpath in the .pc file's Libs.
#   installed_consumer.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
model="$src/models/kjv-fortunes-tiny"

cmake -S "$src/tests/packaging/consumer" -B "$work/cmake" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/cmake" >/dev/null
out=$(env -u LD_LIBRARY_PATH "$work/cmake/readme_example" "$model")
echo "find_package: $out"
[ -n "$out" ]

export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
c++ "$src/tests/packaging/consumer/main.cc" -o "$work/pc_example" $(pkg-config --cflags --libs tformers)
out=$(env -u LD_LIBRARY_PATH "$work/pc_example" "$model")
echo "pkg-config: $out"
[ -n "$out" ]

# The installed CLI finds its library through its RPATH.
"$work/prefix/bin/tformers" generate -m "$model" --prompt-ids 1,2,3 -n 4 --seed 0 >/dev/null
echo "installed CLI: ok"
