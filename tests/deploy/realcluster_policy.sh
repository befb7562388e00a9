#!/bin/bash
# realcluster_policy.sh [base|cozystack|vgpu] - the admission policy of issue 24 (daemonset/base/agent/
# admission-policy.yaml) against a real kube-apiserver: what a token of the agent's ServiceAccount may write.
# Not part of CI (the cluster is not there); tests/deploy/records/admission-policy.md records a run.
#
# Needs the cluster of ../shared/realcluster (its README), running, with the kubelet node gpu-node-1 and the
# busybox image:
#   export WORK=/tmp/realcluster KUBECONFIG=/tmp/realcluster/state/admin.kubeconfig
#   ./run.sh start all && GOROOT=... ./kubelet-dra.sh start && GOROOT=... ./kubelet-dra.sh images
# Env: KUBECONFIG (the administrator's); AGENT (optional: a vfio-gpu-agent binary, then `run` on NODE_A and
# `validate --layers api` are tried with the pod's token too); AUDIT (the API server's audit log, for the codes
# of the agent's own writes; default $WORK/state/audit.log); NODE_A (gpu-node-1, the node the probe pod is
# bound to); NODE_B (gpu-node-2, created here as a Node object with no kubelet).
#
# What it does: `kubectl apply -k` of the overlay (base: namespace vfio-gpu-agent; cozystack: cozy-gpu-operator,
# created here), a pod of the agent's ServiceAccount bound to NODE_A, a token bound to that pod (it carries
# NODE_A as authentication.kubernetes.io/node-name), one not bound to anything and one bound to the Node object
# NODE_B (a node name but no pod); then every write the agent makes, and the ones it must not, with curl, each
# compared with the expected HTTP code. Exit 1 if any differs.
# Everything it created is deleted at the end (the Namespace only when it created it).
set -uo pipefail
OVERLAY=${1:-base}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
NODE_A=${NODE_A:-gpu-node-1}
NODE_B=${NODE_B:-gpu-node-2}
AGENT=${AGENT:-}
AUDIT=${AUDIT:-${WORK:-/tmp/realcluster}/state/audit.log}
SA=vfio-gpu-agent
POLICY=vfio-gpu-agent-own-node
case $OVERLAY in
    base) NS=vfio-gpu-agent; DIR=$ROOT/daemonset/base ;;
    cozystack) NS=cozy-gpu-operator; DIR=$ROOT/daemonset/overlays/cozystack ;;
    vgpu) NS=vfio-gpu-agent; DIR=$ROOT/daemonset/overlays/vgpu ;;
    *) echo "usage: $0 [base|cozystack|vgpu]" >&2; exit 2 ;;
esac
: "${KUBECONFIG:?set KUBECONFIG to a kubeconfig of the cluster administrator}"
K() { kubectl "$@"; }
SERVER=$(K config view --minify -o jsonpath='{.clusters[0].cluster.server}')
CA=$(K config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority}')
TMP=$(mktemp -d)
failed=0

cleanup() {
    K delete --ignore-not-found -f "$TMP/test-grants.yaml" >/dev/null 2>&1
    K delete --ignore-not-found resourceslices.resource.k8s.io policy-probe-a policy-probe-b >/dev/null 2>&1
    K delete --ignore-not-found -n "$NS" pod policy-probe --grace-period=0 --force >/dev/null 2>&1
    K delete --ignore-not-found node "$NODE_B" >/dev/null 2>&1
    K delete -n default events.events.k8s.io --field-selector reason=PolicyProbe >/dev/null 2>&1
    K delete -n default events.events.k8s.io --field-selector "reportingController=vfio-gpu-agent,regarding.name=$NODE_A" >/dev/null 2>&1
    K label node "$NODE_A" nvidia.com/vgpu.config.state- policy-probe- >/dev/null 2>&1
    K patch node "$NODE_A" --subresource status --type strategic \
        -p '{"status":{"conditions":[{"type":"GPUPassthroughReady","$patch":"delete"}]}}' >/dev/null 2>&1
    K delete --ignore-not-found --wait=false -k "$DIR" >/dev/null 2>&1
    [ "$OVERLAY" = cozystack ] && K delete --ignore-not-found --wait=false namespace "$NS" >/dev/null 2>&1
    rm -rf "$TMP"
}
trap cleanup EXIT

# case NAME EXPECTED_CODE TOKEN METHOD PATH CONTENT_TYPE BODY: one request; prints the code and the server's message.
case_() {
    local name=$1 want=$2 token=$3 method=$4 path=$5 ctype=$6 body=${7:-}
    local args=(-sS --cacert "$CA" -o "$TMP/body" -w '%{http_code}' -X "$method" -H "Authorization: Bearer $token")
    [ -n "$body" ] && args+=(-H "Content-Type: $ctype" --data-binary "$body")
    local code
    code=$(curl "${args[@]}" "$SERVER$path")
    local msg
    msg=$(python3 -c 'import json,sys
try:
    b=json.load(open(sys.argv[1]))
except ValueError:
    print(open(sys.argv[1]).read()[:200]); sys.exit()
print(b.get("message") if b.get("kind")=="Status" else "%s %s" % (b.get("kind"), b.get("metadata",{}).get("name")))' "$TMP/body")
    local verdict=ok
    [ "$code" = "$want" ] || { verdict=UNEXPECTED; failed=1; }
    printf '%-58s want %s got %s %-10s %s\n' "$name" "$want" "$code" "$verdict" "$msg"
}

rv() { K get node "$1" -o jsonpath='{.metadata.resourceVersion}'; }
now() { date -u +%Y-%m-%dT%H:%M:%SZ; }
micro() { date -u +%Y-%m-%dT%H:%M:%S.%6NZ; }
# The agent's condition patch (src/kube/reporter.cc PatchCondition): strategic merge of the one condition,
# with the resourceVersion precondition.
condition() {  # condition NODE STATUS REASON [with-transition]
    local t; t=$(now)
    local transition=""; [ "${4:-}" = with-transition ] && transition=",\"lastTransitionTime\":\"$t\""
    printf '{"metadata":{"resourceVersion":"%s"},"status":{"conditions":[{"type":"GPUPassthroughReady","status":"%s","reason":"%s","message":"probe","lastHeartbeatTime":"%s"%s}]}}' \
        "$(rv "$1")" "$2" "$3" "$t" "$transition"
}
event() {  # event NAME NODE: the agent's Event (NewEvent in reporter.cc)
    local uid; uid=$(K get node "$2" -o jsonpath='{.metadata.uid}')
    printf '{"apiVersion":"events.k8s.io/v1","kind":"Event","metadata":{"name":"%s","namespace":"default"},"eventTime":"%s","reportingController":"vfio-gpu-agent","reportingInstance":"%s","action":"Probe","reason":"PolicyProbe","note":"probe","type":"Normal","regarding":{"apiVersion":"v1","kind":"Node","name":"%s","uid":"%s"}}' \
        "$1" "$(micro)" "$NODE_A" "$2" "$uid"
}
series() { printf '{"series":{"count":%s,"lastObservedTime":"%s"}}' "$1" "$(micro)"; }

echo "== kube-apiserver $(K version -o json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])'), overlay $OVERLAY (namespace $NS)"
[ "$OVERLAY" = cozystack ] && K create namespace "$NS" >/dev/null && K label namespace "$NS" pod-security.kubernetes.io/enforce=privileged >/dev/null
K apply -k "$DIR" 2>&1 | sed 's/^/   /'
# kube-controller-manager type-checks the policy against the schemas of what it matches (status.typeChecking).
for _ in $(seq 100); do
    [ -n "$(K get validatingadmissionpolicy "$POLICY" -o jsonpath='{.status.observedGeneration}')" ] && break
    sleep 0.1
done
K get validatingadmissionpolicy "$POLICY" -o jsonpath='{"   matchConditions: "}{.spec.matchConditions[*].expression}{"\n   status: "}{.status}{"\n"}'

# Node B: a Node object nobody runs a kubelet for, with the status a kubelet would have given it.
cat > "$TMP/node-b.yaml" <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $NODE_B
  labels: {kubernetes.io/hostname: $NODE_B}
status:
  capacity: {cpu: "4", memory: 8Gi, pods: "110"}
  allocatable: {cpu: "4", memory: 8Gi, pods: "110"}
EOF
K create -f "$TMP/node-b.yaml" >/dev/null
cat > "$TMP/pod.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: policy-probe
  namespace: $NS
spec:
  serviceAccountName: $SA
  nodeName: $NODE_A
  # The kubelet runs it even before a CNI is ready, so the token it projects can be read too.
  hostNetwork: true
  terminationGracePeriodSeconds: 0
  containers:
    - name: probe
      image: localhost/tools:local
      imagePullPolicy: Never
      command: ["sleep", "3600"]
EOF
K create -f "$TMP/pod.yaml" >/dev/null
BOUND=$(K create token "$SA" -n "$NS" --bound-object-kind Pod --bound-object-name policy-probe --duration 10m)
UNBOUND=$(K create token "$SA" -n "$NS" --duration 10m)
NODEBOUND=$(K create token "$SA" -n "$NS" --bound-object-kind Node --bound-object-name "$NODE_B" --duration 10m)
# whoami TOKEN: `kubectl auth whoami` as that token alone (the admin's client certificate would win).
whoami() {
    kubectl --kubeconfig /dev/null --server "$SERVER" --certificate-authority "$CA" --token "$1" auth whoami -o json \
        | python3 -c 'import json,sys; u=json.load(sys.stdin)["status"]["userInfo"]; print("   username:", u["username"]); print("   extra:", json.dumps(u.get("extra", {}), sort_keys=True))'
}
echo "== the token bound to pod policy-probe (kubectl auth whoami):"
whoami "$BOUND"
echo "== the token bound to nothing:"
whoami "$UNBOUND"
echo "== a token bound to Node $NODE_B (names a node, no pod):"
whoami "$NODEBOUND"

# code TOKEN PATH: the answer to an empty status patch, which changes nothing.
code() {
    curl -sS --cacert "$CA" -o /dev/null -w '%{http_code}' -X PATCH -H "Authorization: Bearer $1" \
        -H "Content-Type: application/merge-patch+json" --data-binary '{"status":{}}' "$SERVER$2"
}
# The API server enforces a new policy once its informer has it: wait for the unbound token to be refused.
for _ in $(seq 100); do [ "$(code "$UNBOUND" "/api/v1/nodes/$NODE_B/status")" = 403 ] && break; sleep 0.1; done

SMP=application/strategic-merge-patch+json
MP=application/merge-patch+json
JSON=application/json
EV=/apis/events.k8s.io/v1/namespaces/default/events
A=/api/v1/nodes/$NODE_A/status
B=/api/v1/nodes/$NODE_B/status
E1=$NODE_A.policyprobe$RANDOM

echo "== what the agent does, with the token bound to its pod on $NODE_A"
case_ "condition PATCH of $NODE_A (first, with transition)" 200 "$BOUND" PATCH "$A" "$SMP" "$(condition "$NODE_A" True GPUsReady with-transition)"
case_ "heartbeat: the same condition again" 200 "$BOUND" PATCH "$A" "$SMP" "$(condition "$NODE_A" True GPUsReady)"
case_ "SIGTERM: Unknown, AgentStopped" 200 "$BOUND" PATCH "$A" "$SMP" "$(condition "$NODE_A" Unknown AgentStopped with-transition)"
case_ "Event create regarding $NODE_A" 201 "$BOUND" POST "$EV" "$JSON" "$(event "$E1" "$NODE_A")"
case_ "Event series merge-PATCH (count 2)" 200 "$BOUND" PATCH "$EV/$E1" "$MP" "$(series 2)"
case_ "Event series merge-PATCH (count 3)" 200 "$BOUND" PATCH "$EV/$E1" "$MP" "$(series 3)"

# The token the kubelet projected into the pod, as the agent reads it; only once the pod runs.
if K wait -n "$NS" pod/policy-probe --for=condition=Ready --timeout=60s >/dev/null 2>&1; then
    PROJECTED=$(K exec -n "$NS" policy-probe -- cat /var/run/secrets/kubernetes.io/serviceaccount/token)
    echo "== the token the kubelet projected into pod policy-probe:"
    whoami "$PROJECTED"
    case_ "projected token: condition PATCH of $NODE_A" 200 "$PROJECTED" PATCH "$A" "$SMP" "$(condition "$NODE_A" True GPUsReady)"
    case_ "projected token: condition PATCH of $NODE_B" 403 "$PROJECTED" PATCH "$B" "$SMP" "$(condition "$NODE_B" True GPUsReady with-transition)"
else
    echo "== pod policy-probe did not become Ready in 60 s: the projected token is not tried"
fi

echo "== what it must not do, with the token bound to its pod on $NODE_A"
case_ "condition PATCH of $NODE_B" 403 "$BOUND" PATCH "$B" "$SMP" "$(condition "$NODE_B" True GPUsReady with-transition)"
case_ "capacity of $NODE_B (nvidia.com/FAKE: 64)" 403 "$BOUND" PATCH "$B" "$SMP" '{"status":{"capacity":{"nvidia.com/FAKE":"64"},"allocatable":{"nvidia.com/FAKE":"64"}}}'
case_ "capacity of $NODE_A (nvidia.com/FAKE: 64)" 403 "$BOUND" PATCH "$A" "$SMP" '{"status":{"capacity":{"nvidia.com/FAKE":"64"}}}'
case_ "allocatable of $NODE_A" 403 "$BOUND" PATCH "$A" "$SMP" '{"status":{"allocatable":{"nvidia.com/FAKE":"64"}}}'
case_ "another condition type on $NODE_A (Ready=False)" 403 "$BOUND" PATCH "$A" "$SMP" "{\"status\":{\"conditions\":[{\"type\":\"Ready\",\"status\":\"False\",\"reason\":\"Probe\",\"message\":\"probe\",\"lastHeartbeatTime\":\"$(now)\"}]}}"
case_ "GPUPassthroughReady + Ready=False in one patch" 403 "$BOUND" PATCH "$A" "$SMP" "{\"status\":{\"conditions\":[{\"type\":\"GPUPassthroughReady\",\"status\":\"True\",\"reason\":\"GPUsReady\"},{\"type\":\"Ready\",\"status\":\"False\",\"reason\":\"Probe\"}]}}"
case_ "addresses of $NODE_A" 403 "$BOUND" PATCH "$A" "$MP" '{"status":{"addresses":[{"type":"InternalIP","address":"10.9.9.9"}]}}'
case_ "a label on $NODE_A through nodes/status" 403 "$BOUND" PATCH "$A" "$MP" '{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}'
case_ "Event create regarding $NODE_B" 403 "$BOUND" POST "$EV" "$JSON" "$(event "$NODE_B.policyprobe$RANDOM" "$NODE_B")"
E2=$NODE_B.policyprobe$RANDOM
K create -f - >/dev/null <<<"$(event "$E2" "$NODE_B")"
case_ "series PATCH of an Event regarding $NODE_B" 403 "$BOUND" PATCH "$EV/$E2" "$MP" "$(series 2)"

echo "== a token of the same ServiceAccount bound to no pod (no node name)"
case_ "condition PATCH of $NODE_A" 403 "$UNBOUND" PATCH "$A" "$SMP" "$(condition "$NODE_A" True GPUsReady)"
case_ "Event create regarding $NODE_A" 403 "$UNBOUND" POST "$EV" "$JSON" "$(event "$NODE_A.policyprobe$RANDOM" "$NODE_A")"
echo "== a token of the same ServiceAccount bound to Node $NODE_B, not to a pod"
case_ "condition PATCH of $NODE_B" 403 "$NODEBOUND" PATCH "$B" "$SMP" "$(condition "$NODE_B" True GPUsReady with-transition)"
case_ "Event create regarding $NODE_B" 403 "$NODEBOUND" POST "$EV" "$JSON" "$(event "$NODE_B.policyprobe$RANDOM" "$NODE_B")"

# Beyond what the ClusterRole grants today: a test-only ClusterRole lets the same account write core v1 Events
# and ResourceSlices, to show the policy holds those too (matchPolicy Equivalent; the DRA rule).
cat > "$TMP/test-grants.yaml" <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: policy-probe-extra}
rules:
  - {apiGroups: [""], resources: ["events"], verbs: ["create"]}
  - {apiGroups: ["resource.k8s.io"], resources: ["resourceslices"], verbs: ["create", "update", "delete"]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: policy-probe-extra}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: policy-probe-extra}
subjects: [{kind: ServiceAccount, name: $SA, namespace: $NS}]
EOF
K apply -f "$TMP/test-grants.yaml" >/dev/null
core_event() {  # core_event NODE
    printf '{"apiVersion":"v1","kind":"Event","metadata":{"name":"%s.core%s","namespace":"default"},"involvedObject":{"apiVersion":"v1","kind":"Node","name":"%s"},"reason":"PolicyProbe","message":"probe","type":"Normal","source":{"component":"probe"},"firstTimestamp":"%s","lastTimestamp":"%s","count":1}' \
        "$1" "$RANDOM" "$1" "$(now)" "$(now)"
}
slice() {  # slice NAME NODE
    printf '{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"%s"},"spec":{"driver":"gpu.example.com","nodeName":"%s","pool":{"name":"%s","generation":1,"resourceSliceCount":1},"devices":[]}}' "$1" "$2" "$2"
}
echo "== with a test-only grant of core v1 events create and resourceslices"
case_ "core v1 Event regarding $NODE_A" 201 "$BOUND" POST /api/v1/namespaces/default/events "$JSON" "$(core_event "$NODE_A")"
case_ "core v1 Event regarding $NODE_B" 403 "$BOUND" POST /api/v1/namespaces/default/events "$JSON" "$(core_event "$NODE_B")"
case_ "ResourceSlice with nodeName $NODE_A" 201 "$BOUND" POST /apis/resource.k8s.io/v1/resourceslices "$JSON" "$(slice policy-probe-a "$NODE_A")"
case_ "ResourceSlice with nodeName $NODE_B" 403 "$BOUND" POST /apis/resource.k8s.io/v1/resourceslices "$JSON" "$(slice policy-probe-b "$NODE_B")"
case_ "ResourceSlice of $NODE_A deleted" 200 "$BOUND" DELETE /apis/resource.k8s.io/v1/resourceslices/policy-probe-a "" ""
K delete -f "$TMP/test-grants.yaml" >/dev/null

# The Node object itself: a vm-vgpu agent reports its profiles in the label nvidia.com/vgpu.config.state (RBAC
# grants patch on nodes only in the vgpu overlay: elsewhere every case is a 403 from RBAC).
N=/api/v1/nodes/$NODE_A
state_label() { printf '{"metadata":{"labels":{"nvidia.com/vgpu.config.state":"%s"}}}' "$1"; }
if [ "$OVERLAY" = vgpu ]; then
    echo "== the vGPU state label (vgpu overlay: patch on nodes granted)"
    case_ "nvidia.com/vgpu.config.state=pending on $NODE_A" 200 "$BOUND" PATCH "$N" "$MP" "$(state_label pending)"
    case_ "nvidia.com/vgpu.config.state=success on $NODE_A" 200 "$BOUND" PATCH "$N" "$MP" "$(state_label success)"
    case_ "the state label on $NODE_B" 403 "$BOUND" PATCH "/api/v1/nodes/$NODE_B" "$MP" "$(state_label success)"
    case_ "the state label with the unbound token" 403 "$UNBOUND" PATCH "$N" "$MP" "$(state_label failed)"
else
    echo "== the vGPU state label ($OVERLAY overlay: no patch on nodes)"
    case_ "nvidia.com/vgpu.config.state on $NODE_A" 403 "$BOUND" PATCH "$N" "$MP" "$(state_label success)"
fi
case_ "another label on $NODE_A" 403 "$BOUND" PATCH "$N" "$MP" '{"metadata":{"labels":{"policy-probe":"x"}}}'
case_ "the GPU Operator's workload label on $NODE_A" 403 "$BOUND" PATCH "$N" "$MP" '{"metadata":{"labels":{"nvidia.com/gpu.workload.config":"vm-vgpu"}}}'
case_ "state label + unschedulable on $NODE_A" 403 "$BOUND" PATCH "$N" "$MP" '{"metadata":{"labels":{"nvidia.com/vgpu.config.state":"success"}},"spec":{"unschedulable":true}}'
case_ "an annotation on $NODE_A" 403 "$BOUND" PATCH "$N" "$MP" '{"metadata":{"annotations":{"policy-probe":"x"}}}'
case_ "delete $NODE_B" 403 "$BOUND" DELETE "/api/v1/nodes/$NODE_B" "" ""

if [ -n "$AGENT" ]; then
    cat > "$TMP/agent.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "$SERVER", certificate-authority: "$CA"}}]
users: [{name: agent, user: {token: "$BOUND"}}]
contexts: [{name: c, context: {cluster: c, user: agent}}]
current-context: c
EOF
    mkdir -p "$TMP/sys/bus/pci/devices"  # the api layer reads no host; validate still scans one
    # The agent itself (its reporter: condition, events) on NODE_A under the policy, with the pod's token: a host
    # without GPUs under temporary roots, no kubelet sockets; SIGTERM after its first condition.
    mkdir -p "$TMP/dev/vfio" "$TMP/kubelet" "$TMP/modules" "$TMP/status"
    echo "== $AGENT run --node-name $NODE_A, with the token bound to pod policy-probe"
    agent_start=$(date -u +%Y-%m-%dT%H:%M:%S)
    "$AGENT" run --node-name "$NODE_A" --kubeconfig "$TMP/agent.kubeconfig" --sysfs-root "$TMP/sys" \
        --dev-root "$TMP/dev" --kubelet-dir "$TMP/kubelet" --modules-root "$TMP/modules" --no-udev \
        --health-port 0 --metrics-port 0 --status-dir "$TMP/status" \
        --pod-resources-socket "$TMP/kubelet/pod-resources.sock" > "$TMP/agent.log" 2>&1 &
    agent_pid=$!
    for _ in $(seq 200); do
        [ -n "$(K get node "$NODE_A" -o jsonpath='{.status.conditions[?(@.reason!="AgentStopped")].type}' \
            | tr ' ' '\n' | grep -x GPUPassthroughReady)" ] && break
        sleep 0.1
    done
    kill -TERM "$agent_pid"; wait "$agent_pid"; echo "   agent exit code $?"
    K get node "$NODE_A" -o jsonpath='{range .status.conditions[?(@.type=="GPUPassthroughReady")]}{"   condition: "}{.status}{" "}{.reason}{": "}{.message}{"\n"}{end}'
    K get events.events.k8s.io -n default --field-selector "regarding.name=$NODE_A,reportingController=vfio-gpu-agent" \
        -o custom-columns=REASON:.reason,COUNT:.series.count,NOTE:.note --no-headers 2>&1 | grep -v PolicyProbe \
        | sed 's/^/   event: /' | head -5
    grep -ciE "403|forbidden|denied|rejected" "$TMP/agent.log" | sed 's/^/   agent log lines with 403, forbidden, denied or rejected: /'
    grep -vE " (debug|trace) " "$TMP/agent.log" | head -12 | cut -c1-220 | sed 's/^/   log: /'
    # The API server's word on each of its writes: the realcluster audit log (every ServiceAccount request).
    if [ -f "$AUDIT" ]; then
        python3 - "$AUDIT" "$agent_start" <<'PY' | sed 's/^/   audit: /'
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e.get("stage") == "ResponseComplete" and e.get("userAgent", "").startswith("vfio-gpu-agent") \
            and e["verb"] in ("create", "update", "patch") and e["requestReceivedTimestamp"] >= sys.argv[2]:
        print(e["verb"], e["requestURI"], e.get("responseStatus", {}).get("code"))
PY
    fi
    echo "== $AGENT validate --layers api, as the agent's ServiceAccount"
    report() {
        "$AGENT" validate --json --layers api --kubeconfig "$TMP/agent.kubeconfig" --sysfs-root "$TMP/sys" \
            --log-level error 2>/dev/null | python3 -c 'import json,sys
for c in json.load(sys.stdin)["checks"]:
    print("  ", c["result"], c["id"], c["subject"] + ":", c["message"])
    for e in c["evidence"]: print("      evidence:", e["source"], "=", e["value"])
    if c["fix"]: print("      fix:", c["fix"])'
    }
    report
    K delete validatingadmissionpolicybinding "$POLICY" >/dev/null
    echo "== the same with the binding deleted"
    for _ in $(seq 100); do [ "$(code "$BOUND" "$B")" = 200 ] && break; sleep 0.1; done
    report
else
    K delete validatingadmissionpolicybinding "$POLICY" >/dev/null
fi
echo "== without the binding (the manifests before issue 24): the same token"
# The binding is gone; the API server stops enforcing once its informer sees that.
for _ in $(seq 100); do [ "$(code "$BOUND" "$B")" = 200 ] && break; sleep 0.1; done
case_ "capacity of $NODE_B (nvidia.com/FAKE: 64)" 200 "$BOUND" PATCH "$B" "$SMP" '{"status":{"capacity":{"nvidia.com/FAKE":"64"}}}'
K get node "$NODE_B" -o jsonpath='{"   "}{.metadata.name}{" capacity: "}{.status.capacity}{"\n"}'
# Why the policy compares metadata too: the status subresource resets spec, not labels.
case_ "a label on $NODE_B through nodes/status" 200 "$BOUND" PATCH "$B" "$MP" '{"metadata":{"labels":{"policy-probe":"set-through-status"}}}'
K get node "$NODE_B" -o jsonpath='{"   "}{.metadata.name}{" labels: "}{.metadata.labels}{"\n"}'

[ "$failed" = 0 ] && echo "== every case as expected" || echo "== UNEXPECTED answers above"
exit "$failed"
