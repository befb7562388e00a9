#!/bin/bash
# Runs every benchmark of tests/bench on a release build and prints the medians (and the ratios the issues
# ask for). Not part of the test command: figures on a shared 2-core machine are for the closing notes.
# Usage: scripts/bench.sh [name-filter]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
modprobe fuse 2>/dev/null || true
scripts/build.sh release >/dev/null
filter=${1:-}
# bench_plugin starts the real agent binary for the process-start figure.
export VA_AGENT_BIN=${VA_AGENT_BIN:-$PWD/build/release/src/cli/vfio-gpu-agent}
for bench in build/release/tests/bench/*/bench_*; do
  [ -x "$bench" ] || continue
  name=$(basename "$bench")
  [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
  echo "== $name"
  "$bench" --benchmark_repetitions="${REPETITIONS:-5}" --benchmark_report_aggregates_only=true \
    --benchmark_counters_tabular=true 2>&1 | grep -E "_median|^Benchmark|^-|ratio|Run on" || true
done
for harness in tests/bench/*/*.sh; do
  [ -x "$harness" ] || continue
  [ -n "$filter" ] && [[ "$(basename "$harness")" != *"$filter"* ]] && continue
  echo "== $(basename "$harness")"
  "$harness" build/release
done
