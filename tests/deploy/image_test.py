#!/usr/bin/env python3
"""The OCI image from scripts/image.sh, checked by running it (needs root, the Debian mirror, umoci, FUSE).

  image_test.py run          --source-dir DIR --agent BIN --sysfs-sim BIN --node FILE
  image_test.py reproducible --source-dir DIR --agent BIN

`run`: builds the archive, unpacks it with umoci (a standard OCI tool: what it unpacks is what a runtime would
get), checks the image has the agent as its Entrypoint and no shell or package manager, and runs the unpacked
root filesystem in fresh mount and pid namespaces (unshare + chroot; podman and crun cannot set rlimits on
these machines): `--version`, and `inspect --json` against the FUSE simulator bind-mounted in, which must print
the same JSON as the agent outside the image (the outside run sees the image's pci.ids at the same path).
`reproducible`: two builds of the same commit give the same archive byte for byte, under 15 MB.
"""
import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

SIZE_LIMIT = 15 * 1024 * 1024


def fail(msg):
    print("FAIL", msg)
    sys.exit(1)


def build_image(source_dir, agent, out):
    proc = subprocess.run([os.path.join(source_dir, "scripts", "image.sh"), "--agent", agent, "--out", out],
                          cwd=source_dir, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        fail(f"image.sh exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
    lines = proc.stdout.strip().splitlines()
    archive = lines[-1]
    if not os.path.isabs(archive):
        archive = os.path.join(source_dir, archive)
    if not os.path.isfile(archive):
        fail(f"image.sh's last line {lines[-1]!r} is not the archive")
    if not any(line.startswith("size: ") for line in lines[:-1]):
        fail(f"image.sh printed no size line: {lines}")
    print(f"built {archive}: {lines[-2]}")
    return archive


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def freeze_inputs(args, tmp):
    """One agent binary and one commit for the whole test: other builds and commits in the same checkout may
    replace the binary or move HEAD while it runs."""
    frozen = os.path.join(tmp, "vfio-gpu-agent")
    shutil.copy2(args.agent, frozen)
    args.agent = frozen
    git = lambda *a: subprocess.run(["git", "-C", args.source_dir, *a], capture_output=True, text=True).stdout.strip()
    os.environ.setdefault("SOURCE_DATE_EPOCH", git("log", "-1", "--format=%ct"))
    os.environ.setdefault("VA_SOURCE_REVISION", git("rev-parse", "HEAD"))


def reproducible(args):
    with tempfile.TemporaryDirectory() as tmp:
        freeze_inputs(args, tmp)
        first = build_image(args.source_dir, args.agent, os.path.join(tmp, "a"))
        second = build_image(args.source_dir, args.agent, os.path.join(tmp, "b"))
        a, b = sha256(first), sha256(second)
        if a != b:
            fail(f"two builds differ: {a} vs {b}")
        size = os.path.getsize(first)
        if size >= SIZE_LIMIT:
            fail(f"archive is {size} bytes, the target is under {SIZE_LIMIT}")
        print(f"two builds identical (sha256 {a}), {size} bytes")


def check_libraries(rootfs):
    """Every ELF file in the image finds each library it needs inside the image (ld.so's multiarch dirs)."""
    libdirs = ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib", "usr/lib"]
    count = 0
    for dirpath, _, filenames in os.walk(rootfs):
        for fn in filenames:
            path = os.path.join(dirpath, fn)
            if os.path.islink(path):
                continue
            with open(path, "rb") as f:
                if f.read(4) != b"\x7fELF":
                    continue
            out = subprocess.run(["readelf", "-d", "-W", path], capture_output=True, text=True).stdout
            for lib in re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out):
                if not any(os.path.exists(os.path.join(rootfs, d, lib)) for d in libdirs):
                    fail(f"{os.path.relpath(path, rootfs)} needs {lib}, which the image lacks")
            count += 1
    if count < 2:
        fail(f"only {count} ELF files in the image")
    print(f"{count} ELF files in the image, every NEEDED library present")


def run_in_namespaces(script, timeout=60):
    """Runs a shell script in new mount and pid namespaces (mounts private, gone when it exits)."""
    return subprocess.run(["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "sh", "-euc", script],
                          capture_output=True, text=True, timeout=timeout)


def start_sim(sim_binary, node, root):
    proc = subprocess.Popen([sim_binary, "--node", node, "--root", root], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        fail(f"sysfs-sim did not start: {line!r}")
    return proc


def run(args):
    with tempfile.TemporaryDirectory() as tmp:
        freeze_inputs(args, tmp)
        archive = build_image(args.source_dir, args.agent, os.path.join(tmp, "out"))
        layout = os.path.join(tmp, "oci")
        os.mkdir(layout)
        subprocess.run(["tar", "-xf", archive, "-C", layout], check=True)
        with open(os.path.join(layout, "index.json")) as f:
            index = json.load(f)
        refs = [m.get("annotations", {}).get("org.opencontainers.image.ref.name") for m in index["manifests"]]
        if len(refs) != 1 or not refs[0]:
            fail(f"index.json should name one manifest with a ref.name: {refs}")
        bundle = os.path.join(tmp, "bundle")
        proc = subprocess.run(["umoci", "unpack", "--image", f"{layout}:{refs[0]}", bundle],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            fail(f"umoci unpack: {proc.stderr}")
        with open(os.path.join(bundle, "config.json")) as f:
            runtime_args = json.load(f)["process"]["args"]
        if runtime_args[:1] != ["/usr/bin/vfio-gpu-agent"]:
            fail(f"the runtime would start {runtime_args}, not the agent")
        rootfs = os.path.join(bundle, "rootfs")
        for absent in ("bin/sh", "usr/bin/sh", "bin/bash", "usr/bin/dpkg", "usr/bin/apt", "usr/bin/apt-get"):
            if os.path.lexists(os.path.join(rootfs, absent)):
                fail(f"the image has /{absent}")

        check_libraries(rootfs)

        outside_version = subprocess.run([args.agent, "--version"], capture_output=True, text=True).stdout
        proc = run_in_namespaces(f"exec chroot {shlex.quote(rootfs)} /usr/bin/vfio-gpu-agent --version")
        if proc.returncode != 0 or proc.stdout != outside_version:
            fail(f"--version in the image: exit {proc.returncode}, {proc.stdout!r}{proc.stderr!r}; outside {outside_version!r}")
        print(f"--version in the image: {proc.stdout.strip()}")

        sim_root = os.path.join(tmp, "sim")
        os.mkdir(sim_root)
        sim = start_sim(args.sysfs_sim, args.node, sim_root)
        try:
            flags = f"--json --sysfs-root {shlex.quote(sim_root)}/sys --dev-root {shlex.quote(sim_root)}/dev"
            image_pci_ids = os.path.join(rootfs, "usr/share/misc/pci.ids")
            # Outside: the same agent on the same simulator, with the image's pci.ids where the agent looks first.
            outside = run_in_namespaces(
                f"mount --bind {shlex.quote(image_pci_ids)} /usr/share/misc/pci.ids\n"
                f"exec {shlex.quote(args.agent)} inspect {flags}")
            # Inside: the simulator bind-mounted at the same path in the image, procfs of the new pid namespace.
            target = rootfs + sim_root
            inside = run_in_namespaces(
                f"mkdir -p {shlex.quote(target)}\n"
                f"mount --rbind {shlex.quote(sim_root)} {shlex.quote(target)}\n"
                f"mount -t proc proc {shlex.quote(rootfs)}/proc\n"
                f"exec chroot {shlex.quote(rootfs)} /usr/bin/vfio-gpu-agent inspect {flags}")
        finally:
            sim.terminate()
            sim.wait(timeout=30)
        for name, proc in (("outside", outside), ("in the image", inside)):
            if proc.returncode not in (0, 1):  # 1: some device is not where it should be yet (inspect only reads)
                fail(f"inspect {name}: exit {proc.returncode}: {proc.stderr}")
        try:
            outside_json, inside_json = json.loads(outside.stdout), json.loads(inside.stdout)
        except json.JSONDecodeError as e:
            fail(f"inspect printed no JSON: {e}\noutside: {outside.stdout[:500]}\ninside: {inside.stdout[:500]}")
        if not outside_json.get("functions"):
            fail("inspect outside found no functions on the simulator: the comparison would prove nothing")
        if inside_json != outside_json or inside.returncode != outside.returncode:
            fail(f"inspect --json differs in the image (exit {inside.returncode} vs {outside.returncode}):\n"
                 f"{inside.stdout}\n---- outside:\n{outside.stdout}")
        print(f"inspect --json in the image equals the agent's outside: {len(inside_json['functions'])} functions, "
              f"exit {inside.returncode}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["run", "reproducible"])
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--sysfs-sim")
    parser.add_argument("--node")
    args = parser.parse_args()
    start = time.monotonic()
    if args.mode == "run":
        if not args.sysfs_sim or not args.node:
            parser.error("run needs --sysfs-sim and --node")
        run(args)
    else:
        reproducible(args)
    print(f"ok in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
