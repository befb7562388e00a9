#!/usr/bin/env python3
"""Checks the Cozystack package daemonset/cozystack (issue 33) with the real helm and kubectl.

  check_cozystack.py variants --cozystack-dir DIR --helm HELM
  check_cozystack.py same     --cozystack-dir DIR --helm HELM --kubectl KUBECTL --daemonset-dir DIR

`variants`: for every variant of packages/core/platform/sources/vfio-gpu-agent.yaml, `helm lint --strict` and
`helm template` with exactly its valuesFiles, release name and namespace; the objects render, in the install
namespace, with the DaemonSet's workload flags the variant's name promises.
`same`: each variant renders the objects of the kustomize tree made from the same node-role file, apart from
Helm's own labels and what the package sets on purpose: the namespace (cozy-vfio-gpu-agent there, the tree's own
here) and the image repository (Cozystack's registry). The `label` variant has no tree.
Every failed check is printed; exit 1 if any failed.
"""
import argparse
import os
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_chart  # noqa: E402

SOURCE = "packages/core/platform/sources/vfio-gpu-agent.yaml"
PACKAGE = "packages/system/vfio-gpu-agent"
# variant -> (its node-role file, the generated kustomize tree with the same role, that tree's namespace)
EXPECTED = {
    "default": ("values-passthrough.yaml", "overlays/cozystack", "cozy-gpu-operator"),
    "vgpu": ("values-vgpu.yaml", "overlays/vgpu", "vfio-gpu-agent"),
    "label": ("values-label.yaml", None, None),
    "hgx": ("values-hgx.yaml", "overlays/hgx", "vfio-gpu-agent"),
    "hgx-shared": ("values-hgx-shared.yaml", "overlays/hgx-shared", "vfio-gpu-agent"),
    "dra": ("values-dra.yaml", "overlays/dra", "vfio-gpu-agent"),
}
FLAGS = {
    "default": (["--status-dir=/run/nvidia/validations"], ["--nvswitches", "--kubelet-api=dra", "--workload=vm-vgpu"]),
    "vgpu": (["--workload=vm-vgpu"], ["--nvswitches", "--kubelet-api=dra"]),
    "label": (["--state-dir=/var/lib/vfio-gpu-agent"], ["--workload=vm-vgpu", "--nvswitches"]),
    "hgx": (["--nvswitches"], ["--kubelet-api=dra"]),
    "hgx-shared": (["--fabric-manager=unix:/run/nvidia-fabricmanager/socket"], ["--nvswitches"]),
    "dra": (["--kubelet-api=dra"], ["--nvswitches"]),
}


def variants(args):
    with open(os.path.join(args.cozystack_dir, SOURCE)) as fh:
        source = yaml.safe_load(fh)
    out = {}
    for v in source["spec"]["variants"]:
        (component,) = v["components"]
        out[v["name"]] = component
    return out


def render(args, component):
    chart = os.path.join(args.cozystack_dir, "packages", component["path"])
    files = []
    for f in component["valuesFiles"]:
        files += ["-f", os.path.join(chart, f)]
    install = component["install"]
    lint = subprocess.run([args.helm, "lint", "--strict", chart, "--namespace", install["namespace"]] + files,
                          capture_output=True, text=True, timeout=120)
    proc = subprocess.run([args.helm, "template", install["releaseName"], chart, "--namespace", install["namespace"]]
                          + files, capture_output=True, text=True, timeout=120)
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d] if proc.returncode == 0 else None
    return lint, proc, docs


def cmd_variants(args):
    failures = []
    found = variants(args)
    if sorted(found) != sorted(EXPECTED):
        failures.append(f"{SOURCE}: variants {sorted(found)}, expected {sorted(EXPECTED)}")
    for name, component in found.items():
        if component["path"] != "system/vfio-gpu-agent":
            failures.append(f"{name}: path {component['path']}")
        role = EXPECTED.get(name, (None,))[0]
        if component["valuesFiles"] != ["values.yaml", role]:
            failures.append(f"{name}: valuesFiles {component['valuesFiles']}, expected ['values.yaml', '{role}']")
        install = component["install"]
        if install != {"privileged": True, "namespace": "cozy-vfio-gpu-agent", "releaseName": "vfio-gpu-agent"}:
            failures.append(f"{name}: install {install}")
        lint, proc, docs = render(args, component)
        if lint.returncode != 0:
            failures.append(f"{name}: helm lint --strict: {lint.stdout}{lint.stderr}")
        if docs is None:
            failures.append(f"{name}: helm template: {proc.stderr}")
            continue
        kinds = [d["kind"] for d in docs]
        if "Namespace" in kinds:
            failures.append(f"{name}: renders a Namespace; the platform creates cozy-vfio-gpu-agent (install.privileged)")
        for d in docs:
            ns = d["metadata"].get("namespace")
            if ns not in (None, "cozy-vfio-gpu-agent"):
                failures.append(f"{name}: {d['kind']}/{d['metadata']['name']} in namespace {ns}")
        ds = [d for d in docs if d["kind"] == "DaemonSet"]
        if len(ds) != 1:
            failures.append(f"{name}: {len(ds)} DaemonSets")
            continue
        args_ = ds[0]["spec"]["template"]["spec"]["containers"][0]["args"]
        want, unwanted = FLAGS[name]
        for flag in want:
            if flag not in args_:
                failures.append(f"{name}: {flag} missing from {args_}")
        for flag in unwanted:
            if flag in args_:
                failures.append(f"{name}: {flag} in {args_}")
        print(f"{name}: {len(docs)} objects ({', '.join(sorted(set(kinds)))})")
    return failures


def normalise(docs, namespace):
    text = yaml.safe_dump_all(check_chart.strip_helm_labels(docs), sort_keys=True)
    text = text.replace("cozy-vfio-gpu-agent", namespace).replace("ghcr.io/cozystack/vfio-gpu-agent:", "IMAGE:")
    return text.replace("image: vfio-gpu-agent:", "image: IMAGE:").replace(
        "ghcr.io/cozystack/vfio-gpu-agent:", "IMAGE:")


def cmd_same(args):
    failures = []
    for name, component in variants(args).items():
        role, tree, namespace = EXPECTED[name]
        if tree is None:
            continue
        _, proc, docs = render(args, component)
        if docs is None:
            failures.append(f"{name}: helm template: {proc.stderr}")
            continue
        kustomize = subprocess.run([args.kubectl, "kustomize", os.path.join(args.daemonset_dir, tree)],
                                   capture_output=True, text=True, timeout=120)
        if kustomize.returncode != 0:
            failures.append(f"{tree}: kubectl kustomize: {kustomize.stderr}")
            continue
        theirs = [d for d in yaml.safe_load_all(kustomize.stdout) if d and d["kind"] != "Namespace"]
        ours = {k: v for k, v in check_chart.by_key([yaml.safe_load(normalise([d], namespace)) for d in docs]).items()}
        theirs = {k: v for k, v in check_chart.by_key([yaml.safe_load(normalise([d], namespace)) for d in theirs]).items()}
        if ours.keys() != theirs.keys():
            failures.append(f"{name} vs {tree}: objects {sorted(ours)} vs {sorted(theirs)}")
            continue
        for key in ours:
            if ours[key] != theirs[key]:
                a = yaml.safe_dump(ours[key], sort_keys=True).splitlines()
                b = yaml.safe_dump(theirs[key], sort_keys=True).splitlines()
                diff = [f"-{x}" for x in b if x not in a][:5] + [f"+{x}" for x in a if x not in b][:5]
                failures.append(f"{name} vs {tree}: {key} differs: {diff}")
        print(f"{name}: the {len(ours)} objects of {tree}")
    return failures


def main():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=("variants", "same"))
    p.add_argument("--cozystack-dir", required=True)
    p.add_argument("--daemonset-dir")
    p.add_argument("--helm", required=True)
    p.add_argument("--kubectl")
    args = p.parse_args()
    failures = cmd_variants(args) if args.command == "variants" else cmd_same(args)
    for f in failures:
        print(f"FAIL {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
