#!/bin/bash
# The main job on the built-in simulated GPU node (8x H200 SXM + 4 NVSwitches on 2 NUMA nodes):
# inspect -> bind (nvidia -> vfio-pci) -> serve, registered with the kubelet simulator -> node capacity
# -> one VM pod admitted with its Allocate response -> validate (every layer). Sets the machine up first
# (root, Debian 12), takes seconds once built, and leaves nothing behind.
# Usage: scripts/demo.sh [node-file]     (default tests/sim/nodes/hgx-h200-8gpu.json)
#        scripts/demo.sh --vgpu          (vGPU nodes, mdev and SR-IOV: scripts/demo-vgpu.sh)
#        scripts/demo.sh --dra           (the kubelet DRA driver: slices, a claim prepared: scripts/demo-dra.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${1:-}" = "--vgpu" ] && exec scripts/demo-vgpu.sh
[ "${1:-}" = "--dra" ] && exec scripts/demo-dra.sh
repo=$PWD
node=${1:-$repo/tests/sim/nodes/hgx-h200-8gpu.json}

source scripts/demo-common.sh

work=$(mktemp -d /tmp/vfio-gpu-agent-demo.XXXXXX)
sim_pid=""; serve_pid=""; kubelet_pid=""
cleanup() {
  [ -n "$kubelet_pid" ] && kill "$kubelet_pid" 2>/dev/null && wait "$kubelet_pid" 2>/dev/null || true
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null || true
  [ -n "$sim_pid" ] && kill "$sim_pid" 2>/dev/null && wait "$sim_pid" 2>/dev/null || true
  fusermount3 -u -z "$work/node/sys" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

step "simulated node: $(basename "$node") mounted at $work/node/sys (FUSE) with devices in $work/node/dev"
mount_node "$node" "$work/node"

roots=(--sysfs-root "$work/node/sys" --dev-root "$work/node/dev" --proc-root "$work/node/proc"
       --kubelet-dir "$work/kubelet" --modules-root "$work/modules-none")
mkdir -p "$work/kubelet"

step "vfio-gpu-agent inspect"
"$agent" inspect "${roots[@]}" || true

step "vfio-gpu-agent bind"
"$agent" bind "${roots[@]}" --log-level warn

step "vfio-gpu-agent serve (background), kubelet simulator in $work/kubelet"
"$agent" serve "${roots[@]}" --no-udev --rescan-interval 200 --log-level warn &
serve_pid=$!

resource=$("$agent" inspect "${roots[@]}" --json | sed -n 's/.*"resourceName": "\(nvidia.com\/[^"]*\)".*/\1/p' | sort -u | head -1)
count=$("$agent" inspect "${roots[@]}" --json | grep -c "\"resourceName\": \"$resource\"")
# The kubelet simulator keeps serving (pod-resources too) so that `validate` below sees the whole chain; its
# output goes to a file, line-buffered so that it can be waited for.
stdbuf -oL "$kubelet" --dir "$work/kubelet" --pod-resources-socket "$work/pod-resources.sock" --wait "$resource=$count" \
  --timeout-ms 10000 --admit "vm-gpu-1:$resource=1" --describe --serve-forever > "$work/kubelet.out" 2>&1 &
kubelet_pid=$!
show_kubelet_report "$work/kubelet.out" "$kubelet_pid"

step "vfio-gpu-agent validate (every layer; a KubeVirt CR permitting $resource; status files in $work/validations)"
cat > "$work/kubevirt.yaml" <<EOF
apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {name: kubevirt, namespace: kubevirt}
spec:
  configuration:
    developerConfiguration: {featureGates: [HostDevices, GPU]}
    permittedHostDevices:
      pciHostDevices:
      - {pciVendorSelector: "10DE:2335", resourceName: $resource, externalResourceProvider: true}
EOF
"$agent" validate "${roots[@]}" --pod-resources-socket "$work/pod-resources.sock" --kubevirt-cr "$work/kubevirt.yaml" \
  --status-dir "$work/validations" --log-level warn || true

step "done: $count x $resource advertised; cleaning up"
