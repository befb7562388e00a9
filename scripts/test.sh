#!/bin/bash
# Sets up a fresh Debian 12 machine (root) and runs every test:
#   1. release build: unit, simulator (FUSE), integration and the real-kernel QEMU test;
#   2. Debug + ASan/UBSan build: every test but the QEMU one (the guest runs the release binary).
# Usage: scripts/test.sh            (CI calls exactly this)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

scripts/install-deps.sh --e2e
# FUSE mounts need the module on a fresh host; harmless when it is built in or already loaded.
modprobe fuse 2>/dev/null || true

scripts/build.sh release
scripts/build.sh asan

echo "== release build: all tests"
ctest --test-dir build/release --output-on-failure -j2 --timeout 900

echo "== ASan/UBSan build: all tests except the QEMU e2e"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build/asan --output-on-failure -j2 --timeout 900 -LE e2e

echo "== all tests passed in $(( $(date +%s) - start )) s"
