#!/usr/bin/env bash
# Installs what tformers needs on a fresh Debian 12 machine and builds it. Safe to re-run.
#   scripts/setup.sh            the C++ build dependencies (apt), then the library and the
#                               `tformers` command of the release preset: what the main job needs
#   scripts/setup.sh --tests    also the test tooling: clang, clang-format and libFuzzer's runtime
#                               (apt), the npm references (tools/npm), and the `test` and
#                               `plugins` groups of pyproject.toml in .venv/ (tokenizers, Jinja2,
#                               pytest; XLA's CPU PJRT plugin and libtpu), and in
#                               build/wheelhouse/ the wheels the Python package's test stage
#                               installs offline; no test is built here
#   scripts/setup.sh --dev      also the `reference` group in .venv/ (Transformers and torch, about
#                               3.5 GB with torch's CUDA libraries), to regenerate the goldens
#   scripts/setup.sh --peers    also llama.cpp's server for bench/peer_serve.sh, built from the
#                               sdist pinned in pyproject.toml (tools/peer/build_llama_server.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

want_tests=0
want_dev=0
want_peers=0
for arg in "$@"; do
  case "$arg" in
    --tests) want_tests=1 ;;
    --dev) want_dev=1; want_tests=1 ;;
    --peers) want_peers=1 ;;
    *) echo "setup.sh: unknown option '$arg' (use --tests, --dev or --peers)" >&2; exit 2 ;;
  esac
done

# GoogleTest, Google Benchmark and cpp-httplib (the HTTP client of the server's tests) are
# configured with the release preset (the test and bench targets exist in it), so the first
# command installs them too; they are headers and small libraries, and building what uses them
# waits for scripts/test.sh.
packages=(g++ cmake ninja-build pkg-config nlohmann-json3-dev libpcre2-dev libicu-dev
          libgtest-dev libgmock-dev libbenchmark-dev libopenmpi-dev openmpi-bin libcli11-dev
          libedit-dev libcpp-httplib-dev libssl-dev)
# clang and libFuzzer (libclang-rt-14-dev) build the fuzz targets (scripts/fuzz.sh); python3-venv
# makes .venv/ where the machine's python3 is Debian's.
[ "$want_tests" = 1 ] && packages+=(nodejs npm clang-format clang libclang-rt-14-dev python3-venv)
[ "$want_peers" = 1 ] && packages+=(curl)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node, npm and Python may come from outside Debian on some images; accept any working ones.
if [ "$want_tests" = 1 ]; then
  filtered=()
  for p in "${missing[@]}"; do
    case "$p" in
      nodejs | npm) command -v node >/dev/null && command -v npm >/dev/null && continue ;;
      python3-venv) python3 -c 'import venv, ensurepip' 2>/dev/null && continue ;;
    esac
    filtered+=("$p")
  done
  missing=("${filtered[@]}")
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The test tools come over the network while the library builds: npm's packages and the
# Python environment in the background, into build/setup-tools.log, waited for at the end.
tools_pid=""
if [ "$want_tests" = 1 ]; then
  mkdir -p build
  (
    set -euo pipefail
    (cd tools/npm && npm ci --no-audit --no-fund --loglevel=error)
    # One virtual environment for the Python tools, every version pinned in pyproject.toml.
    # pip 25.3 reads its dependency groups (--group, pip >= 25.1).
    if [ ! -x .venv/bin/python ]; then
      python3 -m venv .venv
    fi
    if ! .venv/bin/pip --version 2>/dev/null | grep -q '^pip 25\.3 '; then
      .venv/bin/python -m pip install -q --disable-pip-version-check pip==25.3
    fi
    groups=(--group test --group plugins)
    [ "$want_dev" = 1 ] && groups+=(--group reference)
    .venv/bin/pip install -q --disable-pip-version-check "${groups[@]}"
    # The wheels the Python package's stage of scripts/test.sh installs offline into a fresh
    # environment: pip, the package's build requirements and dependencies, and the test group.
    build_requires=$(.venv/bin/python -c 'import tomllib
print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
    # shellcheck disable=SC2086  # one argument per requirement
    .venv/bin/pip download -q --disable-pip-version-check -d build/wheelhouse pip==25.3 \
      $build_requires --group test
  ) >build/setup-tools.log 2>&1 &
  tools_pid=$!
  # A failed build ends the script: the download ends with it.
  trap '[ -z "$tools_pid" ] || kill "$tools_pid" 2>/dev/null || true' EXIT
fi

cmake --preset release >/dev/null
cmake --build --preset release --target tformers_cli
if [ -n "$tools_pid" ] && ! wait "$tools_pid"; then
  tools_pid=""
  cat build/setup-tools.log >&2
  echo "setup.sh: installing the test tools (npm, .venv) failed (above)" >&2
  exit 1
fi
tools_pid=""
# The peers' side of bench/peer_serve.sh: its checkpoint writer and llama.cpp's server.
if [ "$want_peers" = 1 ]; then
  cmake --build --preset release --target make_shape
  tools/peer/build_llama_server.sh
fi
