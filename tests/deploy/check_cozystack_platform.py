#!/usr/bin/env python3
"""The Cozystack platform change for cozystack.vfio-gpu-agent (daemonset/cozystack/patches, issue 33).

  check_cozystack_platform.py tables --cozystack-dir DIR --source-dir SRC
  check_cozystack_platform.py wiring --cozystack-dir DIR --helm HELM [--tree COZYSTACK_TREE]
  check_cozystack_platform.py kubevirt-cr --cozystack-dir DIR --helm HELM [--tree T] --variant V --out-dir D

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

kubevirt-cr: needs a Cozystack checkout too. Writes the KubeVirt CR the patched platform makes for one variant of
cozystack.vfio-gpu-agent (the bundle's cozystack.kubevirt Package values rendered by the tree's kubevirt chart) and
the tree's KubeVirt CRD, for tests/deploy/realcluster_cozystack.sh to dry-run against a real API server.
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


def patched_platform(cozystack_dir, tree, work):
    """The tree's packages/core/platform under `work`, the patch applied and the pull request's files added: the
    platform chart as it would be after the change. Returns (its path, the files added); raises SystemExit(1)
    with the reason when the tree is not a Cozystack checkout or the patch does not apply cleanly."""
    if not os.path.isdir(os.path.join(tree, PLATFORM)):
        print(f"FAIL {tree} has no {PLATFORM}: not a Cozystack checkout")
        raise SystemExit(1)
    dst = os.path.join(work, PLATFORM)
    shutil.copytree(os.path.join(tree, PLATFORM), dst)
    proc = subprocess.run(["git", "apply", "-p1", os.path.join(cozystack_dir, PATCH)], cwd=work,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print("FAIL the patch does not apply to", tree, ":", proc.stderr.strip())
        raise SystemExit(1)
    ours = os.path.join(cozystack_dir, PLATFORM)
    added = []
    for path in sorted(glob.glob(os.path.join(ours, "**", "*"), recursive=True)):
        if os.path.isfile(path):
            rel = os.path.relpath(path, ours)
            os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
            shutil.copyfile(path, os.path.join(dst, rel))
            added.append(rel)
    return dst, added


def no_tree():
    print("skipped: no Cozystack checkout (set COZYSTACK_TREE=<path of a cozystack/cozystack checkout> or pass "
          "--tree); see tests/deploy/records/cozystack.md")
    return 77


def check_wiring(cozystack_dir, source_dir, helm, tree):
    if not tree:
        return no_tree()
    work = tempfile.mkdtemp(prefix="cozystack-platform-")
    try:
        dst, added = patched_platform(cozystack_dir, tree, work)
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


def keep_only(chart, template):
    """Removes every template of `chart` but `template` and the helpers (`_*`), as helm-unittest renders one
    template of a suite at a time."""
    for path in glob.glob(os.path.join(chart, "templates", "**", "*"), recursive=True):
        if os.path.isfile(path) and not os.path.basename(path).startswith("_") \
                and os.path.relpath(path, chart) != template:
            os.remove(path)


def render_kubevirt_cr(cozystack_dir, helm, tree, variant, out_dir):
    """What the patched platform makes of KubeVirt when cozystack.vfio-gpu-agent is enabled at `variant`: the
    platform chart's bundle renders the cozystack.kubevirt Package, whose kubevirt component values the tree's
    packages/system/kubevirt chart turns into the KubeVirt CR. Writes kubevirt-cr.yaml (that CR) and
    kubevirt-crd.yaml (the KubeVirt CRD of the tree's kubevirt-operator package, for a server-side dry run) into
    `out_dir` and prints the CR's feature gates and host-device tables."""
    if not tree:
        return no_tree()
    work = tempfile.mkdtemp(prefix="cozystack-kubevirt-")
    try:
        platform, _ = patched_platform(cozystack_dir, tree, work)
        # The platform's other templates look up live objects (its OCIRepository), which `helm template` cannot.
        keep_only(platform, "templates/bundles/iaas.yaml")
        values = os.path.join(work, "platform-values.yaml")
        with open(values, "w") as f:
            yaml.safe_dump({"bundles": {"system": {"enabled": True, "variant": "isp-full"},
                                        "iaas": {"enabled": True, "vfioGpuAgentVariant": variant},
                                        "enabledPackages": ["cozystack.vfio-gpu-agent"]}}, f)
        rendered = subprocess.run([helm, "template", "cozystack", platform, "-n", "cozy-system", "-f", values], capture_output=True, text=True)
        if rendered.returncode != 0:
            print("FAIL the patched platform does not render:", rendered.stderr.strip())
            return 1
        packages = {d["metadata"]["name"]: d for d in yaml.safe_load_all(rendered.stdout) if d}
        agent = packages.get("cozystack.vfio-gpu-agent")
        if agent is None or agent["spec"].get("variant") != variant:
            print(f"FAIL the platform renders no cozystack.vfio-gpu-agent Package at variant {variant}")
            return 1
        kubevirt_values = (packages.get("cozystack.kubevirt", {}).get("spec", {}).get("components", {})
                           .get("kubevirt", {}).get("values"))
        if not kubevirt_values:
            print("FAIL the cozystack.kubevirt Package carries no kubevirt values: KubeVirt is not wired")
            return 1
        with open(values, "w") as f:
            yaml.safe_dump(kubevirt_values, f)
        # The kubevirt chart's other templates need the values Cozystack gives every package (_cluster).
        chart = os.path.join(work, "kubevirt")
        shutil.copytree(os.path.join(tree, "packages", "system", "kubevirt"), chart)
        keep_only(chart, "templates/kubevirt-cr.yaml")
        cr = subprocess.run([helm, "template", "kubevirt", chart, "-n", "cozy-kubevirt", "-f", values],
                            capture_output=True, text=True)
        if cr.returncode != 0:
            print("FAIL Cozystack's kubevirt chart does not render the platform's values:", cr.stderr.strip())
            return 1
        operator = subprocess.run([helm, "template", "kubevirt-operator",
                                   os.path.join(tree, "packages", "system", "kubevirt-operator"),
                                   "-n", "cozy-kubevirt"], capture_output=True, text=True)
        crds = [d for d in yaml.safe_load_all(operator.stdout) if d and d.get("kind") == "CustomResourceDefinition"
                and d["metadata"]["name"] == "kubevirts.kubevirt.io"]
        if operator.returncode != 0 or len(crds) != 1:
            print("FAIL the tree's kubevirt-operator chart renders no kubevirts.kubevirt.io CRD:",
                  operator.stderr.strip())
            return 1
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "kubevirt-cr.yaml"), "w") as f:
            f.write(cr.stdout)
        with open(os.path.join(out_dir, "kubevirt-crd.yaml"), "w") as f:
            yaml.safe_dump(crds[0], f)
        kubevirt = next(d for d in yaml.safe_load_all(cr.stdout) if d)
        conf = kubevirt["spec"]["configuration"]
        hostdevs = conf.get("permittedHostDevices") or {}
        print(f"variant {variant}: featureGates", ",".join(conf["developerConfiguration"]["featureGates"]))
        for table in ("pciHostDevices", "mediatedDevices"):
            entries = hostdevs.get(table) or []
            print(f"variant {variant}: {table}: {len(entries)} entries"
                  + (f", e.g. {entries[0].get('resourceName')}" if entries else ""))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["tables", "wiring", "kubevirt-cr"])
    ap.add_argument("--cozystack-dir", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--helm")
    ap.add_argument("--tree", default=os.environ.get("COZYSTACK_TREE"))
    ap.add_argument("--variant", default="default")
    ap.add_argument("--out-dir")
    args = ap.parse_args()
    args.cozystack_dir = os.path.abspath(args.cozystack_dir)
    args.source_dir = os.path.abspath(args.source_dir)
    args.helm = args.helm and os.path.abspath(args.helm)
    if args.what == "tables":
        return check_tables(args.cozystack_dir, args.source_dir)
    if args.what == "kubevirt-cr":
        return render_kubevirt_cr(args.cozystack_dir, args.helm, args.tree, args.variant, args.out_dir)
    return check_wiring(args.cozystack_dir, args.source_dir, args.helm, args.tree)


if __name__ == "__main__":
    sys.exit(main())
