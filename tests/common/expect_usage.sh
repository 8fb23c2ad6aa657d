#!/usr/bin/env bash
# Runs `CMD... --help` and passes when it exits 0 with stdout starting "usage: ".
#   expect_usage.sh CMD [ARGS...]
set -uo pipefail
out=$("$@" --help)
status=$?
if [ "$status" -ne 0 ]; then
  echo "$* --help exited with $status" >&2
  exit 1
fi
case "$out" in
  usage:*) exit 0 ;;
  *) echo "$* --help printed no usage: $out" >&2; exit 1 ;;
esac
