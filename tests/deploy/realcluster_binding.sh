#!/bin/bash
# realcluster_binding.sh - DRA binding conditions (issue 32) on the REAL scheduler, kubelet (v1.36) and containerd
# of ../shared/realcluster, on the simulated 8x H200 node gpu-node-1 with its GPUs on the host driver (nvidia):
# the claim router (its own ServiceAccount token) and `vfio-gpu-agent run --kubelet-api dra --bind-on-prepare
# --binding-conditions` (its own pod-bound token), both under the dra-binding overlay's RBAC and admission policy.
#   1. the slices carry the binding condition `<driver>/vfio-bound` and the failure condition `<driver>/bind-failed`;
#   2. "free GPU": a pod with a claim for one GPU. The claim's binding condition is True, and its GPU on vfio-pci,
#      before the scheduler binds the pod to the node (the claim's and the pod's watch events, the condition's
#      lastTransitionTime against the pod's PodScheduled, the agent's Node event against the scheduler's
#      Scheduled event and its "bound" log line); the pod runs;
#   3. "held GPU": a process holds a GPU open on nvidia (its unbind blocks, as the kernel's does while the device
#      is open: the simulator's unbind-delay) and a pod's claim selects exactly that GPU. The claim gets the
#      failure condition naming the holder; the pod is never bound to the node (never ContainerCreating) and stays
#      Pending (one node); the scheduler unallocates the claim and tries again; the GPU stays on nvidia. Then the
#      holder ends: the next attempt binds the GPU and the pod runs;
#   4. the agent's Node events (ClaimDevicesReady, ClaimBindingFailed: the claim and the seconds it waited) and
#      its binding histogram.
# Every check prints ok or FAILED; the exit code is non-zero when one failed. Not part of CI (the cluster is not
# there); tests/deploy/records/binding.md records a run.
#
# Needs the cluster running, the kubelet started with NODE_DEV holding /dev/vfio nodes for the simulated groups
# (containerd creates them in the pods):
#   mkdir -p /tmp/fakedev/vfio; for g in vfio 11 13 15 17 19 21 23 25; do mknod /tmp/fakedev/vfio/$g c 1 3; done
#   # the iommufd cdevs too: the device plugin's --vfio-backend auto hands them out beside the group nodes when no
#   # KubeVirt release is known, and containerd stats every node it is given
#   mkdir -p /tmp/fakedev/vfio/devices; for n in $(seq 0 15); do mknod /tmp/fakedev/vfio/devices/vfio$n c 1 3; done
#   ./run.sh start all && NODE_DEV=/tmp/fakedev GOROOT=... ./kubelet-dra.sh start && GOROOT=... ./kubelet-dra.sh images
# Env: KUBECONFIG (the administrator's), WORK (/tmp/realcluster), BUILD (build/release: the agent and sysfs-sim),
#      REALCLUSTER (../shared/realcluster).
source "$(dirname "$0")/realcluster_common.sh"
CLASS=gh100-h200-sxm-141gb.$DRIVER
CONDITION=$DRIVER/vfio-bound
FAILURE=$DRIVER/bind-failed
LABEL=vfio-gpu-agent-test=binding
GPUS="0000:18:00.0 0000:2a:00.0 0000:3b:00.0 0000:5d:00.0 0000:9a:00.0 0000:ab:00.0 0000:bb:00.0 0000:db:00.0"

# The dra-binding overlay without the router's Deployment (and its PodDisruptionBudget): the router runs here as
# a process of its own, with a token of the ServiceAccount the overlay makes for it.
OVERLAY=$TMP/overlay
mkdir -p "$OVERLAY"
# kustomize takes a base by a relative path only.
cat > "$OVERLAY/kustomization.yaml" <<KUSTOMIZATION
resources: [$(python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' \
              "$ROOT/daemonset/overlays/dra-binding" "$OVERLAY")]
patches:
- patch: |-
    \$patch: delete
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: vfio-gpu-agent-claim-router, namespace: $NS}
- patch: |-
    \$patch: delete
    apiVersion: policy/v1
    kind: PodDisruptionBudget
    metadata: {name: vfio-gpu-agent-claim-router, namespace: $NS}
KUSTOMIZATION

# The events of this test's pods (the scheduler's, the kubelet's): a run reads only its own.
delete_pod_events() {
    for p in free held; do K delete events -n default --field-selector "involvedObject.name=$p" >/dev/null 2>&1; done
}
cleanup() {
    K delete pods -l $LABEL --grace-period=0 --force >/dev/null 2>&1
    delete_pod_events
    K delete resourceclaims -l $LABEL --wait=false >/dev/null 2>&1
    for p in ${watchers:-}; do kill -TERM "$p" 2>/dev/null; done
    for p in ${holder:-} ${router:-}; do kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
    [ -n "${held:-}" ] && sim_control "unbind-delay $held 0" && sim_control "release $held"
    # The agent undoes a pre-bind of a claim deleted before its Prepare: give it the claims' deletion first.
    claims_gone() { [ -z "$(K get resourceclaims -l $LABEL -o name 2>/dev/null)" ]; }
    wait_for claims_gone
    cleanup_dra
    # cleanup_dra deleted the dra overlay; the objects only the dra-binding overlay has (the router's RBAC, the
    # claim rules) go with the namespace or here.
    K delete --ignore-not-found --wait=false -k "$ROOT/daemonset/overlays/dra-binding" >/dev/null 2>&1
}
trap cleanup EXIT

# The simulated sysfs is mounted in the kubelet's mount namespace only.
in_ns() { nsenter -t "$(cat "$WORK/kubelet-dra/containerd.pid")" -m -- "$@"; }
driver_of() { basename "$(in_ns readlink "$TMP/node/sys/bus/pci/devices/$1/driver")" 2>/dev/null; }
sim_control() { in_ns sh -c 'printf "%s" "$1" > "$2"' sh "$1" "$TMP/node/sys/.sim/control"; }
# wait_long COMMAND...: as wait_for, 120 s at most (a held GPU's bind takes the agent's 22 s deadline, and the
# scheduler looks at the claim every 5 s and backs off between attempts).
wait_long() { local end=$((SECONDS + 120)); while [ $SECONDS -lt $end ]; do "$@" && return 0; sleep 0.2; done; return 1; }
pod_phase() { K get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null; }
pod_running() { [ "$(pod_phase "$1")" = Running ]; }
claim_json() { K get resourceclaim "$1" -o json 2>/dev/null; }
# claim_device NAME: the allocated device's BDF (the slices' pciBusID of its result), "" when not allocated.
claim_device() {
    local device
    device=$(K get resourceclaim "$1" -o jsonpath='{.status.allocation.devices.results[0].device}' 2>/dev/null)
    [ -n "$device" ] || return 0
    K get resourceslices --field-selector "spec.nodeName=$NODE" -o json | python3 -c '
import json, sys
for s in json.load(sys.stdin)["items"]:
    for d in s["spec"]["devices"]:
        if d["name"] == sys.argv[1]: print(d["attributes"]["resource.kubernetes.io/pciBusID"]["string"])' "$device"
}
pod_events() {  # pod_events POD: its events (the scheduler's and the kubelet's) in time order, with their counts
    K get events.events.k8s.io -n default --field-selector "regarding.name=$1" -o json 2>/dev/null | python3 -c '
import json, sys
rows = []
for e in json.load(sys.stdin)["items"]:
    when = e.get("eventTime") or e.get("deprecatedLastTimestamp") or ""
    count = (e.get("series") or {}).get("count") or e.get("deprecatedCount") or 1
    rows.append(" ".join([when, e.get("reason", ""), "x%d:" % count, e.get("note", "")])[:230])
print("\n".join(sorted(rows)))'
}
event_notes() {  # event_notes REASON: the notes of the agent's events of that reason on the node
    K get events.events.k8s.io -n default --field-selector "reason=$1,regarding.name=$NODE" \
        -o jsonpath='{range .items[*]}{.eventTime}{" "}{.note}{"\n"}{end}' 2>/dev/null
}

# watch_to FILE KIND NAME: every watch event of the object (from before it exists), stamped with its arrival time,
# one JSON line each ({"t": epoch seconds, "type", "object", and "drivers": the GPUs' drivers read as the event
# arrived}); the pid of its kubectl is added to $watchers (its end ends the stamper too).
watch_to() {
    rm -f "$1.pid"
    ( kubectl get "$2" --field-selector "metadata.name=$3" --watch --output-watch-events -o json 2>/dev/null &
      echo $! > "$1.pid"; wait ) |
        python3 -u -c '
import json, os, sys, time
sysfs, gpus = sys.argv[1], sys.argv[2].split()
def driver(bdf):
    try: return os.path.basename(os.readlink(f"{sysfs}/bus/pci/devices/{bdf}/driver"))
    except OSError: return ""
buf = ""
for line in sys.stdin:
    buf += line
    try:  # kubectl prints each watch event on a line of its own (or indented, when it is older)
        event = json.loads(buf)
    except json.JSONDecodeError:
        continue
    buf = ""
    print(json.dumps({"t": time.time(), "type": event["type"], "object": event["object"],
                          "drivers": {g: driver(g) for g in gpus}}), flush=True)' "$SYSFS_VIEW" "$GPUS" > "$1" &
    wait_for has_events "$1.pid"
    watchers="${watchers:-} $(cat "$1.pid")"
}
# The simulated sysfs seen from here: through the root of a process of the kubelet's mount namespace.
SYSFS_VIEW=/proc/$(cat "$WORK/kubelet-dra/containerd.pid")/root$TMP/node/sys
has_events() { [ -s "$1" ]; }
# before A B: RFC 3339 time A (any fraction of a second) is earlier than B.
before() {
    python3 -c 'import sys, datetime
t = lambda s: datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
sys.exit(not (sys.argv[1] and sys.argv[2] and t(sys.argv[1]) < t(sys.argv[2])))' "$1" "$2"
}
not_before() { [ -n "$1" ] && [ -n "$2" ] && ! before "$2" "$1"; }  # not_before A B: A <= B
earlier() { python3 -c "import sys; sys.exit(not ('$1' and '$2' and float('$1') < float('$2')))"; }
# The summary of a watch file: one line per event (see below), the fields the checks use.
summarize() {  # summarize FILE claim|pod
    python3 - "$1" "$2" "$CONDITION" "$FAILURE" <<'PY'
import json, sys
path, kind, condition, failure = sys.argv[1:5]
for line in open(path):
    e = json.loads(line); o = e["object"]; st = o.get("status", {})
    if kind == "claim":
        alloc = st.get("allocation")
        conds = {c["type"]: c for d in st.get("devices", []) for c in d.get("conditions", [])}
        def show(t):
            c = conds.get(t)
            return f'{c["status"]}@{c["lastTransitionTime"]}' if c else "-"
        msg = (conds.get(failure) or conds.get(condition) or {}).get("message", "")
        print(f'{e["t"]:.3f} claim {e["type"]} allocated={"yes@" + alloc.get("allocationTimestamp", "?") if alloc else "no"} '
              f'reservedFor={len(st.get("reservedFor", []))} vfio-bound={show(condition)} bind-failed={show(failure)} {msg[:150]}')
    else:
        sched = next((c for c in st.get("conditions", []) if c["type"] == "PodScheduled"), {})
        on_vfio = sorted(g for g, d in e.get("drivers", {}).items() if d == "vfio-pci")
        print(f'{e["t"]:.3f} pod {e["type"]} nodeName={o["spec"].get("nodeName", "-")} phase={st.get("phase")} '
              f'on-vfio-pci={",".join(on_vfio) or "none"} '
              f'PodScheduled={sched.get("status", "-")}@{sched.get("lastTransitionTime", "-")} {sched.get("reason", "")} '
              f'{sched.get("message", "")[:150]}')
PY
}
# first_time FILE PYTHON_CONDITION: the arrival time of the first event whose object `o` satisfies it ("" if none).
first_time() {
    python3 - "$1" "$2" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line); o = e["object"]; st = o.get("status", {})
    if eval(sys.argv[2]):
        print(f'{e["t"]:.3f}'); break
PY
}
cond_true() { echo "any(c['type'] == '$1' and c['status'] == 'True' for d in st.get('devices', []) for c in d.get('conditions', []))"; }
BOUND="o['spec'].get('nodeName')"

# claim NAME [CEL]: a ResourceClaim for one GPU of the model's DeviceClass (with a CEL selector when given).
claim() {
    local selectors=""
    [ -n "${2:-}" ] && selectors="selectors: [{cel: {expression: '$2'}}]"
    K apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $1, namespace: default, labels: {vfio-gpu-agent-test: binding}}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: $CLASS, count: 1, $selectors}
EOF
}
# pod NAME CLAIM: a VM-like pod with that claim, through the scheduler, onto the node that stays NotReady (no CNI).
pod() {
    K apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default, labels: {vfio-gpu-agent-test: binding}}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 0
  tolerations: [{key: node.kubernetes.io/not-ready, operator: Exists, effect: NoSchedule}]
  resourceClaims: [{name: gpu, resourceClaimName: $2}]
  containers:
  - name: vm
    image: localhost/tools:local
    imagePullPolicy: Never
    command: [sh, -c, 'ls /dev/vfio | sort | tr "\n" " "; echo; sleep 3600']
    resources: {claims: [{name: gpu}]}
EOF
}

agent_identity "$OVERLAY"
delete_pod_events
scheduler_from=$(($(wc -l < "$WORK/state/scheduler.log") + 1))
scheduler_log() { tail -n +$scheduler_from "$WORK/state/scheduler.log"; }

echo "== sysfs-sim (hgx-h200-8gpu: GPUs on nvidia) in the kubelet's mount namespace"
start_sim hgx-h200-8gpu.json

echo "== the claim router (ServiceAccount vfio-gpu-agent-claim-router, the overlay's RBAC)"
server=$(K config view --minify -o jsonpath='{.clusters[0].cluster.server}')
ca=$(K config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority}')
cat > "$TMP/router.kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "$server", certificate-authority: "$ca"}}]
users: [{name: router, user: {token: "$(K -n $NS create token vfio-gpu-agent-claim-router --duration 1h)"}}]
contexts: [{name: c, context: {cluster: c, user: router}}]
current-context: c
KUBECONFIG
"$BUILD/src/cli/vfio-gpu-agent" claim-router --kubeconfig "$TMP/router.kubeconfig" --lease-namespace $NS \
    --identity realcluster-binding --dra-driver-name $DRIVER > "$TMP/router.log" 2>&1 &
router=$!
lease_held() { [ "$(K -n $NS get lease vfio-gpu-agent-claim-router -o jsonpath='{.spec.holderIdentity}' 2>/dev/null)" = realcluster-binding ]; }
expect "the router holds its Lease" wait_for lease_held

echo "== agent: run --kubelet-api dra --bind-on-prepare --binding-conditions"
# --proc-root: the real /proc, where the agent looks for the processes holding a GPU (the holder of case 3).
in_kubelet_ns "$BUILD/src/cli/vfio-gpu-agent" run --node-name $NODE \
    --kubeconfig "$TMP/agent.kubeconfig" --kubelet-api dra --bind-on-prepare --binding-conditions \
    --sysfs-root "$TMP/node/sys" --dev-root "$TMP/node/dev" --proc-root /proc \
    --modules-root "$TMP/modules" --no-udev --listen-address 127.0.0.1 --health-port 18081 \
    --metrics-port 19400 >> "$TMP/agent.log" 2>&1 &
agent=$!
expect "ResourceSlices of $NODE hold 8 devices" wait_for slices_are 8
slice_conditions() {
    K get resourceslices --field-selector "spec.nodeName=$NODE,spec.driver=$DRIVER" -o json | python3 -c '
import json, sys
print(" ".join(sorted({json.dumps([d.get("bindingConditions"), d.get("bindingFailureConditions")])
                       for s in json.load(sys.stdin)["items"] for d in s["spec"]["devices"]})))'
}
echo "   the slices' devices: [bindingConditions, bindingFailureConditions] = $(slice_conditions)"
expect "every device carries [$CONDITION] and [$FAILURE]" \
    [ "$(slice_conditions)" = "[[\"$CONDITION\"], [\"$FAILURE\"]]" ]
on_nvidia=0
for gpu in $GPUS; do [ "$(driver_of $gpu)" = nvidia ] && on_nvidia=$((on_nvidia + 1)); done
expect "8 GPUs on nvidia while no claim holds them ($on_nvidia)" [ "$on_nvidia" = 8 ]

# BINDING_REST_SECONDS=N: the node at rest for N s with the claim watch on (no claim, nothing changing), then the
# agent's and the router's requests in that window as the API server's audit log has them (its ServiceAccount
# requests), per minute. Off by default: it measures, it checks nothing.
if [ "${BINDING_REST_SECONDS:-0}" -gt 0 ]; then
    echo "== at rest for $BINDING_REST_SECONDS s: requests by the agent and the router (audit log)"
    rest_from=$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)
    sleep "$BINDING_REST_SECONDS"
    rest_to=$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)
    python3 - "$WORK/state/audit.log" "$rest_from" "$rest_to" "$BINDING_REST_SECONDS" <<'PY' | sed 's/^/   /'
import collections, json, sys
log, start, end, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
who = collections.Counter()
what = collections.Counter()
seen = set()
for line in open(log):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    # A request counts once (a watch has a line per stage), by when it was received.
    if e.get("auditID") in seen:
        continue
    seen.add(e.get("auditID"))
    user = (e.get("user") or {}).get("username", "")
    if not (user.endswith(":vfio-gpu-agent") or user.endswith(":vfio-gpu-agent-claim-router")):
        continue
    t = e.get("requestReceivedTimestamp", "")
    if not (start <= t < end):
        continue
    role = "router" if user.endswith("claim-router") else "agent"
    who[role] += 1
    what[(role, e.get("verb"), e.get("requestURI", "").split("?")[0])] += 1
for role in ("agent", "router"):
    print(f"{role}: {who[role]} requests in {seconds:.0f} s = {who[role] * 60 / seconds:.2f} per minute")
for (role, verb, uri), n in sorted(what.items()):
    print(f"  {role} {verb} {uri}: {n}")
PY
fi

echo "== 2. free GPU: claim free-gpu, pod free"
claim free-gpu
watch_to "$TMP/free-claim.json" resourceclaim free-gpu
watch_to "$TMP/free-pod.json" pod free
wait_for has_events "$TMP/free-claim.json"
pod free free-gpu
expect "pod free running" wait_long pod_running free ||
    K describe pod free 2>&1 | sed -n '/^Events:/,$p' | tail -8 | cut -c1-220 | sed 's/^/      /'
free_bdf=$(claim_device free-gpu)
summarize "$TMP/free-claim.json" claim | sed 's/^/   /'
summarize "$TMP/free-pod.json" pod | sed 's/^/   /'
t_condition=$(first_time "$TMP/free-claim.json" "$(cond_true "$CONDITION")")
t_bound=$(first_time "$TMP/free-pod.json" "$BOUND")
expect "the claim's $CONDITION True arrived (${t_condition:-never}) before the pod's nodeName (${t_bound:-never})" \
    earlier "$t_condition" "$t_bound"
unbound_when_true=$(python3 - "$TMP/free-pod.json" "${t_condition:-0}" <<'PY'
import json, sys
# The pod's last state received before the claim's condition: no node yet.
last = None
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e["t"] <= float(sys.argv[2]): last = e["object"]
print("unbound" if last is not None and not last["spec"].get("nodeName") else "bound or unseen")
PY
)
expect "the pod had no node when the condition arrived ($unbound_when_true)" [ "$unbound_when_true" = unbound ]
driver_at_binding() {  # driver_at_binding FILE BDF: the GPU's driver as the pod's first event with a node arrived
    python3 - "$1" "$2" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e["object"]["spec"].get("nodeName"):
        print(e["drivers"].get(sys.argv[2]) or "none"); break
PY
}
at_binding=$(driver_at_binding "$TMP/free-pod.json" "$free_bdf")
expect "the claim's GPU $free_bdf was on ${at_binding:-?} as the pod's binding arrived" [ "$at_binding" = vfio-pci ]
ltt=$(claim_json free-gpu | python3 -c "import json, sys
print(next(c['lastTransitionTime'] for d in json.load(sys.stdin)['status']['devices'] for c in d['conditions'] if c['type'] == '$CONDITION'))")
scheduled=$(K get pod free -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].lastTransitionTime}')
expect "the condition's lastTransitionTime $ltt <= the pod's PodScheduled $scheduled" not_before "$ltt" "$scheduled"
ready_event=$(event_notes ClaimDevicesReady | grep "default/free-gpu" | tail -1)
sched_event=$(K get events.events.k8s.io -n default --field-selector "regarding.name=free,reason=Scheduled" \
    -o jsonpath='{.items[0].eventTime}' 2>/dev/null)
echo "   agent's ClaimDevicesReady at ${ready_event%% *}; scheduler's Scheduled event at $sched_event"
expect "the agent's ClaimDevicesReady precedes the scheduler's Scheduled event" before "${ready_event%% *}" "$sched_event"
scheduler_log | grep -E "\"Successfully bound pod to node\" pod=\"default/free\"" | tail -3 | cut -c1-220 | sed 's/^/   scheduler: /'
pod_events free | sed 's/^/   pod event: /'
expect "the claim's GPU $free_bdf on vfio-pci ($(driver_of "$free_bdf"))" [ "$(driver_of "$free_bdf")" = vfio-pci ]
logged() { K logs "$1" 2>/dev/null | grep -q vfio; }
wait_for logged free
echo "   free: /dev/vfio in the container: $(K logs free 2>/dev/null | head -1)"

echo "== 3. held GPU: a process holds one on nvidia; claim held-gpu selects exactly it; pod held"
for gpu in $GPUS; do [ "$gpu" != "$free_bdf" ] && held=$gpu; done
# comm "cuda-app": what the agent names (a symlink's name is the process's comm).
ln -s "$(command -v sleep)" "$TMP/cuda-app"
# Its /dev/nvidiaN: the simulator numbers the GPUs on nvidia at boot in bus order, as the driver's probe does.
index=0
for gpu in $GPUS; do [ "$gpu" = "$held" ] && break; index=$((index + 1)); done
minor=nvidia$index
in_kubelet_ns sh -c 'exec "$0" 3600 3<"$1"' "$TMP/cuda-app" "$TMP/node/dev/$minor" &
holder=$!
sim_control "unbind-delay $held -1"  # nvidia's unbind waits for the device's last close, as the kernel's does
holder_has_it() { [ -n "$(ls -l /proc/$holder/fd 2>/dev/null | grep "$TMP/node/dev/$minor")" ]; }
expect "holder pid $holder (cuda-app) has $minor open" wait_for holder_has_it
claim held-gpu "device.attributes[\"resource.kubernetes.io\"].pciBusID == \"$held\""
watch_to "$TMP/held-claim.json" resourceclaim held-gpu
watch_to "$TMP/held-pod.json" pod held
wait_for has_events "$TMP/held-claim.json"
pod held held-gpu
held_start=$(date +%s)
failed_with_holder() {
    claim_json held-gpu | python3 -c "import json, sys
st = json.load(sys.stdin)['status']
sys.exit(not any(c['type'] == '$FAILURE' and c['status'] == 'True' and 'pid $holder (cuda-app)' in c['message']
                 for d in st.get('devices', []) for c in d.get('conditions', [])))"
}
expect "claim held-gpu: $FAILURE True, naming pid $holder (cuda-app)" wait_long failed_with_holder
echo "   kubectl get resourceclaim held-gpu -o yaml (status), $(($(date +%s) - held_start)) s after the pod:"
K get resourceclaim held-gpu -o yaml | sed -n '/^status:/,$p' | cut -c1-240 | sed 's/^/      /'
# The scheduler sees the failure at its next look (every 5 s), fails PreBind, then unallocates the claim in its
# next attempt's PostFilter and allocates it again: wait for the second allocation.
allocations() { grep -c . <(python3 - "$TMP/held-claim.json" <<'PY'
import json, sys
seen = set()
for line in open(sys.argv[1]):
    a = json.loads(line)["object"].get("status", {}).get("allocation")
    if a: seen.add(a.get("allocationTimestamp"))
print("\n".join(sorted(seen)))
PY
); }
reallocated() { [ "$(allocations)" -ge 2 ]; }
expect "the scheduler unallocated the claim and allocated it again" wait_long reallocated
# The failure transitions written (one per allocation: each is written anew after the scheduler cleared the last).
failure_count() {
    python3 - "$TMP/held-claim.json" "$FAILURE" <<'PY'
import json, sys
seen = set()
for line in open(sys.argv[1]):
    for d in json.loads(line)["object"].get("status", {}).get("devices", []):
        for c in d.get("conditions", []):
            if c["type"] == sys.argv[2] and c["status"] == "True": seen.add(c["lastTransitionTime"])
print(len(seen))
PY
}
second_failure() { [ "$(failure_count)" -ge 2 ]; }
expect "the second allocation failed again, as the GPU is still held" wait_long second_failure
summarize "$TMP/held-claim.json" claim | sed 's/^/   /'
summarize "$TMP/held-pod.json" pod | sed 's/^/   /'
never_bound=$(first_time "$TMP/held-pod.json" "$BOUND")
expect "pod held never bound to a node while the GPU is held (so never ContainerCreating)" [ -z "$never_bound" ]
expect "pod held is Pending ($(pod_phase held))" [ "$(pod_phase held)" = Pending ]
expect "$held still on nvidia, nothing half-bound ($(driver_of "$held"))" [ "$(driver_of "$held")" = nvidia ]
pod_events held | sed 's/^/   pod event: /'
scheduler_log | grep -E "pod=\"default/held\"|claim=held-gpu" | cut -c1-260 | head -8 | sed 's/^/   scheduler: /'

echo "== 3b. the holder ends: the next attempt binds the GPU and pod held runs"
kill -TERM "$holder"; wait "$holder" 2>/dev/null; holder=
sim_control "unbind-delay $held 0"; sim_control "release $held"
expect "pod held running" wait_long pod_running held ||
    K describe pod held 2>&1 | sed -n '/^Events:/,$p' | tail -8 | cut -c1-220 | sed 's/^/      /'
expect "$held on vfio-pci ($(driver_of "$held"))" [ "$(driver_of "$held")" = vfio-pci ]
t_condition=$(first_time "$TMP/held-claim.json" "$(cond_true "$CONDITION")")
t_bound=$(first_time "$TMP/held-pod.json" "$BOUND")
expect "held-gpu's $CONDITION True arrived (${t_condition:-never}) before the pod's nodeName (${t_bound:-never})" \
    earlier "$t_condition" "$t_bound"
held=

echo "== 4. the agent's Node events and its binding histogram"
for reason in ClaimDevicesReady ClaimBindingFailed; do
    event_notes $reason | cut -c1-300 | sed "s/^/   $reason: /"
done
expect "ClaimDevicesReady names claim default/free-gpu and its seconds" \
    grep -qE "claim default/free-gpu \(.*\) ready for its pod after [0-9.]+ s" <(event_notes ClaimDevicesReady)
expect "ClaimBindingFailed names claim default/held-gpu, its seconds and the holder" \
    grep -qE "claim default/held-gpu \(.*\) failed after [0-9.]+ s.*pid [0-9]+ \(cuda-app\)" <(event_notes ClaimBindingFailed)
curl -s 127.0.0.1:19400/metrics | grep "^vfio_gpu_agent_dra_binding_wait_seconds" |
    grep -E '_count|_sum|le="(1|5|10|30|\+Inf)"' | sed 's/^/   metric: /'
metric() { curl -s 127.0.0.1:19400/metrics | awk -v m="$1" '$1 == m { print $2 }'; }
ok_count=$(metric 'vfio_gpu_agent_dra_binding_wait_seconds_count{result="ok"}')
failed_count=$(metric 'vfio_gpu_agent_dra_binding_wait_seconds_count{result="failed"}')
expect "the histogram counts 2 claims bound (free-gpu, held-gpu at last) ($ok_count)" [ "${ok_count:-0}" = 2 ]
expect "and at least 2 failed attempts of held-gpu ($failed_count)" [ "${failed_count:-0}" -ge 2 ]

echo "== cleanup: pods and claims deleted, the GPUs back on nvidia"
K delete pods -l $LABEL --wait=false >/dev/null
pods_gone() { [ -z "$(K get pods -l $LABEL -o name 2>/dev/null)" ]; }
expect "pods gone" wait_long pods_gone
K delete resourceclaims -l $LABEL --wait=false >/dev/null
all_on_nvidia() { for gpu in $GPUS; do [ "$(driver_of $gpu)" = nvidia ] || return 1; done; }
expect "the 8 GPUs back on nvidia" wait_for all_on_nvidia
kill -TERM "$agent"; wait "$agent"; code=$?; agent=
expect "agent exit code 0 ($code)" [ "$code" = 0 ]
agent_log_summary
grep -E "DRA binding|abandoned unbind" "$TMP/agent.log" | cut -c1-260 | sed 's/^/   log: /'
grep -E "^[^ ]+ (warning|error) " "$TMP/agent.log" | grep -v "DRA binding" | cut -c1-200 | sed 's/^/   log: /'
grep -E " 403 |lease: " "$TMP/router.log" | sed 's/^/   router: /'
[ $failed = 0 ] && echo "== all checks ok" || echo "== some checks FAILED"
exit $failed
