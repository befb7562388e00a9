#!/bin/bash
# realcluster_dra.sh - `vfio-gpu-agent run --kubelet-api dra` on the simulated 8x H200 node against the REAL
# kubelet (DRA manager, v1.36) and kube-apiserver of ../shared/realcluster, with the agent's own pod-bound token
# under the DRA overlay's RBAC and admission policy: registration, the DRAResourceHealth stream the kubelet opens,
# the node's ResourceSlices, and their return after kubelet restarts (the new kubelet deletes them).
# Not part of CI (the cluster is not there); tests/deploy/records/dra.md records a run.
#
# Needs the cluster running as for realcluster_run.sh (./run.sh start all, kubelet-dra.sh start and images).
# Env: KUBECONFIG (the administrator's), WORK (/tmp/realcluster), BUILD (build/release: the agent and sysfs-sim),
#      REALCLUSTER (../shared/realcluster: kubelet-dra.sh).
source "$(dirname "$0")/realcluster_common.sh"
trap cleanup_dra EXIT

agent_identity "$ROOT/daemonset/overlays/dra"

no_slices() { [ "$(slice_devices)" = 0 ]; }
ready() { curl -s 127.0.0.1:19400/metrics | grep -qx "vfio_gpu_agent_ready 1"; }
kubelet_log() { cat "$WORK/kubelet-dra/kubelet.log" 2>/dev/null; }

echo "== sysfs-sim (hgx-h200-8gpu: GPUs on nvidia) in the kubelet's mount namespace"
start_sim hgx-h200-8gpu.json

kubelet_lines_before=$(kubelet_log | wc -l)
echo "== agent start (run --kubelet-api dra)"
# --proc-root: the real /proc (the node's boot ID for the claim checkpoint; nothing holds the simulated groups).
in_kubelet_ns "$BUILD/src/cli/vfio-gpu-agent" run --node-name $NODE \
    --kubeconfig "$TMP/agent.kubeconfig" --kubelet-api dra \
    --sysfs-root "$TMP/node/sys" --dev-root "$TMP/node/dev" --proc-root /proc \
    --modules-root "$TMP/modules" --no-udev --listen-address 127.0.0.1 --health-port 18081 \
    --metrics-port 19400 >> "$TMP/agent.log" 2>&1 &
agent=$!
expect "ResourceSlices of $NODE hold 8 devices" wait_for slices_are 8
expect "the agent reports ready" wait_for ready
for i in 1 2; do
    echo "== kubelet restart $i (SIGKILL): the new kubelet deletes the node's slices"
    WORK=$WORK "$REALCLUSTER/kubelet-dra.sh" restart-kubelet | sed 's/^/   /'
    start=$(date +%s%N)
    wait_for slices_are 8
    # A deletion the agent answered before we looked shows only as a new resourceVersion; either way 8 are back.
    expect "8 devices back after the restart ($(( ($(date +%s%N) - start) / 1000000 )) ms after it returned)" slices_are 8
    expect "the agent reports ready again" wait_for ready
done
echo "== the kubelet's view"
kubelet_log | tail -n +"$((kubelet_lines_before + 1))" > "$TMP/kubelet.log"
grep -E "$DRIVER|NodeWatchResources|DRAResourceHealth" "$TMP/kubelet.log" | cut -c1-220 | tail -12 | sed 's/^/   kubelet: /'
health_errors=$(grep -cE "NodeWatchResources.*(rror|Unimplemented)|Unimplemented.*NodeWatchResources" "$TMP/kubelet.log")
expect "no health-stream error in the kubelet's log ($health_errors)" [ "$health_errors" = 0 ]
echo "== SIGTERM"
start=$(date +%s%N)
kill -TERM "$agent"; wait "$agent"; code=$?; agent=
expect "agent exit code 0 ($code, $(( ($(date +%s%N) - start) / 1000000 )) ms after SIGTERM)" [ "$code" = 0 ]
echo "== what the API holds"
K get resourceslices --field-selector "spec.nodeName=$NODE" -o wide 2>&1 | sed 's/^/   /'
K get resourceslices --field-selector "spec.nodeName=$NODE" -o jsonpath='{.items[0].spec.devices[0]}' | cut -c1-400 | sed 's/^/   device: /'; echo
agent_log_summary
grep -E "^[^ ]+ (warning|error) " "$TMP/agent.log" | cut -c1-200 | sed 's/^/   log: /'
exit $failed
