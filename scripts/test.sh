#!/bin/bash
# Sets up a fresh Debian 12 machine (root) and runs every test:
#   1. release build: unit, simulator (FUSE), integration, deployment, image and the real-kernel QEMU tests;
#   2. Debug + ASan/UBSan build: every test but the QEMU one (the guest runs the release binary);
#   3. every libFuzzer target for 20 s (clang build in build/fuzz), and 60 s of the chaos soak.
# Usage: scripts/test.sh            (CI calls exactly this)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

scripts/install-deps.sh --e2e
# FUSE mounts need the module on a fresh host; harmless when it is built in or already loaded.
modprobe fuse 2>/dev/null || true

scripts/build.sh release
scripts/build.sh asan

# A skipped test is never a silent pass: each run lists how many tests were skipped and why (the GTEST_SKIP
# messages, e.g. "needs /dev/fuse"), and under CI=true any skip fails the whole command.
skipped_total=0
skip_reasons=""
run_ctest() {  # run_ctest DIR ARGS...: ctest with --output-on-failure, then the skip report of that run
  local dir=$1; shift
  local out
  out=$(mktemp)
  ctest --test-dir "$dir" --output-on-failure -j2 --timeout 900 "$@" | tee "$out"
  local skipped
  skipped=$(grep -c '(Skipped)$' "$out" || true)
  rm -f "$out"
  if [ "$skipped" -gt 0 ]; then
    local reasons
    reasons=$(awk '/: Skipped$/ { getline; print }' "$dir/Testing/Temporary/LastTest.log" | sort | uniq -c)
    echo "== $dir: $skipped tests skipped; reasons (test cases each):"
    echo "$reasons"
    skipped_total=$((skipped_total + skipped))
    skip_reasons+="$reasons"$'\n'
  fi
}

echo "== release build: all tests (the soak runs below, for a bounded time)"
run_ctest build/release -LE soak

echo "== ASan/UBSan build: all tests except the QEMU e2e"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_ctest build/asan -LE 'e2e|soak'

echo "== fuzzing: every target for 20 s"
scripts/fuzz.sh 20

echo "== chaos soak: 60 s"
scripts/soak.sh 1

if [ "$skipped_total" -gt 0 ]; then
  echo "== tests passed in $(( $(date +%s) - start )) s, but $skipped_total were SKIPPED:"
  printf '%s' "$skip_reasons" | sort | uniq
  if [ "${CI:-}" = true ]; then
    echo "== CI=true: a skipped test counts as a failure (install what the reasons name, e.g. modprobe fuse)" >&2
    exit 1
  fi
  exit 0
fi
echo "== all tests passed in $(( $(date +%s) - start )) s"
