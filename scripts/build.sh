#!/bin/bash
# Configures and builds one flavour into build/<flavour>: release (default) or asan.
# Usage: scripts/build.sh [release|asan|tsan] [cmake --build args...]
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-release}
shift || true
case "$flavour" in
  release) flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DVFIO_AGENT_STATIC=ON) ;;
  # Benchmarks measure the release build; the sanitizer build runs the tests only.
  asan)    flags=(-DCMAKE_BUILD_TYPE=Debug -DVFIO_AGENT_SANITIZE=ON -DVFIO_AGENT_BUILD_BENCHMARKS=OFF) ;;
  tsan)    flags=(-DCMAKE_BUILD_TYPE=Debug -DVFIO_AGENT_TSAN=ON) ;;
  *) echo "build.sh: unknown flavour $flavour (release, asan, tsan)" >&2; exit 2 ;;
esac
dir=build/$flavour
if [ ! -f "$dir/build.ninja" ]; then
  cmake -S . -B "$dir" -G Ninja "${flags[@]}" >/dev/null
fi
cmake --build "$dir" -j"$(nproc)" "$@"
