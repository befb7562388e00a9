#!/bin/bash
# realcluster_claim_router.sh - DRA binding conditions' grants against a real kube-apiserver (issue 32): the
# claim router with exactly the chart's ServiceAccount, ClusterRole and Role (it must acquire its Lease, list and
# watch claims and label one), and the agent's claim status writes under exactly the chart's grants and the
# own-node admission policy. Not part of CI (the cluster is not there); tests/deploy/records/claim-router.md
# records a run.
#
# Needs the cluster of ../shared/realcluster running with a Node object NODE_A (gpu-node-1; a pod is bound to it,
# it need not run). Env: KUBECONFIG (the administrator's), AGENT (a vfio-gpu-agent binary, for `claim-router`).
# Everything happens in its own namespace and under names of its own (the policy and the agent's ClusterRole
# are renamed copies, the router runs for its own driver name), so a cluster shared with other runs is not
# disturbed; all of it is deleted at the end.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
: "${KUBECONFIG:?set KUBECONFIG to a kubeconfig of the cluster administrator}"
: "${AGENT:?set AGENT to a vfio-gpu-agent binary}"
NODE_A=${NODE_A:-gpu-node-1}
NODE_B=${NODE_B:-gpu-node-2}
NS=claim-router-check
DRIVER=gpu.vfio-agent.cozystack.io
ROUTER_DRIVER=router-check.example.com  # the router labels only this driver's claims: none but ours
HELM=${HELM:-$ROOT/build/tools/bin/helm}
CHART=$ROOT/daemonset/chart/vfio-gpu-agent
TMP=$(mktemp -d)
failed=0
K() { kubectl "$@"; }
SERVER=$(K config view --minify -o jsonpath='{.clusters[0].cluster.server}')
CA=$(K config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority}')

cleanup() {
    [ -n "${ROUTER_PID:-}" ] && kill "$ROUTER_PID" 2>/dev/null
    K delete --ignore-not-found -f "$TMP/policy.yaml" -f "$TMP/agent-rbac.yaml" -f "$TMP/router-rbac.yaml" >/dev/null 2>&1
    K delete --ignore-not-found --wait=false namespace "$NS" >/dev/null 2>&1
    rm -rf "$TMP"
}
trap cleanup EXIT

render() { "$HELM" template vfio-gpu-agent "$CHART" -f "$CHART/values-dra.yaml" --set dra.bindingConditions.enabled=true \
    --set namespace.name=$NS "$@"; }
# The chart's objects, only the kinds named, renamed with -check where they are cluster-scoped and shared.
pick() { python3 -c '
import sys, yaml
kinds = sys.argv[1].split(",")
docs = [d for d in yaml.safe_load_all(sys.stdin) if d and d["kind"] in kinds]
for d in docs:
    if d["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterRole",
                     "ClusterRoleBinding") and d["metadata"]["name"] in ("vfio-gpu-agent", "vfio-gpu-agent-own-node"):
        d["metadata"]["name"] += "-check"
    if d["kind"] == "ValidatingAdmissionPolicyBinding":
        d["spec"]["policyName"] += "-check"
    if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == "vfio-gpu-agent":
        d["roleRef"]["name"] += "-check"
yaml.safe_dump_all(docs, sys.stdout)' "$1"; }

check() {  # NAME WANT GOT MESSAGE
    if [ "$2" = "$3" ]; then echo "   ok   $1: $3 $4"; else echo "   FAIL $1: want $2, got $3 $4"; failed=1; fi
}

echo "== kube-apiserver $(K version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"
K create namespace $NS >/dev/null
render --show-only templates/claim-router.yaml | pick ServiceAccount,ClusterRole,ClusterRoleBinding,Role,RoleBinding >"$TMP/router-rbac.yaml"
render --show-only templates/rbac.yaml | pick ServiceAccount,ClusterRole,ClusterRoleBinding >"$TMP/agent-rbac.yaml"
render --show-only templates/admission-policy.yaml | pick ValidatingAdmissionPolicy,ValidatingAdmissionPolicyBinding >"$TMP/policy.yaml"
K apply -f "$TMP/router-rbac.yaml" -f "$TMP/agent-rbac.yaml" -f "$TMP/policy.yaml" | sed 's/^/   /'

claim() {  # NAME NODE [POOLS...]: a claim allocated as kube-scheduler writes it, one device per pool
    local name=$1 node=$2 driver=$3
    shift 3
    local results="" count=0
    for pool in "$@"; do
        results="$results${results:+,}{\"request\":\"gpu\",\"driver\":\"$driver\",\"pool\":\"$pool\",\"device\":\"gpu-0\"}"
        count=$((count + 1))
    done
    K apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $name, namespace: $NS}
spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: check-gpu, allocationMode: ExactCount, count: $count}}]}}
EOF
    K -n $NS patch resourceclaim "$name" --subresource status --type merge -p "{\"status\":{\"allocation\":{\"devices\":{\"results\":[$results]},\"nodeSelector\":{\"nodeSelectorTerms\":[{\"matchFields\":[{\"key\":\"metadata.name\",\"operator\":\"In\",\"values\":[\"$node\"]}]}]}}}}" >/dev/null
}

echo "== the claim router under the chart's grants"
ROUTER_TOKEN=$(K -n $NS create token vfio-gpu-agent-claim-router)
cat >"$TMP/router.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "$SERVER", certificate-authority: "$CA"}}]
users: [{name: u, user: {token: "$ROUTER_TOKEN"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
EOF
"$AGENT" claim-router --kubeconfig "$TMP/router.kubeconfig" --lease-namespace $NS --identity check-0 \
    --dra-driver-name $ROUTER_DRIVER >"$TMP/router.log" 2>&1 &
ROUTER_PID=$!
claim routed "$NODE_A" $ROUTER_DRIVER "$NODE_A"
label=""
for _ in $(seq 1 60); do
    label=$(K -n $NS get resourceclaim routed -o jsonpath="{.metadata.labels['gpu\.vfio-agent\.cozystack\.io/node']}")
    [ -n "$label" ] && break
    sleep 0.5
done
check "claim labeled by the router" "$NODE_A" "$label" ""
check "lease held" check-0 "$(K -n $NS get lease vfio-gpu-agent-claim-router -o jsonpath='{.spec.holderIdentity}')" ""
kill -TERM $ROUTER_PID
wait $ROUTER_PID
check "SIGTERM: exit code" 0 "$?" ""
ROUTER_PID=
check "SIGTERM: lease released" "" "$(K -n $NS get lease vfio-gpu-agent-claim-router -o jsonpath='{.spec.holderIdentity}')" ""
grep -q "lease: " "$TMP/router.log" && { echo "   FAIL the router logged a lease error:"; grep "lease: " "$TMP/router.log"; failed=1; }
grep -q " 403 " "$TMP/router.log" && { echo "   FAIL the router was refused:"; grep " 403 " "$TMP/router.log"; failed=1; }

echo "== the agent's claim status writes (chart's grants, own-node policy), token bound to a pod on $NODE_A"
K apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: probe, namespace: $NS}
spec:
  nodeName: $NODE_A
  serviceAccountName: vfio-gpu-agent
  containers: [{name: c, image: localhost/tools:local, imagePullPolicy: Never, command: ["sleep", "3600"]}]
EOF
TOKEN=$(K -n $NS create token vfio-gpu-agent --bound-object-kind Pod --bound-object-name probe)
claim mine "$NODE_A" $DRIVER "$NODE_A"
claim theirs "$NODE_B" $DRIVER "$NODE_B"
claim two-pools "$NODE_A" $DRIVER "$NODE_A" "$NODE_B"
sleep 2  # the policy's first use after its creation
dev() { echo "{\"driver\":\"$DRIVER\",\"pool\":\"$1\",\"device\":\"gpu-0\",\"conditions\":[{\"type\":\"$DRIVER/vfio-bound\",\"status\":\"True\",\"reason\":\"Bound\",\"message\":\"\",\"lastTransitionTime\":\"2026-12-05T09:00:00Z\"}]}"; }
case_() {  # NAME WANT METHOD PATH BODY
    local code
    code=$(curl -s --max-time 60 --cacert "$CA" -o "$TMP/body.json" -w '%{http_code}' -X "$3" \
        -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/merge-patch+json' "$SERVER$4" ${5:+-d "$5"})
    check "$1" "$2" "$code" "$(python3 -c "import json; d = json.load(open('$TMP/body.json')); print(d.get('message', '')[:240] if d.get('kind') == 'Status' else '')")"
}
C=/apis/resource.k8s.io/v1/namespaces/$NS/resourceclaims
case_ "list its node's claims by the router's label" 200 GET "/apis/resource.k8s.io/v1/resourceclaims?labelSelector=gpu.vfio-agent.cozystack.io%2Fnode%3D$NODE_A"
case_ "binding condition of its own node's device" 200 PATCH "$C/mine/status" "{\"status\":{\"devices\":[$(dev "$NODE_A")]}}"
case_ "the entry removed again" 200 PATCH "$C/mine/status" '{"status":{"devices":null}}'
case_ "another node's claim (built-in: associated-node)" 422 PATCH "$C/theirs/status" "{\"status\":{\"devices\":[$(dev "$NODE_B")]}}"
case_ "the allocation (built-in: resourceclaims/binding)" 422 PATCH "$C/mine/status" "{\"status\":{\"allocation\":null}}"
case_ "the claim object itself (RBAC)" 403 PATCH "$C/mine" '{"metadata":{"labels":{"gpu.vfio-agent.cozystack.io/node":"elsewhere"}}}'
case_ "own pool's entry in a claim spanning two pools" 200 PATCH "$C/two-pools/status" "{\"status\":{\"devices\":[$(dev "$NODE_A")]}}"
case_ "the other pool's entry there (the policy)" 403 PATCH "$C/two-pools/status" "{\"status\":{\"devices\":[$(dev "$NODE_A"),$(dev "$NODE_B")]}}"
K -n $NS patch resourceclaim two-pools --subresource status --type merge \
    -p "{\"status\":{\"devices\":[$(dev "$NODE_A"),$(dev "$NODE_B")]}}" >/dev/null
case_ "removing the other pool's entry (the policy)" 403 PATCH "$C/two-pools/status" "{\"status\":{\"devices\":[$(dev "$NODE_A")]}}"
echo "   typeChecking: $(K get validatingadmissionpolicy vfio-gpu-agent-own-node-check -o jsonpath='{.status.typeChecking}')"
[ $failed = 0 ] && echo "== all cases as expected" || echo "== some cases FAILED"
exit $failed
