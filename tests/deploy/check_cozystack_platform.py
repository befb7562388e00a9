#!/usr/bin/env python3
"""The Cozystack platform change for cozystack.vfio-gpu-agent (daemonset/cozystack/patches, issue 33).

  check_cozystack_platform.py tables --cozystack-dir DIR --source-dir SRC
  check_cozystack_platform.py wiring --cozystack-dir DIR --helm HELM [--tree COZYSTACK_TREE]

tables: the KubeVirt tables the change adds name what the agent advertises: every resourceName of
files/vfio-gpu-agent-vgpu-defaults.yaml is its mdevNameSelector under the agent's vGPU rule
(names::VgpuResourceName: nvidia.com/ + the type name, ends trimmed, each whitespace run one "_"), and the NVSwitch
entry of files/vfio-gpu-agent-hgx-defaults.yaml is the name the package's values-hgx.yaml pins. Needs no Cozystack.

wiring: needs a Cozystack checkout (--tree, else the environment's COZYSTACK_TREE); without one it prints why and
exits 77, which CTest reports as skipped: CI has no Cozystack tree and this project commits none of its code, so
this is a manual check like tests/deploy/realcluster_policy.sh, its runs recorded in tests/deploy/records/cozystack.md.
It copies the tree's packages/core/platform, applies the patch with `git apply` (refused if it does not apply
cleanly), adds the files the pull request adds (files/, sources/, tests/ under
daemonset/cozystack/packages/core/platform) and runs, with helm_unittest.py, the new wiring suite and every suite
of the tree that renders templates/bundles/iaas.yaml (the GPU Operator's wiring must not change). It also checks
that the tree's passthrough table (files/gpu-passthrough-defaults.yaml) still carries the names the agent pins
(names::PinnedNames in src/names/resource_name_rules.cc), which is what lets both packages share it.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import helm_unittest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PLATFORM = os.path.join("packages", "core", "platform")
PATCH = os.path.join("patches", "platform-vfio-gpu-agent.patch")


def load(path):
    with open(path) as fh:
        return yaml.safe_load(fh)


def vgpu_resource_name(type_name):
    return "nvidia.com/" + "_".join(type_name.split())


def check_tables(cozystack_dir, source_dir):
    errors = []
    platform = os.path.join(cozystack_dir, PLATFORM)
    vgpu = load(os.path.join(platform, "files", "vfio-gpu-agent-vgpu-defaults.yaml"))
    entries = vgpu["permittedHostDevices"]["mediatedDevices"]
    if not entries:
        errors.append("vfio-gpu-agent-vgpu-defaults.yaml lists no mediatedDevices")
    for e in entries:
        want = vgpu_resource_name(e["mdevNameSelector"])
        if e["resourceName"] != want:
            errors.append(f"vGPU table: {e['mdevNameSelector']!r} is advertised as {want}, the table says "
                          f"{e['resourceName']}")
        if e.get("externalResourceProvider") is not True:
            errors.append(f"vGPU table: {e['resourceName']} lacks externalResourceProvider: true")
    hgx_values = load(os.path.join(cozystack_dir, "packages", "system", "vfio-gpu-agent", "values-hgx.yaml"))
    pins = {}
    for pin in hgx_values.get("resourceNames") or []:
        ids, name = pin.split("=", 1)
        pins[ids.upper()] = "nvidia.com/" + name
    hgx = load(os.path.join(platform, "files", "vfio-gpu-agent-hgx-defaults.yaml"))["pciHostDevices"]
    for e in hgx:
        want = pins.get(e["pciVendorSelector"].upper())
        if want != e["resourceName"]:
            errors.append(f"NVSwitch table: {e['pciVendorSelector']} is {e['resourceName']}, values-hgx.yaml pins "
                          f"{want}")
    if not hgx_values.get("nvswitches"):
        errors.append("values-hgx.yaml does not pass NVSwitches (nvswitches: true), yet the platform permits them")
    for msg in errors:
        print("FAIL", msg)
    print(f"tables: {len(entries)} vGPU entries, {len(hgx)} NVSwitch entries, {len(errors)} problems")
    return 1 if errors else 0


def pinned_names(source_dir):
    with open(os.path.join(source_dir, "src", "names", "resource_name_rules.cc")) as fh:
        text = fh.read()
    body = text[text.index("PinnedNames()"):]
    body = body[:body.index("};")]
    return {f"10DE:{dev.upper()}": "nvidia.com/" + name for dev, name in re.findall(r'\{0x([0-9a-f]{4}), "([^"]+)"\}', body)}


def check_wiring(cozystack_dir, source_dir, helm, tree):
    if not tree:
        print("skipped: no Cozystack checkout (set COZYSTACK_TREE=<path of a cozystack/cozystack checkout> or pass "
              "--tree); see tests/deploy/records/cozystack.md")
        return 77
    if not os.path.isdir(os.path.join(tree, PLATFORM)):
        print(f"FAIL {tree} has no {PLATFORM}: not a Cozystack checkout")
        return 1
    work = tempfile.mkdtemp(prefix="cozystack-platform-")
    try:
        dst = os.path.join(work, PLATFORM)
        shutil.copytree(os.path.join(tree, PLATFORM), dst)
        proc = subprocess.run(["git", "apply", "-p1", os.path.join(cozystack_dir, PATCH)], cwd=work,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print("FAIL the patch does not apply to", tree, ":", proc.stderr.strip())
            return 1
        ours = os.path.join(cozystack_dir, PLATFORM)
        added = []
        for path in sorted(glob.glob(os.path.join(ours, "**", "*"), recursive=True)):
            if os.path.isfile(path):
                rel = os.path.relpath(path, ours)
                os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
                shutil.copyfile(path, os.path.join(dst, rel))
                added.append(rel)
        print("applied", PATCH, "and added", ", ".join(added))

        errors = 0
        pins = pinned_names(source_dir)
        table = {e["pciVendorSelector"].upper(): e["resourceName"]
                 for e in load(os.path.join(dst, "files", "gpu-passthrough-defaults.yaml"))["pciHostDevices"]}
        if table != pins:
            errors += 1
            for sel in sorted(set(table) | set(pins)):
                if table.get(sel) != pins.get(sel):
                    print(f"FAIL passthrough table {sel}: Cozystack {table.get(sel)}, the agent pins {pins.get(sel)}")
        else:
            print(f"passthrough table: the tree's {len(table)} entries are the agent's pinned names")

        suites = []
        for suite in sorted(glob.glob(os.path.join(dst, "tests", "*_test.yaml"))):
            doc = load(suite) or {}
            if "templates/bundles/iaas.yaml" not in doc.get("templates", []):
                continue
            kinds = {k for t in doc.get("tests", []) for a in t.get("asserts", []) for k in a
                     if k not in ("not", "template", "documentIndex", "documentSelector")}
            unknown = sorted(kinds - set(helm_unittest.KINDS))
            if unknown:
                # Said, not failed: such a suite tests no GPU wiring (none does today) and the plugin, which
                # Cozystack's CI runs, evaluates it there.
                print(f"not run: {os.path.basename(suite)} uses {', '.join(unknown)}, which helm_unittest.py "
                      "does not evaluate")
                continue
            suites.append(suite)
        print("suites:", ", ".join(os.path.basename(s) for s in suites))
        proc = subprocess.run([sys.executable, os.path.join(HERE, "helm_unittest.py"), "--helm", helm, dst] + suites)
        return 1 if errors or proc.returncode != 0 else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["tables", "wiring"])
    ap.add_argument("--cozystack-dir", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--helm")
    ap.add_argument("--tree", default=os.environ.get("COZYSTACK_TREE"))
    args = ap.parse_args()
    args.cozystack_dir = os.path.abspath(args.cozystack_dir)
    args.source_dir = os.path.abspath(args.source_dir)
    args.helm = args.helm and os.path.abspath(args.helm)
    if args.what == "tables":
        return check_tables(args.cozystack_dir, args.source_dir)
    return check_wiring(args.cozystack_dir, args.source_dir, args.helm, args.tree)


if __name__ == "__main__":
    sys.exit(main())
