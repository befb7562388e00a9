#!/bin/bash
# vGPU nodes on the simulator (`scripts/demo.sh --vgpu`), one per host framework:
#   mdev:   a T4 (its PF is the mdev parent) and an A10 (Ampere: its SR-IOV VFs are the parents)
#   SR-IOV: an L40S and two H200 (vGPU 17+: a VF on nvidia with a type in nvidia/current_vgpu_type)
# For each: the vGPU manager's side (VFs enabled) -> serve --workload vm-vgpu -> vGPUs created (by writes to the
# simulated kernel's attributes, as a profiles config would) -> registered with the kubelet simulator -> node capacity per profile and one VM pod
# admitted with its Allocate response -> kubevirt-config --workload vm-vgpu -> validate --workload vm-vgpu with
# that KubeVirt entry and the GPU Operator's status files. Leaves nothing behind.
# Usage: scripts/demo-vgpu.sh    (BUILD_DIR=build/asan to use another build)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

source scripts/demo-common.sh

work=$(mktemp -d /tmp/vfio-gpu-agent-vgpu-demo.XXXXXX)
pids=()
stop_all() {
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null && wait "${pids[i]}" 2>/dev/null || true
  done
  pids=()
  for mount in "$work"/*/node/sys; do fusermount3 -u -z "$mount" 2>/dev/null || true; done
}
trap 'stop_all; rm -rf "$work"' EXIT

# One write to a kernel attribute, as sriov-manage or vgpu-device-manager make them.
write() { printf '%s' "$2" > "$1"; }
vf() { basename "$(readlink "$1/virtfn$2")"; }

# The vGPU manager's side of the mdev node, before the agent starts: the A10's VFs (its mdev parents) enabled.
prepare_mdev() { write "$1/bus/pci/devices/0000:86:00.0/sriov_numvfs" 32; }
# Then the vGPUs: 4x GRID T4-1Q on the T4, 6x NVIDIA A10-4Q on the A10's VFs.
create_mdev() {
  local sys=$1 t4=$1/bus/pci/devices/0000:3b:00.0 a10=$1/bus/pci/devices/0000:86:00.0 i
  for i in 1 2 3 4; do write "$t4/mdev_supported_types/nvidia-230/create" "$(cat /proc/sys/kernel/random/uuid)"; done
  for i in 0 1 2 3 4 5; do
    write "$sys/bus/pci/devices/$(vf "$a10" "$i")/mdev_supported_types/nvidia-591/create" "$(cat /proc/sys/kernel/random/uuid)"
  done
  waits=(nvidia.com/GRID_T4-1Q=4 nvidia.com/NVIDIA_A10-4Q=6)
  admit=nvidia.com/GRID_T4-1Q
}

# The SR-IOV node, before the agent starts: every card's VFs enabled (sriov-manage -e).
prepare_sriov() {
  local pf
  for pf in 0000:3b:00.0 0000:86:00.0 0000:af:00.0; do write "$1/bus/pci/devices/$pf/sriov_numvfs" 32; done
}
# Then the vGPUs: 4x NVIDIA L40S-4C, 7x NVIDIA H200X-1-18C on one H200, 1x H200X-141C on the other. Both H200 are
# full afterwards and list no type any more: their names come from what the agent read before (its state dir).
create_sriov() {
  local sys=$1 i
  for i in 0 1 2 3; do write "$sys/bus/pci/devices/$(vf "$sys/bus/pci/devices/0000:3b:00.0" "$i")/nvidia/current_vgpu_type" 1160; done
  for i in 0 1 2 3 4 5 6; do
    write "$sys/bus/pci/devices/$(vf "$sys/bus/pci/devices/0000:86:00.0" "$i")/nvidia/current_vgpu_type" 1414
  done
  write "$sys/bus/pci/devices/$(vf "$sys/bus/pci/devices/0000:af:00.0" 0)/nvidia/current_vgpu_type" 1428
  waits=(nvidia.com/NVIDIA_L40S-4C=4 nvidia.com/NVIDIA_H200X-1-18C=7 nvidia.com/NVIDIA_H200X-141C=1)
  admit=nvidia.com/NVIDIA_H200X-1-18C
}

# wait_for FILE PATTERN...: until FILE holds a line matching each pattern (10 s at most).
wait_for() {
  local file=$1 pattern found
  shift
  for _ in $(seq 1000); do
    found=1
    for pattern in "$@"; do grep -q "$pattern" "$file" 2>/dev/null || found=0; done
    [ "$found" = 1 ] && return 0
    sleep 0.01
  done
  echo "demo: $file never listed $*" >&2
  return 1
}

run_node() {
  local name=$1 node=$2 dir=$work/$1
  mkdir -p "$dir/kubelet" "$dir/state"
  step "$name node: $(basename "$node") mounted at $dir/node/sys (FUSE)"
  mkfifo "$dir/ready"
  "$sim" --node "$node" --root "$dir/node" > "$dir/ready" &
  pids+=($!)
  read -r ready_line < "$dir/ready"
  echo "$ready_line"
  local roots=(--sysfs-root "$dir/node/sys" --dev-root "$dir/node/dev" --proc-root "$dir/node/proc"
               --kubelet-dir "$dir/kubelet" --modules-root "$work/modules-none")

  step "$name: the vGPU manager's side, before the agent: VFs enabled through sysfs"
  "prepare_$name" "$dir/node/sys"

  step "$name: vfio-gpu-agent serve --workload vm-vgpu (background; state in $dir/state)"
  "$agent" serve "${roots[@]}" --workload vm-vgpu --state-dir "$dir/state" --no-udev --rescan-interval 200 \
    --log-level warn &
  pids+=($!)
  if [ "$name" = sriov ]; then
    # The type names of every card, remembered before the cards fill up and stop listing them.
    wait_for "$dir/state/vgpu-catalog.txt" '^0000:3b:00.0 10de:26b9 .* NVIDIA L40S-4C$' \
      '^0000:86:00.0 10de:2335 .* NVIDIA H200X-1-18C$' '^0000:af:00.0 10de:2335 .* NVIDIA H200X-141C$'
    echo "$dir/state/vgpu-catalog.txt: $(wc -l < "$dir/state/vgpu-catalog.txt") type names of 3 cards"
  fi

  step "$name: vGPUs created through sysfs (as a profiles config would), then the kubelet simulator in $dir/kubelet"
  "create_$name" "$dir/node/sys"
  printf '%s\n' "${waits[@]}"
  local wait_args=() item
  for item in "${waits[@]}"; do wait_args+=(--wait "$item"); done
  stdbuf -oL "$kubelet" --dir "$dir/kubelet" --pod-resources-socket "$dir/pod-resources.sock" "${wait_args[@]}" \
    --timeout-ms 10000 --admit "vm-vgpu-1:$admit=1" --describe --serve-forever > "$dir/kubelet.out" 2>&1 &
  pids+=($!)
  show_kubelet_report "$dir/kubelet.out" "${pids[-1]}"

  step "$name: vfio-gpu-agent kubevirt-config --workload vm-vgpu"
  "$agent" kubevirt-config "${roots[@]}" --workload vm-vgpu --state-dir "$dir/state" --log-level warn | tee "$dir/patch.yaml"

  step "$name: vfio-gpu-agent validate --workload vm-vgpu (that patch applied to a KubeVirt CR; status files in $dir/validations)"
  { printf 'apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: kubevirt, namespace: kubevirt}\n'
    sed 's/^  configuration:$/  configuration:\n    developerConfiguration: {featureGates: [HostDevices, GPU]}/' "$dir/patch.yaml"
  } > "$dir/kubevirt.yaml"
  "$agent" validate "${roots[@]}" --workload vm-vgpu --state-dir "$dir/state" \
    --pod-resources-socket "$dir/pod-resources.sock" --kubevirt-cr "$dir/kubevirt.yaml" \
    --status-dir "$dir/validations" --log-level warn || true
  echo "status files: $(cd "$dir/validations" && echo *)"
  stop_all
}

run_node mdev "$repo/tests/sim/nodes/vgpu-mdev-t4-a10.json"
run_node sriov "$repo/tests/sim/nodes/vgpu-sriov-l40s-h200.json"
step "done: both vGPU frameworks advertised, admitted and validated; cleaning up"
