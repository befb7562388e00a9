#!/bin/bash
# Chaos soak (tests/soak): the real `vfio-gpu-agent run` on the simulated 8x H200 node under the kubelet simulator
# for MINUTES (default 1) with a seeded random fault schedule; prints each fault's count and worst latencies and
# exits non-zero on a broken invariant. Needs root and /dev/fuse. Usage: scripts/soak.sh [MINUTES] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-1}
seed=${2:-${VA_SOAK_SEED:-1}}
build=${BUILD_DIR:-build/release}
modprobe fuse 2>/dev/null || true
cmake --build "$build" --target soak_test vfio-gpu-agent >/dev/null
seconds=$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 }')
VA_SOAK_SECONDS=$seconds VA_SOAK_SEED=$seed nice -n 10 "$build/tests/soak/soak_test" --gtest_brief=1
