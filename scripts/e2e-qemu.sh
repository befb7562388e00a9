#!/bin/bash
# e2e-qemu.sh - prove vfio-gpu-agent on a real kernel: boot Debian's kernel under QEMU (TCG, q35, emulated Intel
# VT-d) with virtio-net, edu and bridge topologies, run the agent inside (scripts/e2e/guest-test.sh): bind, unbind
# and validate, then `run` under the kubelet simulator with readiness read through its gRPC health port. Judged by
# sysfs, by opening VFIO groups/devices (tests/e2e/vfio-check.c) and by grpc.health.v1 (tests/e2e/health_probe.cc).
#
# Usage: e2e-qemu.sh AGENT [KUBELET_SIM [HEALTH_PROBE]]   (or AGENT=... KUBELET_SIM=... HEALTH_PROBE=...)
#        KUBELET_SIM and HEALTH_PROBE default to tests/sim/kubelet_sim/kubelet-sim and tests/e2e/health-probe of
#        the build tree the agent binary (<build>/src/cli/vfio-gpu-agent) belongs to.
# Env:   E2E_SKIP_BIND=1          self-check: skip the agent's bind step (and `run`, which would bind); the run
#                                 must then FAIL
#        E2E_AGENT_LOADS_VFIO=1   do not preload vfio-pci in the guest: the agent must load it (libkmod)
#        E2E_CACHE_DIR            kernel/initramfs cache (default $XDG_CACHE_HOME/vfio-gpu-agent-e2e,
#                                 else /var/cache/vfio-gpu-agent-e2e)
#        E2E_TIMEOUT=600          seconds before QEMU is killed     E2E_SMP=2  E2E_MEM=1G
#        E2E_GUEST_TEST           guest-side test script to run instead of scripts/e2e/guest-test.sh (debugging)
#        E2E_LOG                  where to keep the guest console log (default $E2E_CACHE_DIR/last-run.log)
# Installs what it needs from Debian packages (needs root then); never touches the host's /sys, /dev or /boot.
# Exit: 0 PASS, 1 FAIL, 2 setup error.
set -euo pipefail

AGENT=${1:-${AGENT:-}}
KUBELET_SIM=${2:-${KUBELET_SIM:-}}
HEALTH_PROBE=${3:-${HEALTH_PROBE:-}}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SOURCE_ROOT=$(dirname "$HERE")
CACHE=${E2E_CACHE_DIR:-${XDG_CACHE_HOME:+$XDG_CACHE_HOME/vfio-gpu-agent-e2e}}
CACHE=${CACHE:-/var/cache/vfio-gpu-agent-e2e}
SKIP_BIND=${E2E_SKIP_BIND:-0}
AGENT_LOADS_VFIO=${E2E_AGENT_LOADS_VFIO:-0}
TIMEOUT=${E2E_TIMEOUT:-600}
LOG=${E2E_LOG:-$CACHE/last-run.log}
PACKAGES=(qemu-system-x86 busybox-static cpio kmod xz-utils gcc libc6-dev binutils)
HOST_MODULES="virtio_pci virtio_net"          # what a booted host has loaded for the test devices
VFIO_MODULES="vfio vfio_iommu_type1 vfio-pci"

START=$(date +%s%N)
elapsed() { local t=$((($(date +%s%N) - START) / 10000000)); printf '%d.%02d' $((t / 100)) $((t % 100)); }
say() { echo "e2e: [$(elapsed)s] $*"; }
die() { echo "e2e: SETUP ERROR: $*" >&2; echo "e2e: RESULT: FAIL (setup)"; exit 2; }

[ -n "$AGENT" ] || die "usage: $0 AGENT [KUBELET_SIM [HEALTH_PROBE]] (or AGENT=...)"
[ -x "$AGENT" ] || die "agent binary $AGENT is missing or not executable"
AGENT=$(readlink -f "$AGENT")
BUILD_TREE=$(dirname "$(dirname "$(dirname "$AGENT")")")
KUBELET_SIM=${KUBELET_SIM:-$BUILD_TREE/tests/sim/kubelet_sim/kubelet-sim}
HEALTH_PROBE=${HEALTH_PROBE:-$BUILD_TREE/tests/e2e/health-probe}
[ -x "$KUBELET_SIM" ] || die "kubelet simulator $KUBELET_SIM is missing (build target kubelet-sim)"
[ -x "$HEALTH_PROBE" ] || die "health probe $HEALTH_PROBE is missing (build target health-probe)"
KUBELET_SIM=$(readlink -f "$KUBELET_SIM")
HEALTH_PROBE=$(readlink -f "$HEALTH_PROBE")

ensure_packages() {
    local missing=() p installed
    installed=$(dpkg-query -W -f='${Package} ${Status}\n' "${PACKAGES[@]}" 2> /dev/null || true)
    for p in "${PACKAGES[@]}"; do
        grep -qx "$p install ok installed" <<< "$installed" || missing+=("$p")
    done
    [ ${#missing[@]} = 0 ] && return
    [ "$(id -u)" = 0 ] || die "missing packages ${missing[*]} and not root to install them"
    say "installing ${missing[*]}"
    local apt=(apt-get -o DPkg::Lock::Timeout=600 -y -q --no-install-recommends)
    export DEBIAN_FRONTEND=noninteractive
    "${apt[@]}" install "${missing[@]}" > "$CACHE/apt.log" 2>&1 ||
        { apt-get -o DPkg::Lock::Timeout=600 -q update >> "$CACHE/apt.log" 2>&1 &&
          "${apt[@]}" install "${missing[@]}" >> "$CACHE/apt.log" 2>&1; } ||
        die "apt-get install ${missing[*]} failed, see $CACHE/apt.log"
}

# The kernel package linux-image-amd64 points to; the .deb is downloaded and unpacked, never installed.
# Resolved at most daily: apt-cache rebuilds its whole cache per call here (no pkgcache.bin), up to 20 s under load.
kernel_package() {
    local memo=$CACHE/kernel-package pkg
    if [ -s "$memo" ] && [ -z "$(find "$memo" -mmin +1440)" ]; then cat "$memo"; return; fi
    local query=(apt-cache depends linux-image-amd64)
    pkg=$("${query[@]}" 2> /dev/null | awk '/Depends: linux-image-[0-9]/ && pkg == "" { pkg = $2 } END { print pkg }')
    if [ -z "$pkg" ] && [ "$(id -u)" = 0 ]; then   # fresh machine: no or stale package lists yet
        apt-get -o DPkg::Lock::Timeout=600 -q update > "$CACHE/apt-update.log" 2>&1 || true
        pkg=$("${query[@]}" 2> /dev/null | awk '/Depends: linux-image-[0-9]/ && pkg == "" { pkg = $2 } END { print pkg }')
    fi
    if [ -n "$pkg" ]; then echo "$pkg" > "$memo"; echo "$pkg"; fi
}

# Kernel image (PVH ELF, which QEMU boots without the ~5 s in-guest XZ decompression of the bzImage) and the
# modules the guest needs, with modules.dep, so busybox insmod and the agent's libkmod both work.
prepare_kernel() {
    local pkg=$1 dir=$CACHE/kernel/$1
    [ -f "$dir/ready" ] && return
    say "preparing kernel $pkg"
    rm -rf "$dir" && mkdir -p "$dir" "$CACHE/debs"
    ls "$CACHE/debs/${pkg}"_*.deb > /dev/null 2>&1 ||
        (cd "$CACHE/debs" && apt-get -q download "$pkg" > "$CACHE/download.log" 2>&1) ||
        { apt-get -o DPkg::Lock::Timeout=600 -q update > /dev/null 2>&1 &&
          (cd "$CACHE/debs" && apt-get -q download "$pkg" > "$CACHE/download.log" 2>&1); } ||
        die "apt-get download $pkg failed, see $CACHE/download.log"
    local unpacked=$dir/unpacked
    dpkg-deb -x "$CACHE/debs/${pkg}"_*.deb "$unpacked"
    local kver
    kver=$(ls "$unpacked/lib/modules" | head -1)
    depmod -b "$unpacked" "$kver"
    local tree=$dir/modules/lib/modules/$kver
    mkdir -p "$tree"
    cp "$unpacked/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$tree/"
    list() {  # module names -> paths relative to the module tree, dependencies first
        local m
        for m in $1; do
            modprobe -d "$unpacked" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
        done | sed "s|^$unpacked/lib/modules/$kver/||" | awk '!seen[$0]++'
    }
    list "$HOST_MODULES" > "$dir/modules.host"
    list "$VFIO_MODULES" | grep -vxF -f "$dir/modules.host" > "$dir/modules.vfio"
    local m
    for m in $(cat "$dir/modules.host" "$dir/modules.vfio"); do
        install -D -m 644 "$unpacked/lib/modules/$kver/$m" "$tree/$m"
    done
    depmod -b "$dir/modules" "$kver"
    local off
    off=$(LC_ALL=C grep -m1 -obUaP '\xFD7zXZ\x00' "$unpacked/boot/vmlinuz-$kver" | awk -F: 'NR == 1 { print $1 }')
    # Process substitution, not a pipe: xz stops reading after the stream and tail would die of SIGPIPE.
    xz -dc --single-stream < <(tail -c +$((off + 1)) "$unpacked/boot/vmlinuz-$kver") > "$dir/vmlinux"
    echo "$kver" > "$dir/kver"
    rm -rf "$unpacked"
    touch "$dir/ready"
}

# Uncompressed: QEMU copies the file into guest RAM at host speed, while gunzip inside a TCG guest costs seconds.
cpio_of() { (cd "$1" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet); }

# Base initramfs: busybox, the modules and the static VFIO checker. Rebuilt when any of its inputs changes.
prepare_base() {
    local pkg=$1 kdir=$CACHE/kernel/$1 key
    key=$( (echo "$pkg"; cat "$SOURCE_ROOT/tests/e2e/vfio-check.c" "$kdir/modules.host" "$kdir/modules.vfio";
            stat -c %s-%Y /bin/busybox) | sha256sum | cut -c1-16)
    BASE=$kdir/base-$key.cpio
    [ -f "$BASE" ] && return
    say "building base initramfs"
    local root
    root=$(mktemp -d "$CACHE/base.XXXXXX")
    mkdir -p "$root"/{bin,dev,proc,sys,tmp,etc/e2e,lib}
    cp /bin/busybox "$root/bin/busybox"
    local applet
    for applet in $(/bin/busybox --list); do [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"; done
    cp -a "$kdir/modules/lib/modules" "$root/lib/"
    cp "$kdir/modules.host" "$kdir/modules.vfio" "$root/etc/e2e/"
    gcc -static -O2 -Wall -Werror -o "$root/bin/vfio-check" "$SOURCE_ROOT/tests/e2e/vfio-check.c"
    rm -f "$kdir"/base-*.cpio*
    cpio_of "$root" > "$BASE.tmp" && mv "$BASE.tmp" "$BASE"
    rm -rf "$root"
}

# install_binary SOURCE ROOT NAME [STRIP]: /bin/NAME in the overlay at ROOT, with its shared libraries and loader at
# their host paths (each library once, whichever binary needs it first). STRIP (default --strip-debug, which keeps
# the agent's symbols for backtraces) is what `strip` takes: every MiB is unpacked by the TCG guest at boot.
install_binary() {
    local source=$1 root=$2 name=$3 mode=${4:---strip-debug} lib
    if head -c 4 "$source" | grep -q ELF; then
        strip "$mode" -o "$root/bin/$name" "$source"
    else
        install -m 755 "$source" "$root/bin/$name"   # a script (harness development only)
    fi
    ldd "$source" > "$root/ldd.txt" 2>&1 || { rm -f "$root/ldd.txt"; return 0; }
    for lib in $(grep -oE '/[^ ]+' "$root/ldd.txt"); do
        [ -e "$root$lib" ] && continue
        install -D -m 755 "$(readlink -f "$lib")" "$root$lib"
        LIBS=$((LIBS + 1))
    done
    rm -f "$root/ldd.txt"
}

# Per-run overlay appended to the base (the kernel unpacks concatenated archives in order): /init, /test/run, the
# agent, the kubelet simulator and the health probe.
prepare_overlay() {
    local root=$1
    mkdir -p "$root/bin" "$root/test"
    install -m 755 "$HERE/e2e/guest-init.sh" "$root/init"
    install -m 755 "${E2E_GUEST_TEST:-$HERE/e2e/guest-test.sh}" "$root/test/run"
    LIBS=0
    install_binary "$AGENT" "$root" vfio-gpu-agent
    install_binary "$KUBELET_SIM" "$root" kubelet-sim --strip-unneeded
    install_binary "$HEALTH_PROBE" "$root" health-probe --strip-unneeded
}

run_qemu() {
    local kernel=$1 initrd=$2
    # no_timer_check: on a loaded host TCG runs the guest so slowly that the boot-time check of the timer through
    # the interrupt-remapped IO-APIC fails, and with IRQ remapping on the kernel panics instead of falling back.
    local append="console=ttyS0 panic=-1 quiet no_timer_check intel_iommu=on iommu=pt"
    append+=" e2e.skip_bind=$SKIP_BIND e2e.agent_loads_vfio=$AGENT_LOADS_VFIO"
    local devices=(
        -device intel-iommu,intremap=on,caching-mode=on
        # 1af4:1000 alone in its group, bound to virtio-pci: the plain unbind-from-a-real-driver path
        -device virtio-net-pci,addr=02.0,romfile=
        # 1234:11e8 without a driver, alone in its group; DMA-capable, so vfio-check proves the IOMMU mapping
        -device edu,addr=03.0
        # 1af4 but class ff0000: must never be selected by --classes 02
        -device virtio-rng-pci,addr=04.0
        # multifunction slot without ACS: both functions land in one group
        -device virtio-net-pci,addr=05.0,multifunction=on,romfile=
        -device virtio-net-pci,addr=05.1,romfile=
        # root port -> PCIe-to-PCI bridge -> edu + virtio-net: one group with a bridge and two vendors
        -device pcie-root-port,id=rp1,chassis=1,addr=07.0
        -device pcie-pci-bridge,id=pb1,bus=rp1
        -device edu,bus=pb1,addr=01.0
        -device virtio-net-pci,bus=pb1,addr=02.0,romfile=
    )
    # Force TCG: /dev/kvm exists on these machines but QEMU aborts or the guest hangs with it.
    timeout --kill-after=10 "$TIMEOUT" qemu-system-x86_64 -machine q35,kernel-irqchip=split -accel tcg -cpu max \
        -smp "${E2E_SMP:-2}" -m "${E2E_MEM:-1G}" -nodefaults -display none -serial stdio -monitor none -no-reboot \
        -kernel "$kernel" -initrd "$initrd" -append "$append" "${devices[@]}" < /dev/null 2>&1
}

mkdir -p "$CACHE"
exec 9> "$CACHE/lock"
flock 9   # concurrent runs would rebuild the same cache files
ensure_packages
PKG=$(kernel_package)
if [ -z "$PKG" ]; then   # no apt lists: use the newest kernel already prepared, if any
    PKG=$(ls -t "$CACHE/kernel" 2> /dev/null | head -1)
    [ -n "$PKG" ] && [ -f "$CACHE/kernel/$PKG/ready" ] || die "cannot resolve linux-image-amd64 (apt lists?)"
fi
prepare_kernel "$PKG"
prepare_base "$PKG"
KDIR=$CACHE/kernel/$PKG
RUN=$(mktemp -d "${TMPDIR:-/tmp}/vfio-e2e.XXXXXX")
trap 'rm -rf "$RUN"' EXIT
prepare_overlay "$RUN/overlay"
cpio_of "$RUN/overlay" > "$RUN/overlay.cpio"
cat "$BASE" "$RUN/overlay.cpio" > "$RUN/initrd"
say "kernel $(cat "$KDIR/kver") ($PKG); agent $AGENT, kubelet-sim, health-probe ($LIBS shared libs);" \
    "initramfs $(($(stat -c %s "$RUN/initrd") / 1024)) KiB (base $(($(stat -c %s "$BASE") / 1024)) KiB)"
[ "$SKIP_BIND" = 1 ] && say "E2E_SKIP_BIND=1: self-check mode, this run is expected to FAIL"
SETUP_S=$(elapsed)

say "booting QEMU (TCG, q35, intel-iommu), timeout ${TIMEOUT}s; console log: $LOG"
BOOT=$(date +%s%N)
set +e
run_qemu "$KDIR/vmlinux" "$RUN/initrd" | while IFS= read -r line; do
    printf '%7s %s\n' "$(elapsed)" "${line%$'\r'}"
done | tee "$LOG"
QEMU_RC=${PIPESTATUS[0]}
set -e
QEMU_S=$(( ($(date +%s%N) - BOOT) / 1000000 ))

echo
echo "==================== e2e-qemu summary ===================="
echo "agent:   $AGENT"
echo "kernel:  $(cat "$KDIR/kver"), QEMU TCG; setup $SETUP_S s, QEMU $((QEMU_S / 1000)).$(printf '%03d' $((QEMU_S % 1000)) | cut -c1-2) s, total $(elapsed) s"
echo "checks:  $(grep -c 'CHECK PASS' "$LOG") passed, $(grep -c 'CHECK FAIL' "$LOG") failed"
grep 'CHECK FAIL' "$LOG" | sed 's/^ *[0-9.]* */  /' || true
RESULT=$(grep -o 'E2E RESULT: .*' "$LOG" | tail -1 || true)
if [ "$QEMU_RC" = 124 ] || [ "$QEMU_RC" = 137 ]; then
    echo "RESULT: FAIL (QEMU killed after ${TIMEOUT}s; last guest line: $(tail -1 "$LOG"))"
    exit 1
fi
case "$RESULT" in
    "E2E RESULT: PASS"*) echo "RESULT: PASS ${RESULT#E2E RESULT: PASS }"; exit 0 ;;
    "E2E RESULT: FAIL"*) echo "RESULT: FAIL ${RESULT#E2E RESULT: FAIL }"; exit 1 ;;
    *) echo "RESULT: FAIL (the guest test did not report a result; QEMU exit $QEMU_RC)"
       grep -m1 -E 'Kernel panic|not syncing' "$LOG" || true
       exit 1 ;;
esac
