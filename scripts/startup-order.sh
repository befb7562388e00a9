#!/bin/bash
# Regenerates src/cli/startup-order.ld, the link order of the shipped binary's start-up code.
#
# Why: the kernel maps a binary's text 64 kB around each page fault, so what counts in the RSS is the number of 64 kB
# windows start-up touches, not the bytes it runs. Left where the linker puts it, the code `serve` runs up to
# Register (gRPC core's start, protobuf's descriptors, the static initializers, our scan) is spread over most of the
# 8 MB of text. The linker script lists the input sections that start-up executes, so that GNU ld puts them first,
# together, in an output section of their own.
#
# How: runs `serve` and then `run` (device plugin, passthrough: the default mode) under callgrind on the simulated
# 8x H200 node (tests/sim/nodes/hgx-h200-8gpu.json) until the kubelet simulator lists the 8 GPUs healthy, stops
# them with SIGTERM, and maps every instruction they executed to its input section through the link map
# (build/release/src/cli/vfio-gpu-agent.map). `serve`'s sections come first, then those only `run` adds.
#
# A stale list is only slower and bigger, never wrong: a section it names that no longer exists matches nothing,
# and new start-up code lands in the rest of the text. Regenerate after a change that moves start-up work, and
# compare `rss_registered_kB` of tests/bench/plugin's BM_LaunchToRegister before and after.
#
# Usage: scripts/startup-order.sh [BUILD_DIR]   (default build/release, after scripts/build.sh release);
#        KEEP_WORK=1 keeps the callgrind profiles and the simulators' logs.
# Needs valgrind (apt-get install valgrind) and /dev/fuse (the sysfs simulator), as the tests do.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
agent=$build/src/cli/vfio-gpu-agent
map=$build/src/cli/vfio-gpu-agent.map
sim=$build/tests/sim
out=src/cli/startup-order.ld
command -v valgrind >/dev/null || { echo "startup-order: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
for f in "$agent" "$map" "$sim/sysfs_sim/sysfs-sim" "$sim/kubelet_sim/kubelet-sim"; do
  [ -e "$f" ] || { echo "startup-order: $f is missing: run scripts/build.sh release first" >&2; exit 1; }
done
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then echo "startup-order: kept $work (the profiles, the simulators' logs)" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

resource=nvidia.com/GH100_H200_SXM_141GB
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# profile NAME COMMAND [ARGS...]: one start of the agent under callgrind on a fresh simulated node.
profile() {
  local name=$1 command=$2
  shift 2
  local dir=$work/$name
  mkdir -p "$dir/kubelet"
  "$sim/sysfs_sim/sysfs-sim" --node tests/sim/nodes/hgx-h200-8gpu.json --root "$dir/node" >"$dir/sim.log" 2>&1 &
  pids+=($!)
  until grep -q READY "$dir/sim.log"; do
    kill -0 "${pids[-1]}" 2>/dev/null || { cat "$dir/sim.log" >&2; exit 1; }
    sleep 0.1
  done
  local roots=(--sysfs-root "$dir/node/sys" --dev-root "$dir/node/dev" --proc-root "$dir/node/proc")
  # `serve` serves what is on vfio-pci already; `run` binds the GPUs itself.
  if [ "$command" = serve ]; then "$agent" bind "${roots[@]}" >"$dir/bind.log" 2>&1; fi
  "$sim/kubelet_sim/kubelet-sim" --dir "$dir/kubelet" --pod-resources-socket "$dir/pod-resources.sock" \
    --wait "$resource=8" --timeout-ms 300000 >"$dir/kubelet.log" 2>&1 &
  local kubelet=$!
  pids+=("$kubelet")
  until [ -S "$dir/kubelet/kubelet.sock" ]; do sleep 0.1; done
  env -u KUBERNETES_SERVICE_HOST -u KUBECONFIG -u NODE_NAME \
    valgrind --tool=callgrind --dump-instr=yes --dump-line=no --compress-pos=no --compress-strings=no \
    --callgrind-out-file="$dir/callgrind.out" "$agent" "$command" "${roots[@]}" --kubelet-dir "$dir/kubelet" "$@" \
    >"$dir/agent.log" 2>&1 &
  local agent_pid=$!
  pids+=("$agent_pid")  # on a failure below, cleanup stops it too
  if ! wait "$kubelet"; then
    echo "startup-order: the kubelet simulator did not see $resource=8 from $command:" >&2
    tail -20 "$dir/agent.log" "$dir/kubelet.log" >&2
    exit 1
  fi
  kill -TERM "$agent_pid"
  wait "$agent_pid" || true
}

profile serve serve
profile run run --pod-resources-socket "$work/run/pod-resources.sock" --listen-address 127.0.0.1 \
  --health-port "$(free_port)" --metrics-port "$(free_port)"

python3 - "$map" "$(readlink -f "$agent")" "$out" "$work/serve/callgrind.out" "$work/run/callgrind.out" <<'EOF'
import bisect, collections, re, subprocess, sys

map_file, agent, out, profiles = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]

# The input sections of every .text* output section: (address, size, section, object).
sections, pending = [], None
in_text = False
for line in open(map_file):
    line = line.rstrip('\n')
    if re.match(r'^\.[A-Za-z_]', line):
        in_text = line.split()[0].startswith('.text')
        continue
    if not in_text:
        continue
    m = re.match(r'^ (\.\S+)\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+(\S.*)$', line)
    if m:
        sections.append((int(m[2], 16), int(m[3], 16), m[1], m[4]))
        pending = None
        continue
    m = re.match(r'^ (\.\S+)$', line)
    if m:
        pending = m[1]
        continue
    m = re.match(r'^\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+(\S.*)$', line)
    if m and pending:
        sections.append((int(m[1], 16), int(m[2], 16), pending, m[3]))
        pending = None
sections = sorted(s for s in sections if s[1] > 0)
starts = [s[0] for s in sections]

# Sections named after their function (-ffunction-sections, and the C++ inline functions of every library) are
# listed by name; the plain .text of an object compiled without it (Debian's gRPC, protobuf, abseil), by archive
# member.
GENERIC = {'.text', '.text.unlikely', '.text.startup', '.text.hot', '.text.exit'}
def pattern(section, obj):
    if section not in GENERIC:
        return f'*({section})'
    member = re.match(r'^(?:.*/)?([^/(]+\.a)\(([^)]+)\)$', obj)
    if member:
        return f'*{member[1]}:{member[2]}({section})'
    return '*' + '/'.join(obj.split('/')[-3:]) + f'({section})'

# valgrind names no object for code outside a binary's .text section (the ordered section of a binary linked with
# this script) and gives its absolute addresses; it still names the functions, and the binary's symbol table says
# where each starts, which yields the load address.
symbols = {}
for line in subprocess.run(['nm', '-C', '--defined-only', agent], capture_output=True, text=True,
                           check=True).stdout.splitlines():
    address, kind, name = line.split(' ', 2)
    if kind in 'tTW':
        symbols[name] = None if name in symbols else int(address, 16)

def executed(profile):
    obj, function = None, None
    relative, unnamed, entries = [], [], {}
    for line in open(profile):
        if line.startswith('ob='):
            obj = line[3:].strip()
        elif line.startswith('fn='):
            function = line[3:].strip()
        elif line.startswith('0x'):
            address = int(line.split()[0], 16)
            if obj == agent:
                relative.append(address)
            elif obj == '???':
                unnamed.append(address)
                entries[function] = min(address, entries.get(function, address))
    biases = collections.Counter(a - symbols[f] for f, a in entries.items() if symbols.get(f) is not None)
    if unnamed and not biases:
        sys.exit('startup-order: no function of the unnamed object is in the binary\'s symbol table')
    bias = biases.most_common(1)[0][0] if biases else 0
    hit = set()
    for address in relative + [a - bias for a in unnamed]:
        i = bisect.bisect_right(starts, address) - 1
        if i >= 0 and address < sections[i][0] + sections[i][1]:
            hit.add(i)
    return hit

patterns, seen, summary = [], set(), []
for profile in profiles:
    hit = executed(profile)
    added = 0
    for i in sorted(hit):
        p = pattern(sections[i][2], sections[i][3])
        if p not in seen:
            seen.add(p)
            patterns.append(p)
            added += sections[i][1]
    summary.append(f'{len(hit)} sections, {added // 1024} kB new')

with open(out, 'w') as f:
    f.write('/* Generated by scripts/startup-order.sh: the input sections `serve`, then `run`, execute from exec to the\n'
            '   kubelet listing their GPUs, on the simulated 8x H200 node. Linked into the shipped binary only\n'
            '   (src/cli/CMakeLists.txt); see the script for why and how. Do not edit by hand. */\n')
    f.write('SECTIONS\n{\n  .text.startup_order :\n  {\n')
    for p in patterns:
        f.write(f'    {p}\n')
    f.write('  }\n}\nINSERT BEFORE .text;\n')
print(f'startup-order: {out}: {len(patterns)} patterns; serve: {summary[0]}; run: {summary[1]}')
EOF
