#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: every test on the release build (gcc), the
# Python package's tests in a fresh virtual environment, then the tests again under
# AddressSanitizer + UndefinedBehaviorSanitizer on a clang build, so that both compilers build
# everything (all areas but the 1.7 MB tokenizer parity runs, whose bad-input, invalid-UTF-8 and
# streaming tests do run there, the packaging and layering checks, which test the build rather
# than the code, and the long numeric runs listed at that stage) with every fuzz target's seed
# corpus replayed (FuzzCorpus.*), and last the concurrency tests under ThreadSanitizer (only
# their binary is built there). Mutation fuzzing, which needs a clang build
# of its own, runs out of this suite: scripts/fuzz.sh TARGET SECONDS, or --smoke RUNS for every
# target. Each stage's time is printed at the end, also when a stage fails.
set -euo pipefail
cd "$(dirname "$0")/.."

stage_names=()
stage_secs=()
stage_start=$SECONDS
current=""
summary() {
  local rc=$?
  [ -n "${reference_pid:-}" ] && kill "$reference_pid" 2>/dev/null
  [ -n "$current" ] && { stage_names+=("$current (failed)"); stage_secs+=($((SECONDS - stage_start))); }
  echo "== stage times"
  for i in "${!stage_names[@]}"; do
    printf '  %-34s %4d s\n' "${stage_names[$i]}" "${stage_secs[$i]}"
  done
  printf '  %-34s %4d s\n' total "$SECONDS"
  exit "$rc"
}
trap summary EXIT
stage() {  # stage NAME: closes the running stage and opens NAME
  [ -n "$current" ] && { stage_names+=("$current"); stage_secs+=($((SECONDS - stage_start))); }
  current=$1
  stage_start=$SECONDS
  echo "== $current"
}

stage "setup (apt, npm, .venv)"
scripts/setup.sh --tests
# The Python package's parity tests need torch and Transformers: the `reference` group, 3.5 GB
# with torch's CUDA wheels. Where .venv/ lacks it (setup.sh --dev adds it there), it goes into an
# environment of its own in the background, a download beside the CPU-bound builds, and the
# Python stage waits for it.
reference_python=.venv/bin/python
reference_pid=""
if ! .venv/bin/python -c 'import torch, transformers' 2>/dev/null; then
  reference_python=build/reference-venv/bin/python
  mkdir -p build
  ( { [ -x "$reference_python" ] || python3 -m venv build/reference-venv; } &&
    "$reference_python" -m pip install -q --disable-pip-version-check pip==25.3 &&
    "$reference_python" -m pip install -q --disable-pip-version-check --group test \
      --group reference ) \
    >build/reference-venv.log 2>&1 &
  reference_pid=$!
fi
stage "clang-format"
# Formatting is part of the suite: every C++ file as .clang-format says.
git ls-files '*.cc' '*.h' | xargs clang-format --dry-run -Werror
echo "clang-format: clean"
stage "release build"
cmake --build --preset release
stage "release tests"
ctest --preset release -j2
stage "python package"
# The Python package into a fresh virtual environment, offline from the wheels setup.sh fetched,
# over the release build's library and command (TFORMERS_PYTHON_CORE) so the core is not
# compiled a second time; then its pytest suite (tests/python/).
rm -rf build/python-venv build/python
python3 -m venv build/python-venv
offline=(env PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/build/wheelhouse" PIP_DISABLE_PIP_VERSION_CHECK=1)
"${offline[@]}" build/python-venv/bin/python -m pip install -q pip==25.3
"${offline[@]}" build/python-venv/bin/pip install -q --group test
"${offline[@]}" build/python-venv/bin/pip install -q . -Cbuild-dir=build/python \
  -Ccmake.define.TFORMERS_PYTHON_CORE="$PWD/build/release"
build/python-venv/bin/python -m pytest -q -rs tests/python
# The suite again in the reference environment, over the same install: with torch there, the
# guide's snippets run verbatim (return_tensors="pt"), torch dtypes and tensors are tested, and
# the parity tests compare with Transformers.
if [ -n "$reference_pid" ] && ! wait "$reference_pid"; then
  cat build/reference-venv.log
  echo "test.sh: installing the reference group into build/reference-venv failed (above)" >&2
  exit 1
fi
reference_pid=""
"$reference_python" -c 'import torch, transformers, pytest'  # never skipped for want of them
PATH="$PWD/build/python-venv/bin:$PATH" \
  PYTHONPATH=$(build/python-venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
  "$reference_python" -m pytest -q -rs tests/python
stage "asan build"
cmake --preset asan >/dev/null
cmake --build --preset asan
stage "asan tests"
# Left to the release stage: the tests whose time goes into long numeric runs over paths that
# smaller tests take under the sanitizers too (AddressSanitizer at -O1 runs the kernels 10 to 20
# times slower): perplexity over the held-out text, the 32-client load test, every README
# command line at once, the XLA CPU plugin's whole-model sweeps (XLA's own compiles, which the
# sanitizers do not see, dominate them; PjrtBackendTest and LowerOps cover the client and the
# lowering; split over ranks, each of the plugin's compile threads then waits for the slow
# unwinder that LSan needs under Open MPI, see tests/CMakeLists.txt), libtpu's whole-model
# compile and the grammar's comparison with llguidance.
heavy='Perplexity\.MatchesThePyTorch|DefaultModel\.(Int4Perplexity|HeldOutLoss)|Serve\.LoadTest'
heavy+='|Cli\.ReadmeCommandLineExamplesRun|XlaCpuModel\.|XlaCpuImported\.|XlaCpuServe\.'
heavy+='|XlaCpuCompileCache\.|Lower\.TinyModelSteps|TpuTopology\.CompilesEveryStep'
heavy+='|JsonGrammarOracle\.|TpMpiXlaCpu\.'
ctest --preset asan -j2 -LE 'tokenizer|packaging|layering' -E "$heavy"
ctest --preset asan -j2 -L tokenizer -R 'BadInput|Invalid|Stream'
stage "tsan build and tests"
cmake --preset tsan >/dev/null
cmake --build --preset tsan
ctest --preset tsan
stage_names+=("$current")
stage_secs+=($((SECONDS - stage_start)))
current=""
