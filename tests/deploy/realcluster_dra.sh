#!/bin/bash
# realcluster_dra.sh - `vfio-gpu-agent run --kubelet-api dra` on the simulated 8x H200 node against the REAL
# kubelet (DRA manager, v1.36) and kube-apiserver of ../shared/realcluster, with the agent's own pod-bound token
# under the DRA overlay's RBAC and admission policy: registration, the DRAResourceHealth stream the kubelet opens,
# the node's ResourceSlices, and their return after kubelet restarts (the new kubelet deletes them) and after a
# deletion through the API (within 5 s: the agent watches its own slices).
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
    before=$(slice_names)
    WORK=$WORK "$REALCLUSTER/kubelet-dra.sh" restart-kubelet | sed 's/^/   /'
    start=$(date +%s%N)
    # The new kubelet wipes the node's slices some time after it answers healthz: wait for that wipe (the old
    # slices gone) and the agent's new slices, not for the old ones still there.
    wait_for slices_replaced_and_are 8 "$before"
    expect "the old slices replaced by 8 devices after the restart ($(( ($(date +%s%N) - start) / 1000000 )) ms after it returned)" \
        slices_replaced_and_are 8 "$before"
    expect "the agent reports ready again" wait_for ready
done
rounds=
for i in 1 2 3; do
    echo "== the node's slices deleted through the API ($i: as an operator or a garbage collection does)"
    before=$(slice_names)
    start=$(date +%s%N)
    # Deleted with the agent's own token, so that the API server's audit log (it records ServiceAccount requests)
    # holds the deletion beside the agent's new slices: their distance is the agent's repair time, without kubectl.
    # shellcheck disable=SC2086
    K --kubeconfig "$TMP/agent.kubeconfig" delete resourceslices $before --wait=false 2>&1 | sed 's/^/   /'
    # The agent watches its own slices: the deletion reaches it at once, not at the next resync (30 s). This
    # wall time includes kubectl's own starts and requests.
    wait_for slices_replaced_and_are 8 "$before"
    took=$(( ($(date +%s%N) - start) / 1000000 ))
    expect "8 devices back within 5 s of the delete ($took ms with kubectl)" [ "$took" -lt 5000 ]
    rounds="$rounds $(printf '%s' "$before" | tr '\n' ',')"
done
echo "   the API server's view (audit log): the last DELETE -> the agent's first new slice stored"
python3 - "$WORK/state/audit.log" $rounds <<'PY' | sed 's/^/   /'
import json, statistics, sys
from datetime import datetime
stamp = lambda t: datetime.strptime(t[:26].rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f")
events = []
for line in open(sys.argv[1]):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if e.get("stage") == "ResponseComplete" and "/resourceslices" in e.get("requestURI", ""):
        events.append((stamp(e["stageTimestamp"]), e["verb"], e["requestURI"].rsplit("/", 1)[-1]))
events.sort()
took = []
for names in sys.argv[2:]:
    deletes = [t for t, verb, name in events if verb == "delete" and name in names.split(",")]
    if not deletes:
        continue
    creates = [t for t, verb, _ in events if verb == "create" and t > max(deletes)]
    if creates:
        took.append((creates[0] - max(deletes)).total_seconds() * 1000)
print("repair times:", ", ".join(f"{t:.0f} ms" for t in took),
      f"(median {statistics.median(took):.0f} ms)" if took else "(none found)")
PY
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
