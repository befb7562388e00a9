#!/bin/sh
# /test/run of the e2e guest (busybox sh): drives vfio-gpu-agent against the real kernel and judges the result
# only by what the kernel shows afterwards (driver links, /dev/vfio, VFIO ioctls via vfio-check) and, for `run`,
# by what its gRPC health port answers (health-probe) with kubelet-sim as the kubelet, never by the agent's own
# word. Expectations are derived from the IOMMU group composition seen in sysfs before each step.
# Prints "CHECK PASS|FAIL: ..." per assertion and one "E2E RESULT:" line; exit status 1 when any check failed.
#
# Every fork costs tens of milliseconds under TCG, so sysfs is read with shell builtins only (read, cd -P,
# globs, parameter expansion) and helpers return values in variables instead of through $(...).
# shellcheck disable=SC2317,SC3060  # helpers run through check(); busybox ash has ${var//a/b}
AGENT=${AGENT:-/bin/vfio-gpu-agent}
SYS=/sys/bus/pci/devices
checks=0
failures=0
failed=""
NL='
'

pass() { checks=$((checks + 1)); echo "CHECK PASS: $*"; }
fail() { checks=$((checks + 1)); failures=$((failures + 1)); echo "CHECK FAIL: $*"; failed="$failed$*$NL"; }
check() { desc=$1; shift; if "$@"; then pass "$desc"; else fail "$desc"; fi; }
section() { read -r up _ < /proc/uptime; echo; echo "==== $* (guest uptime ${up}s)"; }

# fn BDF: sets DRV (driver or "none"), GRP (IOMMU group or "none"), VEN, DEV, CLS (hex, no 0x) and OVR.
fn() {
    if cd -P "$SYS/$1/driver" 2> /dev/null; then DRV=${PWD##*/}; else DRV=none; fi
    if cd -P "$SYS/$1/iommu_group" 2> /dev/null; then GRP=${PWD##*/}; else GRP=none; fi
    cd /
    read -r VEN < "$SYS/$1/vendor"; VEN=${VEN#0x}
    read -r DEV < "$SYS/$1/device"; DEV=${DEV#0x}
    read -r CLS < "$SYS/$1/class"; CLS=${CLS#0x}
    read -r OVR < "$SYS/$1/driver_override"
}
driver_is() { fn "$1"; [ "$DRV" = "$2" ]; }
members() { MEMBERS=""; for m in "/sys/kernel/iommu_groups/$1/devices/"*; do MEMBERS="$MEMBERS${m##*/} "; done; }

inventory() {
    for d in "$SYS"/*; do
        fn "${d##*/}"
        printf '  %s %s:%s class=%s group=%-4s driver=%s\n' "${d##*/}" "$VEN" "$DEV" "$CLS" "$GRP" "$DRV"
    done
}
# snapshot: "BDF=driver/override ..." of every function; lookup BDF SNAPSHOT sets WAS to that driver.
snapshot() { SNAP=""; for d in "$SYS"/*; do fn "${d##*/}"; SNAP="$SNAP ${d##*/}=$DRV/$OVR"; done; }
lookup() { WAS=${2#* "$1"=}; WAS=${WAS%% *}; WAS=${WAS%%/*}; }

# selected VENDOR CLASSES: sets SEL to the functions --vendor/--classes must select (vendor + class prefix).
selected() {
    SEL=""
    for d in "$SYS"/*; do
        fn "${d##*/}"
        [ "$VEN" = "$1" ] || continue
        for c in ${2//,/ }; do case "$CLS" in "$c"*) SEL="$SEL ${d##*/}"; break ;; esac; done
    done
}

# blocked GROUP VENDOR: true (BLOCKER set) when an endpoint of another vendor sits on a driver that keeps the
# group from being viable (anything but vfio-pci, pci-stub or no driver). Bridges never block.
blocked() {
    for m in "/sys/kernel/iommu_groups/$1/devices/"*; do
        fn "${m##*/}"
        case "$CLS" in 0604*) continue ;; esac
        [ "$VEN" = "$2" ] && continue
        case "$DRV" in none | vfio-pci | pci-stub) ;; *) BLOCKER="${m##*/} $VEN:$DEV on $DRV"; return 0 ;; esac
    done
    return 1
}

run_agent() {  # stdout in /tmp/agent.out, stderr in /tmp/agent.err, exit status in $RC
    echo "\$ vfio-gpu-agent $*"
    "$AGENT" "$@" > /tmp/agent.out 2> /tmp/agent.err
    RC=$?
    case " $* " in
        *" --json "*) echo "    | (JSON report, $(wc -l < /tmp/agent.out) lines; kept off the slow serial console)" ;;
        *) while IFS= read -r line; do echo "    | $line"; done < /tmp/agent.out ;;
    esac
    while IFS= read -r line; do echo "    ! $line"; done < /tmp/agent.err
    echo "    (exit $RC)"
}
rc_nonzero() { [ "$1" != 0 ]; }
mentions() { grep -qi "$1.*$2\|$2.*$1" /tmp/agent.out /tmp/agent.err; }

# Actions per BDF from `inspect --json` (protobuf JSON: in every Function object "bdf" precedes "action").
json_action() {
    ACTION=$(tr -d '\n' < /tmp/agent.out | tr '{}' '\n\n' | grep '"action"' |
             sed -n "s/.*\"bdf\": *\"$1\".*\"action\": *\"\([A-Z_]*\)\".*/\1/p")
}
json_ready() { tr -d '\n' < /tmp/agent.out | grep -q "\"ready\": *$1"; }

bound() { fn "$1"; [ "$DRV" = vfio-pci ] && [ -c "/dev/vfio/$GRP" ]; }
vfio_usable() {
    fn "$1"; dma=""; [ "$VEN" = 1234 ] && dma=--dma
    vfio-check "$1" $dma > /tmp/vfio-check.out 2>&1
    rc=$?
    while IFS= read -r line; do echo "    $line"; done < /tmp/vfio-check.out
    return $rc
}
restored() { fn "$1"; [ "$DRV" = "$2" ] && [ "$OVR" = "(null)" ]; }

# inspect, dry run, bind and kernel-side verification for one --vendor/--classes selection.
# $3 = "short": skip the text inspect, the dry run and the second bind (each agent run costs seconds under TCG).
scenario_bind() {
    vendor=$1 classes=$2 short=$3 label="[--vendor $1 --classes $2]"
    section "bind $label"
    selected "$vendor" "$classes"
    sel=$SEL bindable="" blocked_list=""
    for b in $sel; do
        fn "$b"; g=$GRP; members "$g"
        if blocked "$g" "$vendor"; then
            blocked_list="$blocked_list $b"; echo "  expect $b BLOCKED: group $g ($MEMBERS) has $BLOCKER"
        else
            bindable="$bindable $b"; echo "  expect $b bindable: group $g ($MEMBERS)"
        fi
    done
    check "$label the topology provides functions to select" [ -n "$sel" ]
    snapshot; before=$SNAP

    if [ -z "$short" ]; then
        run_agent inspect --vendor "$vendor" --classes "$classes"
        if [ -z "$blocked_list" ]; then check "$label inspect exits 0: every selected function can be passed through" [ $RC = 0 ]
        else check "$label inspect exits non-zero: a selected function is blocked" rc_nonzero $RC; fi
    fi

    run_agent inspect --json --vendor "$vendor" --classes "$classes"
    if [ -z "$blocked_list" ]; then check "$label inspect --json exits 0" [ $RC = 0 ]
    else check "$label inspect --json exits non-zero" rc_nonzero $RC; fi
    if [ -z "$blocked_list" ]; then check "$label inspect --json: ready=true" json_ready true
    else check "$label inspect --json: ready=false" json_ready false; fi
    for b in $sel; do
        json_action "$b"
        case " $blocked_list " in
            *" $b "*) check "$label inspect --json: $b action BLOCKED (is: ${ACTION:-missing})" [ "$ACTION" = BLOCKED ] ;;
            *) check "$label inspect --json: $b action WOULD_BIND or ALREADY_BOUND (is: ${ACTION:-missing})" \
                   [ "$ACTION" = WOULD_BIND -o "$ACTION" = ALREADY_BOUND ] ;;
        esac
    done

    if [ -z "$short" ]; then
        run_agent bind --dry-run --vendor "$vendor" --classes "$classes"
        snapshot
        check "$label bind --dry-run changes no driver" [ "$SNAP" = "$before" ]
    fi

    if [ "${E2E_SKIP_BIND:-0}" = 1 ]; then
        echo "  E2E_SKIP_BIND=1: bind step skipped (self-check: the verification below must fail)"
        RC=skipped
    else
        run_agent bind --vendor "$vendor" --classes "$classes"
    fi
    if [ -z "$blocked_list" ]; then check "$label bind exits 0" [ "$RC" = 0 ]
    else check "$label bind exits non-zero (blocked:$blocked_list)" rc_nonzero "$RC"; fi

    for b in $bindable; do
        bound "$b"
        check "$label $b driver link is vfio-pci (is: $DRV) and /dev/vfio/$GRP exists" bound "$b"
        check "$label $b usable through VFIO (group viable, SET_IOMMU, GET_DEVICE_FD)" vfio_usable "$b"
    done
    if [ -z "$short" ] && [ -z "$blocked_list" ]; then
        # The validator on the real kernel: layers 1-2 (platform, devices) must pass once bind has run; without
        # the bind step the failing check ids end up in the description (device.driver).
        run_agent validate --layers platform,devices --vendor "$vendor" --classes "$classes"
        vfails=$(sed -n 's/^  FAIL  \([a-z_.]*\).*/\1/p' /tmp/agent.out | sort -u | tr '\n' ' ')
        vfails=${vfails% }
        check "$label validate: layers 1-2 pass on the real kernel (exit $RC; failing: ${vfails:-none})" [ "$RC" = 0 ]
        check "$label validate: the VT-d unit's interrupt remapping is seen" \
            grep -q "^  pass  iommu.interrupt_remapping" /tmp/agent.out
    fi
    for b in $blocked_list; do
        lookup "$b" "$before"; fn "$b"
        check "$label blocked $b left untouched (driver $DRV, was $WAS; driver_override $OVR)" \
            [ "$DRV" = "$WAS" -a "$OVR" = "(null)" ]
        check "$label agent reports $b as blocked" mentions "$b" block
    done
    snapshot; after=$SNAP
    changed=""
    for d in "$SYS"/*; do
        b=${d##*/}
        case " $bindable " in *" $b "*) continue ;; esac
        lookup "$b" "$before"; was=$WAS; lookup "$b" "$after"
        [ "$was" = "$WAS" ] || changed="$changed $b:$was->$WAS"
    done
    check "$label no function outside the bindable selection changed driver$changed" [ -z "$changed" ]

    [ "${E2E_SKIP_BIND:-0}" = 1 ] || [ -n "$short" ] && return
    run_agent bind --vendor "$vendor" --classes "$classes"
    snapshot
    check "$label second bind changes nothing" [ "$SNAP" = "$after" ]
    [ -z "$blocked_list" ] && check "$label second bind exits 0" [ $RC = 0 ]
}

# unbind back to the boot drivers: first --device $3 alone, then --group of $4 alone (each optional), then --all.
scenario_unbind() {
    label="[--vendor $1 --classes $2]"
    section "unbind $label"
    selected "$1" "$2"
    sel=$SEL
    if [ -n "$3" ]; then
        run_agent unbind --device "$3"
        check "$label unbind --device $3 exits 0" [ $RC = 0 ]
        expect_restored "$3"
        for b in $sel; do
            [ "$b" = "$3" ] || check "$label unbind --device $3 leaves $b on vfio-pci" driver_is "$b" vfio-pci
        done
    fi
    if [ -n "$4" ]; then
        fn "$4"; g=$GRP
        run_agent unbind --group "$g"
        check "$label unbind --group $g exits 0" [ $RC = 0 ]
        for m in "/sys/kernel/iommu_groups/$g/devices/"*; do
            m=${m##*/}; lookup "$m" "$boot"
            [ "$WAS" = vfio-pci ] || expect_restored "$m"
        done
    fi
    run_agent unbind --all --vendor "$1" --classes "$2"
    check "$label unbind --all exits 0" [ $RC = 0 ]
    for b in $sel; do expect_restored "$b"; done
}
expect_restored() {
    lookup "$1" "$boot"; fn "$1"
    check "$label $1 back on its boot driver $WAS (is: $DRV), driver_override cleared (is: $OVR)" restored "$1" "$WAS"
}

# A running VM holds /dev/vfio/<group> open: unbind must refuse that group and name the holder.
scenario_open_group() {
    b=$1; fn "$b"; g=$GRP
    section "unbind refuses an open group ($b, /dev/vfio/$g held by a process)"
    sleep 300 3<> "/dev/vfio/$g" &
    holder=$!
    # Held once the holder's fd 3 points at the group node (its shell opens it before exec'ing sleep).
    polls=0
    until [ "$(readlink "/proc/$holder/fd/3" 2> /dev/null)" = "/dev/vfio/$g" ] || [ $polls -ge 3000 ]; do
        polls=$((polls + 1)); usleep 10000
    done
    check "the holder (pid $holder) has /dev/vfio/$g open" [ "$(readlink "/proc/$holder/fd/3")" = "/dev/vfio/$g" ]
    run_agent unbind --device "$b"
    check "unbind --device $b exits non-zero while /dev/vfio/$g is open" rc_nonzero $RC
    check "$b stays on vfio-pci" driver_is "$b" vfio-pci
    check "agent names the holding process (pid $holder)" grep -q "\b$holder\b" /tmp/agent.out /tmp/agent.err
    kill "$holder"; wait "$holder" 2> /dev/null
}

# `run` as the DaemonSet runs it, on the node's default kubelet paths, with kubelet-sim playing the kubelet.
KUBELET_DIR=/var/lib/kubelet/device-plugins
POD_RESOURCES_SOCKET=/var/lib/kubelet/pod-resources/kubelet.sock
HEALTH_PORT=8081
METRICS_PORT=9400
WAIT_S=120   # generous bound on each condition below; under TCG each is met in seconds

# probe [SERVICE]: PROBE = health-probe's exit status (0 SERVING, 1 NOT_SERVING, 2 no answer), its line in PROBED.
probe() { health-probe "$HEALTH_PORT" "$@" > /tmp/probe.out 2>&1; PROBE=$?; read -r PROBED < /tmp/probe.out; }
probe_is() { probe "$2"; [ "$PROBE" = "$1" ]; }
probe_answers() { probe; [ "$PROBE" != 2 ]; }
# wait_for COMMAND...: true once COMMAND is, polled every 0.2 s for at most WAIT_S seconds of guest uptime.
wait_for() {
    read -r up _ < /proc/uptime; end=$((${up%.*} + WAIT_S))
    until "$@"; do
        read -r up _ < /proc/uptime; [ "${up%.*}" -ge "$end" ] && return 1
        usleep 200000
    done
}
all_bound() { for b in $1; do bound "$b" || return 1; done; }
# A child that exited is a zombie until `wait`: state Z in /proc/PID/stat (comm of our binaries has no spaces).
exited() { [ ! -e "/proc/$1/stat" ] && return 0; read -r _ _ state _ < "/proc/$1/stat"; [ "$state" = Z ]; }
plugin_sockets() {  # PLUGIN_SOCKETS: sockets in the kubelet directory besides the kubelet's own
    PLUGIN_SOCKETS=""
    for f in "$KUBELET_DIR"/*.sock; do
        [ -S "$f" ] && [ "${f##*/}" != kubelet.sock ] && PLUGIN_SOCKETS="$PLUGIN_SOCKETS ${f##*/}"
    done
}
metrics_ready() { wget -q -O /tmp/metrics.txt "http://127.0.0.1:$METRICS_PORT/metrics" 2> /dev/null &&
                  grep -q '^vfio_gpu_agent_ready 1$' /tmp/metrics.txt; }
print_log() { while IFS= read -r line; do echo "    $2$line"; done < "$1"; }
# stop PID NAME: SIGTERM, then STOPPED = its exit status once it has exited ("hung" if not within WAIT_S).
stop() {
    kill -TERM "$1"
    if wait_for exited "$1"; then wait "$1"; STOPPED=$?
    else STOPPED=hung; kill -KILL "$1"; wait "$1"; fi
}

# `run` on the selection (every function must be bindable): first with no kubelet, so it binds but cannot
# register and must say NOT_SERVING; then with kubelet-sim, until SERVING; then SIGTERM. Nothing is unbound.
scenario_run() {
    vendor=$1 classes=$2 label="[run --vendor $1 --classes $2]"
    section "run $label: kubelet-sim as the kubelet, readiness through the health port"
    selected "$vendor" "$classes"; sel=$SEL
    blocked_list=""
    for b in $sel; do fn "$b"; blocked "$GRP" "$vendor" && blocked_list="$blocked_list $b"; done
    check "$label the topology provides functions to select, none blocked (blocked:${blocked_list:- none})" \
        [ -n "$sel" -a -z "$blocked_list" ]
    snapshot; before=$SNAP
    mkdir -p "$KUBELET_DIR" "${POD_RESOURCES_SOCKET%/*}"

    set -- run --vendor "$vendor" --classes "$classes" --listen-address 127.0.0.1 --health-port "$HEALTH_PORT" \
        --metrics-port "$METRICS_PORT" --pod-resources-socket "$POD_RESOURCES_SOCKET" --kubelet-dir "$KUBELET_DIR"
    echo "\$ vfio-gpu-agent $* &    (no kubelet yet)"
    "$AGENT" "$@" > /tmp/run.out 2> /tmp/run.err &
    run_pid=$!
    check "$label the health port answers (within ${WAIT_S}s)" wait_for probe_answers
    echo "    $PROBED"
    check "$label binds the selection with no kubelet: every selected function on vfio-pci (within ${WAIT_S}s)" \
        wait_for all_bound "$sel"
    probe
    check "$label readiness NOT_SERVING while bound but unregistered (health-probe exit $PROBE: $PROBED)" [ "$PROBE" = 1 ]
    probe liveness
    check "$label liveness SERVING (health-probe exit $PROBE: $PROBED)" [ "$PROBE" = 0 ]

    echo "\$ kubelet-sim --dir $KUBELET_DIR --pod-resources-socket $POD_RESOURCES_SOCKET --serve-forever &"
    kubelet-sim --dir "$KUBELET_DIR" --pod-resources-socket "$POD_RESOURCES_SOCKET" --serve-forever \
        > /tmp/kubelet-sim.out 2>&1 &
    sim_pid=$!
    read -r t0 _ < /proc/uptime
    wait_for probe_is 0
    read -r t1 _ < /proc/uptime
    seen="health-probe exit $PROBE: $PROBED; kubelet-sim started at ${t0}s, SERVING seen at ${t1}s"
    check "$label readiness SERVING once registered and allocatable at the kubelet ($seen)" [ "$PROBE" = 0 ]
    check "$label metrics: vfio_gpu_agent_ready 1 on :$METRICS_PORT/metrics" metrics_ready
    # The kubelet's side, read by the validator through pod-resources, as an operator would check it.
    run_agent validate --layers plugin,kubelet --vendor "$vendor" --classes "$classes"
    check "$label validate --layers plugin,kubelet passes against kubelet-sim (exit $RC)" [ "$RC" = 0 ]
    # A VM (QEMU under virt-launcher) opens the group while the agent serves: `run` must not hold it.
    first=${sel# }; first=${first%% *}
    check "$label $first usable through VFIO while run serves" vfio_usable "$first"

    echo "\$ kill -TERM $run_pid    (run)"
    stop "$run_pid"
    check "$label run exits 0 on SIGTERM (exit $STOPPED)" [ "$STOPPED" = 0 ]
    probe
    check "$label the health port is closed after exit (health-probe exit $PROBE)" [ "$PROBE" = 2 ]
    plugin_sockets
    check "$label its plugin sockets are removed from $KUBELET_DIR (left:${PLUGIN_SOCKETS:- none})" [ -z "$PLUGIN_SOCKETS" ]
    for b in $sel; do
        bound "$b"
        check "$label $b stays on vfio-pci after run exited (is: $DRV) and /dev/vfio/$GRP exists" bound "$b"
        check "$label $b usable through VFIO (group viable, SET_IOMMU, GET_DEVICE_FD)" vfio_usable "$b"
    done
    snapshot; after=$SNAP
    changed=""
    for d in "$SYS"/*; do
        b=${d##*/}
        case " $sel " in *" $b "*) continue ;; esac
        lookup "$b" "$before"; was=$WAS; lookup "$b" "$after"
        [ "$was" = "$WAS" ] || changed="$changed $b:$was->$WAS"
    done
    check "$label no function outside the selection changed driver$changed" [ -z "$changed" ]
    echo "  run's log:"
    print_log /tmp/run.err "! "
    stop "$sim_pid"
    echo "  kubelet-sim exit $STOPPED:"
    print_log /tmp/kubelet-sim.out "| "
}

section "inventory at boot"
inventory
snapshot; boot=$SNAP
check "agent binary present in the guest" [ -x "$AGENT" ]

# Results only mean something on the topology the harness asked QEMU for: verify it first.
selected 1af4 02; virtio_nets=$SEL
selected 1234 00ff; edus=$SEL
on_virtio=0; for b in $virtio_nets; do driver_is "$b" virtio-pci && on_virtio=$((on_virtio + 1)); done
no_driver=0; for b in $edus; do driver_is "$b" none && no_driver=$((no_driver + 1)); done
check "IOMMU on: $(ls /sys/kernel/iommu_groups | wc -l) groups" [ -d /sys/kernel/iommu_groups/0 ]
check "4 virtio-net functions start on virtio-pci (found $on_virtio)" [ $on_virtio = 4 ]
check "2 edu functions start without a driver (found $no_driver)" [ $no_driver = 2 ]
fn 0000:00:05.0; g1=$GRP; fn 0000:00:05.1
check "the multifunction virtio-net pair shares one group ($g1, $GRP)" [ "$g1" = "$GRP" ]
fn 0000:02:01.0; members "$GRP"
check "group $GRP holds a bridge, an edu (1234) and a virtio-net (1af4): $MEMBERS" \
    [ "$MEMBERS" = "0000:01:00.0 0000:02:01.0 0000:02:02.0 " ]

# 1. virtio-net: a real driver to unbind from, a 2-function group, and a bridge group whose foreign edu has no driver.
scenario_bind 1af4 02
# 2. edu while the virtio-nets are on vfio-pci: the bridge group's foreign member does not block it.
scenario_bind 1234 00ff short
[ "${E2E_SKIP_BIND:-0}" = 1 ] || scenario_open_group 0000:00:02.0
scenario_unbind 1234 00ff
scenario_unbind 1af4 02 0000:00:02.0 0000:00:05.0
# 3. edu again with the bridge group's virtio-net back on virtio-pci: that group is blocked, the other is bound.
scenario_bind 1234 00ff short
scenario_unbind 1234 00ff
# 4. `run`, the daemon, from the boot drivers: it unbinds the virtio-nets from virtio-pci itself. Skipped with
# E2E_SKIP_BIND=1: it would bind, and the self-check is about the bind proof failing without a bind.
if [ "${E2E_SKIP_BIND:-0}" = 1 ]; then
    echo; echo "E2E_SKIP_BIND=1: run scenario skipped (run binds)"
else
    scenario_run 1af4 02
    scenario_unbind 1af4 02
fi

section "final state"
inventory
snapshot
check "every function is back on its boot driver with driver_override cleared" [ "$SNAP" = "$boot" ]

echo
if [ $failures = 0 ]; then
    echo "E2E RESULT: PASS ($checks checks)"
    exit 0
fi
echo "E2E RESULT: FAIL ($failures of $checks checks failed)"
printf '%s' "$failed" | while IFS= read -r line; do echo "E2E FAILED: $line"; done
exit 1
