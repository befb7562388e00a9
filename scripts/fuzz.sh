#!/bin/bash
# Builds the libFuzzer targets of tests/fuzz and runs each for SECONDS with libFuzzer's -max_total_time, starting
# from tests/fuzz/corpus/<target>/ (new inputs go to a temporary directory; the checked-in seeds are not changed).
# The targets live in the sanitizer build (scripts/build.sh asan: clang, ASan+UBSan and libFuzzer's coverage
# instrumentation on every object), so the objects the tests run are the ones fuzzed. Prints each target's closing
# line; exits non-zero if any target crashed, leaked or timed out, and leaves the reproducer in build/asan/artifacts/.
# Usage: scripts/fuzz.sh [SECONDS] [target-filter]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
filter=${2:-}
build=build/asan
mkdir -p build
# Only the fuzz targets and what they link (a no-op after scripts/build.sh asan, as in scripts/test.sh).
if ! nice -n 10 scripts/build.sh asan --target fuzz_targets >"$build.fuzz-build.log" 2>&1; then
  grep -E "error|FAILED" "$build.fuzz-build.log" | head -20
  echo "fuzz: build failed (log: $build.fuzz-build.log)"
  exit 1
fi
mkdir -p "$build/artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# One target per core at a time: each still runs its full SECONDS, the whole takes SECONDS x targets / cores.
jobs=${FUZZ_PARALLEL:-$(nproc)}
fuzz_one() {  # fuzz_one BINARY: runs it, then prints its closing line; exit status 1 on a crash, leak or timeout
  local bin=$1 name log rc=0 closing
  name=$(basename "$bin")
  mkdir -p "$work/$name"
  log="$work/$name.log"
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=0 \
    -artifact_prefix="$build/artifacts/$name-" "$work/$name" "tests/fuzz/corpus/$name" >"$log" 2>&1 || rc=$?
  # libFuzzer's last line: "Done N runs in S second(s)" on success, the sanitizer's summary otherwise.
  closing=$(grep -E "^Done [0-9]+ runs|SUMMARY:|^==[0-9]+== ?ERROR|Test unit written" "$log" | tail -1 || true)
  [ -n "$closing" ] || closing=$(tail -1 "$log")
  if [ "$rc" -ne 0 ]; then
    { echo "$name: FAILED (exit $rc): $closing"
      grep -E "ERROR|SUMMARY|Test unit written|#[0-9]+ 0x" "$log" | head -20 | sed 's/^/    /'; } >"$log.result"
    return
  fi
  echo "$name: $closing (corpus $(ls "$work/$name" | wc -l) new inputs)" >"$log.result"
}
targets=()
for bin in "$build"/tests/fuzz/fuzz_*; do
  [ -x "$bin" ] || continue
  name=$(basename "$bin")
  [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
  targets+=("$bin")
done
for bin in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  fuzz_one "$bin" &
done
wait || true
failed=0
for bin in "${targets[@]}"; do
  result="$work/$(basename "$bin").log.result"
  if [ -f "$result" ]; then cat "$result"; else echo "$(basename "$bin"): FAILED (no result)"; failed=1; fi
  grep -q ": FAILED" "$result" 2>/dev/null && failed=1
done
exit $failed
