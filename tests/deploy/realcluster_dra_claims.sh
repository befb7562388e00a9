#!/bin/bash
# realcluster_dra_claims.sh - pods that get their GPUs through DRA from `vfio-gpu-agent run --kubelet-api dra`
# against the REAL scheduler, kubelet (v1.36) and containerd (CDI) of ../shared/realcluster, on the simulated 8x
# H200 node, with the agent's own pod-bound token under the DRA overlay (RBAC, admission policy, DeviceClasses):
#   1. a pod that asks for `nvidia.com/GH100_H200_SXM_141GB: 1` as on a device-plugin node (DRAExtendedResource: the
#      scheduler makes the claim) gets PCI_RESOURCE_NVIDIA_COM_GH100_H200_SXM_141GB and the group's /dev/vfio node;
#      one asking for 2 gets both BDFs comma-joined;
#   2. a pod with a ResourceClaimTemplate of the model's DeviceClass gets the KEP-5304 metadata file KubeVirt reads
#      (pciBusID) at its path;
#   3. deleting the pods unprepares their claims: no CDI spec of ours is left;
#   4. with --bind-on-prepare, the GPUs stay on nvidia until a pod's claim binds its group to vfio-pci, and go back
#      to nvidia after the pod is deleted;
#   5. with --fabric-manager (the fake libnvfm), the slices carry the partition attributes, a claim of two requests
#      tied by matchAttribute on partition2 activates exactly one 2-GPU partition, released after the pod goes, and
#      the PartitionActivated and PartitionReleased events name the claim.
# Not part of CI (the cluster is not there); tests/deploy/records/dra.md records a run.
#
# Needs the cluster running, and the kubelet started with NODE_DEV holding /dev/vfio nodes for the simulated groups
# (containerd creates them in the pods):
#   mkdir -p /tmp/fakedev/vfio; for g in vfio 11 13 15 17 19 21 23 25; do mknod /tmp/fakedev/vfio/$g c 1 3; done
#   # the iommufd cdevs too: the device plugin's --vfio-backend auto hands them out beside the group nodes when no
#   # KubeVirt release is known, and containerd stats every node it is given
#   mkdir -p /tmp/fakedev/vfio/devices; for n in $(seq 0 15); do mknod /tmp/fakedev/vfio/devices/vfio$n c 1 3; done
#   ./run.sh start all && NODE_DEV=/tmp/fakedev GOROOT=... ./kubelet-dra.sh start && GOROOT=... ./kubelet-dra.sh images
# Env: KUBECONFIG (the administrator's), WORK (/tmp/realcluster), BUILD (build/release: the agent, sysfs-sim and
#      tests/fabric/lib/libnvfm.so.1).
source "$(dirname "$0")/realcluster_common.sh"
RES=nvidia.com/GH100_H200_SXM_141GB
ENV_NAME=PCI_RESOURCE_NVIDIA_COM_GH100_H200_SXM_141GB
CLASS=gh100-h200-sxm-141gb.$DRIVER
CDI_DIR=$WORK/kubelet-dra/cdi
trap 'cleanup_dra vfio-gpu-agent-test=dra-claims' EXIT

agent_identity "$ROOT/daemonset/overlays/dra"

ours_in_cdi() { ls "$CDI_DIR" 2>/dev/null | grep -c "^${DRIVER}_claim_"; }
no_cdi_specs() { [ "$(ours_in_cdi)" = 0 ]; }
pod_running() { [ "$(K get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null)" = Running ]; }
# expect_running POD: waits for it; when it does not run, its events say why.
expect_running() {
    expect "pod $1 running" wait_for pod_running "$1" ||
        K describe pod "$1" 2>&1 | sed -n '/^Events:/,$p' | tail -6 | cut -c1-220 | sed 's/^/      /'
}
pod_gone() { ! K get pod "$1" >/dev/null 2>&1; }
# The simulated sysfs is mounted in the kubelet's mount namespace only.
in_ns() { nsenter -t "$(cat "$WORK/kubelet-dra/containerd.pid")" -m -- "$@"; }
driver_of() { basename "$(in_ns readlink "$TMP/node/sys/bus/pci/devices/$1/driver")" 2>/dev/null; }
group_of() { basename "$(in_ns readlink "$TMP/node/sys/bus/pci/devices/$1/iommu_group")"; }

start_agent() {  # start_agent [FLAGS...]
    in_kubelet_ns "$BUILD/src/cli/vfio-gpu-agent" run --node-name $NODE \
        --kubeconfig "$TMP/agent.kubeconfig" --kubelet-api dra "$@" \
        --sysfs-root "$TMP/node/sys" --dev-root "$TMP/node/dev" --proc-root /proc \
        --modules-root "$TMP/modules" --no-udev --listen-address 127.0.0.1 --health-port 18081 \
        --metrics-port 19400 >> "$TMP/agent.log" 2>&1 &
    agent=$!
    expect "ResourceSlices of $NODE hold 8 devices" wait_for slices_are 8
}
stop_agent() {
    kill -TERM "$agent"; wait "$agent"; local code=$?; agent=
    expect "agent exit code 0 ($code)" [ "$code" = 0 ]
}

# pod NAME [extended GPUS | claim TEMPLATE]: a VM-like pod that prints what it got and sleeps.
pod() {
    local resources="" claims=""
    if [ "$2" = extended ]; then
        resources="resources: {limits: {$RES: $3}}"
    else
        claims="resourceClaims: [{name: gpu, resourceClaimTemplateName: $3}]"
        resources="resources: {claims: [{name: gpu}]}"
    fi
    K apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, labels: {vfio-gpu-agent-test: dra-claims}}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 0
  # Through the scheduler (it makes the extended-resource claim), onto a node that has no CNI and so stays NotReady.
  tolerations: [{key: node.kubernetes.io/not-ready, operator: Exists, effect: NoSchedule}]
  $claims
  containers:
  - name: vm
    image: localhost/tools:local
    imagePullPolicy: Never
    command: [sh, -c, 'env | grep ^PCI_RESOURCE_ ; ls /dev/vfio | sort | tr "\n" " "; echo;
              find /var/run/kubernetes.io/dra-device-attributes -name "*.json" -exec cat {} \; 2>/dev/null; sleep 3600']
    $resources
EOF
}
pod_log() { K logs "$1" 2>/dev/null; }
env_of() { pod_log "$1" | sed -n "s/^$ENV_NAME=//p"; }
claim_of() { K get pod "$1" -o jsonpath='{.status.extendedResourceClaimStatus.resourceClaimName}{.status.resourceClaimStatuses[0].resourceClaimName}'; }
claim_devices() {  # the BDFs the claim was allocated, from the slices' pciBusID attribute
    local devices
    devices=$(K get resourceclaim "$1" -o jsonpath='{range .status.allocation.devices.results[*]}{.device}{"\n"}{end}')
    for d in $devices; do
        K get resourceslices --field-selector "spec.nodeName=$NODE" -o json | python3 -c '
import json, sys
name = sys.argv[1]
for s in json.load(sys.stdin)["items"]:
    for d in s["spec"]["devices"]:
        if d["name"] == name: print(d["attributes"]["resource.kubernetes.io/pciBusID"]["string"])' "$d"
    done | sort | paste -sd, -
}
bdfs_in_env() { env_of "$1" | tr ',' '\n' | sort | paste -sd, -; }

echo "== sysfs-sim (hgx-h200-8gpu: GPUs on nvidia) in the kubelet's mount namespace"
start_sim hgx-h200-8gpu.json

echo "== 1. agent: run --kubelet-api dra (binds the 8 GPUs); pods ask for $RES as on a device-plugin node"
start_agent
pod ext-1 extended 1
pod ext-2 extended 2
expect_running ext-1
expect_running ext-2
log_has_env() { [ -n "$(env_of "$1")" ]; }
wait_for log_has_env ext-1; wait_for log_has_env ext-2
for p in ext-1 ext-2; do
    claim=$(claim_of $p)
    echo "   $p: claim $claim; $(pod_log $p | head -2 | tr '\n' ';')"
    annotation=$(K get resourceclaim "$claim" -o jsonpath='{.metadata.annotations.resource\.kubernetes\.io/extended-resource-claim}')
    expect "$p: the scheduler made claim $claim for the extended resource (annotation '$annotation')" [ "$annotation" = true ]
    expect "$p: $ENV_NAME = the claim's BDFs ($(bdfs_in_env $p) = $(claim_devices "$claim"))" \
        [ -n "$(bdfs_in_env $p)" ] && [ "$(bdfs_in_env $p)" = "$(claim_devices "$claim")" ]
    nodes=$(pod_log $p | sed -n 2p)
    for bdf in $(env_of $p | tr ',' ' '); do
        expect "$p: /dev/vfio/$(group_of "$bdf") of $bdf in the container" grep -qw "$(group_of "$bdf")" <<< "$nodes"
    done
done
expect "ext-2 got 2 GPUs" [ "$(env_of ext-2 | tr ',' '\n' | grep -c .)" = 2 ]

echo "== 2. a pod with a ResourceClaimTemplate of DeviceClass $CLASS"
K apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: h200-1, labels: {vfio-gpu-agent-test: dra-claims}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: $CLASS, count: 1}
EOF
pod tmpl-1 claim h200-1
expect_running tmpl-1
metadata_seen() { pod_log tmpl-1 | grep -q pciBusID; }
expect "tmpl-1 reads the KEP-5304 metadata file" wait_for metadata_seen
claim=$(claim_of tmpl-1)
bdf=$(claim_devices "$claim")
pod_log tmpl-1 | sed -n '/^{/,$p' > "$TMP/metadata.json"
head -c 600 "$TMP/metadata.json" | sed 's/^/   raw: /'; echo
python3 -c '
import json, sys
text = sys.stdin.read()
objects, at = [], 0
decoder = json.JSONDecoder()
while at < len(text):
    while at < len(text) and text[at].isspace(): at += 1
    if at >= len(text): break
    obj, at = decoder.raw_decode(text, at); objects.append(obj)
for o in objects:
    for r in o.get("requests", []):
        for d in r.get("devices", []):
            print("   metadata:", o.get("apiVersion"), r.get("name"), d.get("name"),
                  d.get("attributes", {}).get("resource.kubernetes.io/pciBusID"))' < "$TMP/metadata.json" > "$TMP/metadata.txt"
cat "$TMP/metadata.txt"
expect "tmpl-1: the metadata's pciBusID is the claim's device ($bdf)" grep -q "'string': '$bdf'" "$TMP/metadata.txt"
expect "3 CDI specs of ours while 3 claims are prepared ($(ours_in_cdi))" [ "$(ours_in_cdi)" = 3 ]

echo "== 3. pods deleted: every claim unprepared"
K delete pods -l vfio-gpu-agent-test=dra-claims --wait=false >/dev/null
expect "pods gone" wait_for pod_gone tmpl-1
expect "no CDI spec of ours left" wait_for no_cdi_specs
stop_agent

echo "== 4. --bind-on-prepare: the GPUs go back to nvidia and stay there until a claim needs them"
in_ns "$BUILD/src/cli/vfio-gpu-agent" unbind --sysfs-root "$TMP/node/sys" --dev-root "$TMP/node/dev" \
    --proc-root /proc --modules-root "$TMP/modules" --all 2>&1 | tail -1 | sed 's/^/   /'
start_agent --bind-on-prepare
GPUS="0000:18:00.0 0000:2a:00.0 0000:3b:00.0 0000:5d:00.0 0000:9a:00.0 0000:ab:00.0 0000:bb:00.0 0000:db:00.0"
on_nvidia=0
for gpu in $GPUS; do [ "$(driver_of $gpu)" = nvidia ] && on_nvidia=$((on_nvidia + 1)); done
expect "8 GPUs on nvidia while no claim holds them ($on_nvidia)" [ "$on_nvidia" = 8 ]
pod bop-1 extended 1
expect_running bop-1
wait_for log_has_env bop-1
bdf=$(env_of bop-1)
expect "bop-1: $bdf on vfio-pci while the pod runs ($(driver_of "$bdf"))" [ "$(driver_of "$bdf")" = vfio-pci ]
K delete pod bop-1 --wait=false >/dev/null
expect "bop-1 gone" wait_for pod_gone bop-1
back_on_nvidia() { [ "$(driver_of "$bdf")" = nvidia ]; }
expect "$bdf back on nvidia after the claim's Unprepare" wait_for back_on_nvidia
expect "no CDI spec of ours left" wait_for no_cdi_specs
stop_agent

echo "== 5. Fabric Manager (fake libnvfm, shared-NVSwitch mode): a claim of 2 requests tied by matchAttribute"
# The fake's layout (tests/fabric/fake_nvfm_state.cc): P0 all 8, P1-P2 fours, P3-P6 pairs (modules 1-2, 3-4, 5-6,
# 7-8), P7-P14 singles.
fake_fabric_manager
start_agent --fabric-manager "unix:$FM" --fabric-library "$BUILD/tests/fabric/lib/libnvfm.so.1"
partition_attrs() {
    K get resourceslices --field-selector "spec.nodeName=$NODE" -o json | python3 -c '
import json, sys
names = set()
for s in json.load(sys.stdin)["items"]:
    for d in s["spec"]["devices"]: names |= {k.split("/")[1] for k in d["attributes"] if "/partition" in k}
print(" ".join(sorted(names)))'
}
attrs_published() { [ "$(partition_attrs)" = "partition1 partition2 partition4 partition8" ]; }
wait_for attrs_published
expect "the slices carry the partition attributes ($(partition_attrs))" attrs_published
K apply -f - >/dev/null <<TEMPLATE
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: h200-pair, labels: {vfio-gpu-agent-test: dra-claims}}
spec:
  spec:
    devices:
      requests:
      - {name: gpu-0, exactly: {deviceClassName: $CLASS}}
      - {name: gpu-1, exactly: {deviceClassName: $CLASS}}
      constraints:
      - matchAttribute: $DRIVER/partition2
TEMPLATE
pod fm-2 claim h200-pair
expect_running fm-2
pair=$(claim_devices "$(claim_of fm-2)")
active_one() { [ -n "$(fm_active)" ]; }
wait_for active_one
expect "fm-2's claim ($pair) activated one 2-GPU FM partition (active: $(fm_active))" \
    [ "$(fm_active | wc -w)" = 1 ] && [ "$(fm_active)" -ge 3 ] && [ "$(fm_active)" -le 6 ]
K delete pod fm-2 --wait=false >/dev/null
expect "fm-2 gone" wait_for pod_gone fm-2
none_active() { [ -z "$(fm_active)" ]; }
expect "its partition released after the claim's Unprepare" wait_for none_active
event_note() {  # event_note REASON: the note of the agent's newest event of that reason on the node
    K get events.events.k8s.io -n default --field-selector "reason=$1,regarding.name=$NODE" \
        -o jsonpath='{range .items[*]}{.note}{"\n"}{end}' 2>/dev/null | tail -1
}
for reason in PartitionActivated PartitionReleased; do
    names_claim() { event_note $reason | grep -q "claim default/fm-2-gpu-"; }
    wait_for names_claim
    expect "a $reason event names the claim: $(event_note $reason | cut -c1-160)" names_claim
done
stop_agent

agent_log_summary
grep -E "^[^ ]+ (warning|error) " "$TMP/agent.log" | cut -c1-200 | sed 's/^/   log: /'
grep -E "DRA claim|Prepare|prepared" "$TMP/agent.log" | cut -c1-200 | head -12 | sed 's/^/   log: /'
exit $failed
