#!/bin/bash
# Configures and builds one flavour into build/<flavour>: release (default), asan or tsan.
#   release  gcc, RelWithDebInfo, gRPC/protobuf/abseil static: the shipped agent, the simulators, the benchmarks
#   asan     clang, ASan+UBSan, -O0 with line tables (what the fuzz targets exercise -O1, with libFuzzer's
#            coverage instrumentation): the same objects link the tests and the libFuzzer targets
#            (tests/fuzz, scripts/fuzz.sh); no benchmarks
#   tsan     gcc, Debug, TSan (scripts/tsan-test.sh)
# A directory configured with other settings (e.g. a gcc build/asan from before) is started afresh.
# Usage: scripts/build.sh [release|asan|tsan] [cmake --build args...]   e.g. scripts/build.sh release --target vfio-gpu-agent
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-release}
shift || true
env=()
case "$flavour" in
  # Line tables only (-g1): backtraces keep their lines, and the shipped image strips the agent anyway.
  release) flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
                  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DVFIO_AGENT_STATIC=ON) ;;
  # Benchmarks measure the release build; the sanitizer build runs the tests and the fuzz targets only.
  asan)    env=(CC=clang CXX=clang++)
           # Line tables are all a sanitizer's stack trace needs; full -g costs compile and link time.
           flags=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-O0 -gline-tables-only"
                  "-DCMAKE_CXX_FLAGS_DEBUG=-O0 -gline-tables-only" -DVFIO_AGENT_FUZZ=ON -DVFIO_AGENT_BUILD_BENCHMARKS=OFF) ;;
  tsan)    flags=(-DCMAKE_BUILD_TYPE=Debug -DVFIO_AGENT_TSAN=ON) ;;
  *) echo "build.sh: unknown flavour $flavour (release, asan, tsan)" >&2; exit 2 ;;
esac
dir=build/$flavour
settings="${env[*]} ${flags[*]}"
if [ -f "$dir/build.ninja" ] && [ "$(cat "$dir/.build-sh-settings" 2>/dev/null)" != "$settings" ]; then
  echo "build.sh: $dir was configured with other settings; starting it afresh" >&2
  rm -rf "$dir"
fi
if [ ! -f "$dir/build.ninja" ]; then
  env "${env[@]}" cmake -S . -B "$dir" -G Ninja "${flags[@]}" >/dev/null
  printf '%s\n' "$settings" >"$dir/.build-sh-settings"
fi
cmake --build "$dir" -j"$(nproc)" "$@"
