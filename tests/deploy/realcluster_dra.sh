#!/bin/bash
# realcluster_dra.sh - `vfio-gpu-agent run --kubelet-api dra` on the simulated 8x H200 node against the REAL
# kubelet (DRA manager, v1.36) and kube-apiserver of ../shared/realcluster, with the agent's own pod-bound token
# under the DRA overlay's RBAC and admission policy: registration, the DRAResourceHealth stream the kubelet opens,
# the node's ResourceSlices, and their return after kubelet restarts (the new kubelet deletes them).
# Not part of CI (the cluster is not there); daemonset/README.md (DRA nodes) records a run.
#
# Needs the cluster running as for realcluster_run.sh (./run.sh start all, kubelet-dra.sh start and images).
# Env: KUBECONFIG (the administrator's), WORK (/tmp/realcluster), BUILD (build/release: the agent and sysfs-sim),
#      REALCLUSTER (../shared/realcluster: kubelet-dra.sh).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=${WORK:-/tmp/realcluster}
BUILD=${BUILD:-$ROOT/build/release}
REALCLUSTER=${REALCLUSTER:-$ROOT/../shared/realcluster}
NODE=gpu-node-1
NS=vfio-gpu-agent
DRIVER=gpu.vfio-agent.cozystack.io
: "${KUBECONFIG:?set KUBECONFIG to a kubeconfig of the cluster administrator}"
K() { kubectl "$@"; }
TMP=$(mktemp -d)
failed=0
# expect WHAT COMMAND...: runs the command; prints ok or FAILED.
expect() { local what=$1; shift; if "$@"; then echo "   ok: $what"; else echo "   FAILED: $what"; failed=1; fi; }
# wait_for COMMAND...: until it succeeds, 30 s at most (the other side is waited for, never slept for).
wait_for() { for _ in $(seq 300); do "$@" && return 0; sleep 0.1; done; return 1; }
sim_ready() { grep -qs READY "$TMP/sim.out"; }

cleanup() {
    [ -n "${agent:-}" ] && kill -TERM "$agent" 2>/dev/null && wait "$agent" 2>/dev/null
    [ -n "${sim:-}" ] && kill -TERM "$sim" 2>/dev/null && wait "$sim" 2>/dev/null
    K delete --ignore-not-found -n $NS pod agent-identity --grace-period=0 --force >/dev/null 2>&1
    K delete -n default events.events.k8s.io --field-selector "reportingController=vfio-gpu-agent,regarding.name=$NODE" >/dev/null 2>&1
    K patch node $NODE --subresource status --type strategic \
        -p '{"status":{"conditions":[{"type":"GPUPassthroughReady","$patch":"delete"}]}}' >/dev/null 2>&1
    K delete --ignore-not-found --wait=false -k "$ROOT/daemonset/overlays/dra" >/dev/null 2>&1
    K delete --ignore-not-found resourceslices --field-selector "spec.nodeName=$NODE" >/dev/null 2>&1
    rm -rf "$TMP"
}
trap cleanup EXIT

echo "== manifests (daemonset/overlays/dra: RBAC, admission policy, DeviceClasses; the DaemonSet selects no node here)"
K apply -k "$ROOT/daemonset/overlays/dra" 2>&1 | sed 's/^/   /'
K -n $NS wait --for=jsonpath='{.metadata.name}'=default serviceaccount/default --timeout=30s >/dev/null 2>&1
K -n $NS apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: agent-identity}
spec:
  nodeName: $NODE
  serviceAccountName: vfio-gpu-agent
  hostNetwork: true  # runs before a CNI is ready; only its bound token is used
  terminationGracePeriodSeconds: 0
  containers: [{name: c, image: localhost/tools:local, imagePullPolicy: Never, command: [sleep, "3600"]}]
EOF
K -n $NS wait --for=condition=Ready pod/agent-identity --timeout=60s >/dev/null
TOKEN=$(K -n $NS create token vfio-gpu-agent --bound-object-kind Pod --bound-object-name agent-identity --duration 1h)
SERVER=$(K config view --minify -o jsonpath='{.clusters[0].cluster.server}')
CA=$(K config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority}')
cat > "$TMP/agent.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "$SERVER", certificate-authority: "$CA"}}]
users: [{name: agent, user: {token: "$TOKEN"}}]
contexts: [{name: c, context: {cluster: c, user: agent}}]
current-context: c
EOF

slice_devices() {
    K get resourceslices --field-selector "spec.nodeName=$NODE,spec.driver=$DRIVER" \
        -o jsonpath='{range .items[*]}{range .spec.devices[*]}{.name}{"\n"}{end}{end}' 2>/dev/null | grep -c .
}
slices_are() { [ "$(slice_devices)" = "$1" ]; }
no_slices() { [ "$(slice_devices)" = 0 ]; }
ready() { curl -s 127.0.0.1:19400/metrics | grep -qx "vfio_gpu_agent_ready 1"; }
kubelet_log() { cat "$WORK/kubelet-dra/kubelet.log" 2>/dev/null; }

echo "== sysfs-sim (hgx-h200-8gpu: GPUs on nvidia) in the kubelet's mount namespace"
mkdir -p "$TMP/node" "$TMP/modules"
nsenter -t "$(cat "$WORK/kubelet-dra/containerd.pid")" -m -- "$BUILD/tests/sim/sysfs_sim/sysfs-sim" --node "$ROOT/tests/sim/nodes/hgx-h200-8gpu.json" --root "$TMP/node" \
    > "$TMP/sim.out" 2> "$TMP/sim.log" &
sim=$!
wait_for sim_ready || { echo "sysfs-sim did not start"; cat "$TMP/sim.log"; exit 1; }

kubelet_lines_before=$(kubelet_log | wc -l)
echo "== agent start (run --kubelet-api dra)"
# --proc-root: the real /proc (the node's boot ID for the claim checkpoint; nothing holds the simulated groups).
nsenter -t "$(cat "$WORK/kubelet-dra/containerd.pid")" -m -- "$BUILD/src/cli/vfio-gpu-agent" run --node-name $NODE \
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
kill -TERM "$agent"; wait "$agent"; code=$?; agent=
expect "agent exit code 0 ($code)" [ "$code" = 0 ]
echo "== what the API holds"
K get resourceslices --field-selector "spec.nodeName=$NODE" -o wide 2>&1 | sed 's/^/   /'
K get resourceslices --field-selector "spec.nodeName=$NODE" -o jsonpath='{.items[0].spec.devices[0]}' | cut -c1-400 | sed 's/^/   device: /'; echo
echo "   agent log: $(wc -l < "$TMP/agent.log") lines; by level: $(grep -oE '^[^ ]+ (info|warning|error|debug) ' "$TMP/agent.log" | cut -d' ' -f2 | sort | uniq -c | tr '\n' ' ')"
grep -E "^[^ ]+ (warning|error) " "$TMP/agent.log" | cut -c1-200 | sed 's/^/   log: /'
exit $failed
