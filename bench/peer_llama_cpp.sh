#!/usr/bin/env bash
# llama.cpp beside tformers on the very same weights, in one run: a checkpoint with random weights
# is timed by tformers, then written as GGUF (tools/peer/safetensors_to_gguf.py) and timed by
# llama.cpp's prebuilt CPU build through node-llama-cpp (tools/peer/llama_cpp_bench.mjs, pinned in
# tools/peer/package.json).
#
#   bench/peer_llama_cpp.sh [--shape qwen3-0.6b] [--threads 1,2] [--decode 32] [--prefill 512]
#                           [--dir /tmp] [--weights bf16,int8,int4] [--load-modes mmap,none]
#                           [--rounds 1]
#
# --shape qwen3-0.6b (the default): bench_model's Qwen3-0.6B-shaped checkpoint (random bf16),
# timed by bench_model. --weights picks the pairs: bf16 against bf16, tformers' --quantize int8
# against llama.cpp's Q8_0 and --quantize int4 against Q4_0 (the same 32-value blocks with one f16
# scale each; the GGUFs are quantized with numpy from .venv/, which scripts/setup.sh --tests makes,
# and skipped without it).
# --shape gpt-oss-20b-2l: two of gpt-oss-20b's 24 layers (bench/model_shapes.h: 32 experts of 2880,
# 4 per token, MXFP4 as released; bf16 attention, router and a tied 201088-token embedding),
# written by build/release/bench/make_shape into DIR/tformers-bench-gpt-oss-20b-2l and timed by
# `tformers bench` (its decode steps follow an 8-token prompt, llama.cpp's a 128-token one: the
# attention over either is small beside the weights). Only --weights bf16, the weights as stored:
# the GGUF keeps the experts in GGML's MXFP4 (the same blocks and bytes) and the rest in bf16.
# --shape qwen3.5-9b-4l: four of Qwen3.5-9B's 32 layers (bench/model_shapes.h: three Gated DeltaNet
# layers and one of gated attention, random bf16), made and timed the same way, written as
# llama.cpp's qwen35 GGUF as its own converter lays it out (its (1 + w) norms stored as 1 + w,
# ssm_a = -exp(A_log), the value heads in ggml's tiled order); only --weights bf16.
# --shape gemma-4-e4b-12l: twelve of Gemma-4-E4B's 42 text layers (bench/model_shapes.h: two groups
# of five sliding layers and a full one, the second group KV-shared, per-layer inputs of 256 from a
# 262144-token table, random bf16), made and timed the same way, written as llama.cpp's gemma4
# GGUF (the full layers' proportional RoPE as its rope_freqs); only --weights bf16.
# --load-modes times llama.cpp on the GGUF's mapping (mmap, its default) and on weights it reads
# into memory of its own (none: the like of tformers' default load, a copy, which bench_model and
# `tformers bench` use).
# --prefill N (0 = skip) is the prompt length of both prefill timings; bench_model times it with
# bf16 weights at the largest thread count only, llama.cpp for every weight type and thread count.
# --rounds N runs the two engines in turn N times (tformers, llama.cpp, tformers, ...), so that
# the load of a shared machine falls on both sides alike.
# Needs the release build (scripts/setup.sh) and Node.js with npm (scripts/setup.sh --tests);
# installs tools/peer/node_modules from the npm registry on first use (about 85 MB: the Linux
# x64 binaries only, no GPU packages, no install scripts).
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: $0 [--shape qwen3-0.6b|gpt-oss-20b-2l|qwen3.5-9b-4l|gemma-4-e4b-12l] [--threads 1,2] [--decode 32] [--prefill 512] [--dir /tmp] [--weights bf16,int8,int4] [--load-modes mmap,none] [--rounds 1]"
shape=qwen3-0.6b threads=1,2 decode=32 prefill=512 dir=/tmp weights= load_modes=mmap,none rounds=1
while [ $# -gt 0 ]; do
  case "$1" in
    --shape) shape=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --decode) decode=$2; shift 2 ;;
    --prefill) prefill=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --weights) weights=$2; shift 2 ;;
    --load-modes) load_modes=$2; shift 2 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
# Checked before anything runs, so that a typo does not cost the tformers run first.
case "$shape" in
  qwen3-0.6b) weights=${weights:-bf16,int8,int4} ;;
  gpt-oss-20b-2l|qwen3.5-9b-4l|gemma-4-e4b-12l)
    weights=${weights:-bf16}
    [ "$weights" = bf16 ] || { echo "$0: --shape $shape: only --weights bf16 (the weights as stored)" >&2; exit 2; } ;;
  *) echo "$0: --shape $shape: use qwen3-0.6b, gpt-oss-20b-2l, qwen3.5-9b-4l or gemma-4-e4b-12l" >&2; exit 2 ;;
esac
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "$0: --rounds $rounds: use a positive count" >&2; exit 2; }
for w in ${weights//,/ }; do
  case "$w" in bf16|int8|int4) ;; *) echo "$0: --weights $w: use bf16, int8 or int4" >&2; exit 2 ;; esac
done
for m in ${load_modes//,/ }; do
  case "$m" in mmap|none) ;; *) echo "$0: --load-modes $m: use mmap or none" >&2; exit 2 ;; esac
done
# The shapes that make_shape writes and `tformers bench` times; the others are bench_model's.
case "$shape" in gpt-oss-20b-2l|qwen3.5-9b-4l|gemma-4-e4b-12l) made=1 ;; *) made= ;; esac
if [ -n "$made" ]; then
  [ -x build/release/tformers ] && [ -x build/release/bench/make_shape ] ||
    { echo "$0: build/release/tformers or bench/make_shape is missing: run scripts/setup.sh" >&2; exit 1; }
  .venv/bin/python -c "import numpy" 2>/dev/null ||
    { echo "$0: the $shape GGUF needs numpy in .venv/: scripts/setup.sh --tests" >&2; exit 1; }
else
  [ -x build/release/bench/bench_model ] || { echo "$0: build/release/bench/bench_model is missing: run scripts/setup.sh" >&2; exit 1; }
fi
command -v node >/dev/null || { echo "$0: node is missing: run scripts/setup.sh --tests" >&2; exit 1; }

if [ ! -d tools/peer/node_modules/node-llama-cpp ]; then
  (cd tools/peer && npm ci --omit=optional --ignore-scripts --no-audit --no-fund --loglevel=error)
fi

# llama.cpp on GGUF $2 in every load mode, labelled with the weights $1, in round $r.
llama_cpp() {
  for mode in ${load_modes//,/ }; do
    echo "== llama.cpp, $1 weights, load mode $mode, round $r of $rounds"
    node tools/peer/llama_cpp_bench.mjs "$2" --threads "$threads" --decode "$decode" \
      --prefill "$prefill" --load-mode "$mode"
  done
}

if [ -n "$made" ]; then
  ckpt=$dir/tformers-bench-$shape
  build/release/bench/make_shape "$shape" "$ckpt"  # leaves a checkpoint that is there as it is
  gguf=$ckpt.gguf
  if [ ! -s "$gguf" ] || [ "$gguf" -ot "$ckpt/model.safetensors" ]; then
    .venv/bin/python tools/peer/safetensors_to_gguf.py "$ckpt" "$gguf"
  fi
  for ((r = 1; r <= rounds; ++r)); do
    echo "== tformers (tformers bench), round $r of $rounds"
    build/release/tformers bench -m "$ckpt" -t "$threads" -n "$decode" -p "$prefill" -r 3
    if [ "$shape" = gpt-oss-20b-2l ]; then llama_cpp "bf16 and MXFP4" "$gguf"; else llama_cpp bf16 "$gguf"; fi
  done
  exit 0
fi

ckpt=$dir/tformers-bench-qwen3-0.6b
for ((r = 1; r <= rounds; ++r)); do
  echo "== tformers (bench_model), round $r of $rounds"
  build/release/bench/bench_model --models qwen3 --threads "$threads" --decode "$decode" \
    --prefill "$prefill" --weights "$weights" --dir "$dir"

  # Each GGUF is written again when the checkpoint is newer than it. The project's .venv/ has the
  # pinned numpy that Q8_0 and Q4_0 need.
  for w in ${weights//,/ }; do
    case "$w" in bf16) kind=bf16 quant= ;; int8) kind=q8_0 quant=--q8_0 ;; int4) kind=q4_0 quant=--q4_0 ;; esac
    gguf=$ckpt.$kind.gguf
    if [ -n "$quant" ] && ! .venv/bin/python -c "import numpy" 2>/dev/null; then
      echo "== llama.cpp $kind: skipped (needs numpy in .venv/: scripts/setup.sh --tests)"
      continue
    fi
    if [ ! -s "$gguf" ] || [ "$gguf" -ot "$ckpt/model.safetensors" ]; then
      .venv/bin/python tools/peer/safetensors_to_gguf.py ${quant:+"$quant"} "$ckpt" "$gguf"
    fi
    llama_cpp "$kind" "$gguf"
  done
done
