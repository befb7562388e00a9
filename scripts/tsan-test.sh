#!/bin/bash
# ThreadSanitizer run of the concurrent parts: the plugin's async gRPC server and Register client, the agent,
# the worker pool, concurrent binding and the kubelet simulator. Debug TSan build in build/tsan (only these
# tests' executables), then their tests with tests/tsan.supp (Debian's gRPC and abseil are not instrumented).
# Usage: scripts/tsan-test.sh [CTEST_REGEX]
set -euo pipefail
cd "$(dirname "$0")/.."
regex=${1:-'ResourceServer|Register|Agent|WorkerPool|Concurrency|PluginIntegration|KubeletSim|Takeover'}
scripts/build.sh tsan --target plugin_test common_worker_pool_test binding_concurrency_test \
  plugin_integration_test kubelet_sim_test
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
  ctest --test-dir build/tsan --output-on-failure -j2 --timeout 900 -R "$regex"
