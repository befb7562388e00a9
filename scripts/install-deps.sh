#!/bin/bash
# Installs every Debian 12 package the build, the tests and the demo need. Idempotent; needs root.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libpci-dev pci.ids libudev-dev libkmod-dev kmod libspdlog-dev libabsl-dev
  libfuse3-dev fuse3
  libgtest-dev libgmock-dev libbenchmark-dev
  libyaml-cpp-dev nlohmann-json3-dev libcurl4-openssl-dev prometheus-cpp-dev libcivetweb-dev
  python3 stress-ng clang libclang-rt-14-dev
  python3-yaml mmdebstrap umoci
)
# The deploy tests render daemonset/ with `kubectl kustomize`. A machine image may bring its own kubectl
# (e.g. v1.32 from Kubernetes' apt repository); otherwise Debian's kubectl 1.20 (kustomize v2.0.3) does.
if ! command -v kubectl >/dev/null; then
  PACKAGES+=(kubernetes-client)
fi
if [ "${1:-}" = --e2e ]; then
  # The real-kernel test: QEMU, a busybox initramfs and a static VFIO checker.
  PACKAGES+=(qemu-system-x86 busybox-static cpio xz-utils gzip gcc libc6-dev)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install-deps: these packages are missing and installing them needs root: ${missing[*]}" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -q
apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}"
