#!/bin/bash
# Proves the suite does not depend on the machine's speed: runs every CTest test N times in a row while
# `stress-ng --cpu 2` keeps the CPUs busy, first in the release build (QEMU e2e included, as scripts/test.sh
# runs it), then in the ASan/UBSan build (without the e2e); the soak is left to scripts/soak.sh in both. Stops at the first failing iteration, prints
# that iteration's failures and a summary; exit 1 then, 0 when every iteration passed.
# Usage: scripts/stress-test.sh [N]          (N defaults to 20; each build is brought up to date first)
#   FLAVOURS="release"  scripts/stress-test.sh 5     only one build
#   STRESS_CPU=4        scripts/stress-test.sh       more stressors (default 2, one per core of the CI machine)
#   CTEST_ARGS="-L binding|plugin" scripts/stress-test.sh 3   a subset (any extra ctest arguments)
set -euo pipefail
cd "$(dirname "$0")/.."
iterations=${1:-20}
flavours=${FLAVOURS:-release asan}
stressors=${STRESS_CPU:-2}
case "$iterations" in '' | *[!0-9]* | 0) echo "stress-test.sh: N must be a positive integer" >&2; exit 2 ;; esac
command -v stress-ng >/dev/null || { echo "stress-test.sh: stress-ng missing (scripts/install-deps.sh installs it)" >&2; exit 2; }
modprobe fuse 2>/dev/null || true

# Up to date first: an executable left unbuilt (CTest's <name>_NOT_BUILT) or older than the sources would make
# the iterations prove nothing about this code.
for flavour in $flavours; do
  echo "== bringing build/$flavour up to date"
  scripts/build.sh "$flavour"
done

logs=$(mktemp -d /tmp/vfio-stress.XXXXXX)
stress-ng --cpu "$stressors" --timeout 0 --quiet &
stress_pid=$!
trap 'kill "$stress_pid" 2>/dev/null; wait "$stress_pid" 2>/dev/null || true' EXIT
echo "== stress-ng --cpu $stressors running (pid $stress_pid); $iterations iterations per build: $flavours; logs in $logs"

start=$(date +%s)
summary=()
skips=0
for flavour in $flavours; do
  # shellcheck disable=SC2206  # CTEST_ARGS is split on purpose
  args=(--test-dir "build/$flavour" --output-on-failure -j2 --timeout 900 ${CTEST_ARGS:-})
  env=()
  # The suite as scripts/test.sh runs it: the soak (label soak) is its own bounded run, and its RSS bound
  # means nothing under ASan, whose quarantine holds freed memory by design.
  [ "$flavour" = asan ] || args+=(-LE soak)
  if [ "$flavour" = asan ]; then
    args+=(-LE 'e2e|soak')
    env=(ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
  fi
  times=()
  for i in $(seq 1 "$iterations"); do
    log="$logs/$flavour-$i.log"
    t0=$(date +%s)
    if ! env "${env[@]}" ctest "${args[@]}" >"$log" 2>&1; then
      echo "== $flavour iteration $i/$iterations FAILED after $(( $(date +%s) - t0 )) s; end of its output:"
      tail -n 200 "$log"
      echo "== full output (every failed test's own output included): $log"
      summary+=("$flavour: $((i - 1)) of $iterations iterations passed, iteration $i failed")
      printf '== summary after %s s:\n' "$(( $(date +%s) - start ))"
      printf '   %s\n' "${summary[@]}"
      exit 1
    fi
    took=$(( $(date +%s) - t0 ))
    times+=("$took")
    tests=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\)/\2/p' "$log")
    skipped=$(grep -c '(Skipped)$' "$log" || true)
    note=""
    if [ "$skipped" -gt 0 ]; then
      note=", $skipped SKIPPED (see $log)"
      skips=$((skips + skipped))
    fi
    echo "   $flavour iteration $i/$iterations: ${tests:-?} tests passed in $took s$note"
  done
  sorted=$(printf '%s\n' "${times[@]}" | sort -n)
  median=$(printf '%s\n' "$sorted" | sed -n "$(( (${#times[@]} + 1) / 2 ))p")
  summary+=("$flavour: $iterations of $iterations iterations passed; one iteration median $median s (min $(head -1 <<<"$sorted") s, max $(tail -1 <<<"$sorted") s)")
done

printf '== all iterations passed under stress-ng --cpu %s in %s s:\n' "$stressors" "$(( $(date +%s) - start ))"
printf '   %s\n' "${summary[@]}"
if [ "$skips" -gt 0 ]; then
  echo "== $skips test runs were SKIPPED (logs kept in $logs); a skipped test proves nothing"
else
  rm -rf "$logs"
fi
