#!/usr/bin/env bash
# realcluster_cozystack.sh - the Cozystack package against the real v1.36 apiserver (../shared/realcluster; not CI,
# its runs are recorded in tests/deploy/records/cozystack.md):
#  1. every variant of sources/vfio-gpu-agent.yaml, rendered with exactly the values files it lists, as the platform
#     installs it (release vfio-gpu-agent, namespace cozy-vfio-gpu-agent), is applied server-side as a dry run into
#     the namespace the platform creates for a privileged package (cozystack.io/system=true,
#     pod-security.kubernetes.io/enforce=privileged); any warning (a deprecated API, an unknown field) fails;
#  2. each workload's pod template, created as a Pod (dry run) in that namespace, is admitted by Pod Security; the
#     same Pod in a namespace that enforces baseline is refused, which shows the admission check can fail;
#  3. with COZYSTACK_TREE (a cozystack/cozystack checkout): for each variant, the KubeVirt CR the patched platform
#     renders (check_cozystack_platform.py kubevirt-cr) is applied as a server-side dry run against the KubeVirt CRD
#     of the tree's kubevirt-operator package, and carries the HostDevices gate and the variant's table.
# Env: KUBECONFIG (the cluster administrator's), HELM and KUBECTL (default: build/tools/bin, the pinned v4.1.4 and
#      1.35.2), COZYSTACK_TREE (optional). Leaves nothing behind: its namespaces and the CRD it created are deleted.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
: "${KUBECONFIG:?set KUBECONFIG to a kubeconfig of the cluster administrator}"
HELM=${HELM:-$ROOT/build/tools/bin/helm}
KUBECTL=${KUBECTL:-$ROOT/build/tools/bin/kubectl}
COZY=$ROOT/daemonset/cozystack
PACKAGE=$COZY/packages/system/vfio-gpu-agent
SOURCE=$COZY/packages/core/platform/sources/vfio-gpu-agent.yaml
NS=cozy-vfio-gpu-agent
BASELINE_NS=vfio-gpu-agent-baseline-check
TMP=$(mktemp -d)
failed=0
created_crd=0
K() { "$KUBECTL" "$@"; }
expect() { local what=$1; shift; if "$@"; then echo "   ok: $what"; else echo "   FAILED: $what"; failed=1; fi; }
cleanup() {
    K delete --ignore-not-found --wait=false namespace "$NS" "$BASELINE_NS" cozy-kubevirt >/dev/null 2>&1
    [ "$created_crd" = 1 ] && K delete --ignore-not-found crd kubevirts.kubevirt.io >/dev/null 2>&1
    rm -rf "$TMP"
}
trap cleanup EXIT

echo "== $("$HELM" version --short), kubectl $(K version --client -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])'), server $(K version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"

# The namespaces as Cozystack's package reconciler makes them (internal/operator/package_reconciler.go), and one
# that enforces baseline. Their ServiceAccounts exist for real: the ServiceAccount admission plugin refuses a Pod
# whose account is missing, even in a dry run.
K wait --for=delete namespace/"$NS" namespace/"$BASELINE_NS" --timeout=120s >/dev/null 2>&1
K apply -f - >/dev/null <<YAML || { echo "cannot create the namespaces"; exit 1; }
apiVersion: v1
kind: Namespace
metadata:
  name: $NS
  labels: {cozystack.io/system: "true", pod-security.kubernetes.io/enforce: privileged}
---
apiVersion: v1
kind: Namespace
metadata:
  name: $BASELINE_NS
  labels: {pod-security.kubernetes.io/enforce: baseline}
YAML

# variant<TAB>values files (comma separated), in the PackageSource's order.
python3 - "$SOURCE" > "$TMP/variants" <<'PY'
import sys, yaml
source = yaml.safe_load(open(sys.argv[1]))
for variant in source["spec"]["variants"]:
    (component,) = variant["components"]
    print(variant["name"], ",".join(component["valuesFiles"]), component["install"]["namespace"],
          component["install"]["releaseName"], sep="\t")
PY

while IFS=$'\t' read -r variant values namespace release; do
    echo "== variant $variant (values: ${values//,/ })"
    expect "the PackageSource installs it into $NS as release vfio-gpu-agent" \
        test "$namespace/$release" = "$NS/vfio-gpu-agent"
    args=()
    for f in ${values//,/ }; do args+=(-f "$PACKAGE/$f"); done
    out=$TMP/$variant.yaml
    if ! "$HELM" template "$release" "$PACKAGE" -n "$NS" "${args[@]}" > "$out" 2> "$TMP/helm.err"; then
        echo "   FAILED: helm template: $(cat "$TMP/helm.err")"; failed=1; continue
    fi
    kinds=$(python3 -c 'import sys,yaml; print(" ".join(sorted({d["kind"] for d in yaml.safe_load_all(open(sys.argv[1])) if d})))' "$out")
    echo "   renders: $kinds"
    K apply --server-side --dry-run=server --field-manager=cozystack -n "$NS" -f "$out" > "$TMP/apply.out" 2> "$TMP/apply.err"
    rc=$?
    expect "server-side dry run accepted ($(wc -l < "$TMP/apply.out") objects)" test "$rc" = 0
    [ "$rc" = 0 ] || sed 's/^/      /' "$TMP/apply.err"
    expect "no warning from the server or kubectl" test ! -s "$TMP/apply.err"
    [ -s "$TMP/apply.err" ] && [ "$rc" = 0 ] && sed 's/^/      /' "$TMP/apply.err"

    # One Pod per workload, from its pod template, in each namespace.
    python3 - "$out" "$TMP/pods-$variant" <<'PY'
import os, sys, yaml
os.makedirs(sys.argv[2], exist_ok=True)
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if not doc or doc["kind"] not in ("DaemonSet", "Deployment", "StatefulSet", "Job"):
        continue
    template = doc["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": doc["metadata"]["name"] + "-admission", "labels": template["metadata"].get("labels", {})},
           "spec": template["spec"]}
    with open(os.path.join(sys.argv[2], doc["metadata"]["name"] + ".yaml"), "w") as f:
        yaml.safe_dump(pod, f)
    with open(os.path.join(sys.argv[2], doc["metadata"]["name"] + ".sa"), "w") as f:
        f.write(template["spec"].get("serviceAccountName", "default"))
PY
    for pod in "$TMP/pods-$variant"/*.yaml; do
        [ -e "$pod" ] || { echo "   FAILED: no workload rendered"; failed=1; break; }
        name=$(basename "$pod" .yaml)
        sa=$(cat "${pod%.yaml}.sa")
        for ns in "$NS" "$BASELINE_NS"; do
            K -n "$ns" get serviceaccount "$sa" >/dev/null 2>&1 || K -n "$ns" create serviceaccount "$sa" >/dev/null
        done
        K -n "$NS" create --dry-run=server -f "$pod" > /dev/null 2> "$TMP/pod.err"
        rc=$?
        expect "$name's pod admitted in $NS (Pod Security: privileged)" test "$rc" = 0
        [ "$rc" = 0 ] || sed 's/^/      /' "$TMP/pod.err"
        if K -n "$BASELINE_NS" create --dry-run=server -f "$pod" > /dev/null 2> "$TMP/pod.err"; then
            # A pod that baseline admits needs no privileged namespace: say so, it is not a failure.
            echo "   note: $name's pod is admitted under baseline too"
        else
            expect "$name's pod refused where baseline is enforced ($(grep -o 'violates PodSecurity "baseline[^"]*"' "$TMP/pod.err" | head -1))" \
                grep -q 'violates PodSecurity' "$TMP/pod.err"
        fi
    done
done < "$TMP/variants"

if [ -n "${COZYSTACK_TREE:-}" ]; then
    echo "== the patched platform's KubeVirt CR (Cozystack tree $COZYSTACK_TREE)"
    K apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Namespace
metadata: {name: cozy-kubevirt}
YAML
    while IFS=$'\t' read -r variant _ _ _; do
        dir=$TMP/kubevirt-$variant
        if ! python3 "$ROOT/tests/deploy/check_cozystack_platform.py" kubevirt-cr --cozystack-dir "$COZY" \
                --source-dir "$ROOT" --helm "$HELM" --tree "$COZYSTACK_TREE" --variant "$variant" --out-dir "$dir" \
                | sed 's/^/   /'; then
            echo "   FAILED: variant $variant: no KubeVirt CR"; failed=1; continue
        fi
        if ! K get crd kubevirts.kubevirt.io >/dev/null 2>&1; then
            K create -f "$dir/kubevirt-crd.yaml" >/dev/null && created_crd=1
            K wait --for=condition=Established crd/kubevirts.kubevirt.io --timeout=60s >/dev/null
        fi
        K apply --server-side --dry-run=server --field-manager=cozystack -f "$dir/kubevirt-cr.yaml" \
            > /dev/null 2> "$TMP/kv.err"
        rc=$?
        expect "variant $variant: the KubeVirt CR passes the CRD's server-side validation" test "$rc" = 0
        [ "$rc" = 0 ] || sed 's/^/      /' "$TMP/kv.err"
        expect "variant $variant: no warning" test ! -s "$TMP/kv.err"
        expect "variant $variant: the HostDevices feature gate" \
            grep -qx -- '      - HostDevices' "$dir/kubevirt-cr.yaml"
    done < "$TMP/variants"
else
    echo "== the patched platform's KubeVirt CR: skipped (set COZYSTACK_TREE to a cozystack/cozystack checkout)"
fi

[ "$failed" = 0 ] && echo "PASS" || echo "FAIL"
exit "$failed"
