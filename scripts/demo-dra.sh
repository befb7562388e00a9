#!/bin/bash
# The agent as a kubelet DRA driver on the simulated 8x H200 node (`scripts/demo.sh --dra`): bind (nvidia ->
# vfio-pci) -> serve --kubelet-api dra against the fake API server (tests/sim/kube_api_sim) -> the node's
# ResourceSlice, one device per GPU -> a VM's ResourceClaim allocated to two GPUs (one per request, KubeVirt's
# shape) prepared through the kubelet DRA simulator -> its CDI spec and the KEP-5304 metadata file KubeVirt reads.
# Leaves nothing behind.
# Usage: scripts/demo-dra.sh    (BUILD_DIR=build/asan to use another build)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
node=$repo/tests/sim/nodes/hgx-h200-8gpu.json
driver=gpu.vfio-agent.cozystack.io
claim_uid=7d5c1a2e-4f3b-4c8d-9e0a-1b2c3d4e5f60

source scripts/demo-common.sh
kubelet_dra=$bin/tests/sim/kubelet_dra_sim/kubelet-dra-sim

work=$(mktemp -d /tmp/vfio-gpu-agent-dra-demo.XXXXXX)
sim_pid=""; serve_pid=""; api_pid=""; api_in=""
cleanup() {
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null || true
  # The fake API server stops when its control input closes.
  if [ -n "$api_in" ]; then exec {api_in}>&-; fi
  [ -n "$api_pid" ] && wait "$api_pid" 2>/dev/null || true
  [ -n "$sim_pid" ] && kill "$sim_pid" 2>/dev/null && wait "$sim_pid" 2>/dev/null || true
  fusermount3 -u -z "$work/node/sys" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# api COMMAND: one control command to the fake API server; prints its answer's JSON (after "OK "), fails on "ERR".
api() {
  local reply
  printf '%s\n' "$1" >&"$api_in"
  read -r reply <&"$api_out"
  case "$reply" in OK*) printf '%s\n' "${reply#OK}" ;; *) echo "demo: kube-api-sim: $1: $reply" >&2; return 1 ;; esac
}

step "simulated node: $(basename "$node") mounted at $work/node/sys (FUSE)"
mount_node "$node" "$work/node"
roots=(--sysfs-root "$work/node/sys" --dev-root "$work/node/dev" --proc-root "$work/node/proc"
       --modules-root "$work/modules-none")
# The driver's checkpoint is kept per boot: the simulated node's boot ID.
mkdir -p "$work/node/proc/sys/kernel/random"
cat /proc/sys/kernel/random/uuid > "$work/node/proc/sys/kernel/random/boot_id"

step "vfio-gpu-agent bind"
"$agent" bind "${roots[@]}" --log-level warn

step "fake Kubernetes API (node node-a) and its kubeconfig"
mkfifo "$work/api.in" "$work/api.out"
python3 "$repo/tests/sim/kube_api_sim/kube_api_sim.py" --node node-a --token demo --log "$work/api.log" \
  < "$work/api.in" > "$work/api.out" &
api_pid=$!
exec {api_in}>"$work/api.in" {api_out}<"$work/api.out"
read -r listening <&"$api_out"
echo "$listening"
cat > "$work/kubeconfig" <<EOF
apiVersion: v1
kind: Config
current-context: sim
clusters: [{name: sim, cluster: {server: ${listening#LISTENING }}}]
users: [{name: sim, user: {token: demo}}]
contexts: [{name: sim, context: {cluster: sim, user: sim}}]
EOF

step "vfio-gpu-agent serve --kubelet-api dra (background): registry $work/registry, CDI specs in $work/cdi"
"$agent" serve "${roots[@]}" --kubelet-api dra --kubelet-registry-dir "$work/registry" \
  --kubelet-plugins-dir "$work/plugins" --cdi-dir "$work/cdi" --kubeconfig "$work/kubeconfig" --node-name node-a \
  --no-udev --rescan-interval 200 --log-level warn &
serve_pid=$!

step "the node's ResourceSlices, as the driver published them"
for _ in $(seq 1000); do
  [ "$(api slices)" != " []" ] && break
  kill -0 "$serve_pid" || { echo "demo: serve exited" >&2; exit 1; }
  sleep 0.01
done
# One line per device with what a DeviceClass selects on, then one device as the API has it.
show_slices=$(cat <<'PY'
import json, sys
for s in json.load(sys.stdin):
    spec = s['spec']
    print(f"{s['metadata']['name']}: driver {spec['driver']}, node {spec['nodeName']}, pool {spec['pool']['name']} "
          f"(generation {spec['pool']['generation']}), {len(spec['devices'])} devices")
    for d in spec['devices']:
        a = {k.split('/')[-1]: next(iter(v.values())) for k, v in d['attributes'].items()}
        print(f"  {d['name']}  pciBusID={a['pciBusID']} resourceName={a['resourceName']} numaNode={a.get('numaNode')} "
              f"iommuGroup={a['iommuGroup']} pcieRoot={a.get('pcieRoot')}" + ('  TAINTED' if d.get('taints') else ''))
    print('first device in full:')
    print(json.dumps(spec['devices'][0], indent=2))
PY
)
api slices | python3 -c "$show_slices"

step "a VM's ResourceClaim vms/vm-gpus, allocated by the scheduler to two GPUs (one per request)"
make_claim=$(cat <<'PY'
import json, sys
uid, driver = sys.argv[1], sys.argv[2]
results = [{'request': f'gpu{i}', 'driver': driver, 'pool': 'node-a', 'device': d}
           for i, d in enumerate(['gpu-0000-18-00-0', 'gpu-0000-2a-00-0'])]
requests = [{'name': f'gpu{i}', 'exactly': {'deviceClassName': 'vfio-gpu'}} for i in range(2)]
print(json.dumps({'metadata': {'namespace': 'vms', 'name': 'vm-gpus', 'uid': uid},
                  'spec': {'devices': {'requests': requests}},
                  'status': {'allocation': {'devices': {'results': results}}}}))
PY
)
claim=$(python3 -c "$make_claim" "$claim_uid" "$driver")
api "claim $claim" >/dev/null
echo "$claim" | python3 -m json.tool

step "kubelet DRA simulator: registration, health stream, NodePrepareResources of the claim"
"$kubelet_dra" --registry-dir "$work/registry" --driver "$driver" --prepare "vms/vm-gpus/$claim_uid"

step "the claim's CDI spec: $work/cdi/${driver}_claim_$claim_uid.json"
cat "$work/cdi/${driver}_claim_$claim_uid.json"

for file in "$work/plugins/$driver/dra-device-metadata/vms_vm-gpus"/*/metadata.json; do
  step "KEP-5304 metadata (bind-mounted where virt-launcher reads it): $file"
  python3 -m json.tool --json-lines < "$file"   # one object per version, newest first
done

step "done: 8 GPUs published, a 2-GPU claim prepared; cleaning up"
