# realcluster_common.sh - sourced by the realcluster_*.sh scripts: their settings, the expect/wait_for helpers, the
# simulated node in the kubelet's mount namespace, and the agent's own pod-bound identity. Not run by itself.
# Env: KUBECONFIG (the administrator's), WORK (/tmp/realcluster), BUILD (build/release: the agent and sysfs-sim),
#      REALCLUSTER (../shared/realcluster: kubelet-dra.sh).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=${WORK:-/tmp/realcluster}
BUILD=${BUILD:-$ROOT/build/release}
REALCLUSTER=${REALCLUSTER:-$ROOT/../shared/realcluster}
NODE=gpu-node-1
NS=vfio-gpu-agent
: "${KUBECONFIG:?set KUBECONFIG to a kubeconfig of the cluster administrator}"
K() { kubectl "$@"; }
TMP=$(mktemp -d)
failed=0
# expect WHAT COMMAND...: runs the command; prints ok or FAILED.
expect() { local what=$1; shift; if "$@"; then echo "   ok: $what"; else echo "   FAILED: $what"; failed=1; return 1; fi; }
# wait_for COMMAND...: until it succeeds, 30 s at most (the other side is waited for, never slept for).
wait_for() { for _ in $(seq 300); do "$@" && return 0; sleep 0.1; done; return 1; }
# in_kubelet_ns PROGRAM ARGS... &: in the kubelet's mount namespace, where it sees the FUSE node. Background calls
# only: exec replaces the subshell `&` makes, and nsenter execs the program (no --fork), so $! is the program's own
# pid (a signal to it reaches the program, not a shell around it).
in_kubelet_ns() { exec nsenter -t "$(cat "$WORK/kubelet-dra/containerd.pid")" -m -- "$@"; }

# start_sim NODE_FILE: sysfs-sim of tests/sim/nodes/NODE_FILE at $TMP/node, its pid in $sim.
start_sim() {
    mkdir -p "$TMP/node" "$TMP/modules"
    in_kubelet_ns "$BUILD/tests/sim/sysfs_sim/sysfs-sim" --node "$ROOT/tests/sim/nodes/$1" --root "$TMP/node" \
        > "$TMP/sim.out" 2> "$TMP/sim.log" &
    sim=$!
    sim_ready() { grep -qs READY "$TMP/sim.out"; }
    wait_for sim_ready || { echo "sysfs-sim did not start"; cat "$TMP/sim.log"; exit 1; }
}

# agent_identity KUSTOMIZE_DIR: applies the manifests (RBAC, admission policy; their DaemonSet selects no node
# here), starts a pod of the agent's ServiceAccount on $NODE and writes $TMP/agent.kubeconfig with a token bound
# to that pod, which carries the node name the admission policy holds the agent to.
agent_identity() {
    echo "== manifests (${1#"$ROOT"/}: RBAC, admission policy; the DaemonSet selects no node here)"
    # The previous run's cleanup deletes the namespace without waiting: its ServiceAccount would go with it.
    K wait --for=delete namespace/$NS --timeout=180s >/dev/null 2>&1
    K apply -k "$1" 2>&1 | sed 's/^/   /'
    K -n $NS wait --for=jsonpath='{.metadata.name}'=default serviceaccount/default --timeout=30s >/dev/null 2>&1
    K -n $NS apply -f - >/dev/null <<POD
apiVersion: v1
kind: Pod
metadata: {name: agent-identity}
spec:
  nodeName: $NODE
  serviceAccountName: vfio-gpu-agent
  hostNetwork: true  # runs before a CNI is ready; only its bound token is used
  terminationGracePeriodSeconds: 0
  containers: [{name: c, image: localhost/tools:local, imagePullPolicy: Never, command: [sleep, "3600"]}]
POD
    K -n $NS wait --for=condition=Ready pod/agent-identity --timeout=60s >/dev/null
    local token server ca
    token=$(K -n $NS create token vfio-gpu-agent --bound-object-kind Pod --bound-object-name agent-identity --duration 1h)
    server=$(K config view --minify -o jsonpath='{.clusters[0].cluster.server}')
    ca=$(K config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority}')
    cat > "$TMP/agent.kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "$server", certificate-authority: "$ca"}}]
users: [{name: agent, user: {token: "$token"}}]
contexts: [{name: c, context: {cluster: c, user: agent}}]
current-context: c
KUBECONFIG
}

# cleanup_common KUSTOMIZE_DIR: stops the agent and the simulator, and removes what the agent and agent_identity
# left in the cluster.
cleanup_common() {
    [ -n "${agent:-}" ] && kill -TERM "$agent" 2>/dev/null && wait "$agent" 2>/dev/null
    [ -n "${sim:-}" ] && kill -TERM "$sim" 2>/dev/null && wait "$sim" 2>/dev/null
    K delete --ignore-not-found -n $NS pod agent-identity --grace-period=0 --force >/dev/null 2>&1
    K delete -n default events.events.k8s.io --field-selector "reportingController=vfio-gpu-agent,regarding.name=$NODE" >/dev/null 2>&1
    K patch node $NODE --subresource status --type strategic \
        -p '{"status":{"conditions":[{"type":"GPUPassthroughReady","$patch":"delete"}]}}' >/dev/null 2>&1
    [ -n "${1:-}" ] && K delete --ignore-not-found --wait=false -k "$1" >/dev/null 2>&1
    rm -rf "$TMP"
}

# agent_log_summary: the log's size by level and its warnings and errors.
agent_log_summary() {
    echo "   agent log: $(wc -l < "$TMP/agent.log") lines; by level: $(grep -oE '^[^ ]+ (info|warning|error|debug) ' "$TMP/agent.log" | cut -d' ' -f2 | sort | uniq -c | tr '\n' ' ')"
}

# The DRA driver's name and its ResourceSlices of $NODE: slice_devices counts their devices.
DRIVER=gpu.vfio-agent.cozystack.io
slice_devices() {
    K get resourceslices --field-selector "spec.nodeName=$NODE,spec.driver=$DRIVER" \
        -o jsonpath='{range .items[*]}{range .spec.devices[*]}{.name}{"\n"}{end}{end}' 2>/dev/null | grep -c .
}
slices_are() { [ "$(slice_devices)" = "$1" ]; }
slice_names() {
    K get resourceslices --field-selector "spec.nodeName=$NODE,spec.driver=$DRIVER" \
        -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' 2>/dev/null | sort
}
# slices_replaced_and_are N OLD_NAMES: none of the slices named OLD_NAMES is left, and the node's slices hold N
# devices (the agent's new slices have new names: it creates them with generateName).
slices_replaced_and_are() {
    [ -z "$(comm -12 <(slice_names) <(printf '%s\n' "$2" | sort))" ] && slices_are "$1"
}
# cleanup_dra [SELECTOR]: cleanup_common of the DRA overlay, the node's slices, and the test's pods and claim
# templates labelled SELECTOR.
cleanup_dra() {
    if [ -n "${1:-}" ]; then
        K delete pods -l "$1" --grace-period=0 --force >/dev/null 2>&1
        K delete resourceclaimtemplates -l "$1" >/dev/null 2>&1
    fi
    cleanup_common "$ROOT/daemonset/overlays/dra"
    K delete --ignore-not-found resourceslices --field-selector "spec.nodeName=$NODE" >/dev/null 2>&1
}

# fake_fabric_manager: the fake libnvfm's state file at $FM for the simulated 8x H200 board, shared-NVSwitch mode,
# nothing active. Module ids out of PCI order, as NVIDIA's HGX guide maps them (tests/fabric/fabric_fixture.h).
FM=$TMP/fm.state
fake_fabric_manager() {
    cat > "$FM" <<STATE
mode shared
epoch 0
gpu 1 0000:9a:00.0
gpu 2 0000:bb:00.0
gpu 3 0000:ab:00.0
gpu 4 0000:db:00.0
gpu 5 0000:18:00.0
gpu 6 0000:3b:00.0
gpu 7 0000:2a:00.0
gpu 8 0000:5d:00.0
active
unsupported
STATE
}
# The partitions FM has active (the fake's ids, space-separated).
fm_active() { flock "$FM" awk '$1 == "active" { $1 = ""; sub(/^ /, ""); print }' "$FM"; }
