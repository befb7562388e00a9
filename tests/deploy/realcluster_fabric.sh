#!/bin/bash
# realcluster_fabric.sh - shared-NVSwitch mode against the REAL kubelet of ../shared/realcluster: `vfio-gpu-agent
# run --fabric-manager` on the simulated 8x H200 node with the fake libnvfm (tests/fabric), VM-like pods of 1, 2, 4
# and 8 GPUs admitted by the real scheduler and kubelet (GetPreferredAllocation, Allocate, pod-resources), then
# deleted. Not part of CI (the cluster is not there); tests/deploy/records/fabric.md
# records a run.
#
# Needs the cluster running with node gpu-node-1, the busybox image, and the kubelet started with NODE_DEV holding
# /dev/vfio nodes for the simulated groups (containerd creates them in the pods):
#   mkdir -p /tmp/fakedev/vfio; for g in vfio 11 13 15 17 19 21 23 25; do mknod /tmp/fakedev/vfio/$g c 1 3; done
#   # the iommufd cdevs too: the device plugin's --vfio-backend auto hands them out beside the group nodes when no
#   # KubeVirt release is known, and containerd stats every node it is given
#   mkdir -p /tmp/fakedev/vfio/devices; for n in $(seq 0 15); do mknod /tmp/fakedev/vfio/devices/vfio$n c 1 3; done
#   ./run.sh start all && NODE_DEV=/tmp/fakedev GOROOT=... ./kubelet-dra.sh start && GOROOT=... ./kubelet-dra.sh images
# Env: KUBECONFIG (the administrator's), WORK (/tmp/realcluster), BUILD (build/release: the agent, sysfs-sim and
# tests/fabric/lib/libnvfm.so.1).
# Exit 1 when an expectation failed: each pod's PCI_RESOURCE_ variable names exactly one FM partition, active in
# FM while the pod runs, and released within 10 s of the pod's deletion.
source "$(dirname "$0")/realcluster_common.sh"
RES=nvidia.com/GH100_H200_SXM_141GB
ENV_NAME=PCI_RESOURCE_NVIDIA_COM_GH100_H200_SXM_141GB
allocatable_is() { [ "$(K get node $NODE -o jsonpath="{.status.allocatable.nvidia\.com/GH100_H200_SXM_141GB}")" = "$1" ]; }
active_is() { [ "$(fm_active)" = "$1" ]; }

cleanup() {
    K delete pods -l vfio-gpu-agent-test=fabric --grace-period=0 --force >/dev/null 2>&1
    cleanup_common
}
trap cleanup EXIT

echo "== sysfs-sim (hgx-h200-8gpu) in the kubelet's mount namespace, GPUs on vfio-pci; the fake Fabric Manager"
start_sim hgx-h200-8gpu.json
fake_fabric_manager

echo "== agent: run --fabric-manager unix:$FM"
in_kubelet_ns "$BUILD/src/cli/vfio-gpu-agent" run --node-name $NODE \
    --sysfs-root "$TMP/node/sys" --dev-root "$TMP/node/dev" --proc-root "$TMP/node/proc" --modules-root "$TMP/modules" \
    --no-udev --listen-address 127.0.0.1 --health-port 18081 --metrics-port 19400 \
    --fabric-manager "unix:$FM" --fabric-library "$BUILD/tests/fabric/lib/libnvfm.so.1" > "$TMP/agent.log" 2>&1 &
agent=$!
expect "allocatable $RES: 8" wait_for allocatable_is 8

# partition_of BDF-LIST: the fake's partition id of exactly these GPUs (its table: tests/fabric/fake_nvfm_state.cc).
partition_of() {
    python3 - "$1" "$FM" <<'PY'
import sys
gpus = set(sys.argv[1].split(","))
module = {}
for line in open(sys.argv[2]):
    w = line.split()
    if w and w[0] == "gpu": module[w[2]] = int(w[1])
layout = [list(range(1, 9)), [1, 2, 3, 4], [5, 6, 7, 8], [1, 2], [3, 4], [5, 6], [7, 8]] + [[m] for m in range(1, 9)]
wanted = sorted(module.get(g, 0) for g in gpus)
print(next((i for i, p in enumerate(layout) if sorted(p) == wanted), -1))
PY
}
pod() {  # pod NAME GPUS
    K apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, labels: {vfio-gpu-agent-test: fabric}}
spec:
  nodeName: $NODE
  hostNetwork: true
  terminationGracePeriodSeconds: 0
  containers:
  - name: vm
    image: localhost/tools:local
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources: {limits: {$RES: "$2"}}
EOF
}
echo "== a pod of 3 GPUs: no partition has 3"
pod vm3 3
wait_for sh -c "kubectl get pod vm3 -o jsonpath='{.status.phase} {.status.reason}' | grep -q UnexpectedAdmissionError"
echo "   $(K get pod vm3 -o jsonpath='{.status.phase} {.status.reason}: {.status.message}' | cut -c1-240)"
expect "vm3 refused at admission, naming the partition sizes" sh -c "kubectl get pod vm3 -o jsonpath='{.status.message}' | grep -q 'sizes: 1, 2, 4, 8'"
K delete pod vm3 --grace-period=0 --force >/dev/null 2>&1
wait_for sh -c "! kubectl get pod vm3 >/dev/null 2>&1"
declare -A PART
for spec in vm4:4 vm2:2 vm1:1; do
    name=${spec%%:*}; n=${spec##*:}
    echo "== pod $name asks for $n GPUs"
    pod "$name" "$n"
    K wait --for=condition=Ready "pod/$name" --timeout=60s >/dev/null || { K describe pod "$name" | tail -5; failed=1; continue; }
    bdfs=$(K exec "$name" -- sh -c "echo \$$ENV_NAME")
    p=$(partition_of "$bdfs")
    PART[$name]=$p
    echo "   $ENV_NAME=$bdfs -> partition P$p"
    expect "$name's GPUs are one partition" [ "$p" -ge 0 ]
    expect "$name's /dev/vfio nodes" K exec "$name" -- sh -c "ls /dev/vfio/vfio >/dev/null"
done
expect "FM active: the three pods' partitions ($(fm_active))" \
    [ "$(fm_active | tr ' ' '\n' | sort -n | tr '\n' ' ')" = "$(printf '%s\n' "${PART[@]}" | sort -n | tr '\n' ' ')" ]
echo "== delete every pod; partitions released within 10 s"
K delete pods -l vfio-gpu-agent-test=fabric --grace-period=0 --force >/dev/null 2>&1
start=$(date +%s.%N)
for _ in $(seq 200); do active_is "" && break; sleep 0.1; done
took=$(echo "$(date +%s.%N) - $start" | bc)
expect "no partition active ${took}s after the pods were deleted" [ "$(fm_active)" = "" ]
expect "released within 10 s" [ "$(echo "$took < 10" | bc)" = 1 ]
echo "== a pod of all 8"
pod vm8 8
K wait --for=condition=Ready pod/vm8 --timeout=60s >/dev/null && expect "vm8 has partition P0" active_is "0"
echo "   agent log: $(wc -l < "$TMP/agent.log") lines"
grep -E "fabric:|allocate|warning|error" "$TMP/agent.log" | cut -c1-220 | sed 's/^/   log: /'
exit $failed
