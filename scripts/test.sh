#!/bin/bash
# Sets up a fresh Debian 12 machine (root) and runs every test, each at least once:
#   1. release build (gcc, static, as shipped), only what needs it (target release_checks): the agent and the
#      simulators for the tests labelled `release` (the real-kernel QEMU pair, the OCI image tests) and the soak,
#      and the benchmarks, compiled so that they cannot rot (scripts/bench.sh runs them);
#   2. ASan/UBSan build (clang, libFuzzer's coverage on what the fuzz targets exercise): every other test (unit, simulator
#      (FUSE), integration, daemon, deployment) and the libFuzzer targets, linked from the same objects;
#   3. 60 s of the chaos soak (release agent) beside the release tests; every libFuzzer target for 20 s.
# Usage: scripts/test.sh            (CI calls exactly this)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

# Where the time goes: each phase's wall time, the CPU time (user+sys) of the processes it ran, and the CPU time
# the rest of the machine used meanwhile (other builds inflate the wall time, not the CPU time). The table is
# printed when the run ends, passed or failed (a failed phase is the last row).
tick=$(getconf CLK_TCK)
own_cpu() { awk '{ print $14 + $15 + $16 + $17 }' "/proc/$$/stat"; }               # this shell + waited-for children
machine_cpu() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }  # every process, every core
phases=""
phase_name=""
phase_begin() {  # phase_begin NAME: the commands up to phase_end are this phase
  phase_name=$1; phase_t0=$(date +%s%N); phase_c0=$(own_cpu); phase_m0=$(machine_cpu)
}
phase_end() {
  [ -n "$phase_name" ] || return 0
  local wall cpu others
  wall=$(( ($(date +%s%N) - phase_t0) / 1000000 ))
  cpu=$(( $(own_cpu) - phase_c0 ))
  others=$(( $(machine_cpu) - phase_m0 - cpu ))
  [ "$others" -ge 0 ] || others=0
  phases+=$(awk -v n="$phase_name" -v c="$cpu" -v w="$wall" -v o="$others" -v t="$tick" \
    'BEGIN { printf "%-28s %8.1f %8.1f %13.1f", n, c / t, w / 1000, o / t }')$'\n'
  phase_name=""
}
report_times() {
  phase_end
  [ -n "$phases" ] || return 0
  echo "== where the time went (CPU: user+sys of this run's processes; others: CPU the rest of the machine used meanwhile)"
  printf '%-28s %8s %8s %13s\n' phase "CPU s" "wall s" "others CPU s"
  printf '%s' "$phases"
}
trap report_times EXIT

phase_begin install-deps
scripts/install-deps.sh --e2e
# FUSE mounts need the module on a fresh host; harmless when it is built in or already loaded.
modprobe fuse 2>/dev/null || true
phase_end

phase_begin "build release"
scripts/build.sh release --target release_checks
phase_end
phase_begin "build asan (+ fuzz targets)"
scripts/build.sh asan
phase_end

# A skipped test is never a silent pass: each run lists how many tests were skipped and why (the GTEST_SKIP
# messages, e.g. "needs /dev/fuse"), and under CI=true any skip fails the whole command.
skipped_total=0
skip_reasons=""
run_ctest() {  # run_ctest DIR ARGS...: ctest with --output-on-failure, then the skip report of that run
  local dir=$1; shift
  local out
  out=$(mktemp)
  ctest --test-dir "$dir" --output-on-failure -j2 --timeout 900 "$@" | tee "$out"
  # A label that matches nothing (a renamed label, an unconfigured build) must not pass as an empty run.
  if grep -q "No tests were found" "$out"; then
    echo "== $dir: no tests matched $*" >&2
    rm -f "$out"
    return 1
  fi
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

# The chaos soak (release agent, 60 s of wall time whatever the load; it needs about two thirds of a core) runs beside
# the release-labelled tests, which leave part of the machine idle (their QEMU guest and image builds wait on
# I/O). Its output is printed when both are done.
echo "== release build: the tests that need it (label release: the QEMU e2e pair, the OCI image tests), and beside"
echo "   them the chaos soak: 60 s"
phase_begin "ctest release + soak 60 s"
soak_log=$(mktemp)
scripts/soak.sh 1 >"$soak_log" 2>&1 &
soak_pid=$!
release_status=0
run_ctest build/release -L release || release_status=$?
soak_status=0
wait "$soak_pid" || soak_status=$?
echo "== chaos soak (exit $soak_status)"
cat "$soak_log"
rm -f "$soak_log"
[ "$release_status" = 0 ] || exit "$release_status"
[ "$soak_status" = 0 ] || exit "$soak_status"
phase_end

echo "== ASan/UBSan build: every other test (the soak ran above, for a bounded time)"
phase_begin "ctest asan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_ctest build/asan -LE 'release|soak'
phase_end

echo "== fuzzing: every target for 20 s"
phase_begin "fuzz 8 x 20 s"
scripts/fuzz.sh 20
phase_end

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
