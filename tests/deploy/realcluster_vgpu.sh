#!/bin/bash
# realcluster_vgpu.sh - a vGPU node and its mode switch against the REAL kubelet and kube-apiserver of
# ../shared/realcluster: `vfio-gpu-agent run` without --workload (the node label decides, as the chart's
# `workloadMode: label` runs it) on the simulated SR-IOV node (an L40S and two H200, vgpu-sriov-l40s-h200), with
# the agent's own pod-bound token under the vgpu overlay's RBAC and admission policy. The node is labelled vm-vgpu
# with a profiles config, then relabelled vm-passthrough while the agent runs.
# Not part of CI (the cluster is not there); tests/deploy/records/vgpu.md records a run.
#
# Needs the cluster running as for realcluster_run.sh (./run.sh start all, kubelet-dra.sh start and images).
# Env: KUBECONFIG (the administrator's), WORK (/tmp/realcluster), BUILD (build/release: the agent and sysfs-sim).
# Exit 1 when an expectation failed: 6 H200X-1-18C vGPUs in the node's capacity and the state label `success`
# written by the agent itself; after the relabel the vGPU resource at 0, the whole GPUs on vfio-pci and in the
# capacity, the state label gone, a WorkloadModeChanged event; exit 0 on SIGTERM.
source "$(dirname "$0")/realcluster_common.sh"
VGPU=nvidia.com/NVIDIA_H200X-1-18C
H200=nvidia.com/GH100_H200_SXM_141GB
L40S=nvidia.com/AD102GL_L40S
capacity() { K get node $NODE -o jsonpath="{.status.capacity.${1//./\\.}}"; }
allocatable() { K get node $NODE -o jsonpath="{.status.allocatable.${1//./\\.}}"; }
capacity_is() { [ "$(capacity "$1")" = "$2" ]; }
allocatable_is() { [ "$(allocatable "$1")" = "$2" ]; }
state_is() { [ "$(K get node $NODE -o jsonpath='{.metadata.labels.nvidia\.com/vgpu\.config\.state}')" = "$1" ]; }
event_seen() { K get events.events.k8s.io -n default --field-selector "regarding.name=$NODE,reason=$1" --no-headers 2>/dev/null | grep -q .; }
# sysfs as the kubelet's mount namespace sees it (the FUSE node is mounted there only).
host_write() { nsenter -t "$(cat "$WORK/kubelet-dra/containerd.pid")" -m -- sh -c "echo $2 > $TMP/node/sys/bus/pci/devices/$1"; }
host_read() { nsenter -t "$(cat "$WORK/kubelet-dra/containerd.pid")" -m -- cat "$TMP/node/sys/bus/pci/devices/$1"; }
driver_of() { nsenter -t "$(cat "$WORK/kubelet-dra/containerd.pid")" -m -- readlink "$TMP/node/sys/bus/pci/devices/$1/driver" | xargs -r basename; }
cleanup() {
    cleanup_common "$ROOT/daemonset/overlays/vgpu"
    K label node $NODE nvidia.com/gpu.workload.config- nvidia.com/vgpu.config- nvidia.com/vgpu.config.state- >/dev/null 2>&1
}
trap cleanup EXIT

agent_identity "$ROOT/daemonset/overlays/vgpu"
echo "== sysfs-sim (vgpu-sriov-l40s-h200: L40S 0000:3b:00.0, H200 0000:86:00.0 and 0000:af:00.0, all on nvidia)"
start_sim vgpu-sriov-l40s-h200.json
echo "== the vGPU manager's side: every card's VFs enabled (sriov-manage -e)"
for pf in 0000:3b:00.0 0000:86:00.0 0000:af:00.0; do host_write "$pf/sriov_numvfs" 32; done
echo "   sriov_numvfs: $(for pf in 0000:3b:00.0 0000:86:00.0 0000:af:00.0; do printf '%s ' "$(host_read "$pf/sriov_numvfs")"; done)"
cat > "$TMP/vgpu-config.yaml" <<EOF
version: v1
vgpu-configs:
  h200-small-3:
    - devices: all
      device-filter: 0x233510DE
      vgpu-devices: {H200X-1-18C: 3}
EOF
K label node $NODE nvidia.com/gpu.workload.config=vm-vgpu nvidia.com/vgpu.config=h200-small-3 --overwrite | sed 's/^/   /'

echo "== agent start (run, the mode from the node label)"
in_kubelet_ns "$BUILD/src/cli/vfio-gpu-agent" run --node-name $NODE --kubeconfig "$TMP/agent.kubeconfig" \
    --sysfs-root "$TMP/node/sys" --dev-root "$TMP/node/dev" --proc-root "$TMP/node/proc" \
    --modules-root "$TMP/modules" --no-udev --state-dir "$TMP/state" --vgpu-config-file "$TMP/vgpu-config.yaml" \
    --workload-label-interval 1000 --listen-address 127.0.0.1 --health-port 18081 \
    --metrics-port 19400 >> "$TMP/agent.log" 2>&1 &
agent=$!
expect "capacity $VGPU: 6 (3 on each H200)" wait_for capacity_is $VGPU 6
expect "allocatable $VGPU: 6" wait_for allocatable_is $VGPU 6
expect "node label nvidia.com/vgpu.config.state=success, written by the agent" wait_for state_is success
expect "the GPUs stay on nvidia" [ "$(driver_of 0000:86:00.0)/$(driver_of 0000:af:00.0)/$(driver_of 0000:3b:00.0)" = nvidia/nvidia/nvidia ]

echo "== relabel: nvidia.com/gpu.workload.config=vm-passthrough (the agent keeps running)"
K label node $NODE nvidia.com/gpu.workload.config=vm-passthrough --overwrite | sed 's/^/   /'
expect "event WorkloadModeChanged" wait_for event_seen WorkloadModeChanged
expect "capacity $VGPU: 0 (the vGPU plugin deregistered)" wait_for capacity_is $VGPU 0
expect "capacity $H200: 2" wait_for capacity_is $H200 2
expect "capacity $L40S: 1" wait_for capacity_is $L40S 1
no_state_label() { ! K get node $NODE -o jsonpath='{.metadata.labels}' | grep -q 'vgpu.config.state'; }
expect "the state label removed (no vGPU config on a passthrough node)" wait_for no_state_label
expect "the GPUs on vfio-pci" [ "$(driver_of 0000:86:00.0)/$(driver_of 0000:af:00.0)/$(driver_of 0000:3b:00.0)" = vfio-pci/vfio-pci/vfio-pci ]

echo "== SIGTERM"
start=$(date +%s%N)
kill -TERM "$agent"; wait "$agent"; code=$?; agent=
expect "agent exit code 0 ($code, $(( ($(date +%s%N) - start) / 1000000 )) ms after SIGTERM)" [ "$code" = 0 ]

echo "== what the API holds"
K get node $NODE -o json | python3 -c 'import json,sys; n=json.load(sys.stdin); print("   capacity:", {k: v for k, v in n["status"]["capacity"].items() if "/" in k}); print("   labels:", {k: v for k, v in n["metadata"]["labels"].items() if k.startswith("nvidia.com/")})'
K get events.events.k8s.io -n default --field-selector "regarding.name=$NODE,reportingController=vfio-gpu-agent" \
    -o custom-columns=TYPE:.type,REASON:.reason,NOTE:.note --no-headers | cut -c1-200 | sed 's/^/   event: /'
agent_log_summary
grep -E "^[^ ]+ (warning|error) " "$TMP/agent.log" | cut -c1-200 | sed 's/^/   log: /'
exit $failed
