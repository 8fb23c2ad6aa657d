#!/usr/bin/env bash
# Validation on a machine with a PJRT accelerator, an NVIDIA GPU by default: the PJRT op,
# backend and generation tests on that device (tests/pjrt/test_device.h), then `tformers bench
# --device` on the Qwen3-0.6B and Llama-3.1-8B shapes with random bf16 weights, each decode
# speed printed as a fraction of the device memory's read bandwidth measured in the same run
# (the "of roofline" column). Every stage's time is printed at the end; the tests and the
# benchmarks take under 5 minutes on one GPU, a build where there is none takes longer.
#
#   scripts/device_check.sh [--device cuda|tpu|xla-cpu] [--build-dir DIR] [--models-dir DIR]
#                           [--shapes qwen3-0.6b,llama-3.1-8b] [--log FILE]
#
# --build-dir (default build/release) holds a release build with tests; where it lacks the
# command, test_pjrt or bench/make_shape, they are built there first. The device's plugin is
# found as `tformers env` finds it, with VIRTUAL_ENV defaulting to python3's environment; a
# missing CUDA plugin is installed from pyproject.toml's `cuda` group with that python3's pip.
# --log also writes everything printed to FILE.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '9,10p' "$0" | sed 's/^# \{0,1\}//'; }
device=cuda build=build/release models=/tmp/tformers-device-check
shapes=qwen3-0.6b,llama-3.1-8b log=""
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --device | --build-dir | --models-dir | --shapes | --log)
      [ $# -ge 2 ] || { echo "device_check.sh: $1 needs a value" >&2; exit 2; }
      case $1 in
        --device) device=$2 ;;
        --build-dir) build=$2 ;;
        --models-dir) models=$2 ;;
        --shapes) shapes=$2 ;;
        --log) log=$2 ;;
      esac
      shift 2 ;;
    *) echo "device_check.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case $device in
  cuda | tpu | xla-cpu) ;;
  *) echo "device_check.sh: --device $device: give cuda, tpu or xla-cpu" >&2; exit 2 ;;
esac
[ -n "$log" ] && exec > >(tee "$log") 2>&1

stage_names=() stage_secs=() stage_start=$SECONDS current=""
summary() {
  local rc=$?
  [ -n "$current" ] && { stage_names+=("$current$([ $rc -ne 0 ] && echo ' (failed)')");
                         stage_secs+=($((SECONDS - stage_start))); }
  echo "== stage times (device $device)"
  for i in "${!stage_names[@]}"; do printf '  %-34s %4d s\n' "${stage_names[$i]}" "${stage_secs[$i]}"; done
  printf '  %-34s %4d s\n' total "$SECONDS"
  exit "$rc"
}
trap summary EXIT
stage() {
  [ -n "$current" ] && { stage_names+=("$current"); stage_secs+=($((SECONDS - stage_start))); }
  current=$1 stage_start=$SECONDS
  echo "== $current"
}

stage "build"
targets=()
[ -x "$build/tformers" ] || targets+=(tformers)
[ -x "$build/tests/test_pjrt" ] || targets+=(test_pjrt)
[ -x "$build/bench/make_shape" ] || targets+=(make_shape)
if [ ${#targets[@]} -gt 0 ]; then
  [ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
  cmake --build "$build" --target "${targets[@]}"
fi

stage "plugin"
if [ -z "${VIRTUAL_ENV:-}" ] && command -v python3 >/dev/null; then
  VIRTUAL_ENV=$(python3 -c 'import sys; print(sys.prefix)')
  export VIRTUAL_ENV
fi
runs_on() { "$build/tformers" env 2>&1 | grep -q "device_map=\"$device\" runs on it"; }
if ! runs_on && [ "$device" = cuda ]; then
  pin=$(python3 -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["dependency-groups"]["cuda"]))')
  echo "no CUDA plugin found: installing $pin"
  python3 -m pip install -q $pin
fi
"$build/tformers" env
runs_on || { echo "device_check.sh: no $device device runs (tformers env above says why)" >&2; exit 1; }

stage "pjrt tests on $device"
TFORMERS_PJRT_TEST_DEVICE=$device timeout 300 "$build/tests/test_pjrt" \
  --gtest_filter='Lower.*:LowerModule.*:Activations/*:PjrtBackendTest.*:SplitAtCollectives.*:XlaCpuGenerate.*:TinyModels/*-*Bfloat16*'

IFS=, read -ra shape_list <<<"$shapes"
for shape in "${shape_list[@]}"; do
  stage "bench $shape"
  "$build/bench/make_shape" "$shape" "$models/$shape"
  timeout 240 "$build/tformers" bench -m "$models/$shape" --device "$device" -p 128 -n 32 -r 3
done
