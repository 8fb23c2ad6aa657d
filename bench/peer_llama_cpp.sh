#!/usr/bin/env bash
# llama.cpp beside tformers on the very same weights, in one run: bench_model's Qwen3-0.6B-shaped
# checkpoint (random bf16) is timed by tformers (bench_model), then written as GGUF
# (tools/peer/safetensors_to_gguf.py) and timed by llama.cpp's prebuilt CPU build through
# node-llama-cpp (tools/peer/llama_cpp_bench.mjs, pinned in tools/peer/package.json).
#
#   bench/peer_llama_cpp.sh [--threads 1,2] [--decode 32] [--dir /tmp]
#
# bf16 against bf16, and tformers' --quantize int8 against llama.cpp's Q8_0 (the same 32-value
# blocks with one scale; written only where Debian's python3-torch is, scripts/setup.sh --dev).
# Needs the release build (scripts/setup.sh) and Node.js with npm (scripts/setup.sh --tests);
# installs tools/peer/node_modules from the npm registry on first use (about 85 MB: the Linux
# x64 binaries only, no GPU packages, no install scripts).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=1,2 decode=32 dir=/tmp
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --decode) decode=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) echo "usage: $0 [--threads 1,2] [--decode 32] [--dir /tmp]" >&2; exit 2 ;;
  esac
done
[ -x build/release/bench/bench_model ] || { echo "$0: build/release/bench/bench_model is missing: run scripts/setup.sh" >&2; exit 1; }
command -v node >/dev/null || { echo "$0: node is missing: run scripts/setup.sh --tests" >&2; exit 1; }

echo "== tformers (bench_model)"
build/release/bench/bench_model --models qwen3 --threads "$threads" --decode "$decode" --dir "$dir"

ckpt=$dir/tformers-bench-qwen3-0.6b
if [ ! -d tools/peer/node_modules/node-llama-cpp ]; then
  (cd tools/peer && npm ci --omit=optional --ignore-scripts --no-audit --no-fund --loglevel=error)
fi
# Each GGUF is written again when the checkpoint is newer than it. Debian's python3 (not one
# first on PATH, such as a pyenv one) is the one that has python3-torch for Q8_0.
for kind in bf16 q8_0; do
  gguf=$ckpt.$kind.gguf
  if [ "$kind" = q8_0 ] && ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
    echo "== llama.cpp Q8_0: skipped (needs python3-torch: scripts/setup.sh --dev)"
    continue
  fi
  if [ ! -s "$gguf" ] || [ "$gguf" -ot "$ckpt/model.safetensors" ]; then
    /usr/bin/python3 tools/peer/safetensors_to_gguf.py $([ "$kind" = q8_0 ] && echo --q8_0) "$ckpt" "$gguf"
  fi
  echo "== llama.cpp, $kind weights"
  node tools/peer/llama_cpp_bench.mjs "$gguf" --threads "$threads" --decode "$decode"
done
