# Sourced by scripts/demo.sh, scripts/demo-vgpu.sh and scripts/demo-dra.sh from the repository's root, with $repo set: sets the machine
# up (root, Debian 12), builds the agent and the simulators (or takes them from $BUILD_DIR), and what both demos
# print with.

# A given build was made on a machine set up already.
[ -n "${BUILD_DIR:-}" ] || scripts/install-deps.sh
modprobe fuse 2>/dev/null || true
[ -n "${BUILD_DIR:-}" ] || scripts/build.sh release --target vfio-gpu-agent sysfs-sim kubelet-sim kubelet-dra-sim >/dev/null
bin=${BUILD_DIR:-$repo/build/release}
agent=$bin/src/cli/vfio-gpu-agent
sim=$bin/tests/sim/sysfs_sim/sysfs-sim
kubelet=$bin/tests/sim/kubelet_sim/kubelet-sim

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# show_kubelet_report FILE PID: the kubelet simulator's output (line-buffered into FILE by process PID), printed
# once its report is complete: the node description is the last thing it prints. Fails when it never came.
show_kubelet_report() {
  local file=$1 pid=$2
  for _ in $(seq 1000); do
    grep -q '^Allocatable:' "$file" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  cat "$file"
  grep -q '^Allocatable:' "$file"
}

# mount_node NODE_FILE ROOT: sysfs-sim serves NODE_FILE at ROOT/sys (FUSE) with its devices in ROOT/dev; sets
# sim_pid and returns once the mount is ready (the simulator's READY line, printed).
mount_node() {
  mkfifo "$2.ready"
  "$sim" --node "$1" --root "$2" > "$2.ready" &
  sim_pid=$!
  local ready_line
  read -r ready_line < "$2.ready"
  rm -f "$2.ready"
  echo "$ready_line"
}
