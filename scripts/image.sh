#!/bin/bash
# Builds the agent's OCI image archive (OCI layout in a tar: oci-layout, index.json, blobs/sha256/) from Debian 12
# packages only, with no registry pull: mmdebstrap extracts daemonset/packages.txt and their dependencies (no
# shell, no dpkg, no apt), the stripped release binary becomes /usr/bin/vfio-gpu-agent, the image's Entrypoint.
# Reproducible: the same binary and package versions give the same archive byte for byte (SOURCE_DATE_EPOCH
# from the commit, sorted tar, fixed mtimes, uid/gid 0, gzip -n, JSON with sorted keys).
#
# Usage: scripts/image.sh [--agent BINARY] [--out DIR]
#   --agent  the release agent (default build/release/src/cli/vfio-gpu-agent, built by scripts/build.sh release)
#   --out    where the archive goes (default build/image)
# Environment: VA_DEBIAN_MIRROR (default http://deb.debian.org/debian; snapshot.debian.org/archive/debian/<time>
# pins every package), VA_DEBIAN_SECURITY (default http://deb.debian.org/debian-security, empty: none),
# SOURCE_DATE_EPOCH (default: the commit time of HEAD), VA_SOURCE_REVISION (default: HEAD's hash; the image's
# revision label). Needs root, mmdebstrap, python3, and the mirror;
# downloaded packages are kept in build/image-cache.
# Prints the archive's size, then its path as the last line.
set -euo pipefail
cd "$(dirname "$0")/.."

agent=build/release/src/cli/vfio-gpu-agent
out=build/image
while [ $# -gt 0 ]; do
  case "$1" in
    --agent) agent=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "image.sh: unknown argument $1 (usage: scripts/image.sh [--agent BINARY] [--out DIR])" >&2; exit 2 ;;
  esac
done
mirror=${VA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${VA_DEBIAN_SECURITY-http://deb.debian.org/debian-security}
cache=$PWD/build/image-cache
: "${SOURCE_DATE_EPOCH:=$(git log -1 --format=%ct 2>/dev/null || true)}"
revision=${VA_SOURCE_REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
if ! [[ "$SOURCE_DATE_EPOCH" =~ ^[0-9]+$ ]]; then
  echo "image.sh: not a git checkout: set SOURCE_DATE_EPOCH (seconds) for the image's timestamps" >&2
  exit 2
fi
export SOURCE_DATE_EPOCH LC_ALL=C TZ=UTC

if [ ! -x "$agent" ]; then
  echo "image.sh: no agent binary at $agent (scripts/build.sh release builds it)" >&2
  exit 2
fi
for tool in mmdebstrap python3 strip sha256sum; do
  command -v "$tool" >/dev/null || { echo "image.sh: $tool is missing (scripts/install-deps.sh)" >&2; exit 2; }
done
version=$("$agent" --version | awk '{print $2}')
mapfile -t packages < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' daemonset/packages.txt | grep -v '^$')

# Every library the binary loads must come from a listed package: the NEEDED entries and the sonames it names
# for dlopen (libkmod.so.2) alike. A library from an unlisted package would be missing at run time.
listed=" ${packages[*]%%=*} "
# Libraries the agent dlopens from the node itself, never from the image: Fabric Manager's client must be the
# node's FM version, and the chart mounts the node's copy (fabricManager.libraryHostPath).
export HOST_PROVIDED="libnvfm.so.1"
for soname in $(grep -aoE 'lib[a-z0-9_+-]+\.so(\.[0-9]+)+|ld-linux-x86-64\.so\.2' "$agent" | sort -u); do
  case " $HOST_PROVIDED " in *" $soname "*) continue ;; esac
  # awk reads to the end: exiting at the first match would kill ldconfig with SIGPIPE, and pipefail would make
  # that (timing-dependent) exit 141 the script's.
  path=$(ldconfig -p | awk -v s="$soname" '$1 == s && /x86-64/ && path == "" {path = $NF} END {print path}')
  [ -n "$path" ] || { echo "image.sh: $agent names $soname, which this machine does not have" >&2; exit 1; }
  pkg=$(dpkg -S "$path" 2>/dev/null || dpkg -S "$(readlink -f "$path")" 2>/dev/null || true)
  pkg=${pkg%%:*}
  case "$listed" in
    *" $pkg "*) ;;
    *) echo "image.sh: $agent loads $soname from package '${pkg:-?}', which daemonset/packages.txt lacks" >&2; exit 1 ;;
  esac
done

work=$(mktemp -d "${TMPDIR:-/tmp}/vfio-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
mkdir -p "$cache" "$out"

sources=("deb $mirror bookworm main")
[ -n "$security" ] && sources+=("deb $security bookworm-security main")
# extract: unpack the packages (and their dependencies) without running maintainer scripts, so no dpkg,
# apt or shell has to be in the image. The package cache is synced in and out so reruns download nothing.
mmdebstrap --quiet --variant=extract --mode=root --format=directory \
  --include="$(IFS=,; echo "${packages[*]}")" \
  --skip=output/dev,output/mknod \
  --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
  --setup-hook="sync-in $cache /var/cache/apt/archives/" \
  --extract-hook="sync-out /var/cache/apt/archives $cache" \
  bookworm "$rootfs" "${sources[@]}" >&2

# Drop everything that is not a package's run-time file: mmdebstrap's apt/dpkg state, /etc and /dev skeleton
# (a runtime provides resolv.conf, hostname and /dev), caches, documentation (copyright files stay), locales.
(cd "$rootfs" && rm -rf var etc dev usr/share/man usr/share/info usr/share/locale usr/share/lintian)
find "$rootfs/usr/share/doc" -type f ! -name copyright -delete
find "$rootfs/usr/share/doc" -type l -delete
install -D -m 0755 /dev/null "$rootfs/usr/bin/vfio-gpu-agent"
strip --strip-all -o "$rootfs/usr/bin/vfio-gpu-agent" "$agent"

# Keep only the shared objects the agent can reach: its interpreter, what it names (NEEDED entries and the
# sonames it dlopens) and, recursively, what those need. The rest of the packages' libraries (glibc's iconv
# modules, libmvec, SASL and OpenSSL plugins, libraries of other tools) is never loaded. A soname that is
# missing stops the build here instead of failing at run time.
python3 - "$rootfs" <<'EOF'
import os, re, subprocess, sys

rootfs = sys.argv[1]
LIBDIRS = ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "lib", "usr/lib"]


def host(path):
    return os.path.join(rootfs, path.lstrip("/"))


def chain(path):
    """The path and every symlink hop from it, resolved inside the root filesystem; None if it dangles."""
    hops = []
    for _ in range(40):
        hops.append(path)
        if os.path.islink(host(path)):
            target = os.readlink(host(path))
            path = os.path.normpath(target if target.startswith("/") else os.path.join(os.path.dirname(path), target))
            continue
        return hops if os.path.isfile(host(path)) else None
    return None


def dynamic(path, tag):
    out = subprocess.run(["readelf", "-d", "-l", "-W", host(path)], capture_output=True, text=True, check=True).stdout
    if tag == "interp":
        return re.findall(r"Requesting program interpreter: (\S+)\]", out)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out)


agent = "/usr/bin/vfio-gpu-agent"
with open(host(agent), "rb") as f:
    named = set(m.decode() for m in re.findall(rb"lib[a-z0-9_+-]+\.so(?:\.[0-9]+)+", f.read()))
named -= set(os.environ["HOST_PROVIDED"].split())
# glibc itself dlopens libgcc_s for pthread_cancel/pthread_exit unwinding and backtrace().
named.add("libgcc_s.so.1")
keep = set()
todo = [(p, agent) for p in dynamic(agent, "interp")] + [(n, agent) for n in sorted(named | set(dynamic(agent, "needed")))]
seen = set()
while todo:
    name, user = todo.pop()
    if name in seen:
        continue
    seen.add(name)
    hops = chain(name) if name.startswith("/") else next(
        (c for c in (chain("/" + d + "/" + name) for d in LIBDIRS) if c), None)
    if not hops:
        sys.exit(f"image.sh: {user} needs {name}, which no package in daemonset/packages.txt provides")
    keep.update(hops)
    todo += [(n, hops[-1]) for n in dynamic(hops[-1], "needed")]

removed = 0
for d in LIBDIRS:
    for dirpath, dirnames, filenames in os.walk(host("/" + d)):
        for fn in filenames:
            rel = "/" + os.path.relpath(os.path.join(dirpath, fn), rootfs)
            if ".so" in fn and rel not in keep:
                os.unlink(os.path.join(dirpath, fn))
                removed += 1
for d in LIBDIRS:
    for dirpath, dirnames, filenames in os.walk(host("/" + d), topdown=False):
        if not os.listdir(dirpath) and dirpath != host("/" + d):
            os.rmdir(dirpath)
print(f"image.sh: kept {len(keep)} library paths ({', '.join(sorted(os.path.basename(k) for k in keep))}), "
      f"removed {removed}", file=sys.stderr)
EOF
# Mount points a runtime expects; /tmp for the agent's temporary files.
for d in proc sys dev etc run tmp var/run; do mkdir -p "$rootfs/$d"; done
chmod 1777 "$rootfs/tmp"
find "$rootfs" -depth -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +

layout=$work/oci
mkdir -p "$layout/blobs/sha256"
# One layer: names sorted, owner 0:0, mtimes fixed, no atime/ctime, gzip without name or time.
(cd "$rootfs" && find . -mindepth 1 -printf '%P\n' | sort > "$work/files")
tar --create --file="$work/layer.tar" --directory="$rootfs" --no-recursion --files-from="$work/files" \
  --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" --format=posix \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime
gzip -9 -n -c "$work/layer.tar" > "$work/layer.tar.gz"

python3 - "$layout" "$work" "$version" "$SOURCE_DATE_EPOCH" "$revision" <<'EOF'
import datetime, hashlib, json, os, shutil, sys

layout, work, version, epoch, revision = sys.argv[1:]
created = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def put_blob(data):
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(layout, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + digest, "size": len(data)}


def dumps(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


layer_digest = sha256(os.path.join(work, "layer.tar.gz"))
shutil.copyfile(os.path.join(work, "layer.tar.gz"), os.path.join(layout, "blobs", "sha256", layer_digest))
with open("daemonset/packages.txt") as f:
    packages = " ".join(line.split("#")[0].strip() for line in f if line.split("#")[0].strip())
labels = {
    "org.opencontainers.image.title": "vfio-gpu-agent",
    "org.opencontainers.image.version": version,
    "org.opencontainers.image.revision": revision,
    "org.opencontainers.image.created": created,
    "org.opencontainers.image.base.name": "debian:bookworm (mmdebstrap --variant=extract)",
}
config = {
    "architecture": "amd64",
    "os": "linux",
    "created": created,
    "config": {
        "Entrypoint": ["/usr/bin/vfio-gpu-agent"],
        "Cmd": ["run"],
        "Env": ["PATH=/usr/bin"],
        "Labels": labels,
    },
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + sha256(os.path.join(work, "layer.tar"))]},
    "history": [{"created": created, "created_by": "scripts/image.sh: mmdebstrap --variant=extract bookworm " + packages}],
}
config_desc = put_blob(dumps(config))
manifest = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": dict(mediaType="application/vnd.oci.image.config.v1+json", **config_desc),
    "layers": [dict(mediaType="application/vnd.oci.image.layer.v1.tar+gzip", digest="sha256:" + layer_digest,
                    size=os.path.getsize(os.path.join(work, "layer.tar.gz")))],
    "annotations": {k: v for k, v in labels.items() if k != "org.opencontainers.image.base.name"},
}
manifest_desc = put_blob(dumps(manifest))
index = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [dict(mediaType="application/vnd.oci.image.manifest.v1+json",
                       annotations={"org.opencontainers.image.ref.name": version}, **manifest_desc)],
}
with open(os.path.join(layout, "index.json"), "wb") as f:
    f.write(dumps(index))
with open(os.path.join(layout, "oci-layout"), "wb") as f:
    f.write(dumps({"imageLayoutVersion": "1.0.0"}))
EOF

archive=$out/vfio-gpu-agent-$version.oci.tar
find "$layout" -depth -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +
(cd "$layout" && find . -mindepth 1 -printf '%P\n' | sort > "$work/layout-files")
tar --create --file="$archive.tmp" --directory="$layout" --no-recursion --files-from="$work/layout-files" \
  --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" --format=posix \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime
mv "$archive.tmp" "$archive"
size=$(stat -c %s "$archive")
echo "size: $size bytes ($(( (size + 524288) / 1048576 )) MB), sha256 $(sha256sum "$archive" | cut -d' ' -f1)"
echo "$archive"
