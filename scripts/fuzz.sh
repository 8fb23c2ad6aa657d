#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz preset: clang, AddressSanitizer + UndefinedBehaviorSanitizer)
# and runs them.
#   scripts/fuzz.sh TARGET SECONDS   fuzz one target (e.g. tokenizer) for SECONDS, starting from
#                                    tests/fuzz/corpus/TARGET; new inputs go to
#                                    build/fuzz/corpus/TARGET, crashes to build/fuzz/crashes/TARGET
#   scripts/fuzz.sh --smoke [RUNS]   every target over its seed corpus plus RUNS mutations
#                                    (default 3000); fails on the first crash
#   scripts/fuzz.sh --list           the targets
# A crash leaves the input behind (libFuzzer prints its path); turn it into a regression test in
# the normal suite, then add it to the target's seed corpus.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=()
for f in tests/fuzz/fuzz_*.cc; do
  t=$(basename "$f" .cc)
  targets+=("${t#fuzz_}")
done

if [ "${1:-}" = --list ]; then
  printf '%s\n' "${targets[@]}"
  exit 0
fi

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz

# Every input must finish in seconds and within memory; both limits fail the run like a crash.
common=(-timeout=20 -rss_limit_mb=4096 -malloc_limit_mb=2048 -print_final_stats=1)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

if [ "${1:-}" = --smoke ]; then
  runs=${2:-3000}
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  for t in "${targets[@]}"; do
    start=$SECONDS
    mkdir -p "$scratch/$t" build/fuzz/crashes/"$t"
    # The seed corpus is read, never written: new inputs go to the scratch folder.
    if ! build/fuzz/tests/fuzz/fuzz_"$t" "${common[@]}" -runs="$runs" \
        -artifact_prefix=build/fuzz/crashes/"$t"/ "$scratch/$t" tests/fuzz/corpus/"$t" \
        >"$scratch/$t.log" 2>&1; then
      tail -n 60 "$scratch/$t.log"
      echo "fuzz smoke: $t failed; the input is in build/fuzz/crashes/$t/" >&2
      exit 1
    fi
    echo "fuzz smoke: $t: $(grep -o 'stat::number_of_executed_units: [0-9]*' "$scratch/$t.log" |
      grep -o '[0-9]*$') runs, $((SECONDS - start)) s"
  done
  exit 0
fi

if [ $# -ne 2 ]; then
  echo "usage: scripts/fuzz.sh TARGET SECONDS | --smoke [RUNS] | --list" >&2
  exit 2
fi
t=$1
if [ ! -f tests/fuzz/fuzz_"$t".cc ]; then
  echo "fuzz.sh: no target '$t'; targets: ${targets[*]}" >&2
  exit 2
fi
mkdir -p build/fuzz/corpus/"$t" build/fuzz/crashes/"$t"
exec build/fuzz/tests/fuzz/fuzz_"$t" "${common[@]}" -max_total_time="$2" \
  -artifact_prefix=build/fuzz/crashes/"$t"/ build/fuzz/corpus/"$t" tests/fuzz/corpus/"$t"
