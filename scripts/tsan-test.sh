#!/bin/bash
# ThreadSanitizer run of the concurrent parts: the plugin's async gRPC server and Register client, the agent and
# its Fabric Manager partition manager, the DRA driver's registration and DRAPlugin servers, the worker pool,
# concurrent binding and both kubelet simulators. Debug TSan
# build in build/tsan (only these tests' executables), then their tests with tests/tsan.supp (Debian's gRPC and
# abseil are not instrumented).
# Usage: scripts/tsan-test.sh [CTEST_REGEX]     (default: every test of those executables)
set -euo pipefail
cd "$(dirname "$0")/.."
# Other executables are not built here: CTest lists them as <name>_NOT_BUILT; the script tests (demos among them)
# need the release build.
select=(-E '_NOT_BUILT$|^soak_test$|^e2e_|^deploy_|^image_|^demo')
[ $# -gt 0 ] && select=(-R "$1")
scripts/build.sh tsan --target plugin_test common_worker_pool_test binding_concurrency_test \
  plugin_integration_test kubelet_sim_test fabric_test dra_test kubelet_dra_sim_test
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
  ctest --test-dir build/tsan --output-on-failure -j2 --timeout 900 "${select[@]}"
