#!/bin/sh
# /init of the e2e guest (see scripts/e2e-qemu.sh): mount the kernel file systems, load the drivers a real host
# would have loaded at boot, run /test/run and power off. QEMU runs with -no-reboot and the kernel with panic=-1,
# so any way this ends (poweroff, init exiting, panic) stops QEMU instead of hanging the harness.
export PATH=/bin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp

# Kernel command line switches from the harness: e2e.skip_bind=1, e2e.agent_loads_vfio=1.
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        e2e.*=*) key=${arg%%=*}; key=$(echo "${key#e2e.}" | tr 'a-z' 'A-Z'); export "E2E_$key=${arg#*=}" ;;
    esac
done

# Loopback up, as on any booted host: `run` serves its gRPC health port and metrics on 127.0.0.1.
ip link set lo up || echo "e2e-guest: ip link set lo up FAILED"

modules=/lib/modules/$(uname -r)
load_modules() {
    while read -r module; do
        insmod "$modules/$module" || echo "e2e-guest: insmod $module FAILED"
    done < "$1"
}
# Host NIC drivers first, so the virtio functions start out bound to virtio-pci like on a booted host.
load_modules /etc/e2e/modules.host
# vfio-pci normally is loaded already; with e2e.agent_loads_vfio=1 the agent has to load it itself (libkmod).
[ "${E2E_AGENT_LOADS_VFIO:-0}" = 1 ] || load_modules /etc/e2e/modules.vfio
echo "e2e-guest: kernel $(uname -r), uptime $(cut -d' ' -f1 /proc/uptime)s," \
     "iommu groups: $(ls /sys/kernel/iommu_groups | wc -l), modules: $(cut -d' ' -f1 /proc/modules | tr '\n' ' ')"

/test/run
echo "e2e-guest: /test/run exit=$? at uptime $(cut -d' ' -f1 /proc/uptime)s"
poweroff -f
