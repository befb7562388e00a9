#!/bin/bash
# realcluster_run.sh - `vfio-gpu-agent run` on the simulated 8x H200 node against the REAL kubelet and
# kube-apiserver of ../shared/realcluster, with the agent's own pod-bound token under the admission policy:
# what an operator sees through a start, two kubelet restarts (SIGKILL, as a crash), a SIGTERM and a new start.
# Not part of CI (the cluster is not there); tests/deploy/records/run.md records a run.
#
# Needs the cluster running with the kubelet node gpu-node-1 and the busybox image:
#   export WORK=/tmp/realcluster KUBECONFIG=/tmp/realcluster/state/admin.kubeconfig
#   ./run.sh start all && GOROOT=... ./kubelet-dra.sh start && GOROOT=... ./kubelet-dra.sh images
# Env: KUBECONFIG (the administrator's), WORK (/tmp/realcluster), BUILD (build/release: the agent and sysfs-sim),
#      REALCLUSTER (../shared/realcluster: kubelet-dra.sh).
# Prints what it saw and exit 1 when an expectation failed: capacity 8 after each step, no False condition and no
# Warning event, one plugin server restart per kubelet restart, Unknown/AgentStopped after SIGTERM, True again
# after the new start.
source "$(dirname "$0")/realcluster_common.sh"
RES=nvidia.com/GH100_H200_SXM_141GB
capacity() { K get node $NODE -o jsonpath="{.status.capacity.nvidia\.com/GH100_H200_SXM_141GB}"; }
condition() { K get node $NODE -o jsonpath='{range .status.conditions[?(@.type=="GPUPassthroughReady")]}{.status} {.reason}{end}'; }
capacity_is() { [ "$(capacity)" = "$1" ]; }
condition_is() { [ "$(condition)" = "$1" ]; }
restarts_are() { curl -s 127.0.0.1:19400/metrics | grep -qx "vfio_gpu_agent_kubelet_restarts_total $1"; }
trap 'cleanup_common "$ROOT/daemonset/base"' EXIT

agent_identity "$ROOT/daemonset/base"
echo "== sysfs-sim (hgx-h200-8gpu: GPUs on nvidia) in the kubelet's mount namespace"
start_sim hgx-h200-8gpu.json

start_agent() {
    in_kubelet_ns "$BUILD/src/cli/vfio-gpu-agent" run --node-name $NODE --kubeconfig "$TMP/agent.kubeconfig" \
        --sysfs-root "$TMP/node/sys" --dev-root "$TMP/node/dev" --proc-root "$TMP/node/proc" \
        --modules-root "$TMP/modules" --no-udev --listen-address 127.0.0.1 --health-port 18081 \
        --metrics-port 19400 >> "$TMP/agent.log" 2>&1 &
    agent=$!
}
since=$(date -u +%Y-%m-%dT%H:%M:%S)
echo "== agent start"
start_agent
expect "capacity $RES: 8 after the start" wait_for capacity_is 8
expect "condition True AllDevicesReady" wait_for condition_is "True AllDevicesReady"
for i in 1 2; do
    echo "== kubelet restart $i (SIGKILL)"
    WORK=$WORK "$REALCLUSTER/kubelet-dra.sh" restart-kubelet | sed 's/^/   /'
    expect "registered again (kubelet_restarts_total $i)" wait_for restarts_are $i
    expect "capacity 8 again" wait_for capacity_is 8
done
# The exiting kubelet ends the plugin's stream a moment before it stops accepting on kubelet.sock; the new one
# deletes the plugin's socket. One server restart per kubelet restart, not one for each.
server_restarts=$(grep -c "restarting server" "$TMP/agent.log")
expect "one server restart per kubelet restart ($server_restarts for 2)" [ "$server_restarts" = 2 ]
echo "== SIGTERM"
kill -TERM "$agent"; wait "$agent"; echo "   agent exit code $?"; agent=
expect "condition Unknown AgentStopped" condition_is "Unknown AgentStopped"
echo "== the rollout's new agent"
start_agent
expect "condition True AllDevicesReady again" wait_for condition_is "True AllDevicesReady"
expect "capacity 8" wait_for capacity_is 8

echo "== what the API holds"
K get node $NODE -o jsonpath='{range .status.conditions[?(@.type=="GPUPassthroughReady")]}   condition: {.status} {.reason}: {.message} (transition {.lastTransitionTime}, heartbeat {.lastHeartbeatTime}){"\n"}{end}'
K get events.events.k8s.io -n default --field-selector "regarding.name=$NODE,reportingController=vfio-gpu-agent" \
    -o custom-columns=TYPE:.type,REASON:.reason,COUNT:.series.count,NOTE:.note --no-headers | cut -c1-150 | sed 's/^/   event: /'
warnings=$(K get events.events.k8s.io -n default --field-selector "regarding.name=$NODE,reportingController=vfio-gpu-agent,type=Warning" --no-headers 2>/dev/null | wc -l)
expect "no Warning event ($warnings)" [ "$warnings" = 0 ]
if [ -f "$WORK/state/audit.log" ]; then
    python3 - "$WORK/state/audit.log" "$since" > "$TMP/audit.txt" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e.get("stage") != "ResponseComplete" or not e.get("userAgent", "").startswith("vfio-gpu-agent"):
        continue
    if e["requestReceivedTimestamp"] < sys.argv[2] or e["verb"] not in ("create", "update", "patch"):
        continue
    print(e["verb"], e["requestURI"], e.get("responseStatus", {}).get("code"))
PY
    sort "$TMP/audit.txt" | uniq -c | sed 's/^/   audit: /'
    # 409: the condition PATCH's resourceVersion precondition lost to the kubelet's own status update; the agent
    # reads the node again and patches again.
    all_accepted() { ! grep -qvE ' (200|201|409)$' "$TMP/audit.txt"; }
    expect "every write of the agent accepted (a 409 is retried after a read)" all_accepted
fi
falses=$(grep -c "not ready: " "$TMP/agent.log")
expect "no 'not ready' (published failure) line in the agent log ($falses)" [ "$falses" = 0 ]
agent_log_summary
grep -E "^[^ ]+ (warning|error) |restarting server|ListAndWatch stream|Register failed|AgentStopped|signal" "$TMP/agent.log" | cut -c1-200 | sed 's/^/   log: /'
exit $failed
