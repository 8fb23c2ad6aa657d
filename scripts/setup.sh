#!/usr/bin/env bash
# Installs what tformers needs on a fresh Debian 12 machine and builds it. Safe to re-run.
#   scripts/setup.sh            build dependencies, then the release build
#   scripts/setup.sh --tests    also the test tooling (npm references) and the asan build
#   scripts/setup.sh --dev      also python3-torch, to regenerate goldens (tools/reference), and
#                               python3-numpy, to write the peer GGUFs (bench/peer_llama_cpp.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

want_tests=0
want_dev=0
for arg in "$@"; do
  case "$arg" in
    --tests) want_tests=1 ;;
    --dev) want_dev=1; want_tests=1 ;;
    *) echo "setup.sh: unknown option '$arg' (use --tests or --dev)" >&2; exit 2 ;;
  esac
done

packages=(g++ cmake ninja-build pkg-config nlohmann-json3-dev libpcre2-dev libicu-dev
          libgtest-dev libgmock-dev libbenchmark-dev libopenmpi-dev openmpi-bin libcli11-dev
          libedit-dev libcpp-httplib-dev libssl-dev)
# clang and libFuzzer (libclang-rt-14-dev) build the fuzz targets (scripts/fuzz.sh).
[ "$want_tests" = 1 ] && packages+=(nodejs npm clang-format clang libclang-rt-14-dev)
[ "$want_dev" = 1 ] && packages+=(python3-torch python3-numpy libopenblas0-pthread)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node and npm may come from outside Debian on some images; accept any working ones.
if [ "$want_tests" = 1 ] && command -v node >/dev/null && command -v npm >/dev/null; then
  filtered=()
  for p in "${missing[@]}"; do [ "$p" = nodejs ] || [ "$p" = npm ] || filtered+=("$p"); done
  missing=("${filtered[@]}")
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "$want_tests" = 1 ]; then
  (cd tools/npm && npm ci --no-audit --no-fund --loglevel=error)
fi

cmake --preset release >/dev/null
cmake --build --preset release
