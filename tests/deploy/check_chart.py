#!/usr/bin/env python3
"""Checks the Helm chart daemonset/chart/vfio-gpu-agent with the real helm and kubectl (issue 23).

  check_chart.py lint      --daemonset-dir DIR --helm HELM
  check_chart.py schema    --daemonset-dir DIR --helm HELM
  check_chart.py render    --daemonset-dir DIR --helm HELM --agent AGENT_BINARY
  check_chart.py same      --daemonset-dir DIR --helm HELM --kubectl KUBECTL
  check_chart.py kustomize --daemonset-dir DIR --kubectl KUBECTL

`lint`: helm lint --strict on the chart with every variant file (and Cozystack with each node role).
`schema`: values.schema.json refuses a wrong type, an unknown key and a mode the agent does not have, with Helm's
message naming the value.
`render`: every variant and the edge values (custom namespace, no metrics, CDI, ServiceMonitor, no admission
policy, extra args) render objects whose args, env, ports, probes, mounts, PSA labels, RBAC and admission policy
follow the values; the deep checks are check_manifests.py's, run on the chart's output.
`same`: each generated kustomize tree renders (kubectl kustomize) exactly the objects helm template renders with
its values, apart from Helm's own labels: moving between kubectl apply -k and the chart changes nothing.
`kustomize`: every kustomization under daemonset/ renders with no warning (nothing on stderr).
Every failed check is printed; exit 1 if any failed.
"""
import argparse
import copy
import glob
import os
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_manifests as cm  # noqa: E402

HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
               "app.kubernetes.io/version")
VARIANTS = ("values-passthrough.yaml", "values-hgx.yaml", "values-cozystack.yaml", "values-dra.yaml", "values-vgpu.yaml",
            "values-label.yaml")
NODE_ROLES = ("values-passthrough.yaml", "values-hgx.yaml", "values-dra.yaml", "values-vgpu.yaml", "values-label.yaml")
SCHEMA_MESSAGE = "values don't meet the specifications of the schema"

# kustomize dir -> the helm template arguments scripts/render-manifests.sh renders it with
TREES = {
    "base": ["-f", "values-passthrough.yaml"],
    "overlays/cozystack": ["-f", "values-cozystack.yaml", "-f", "values-passthrough.yaml"],
    "overlays/cdi": ["-f", "values-passthrough.yaml", "--set", "cdi.enabled=true"],
    "overlays/hgx": ["-f", "values-hgx.yaml"],
    "overlays/dra": ["-f", "values-dra.yaml"],
    "overlays/dra-binding": ["-f", "values-dra.yaml", "--set", "dra.bindingConditions.enabled=true", "--set",
                             "dra.bindOnPrepare=true"],
    "overlays/vgpu": ["-f", "values-vgpu.yaml"],
}


def chart_dir(args):
    return os.path.join(args.daemonset_dir, "chart", "vfio-gpu-agent")


def helm_args(args, extra):
    """Variant file names are relative to the chart."""
    out = []
    for i, a in enumerate(extra):
        out.append(os.path.join(chart_dir(args), a) if i > 0 and extra[i - 1] == "-f" else a)
    return out


def template(args, extra):
    proc = subprocess.run([args.helm, "template", "vfio-gpu-agent", chart_dir(args)] + helm_args(args, extra),
                          capture_output=True, text=True, timeout=120)
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d] if proc.returncode == 0 else None
    return proc, docs


def strip_helm_labels(docs):
    out = copy.deepcopy(docs)
    for d in out:
        labels = d.get("metadata", {}).get("labels", {})
        for k in HELM_LABELS:
            labels.pop(k, None)
    return out


def by_key(docs):
    return {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs}


def container(docs):
    ds = [d for d in docs if d["kind"] == "DaemonSet"]
    return ds[0]["spec"]["template"]["spec"]["containers"][0] if len(ds) == 1 else None


def check_values_comments(c, args):
    """Every value the schema describes field by field has a comment line right above it in values.yaml, and
    every such schema field is in values.yaml (a value nobody can find is as good as none)."""
    import json
    import re
    with open(os.path.join(chart_dir(args), "values.schema.json")) as f:
        schema = json.load(f)
    with open(os.path.join(chart_dir(args), "values.yaml")) as f:
        lines = f.read().splitlines()
    stack, seen, prev = [], set(), ""
    for n, line in enumerate(lines, 1):
        m = re.match(r"^( *)([A-Za-z][A-Za-z0-9]*):", line)
        if m:
            depth = len(m.group(1)) // 2
            stack = stack[:depth] + [m.group(2)]
            node = schema
            for key in stack[:-1]:
                node = node.get("properties", {}).get(key, {})
            if "properties" in node:
                path = ".".join(stack)
                seen.add(path)
                c.check(prev.lstrip().startswith("#"), f"values.yaml:{n}: {path} has no comment above it")
        if line.strip():
            prev = line

    def fields(node, prefix):
        for key, sub in node.get("properties", {}).items():
            if key == "global":
                continue
            yield prefix + key
            yield from fields(sub, prefix + key + ".")
    missing = sorted(set(fields(schema, "")) - seen)
    c.check(not missing, f"values.schema.json describes {missing}, which values.yaml does not set")
    print(f"values.yaml: {len(seen)} values, each with a comment")


def cmd_lint(c, args):
    check_values_comments(c, args)
    runs = [[]] + [["-f", v] for v in VARIANTS] + [["-f", "values-cozystack.yaml", "-f", r] for r in NODE_ROLES]
    for extra in runs:
        proc = subprocess.run([args.helm, "lint", "--strict", chart_dir(args)] + helm_args(args, extra),
                              capture_output=True, text=True, timeout=120)
        out = proc.stdout + proc.stderr
        c.check(proc.returncode == 0 and "[WARNING]" not in out and "[ERROR]" not in out,
                f"helm lint --strict {' '.join(extra)}: rc {proc.returncode}\n{out}")
        print(f"lint {' '.join(extra) or '(defaults)'}: rc {proc.returncode}")


def cmd_schema(c, args):
    # (values, the path Helm's message must name, what it must say)
    bad = [
        (["--set", "healthPort=abc"], "/healthPort", "want integer"),
        (["--set", "cdi.enabled=yes"], "/cdi/enabled", "want boolean"),
        (["--set", "workloadMode=vm-mig"], "/workloadMode", "value must be"),
        (["--set", "workloadMode=vm-vgpu", "--set", "nvswitches=true"], "", "'allOf' failed"),
        (["--set", "workloadMode=label", "--set", "fabricManager.address=unix:/run/fm.sock"], "", "'allOf' failed"),
        (["--set", "vgpu.configMap=Profiles"], "/vgpu/configMap", "does not match pattern"),
        (["--set", "kubeletApi=grpc"], "/kubeletApi", "value must be"),
        (["--set", "dra.driverName=GPU_Driver"], "/dra/driverName", "does not match pattern"),
        (["--set", "dra.deviceClasses={H200,H200}"], "/dra/deviceClasses", "items at"),
        (["--set", "kubeletApi=dra", "--set", "dra.bindOnPrepare=yes"], "/dra/bindOnPrepare", "want boolean"),
        (["--set", "dra.bindOnPrepare=true"], "", "'allOf' failed"),  # a device-plugin node binds at start
        # A vGPU node's GPUs stay with the vGPU manager: binding one would take its vGPUs (issue 31, defect 1).
        (["-f", "values-dra.yaml", "--set", "dra.bindOnPrepare=true", "--set", "workloadMode=vm-vgpu"], "",
         "'allOf' failed"),
        (["-f", "values-dra.yaml", "--set", "dra.bindOnPrepare=true", "--set", "workloadMode=label"], "",
         "'allOf' failed"),
        (["--set", "metrics.prot=9400"], "/metrics", "'prot' not allowed"),
        (["--set", "nodeselector.label=x"], "", "'nodeselector' not allowed"),
        (["--set", "logLevel=verbose"], "/logLevel", "value must be one of"),
        (["--set", "namespace.name=Bad_Name"], "/namespace/name", "does not match pattern"),
    ]
    for extra, path, what in bad:
        proc, _ = template(args, extra)
        c.check(proc.returncode != 0 and SCHEMA_MESSAGE in proc.stderr and f"at '{path}'" in proc.stderr
                and what in proc.stderr,
                f"{' '.join(extra)}: want Helm's schema error at '{path}' ({what}), got rc {proc.returncode}: "
                f"{proc.stderr.strip()}")
        print(f"schema {' '.join(extra)}: rc {proc.returncode}")
    # The variants and the documented values pass the schema (a schema refusing everything would pass above).
    for extra in [["-f", v] for v in VARIANTS] + [["--set", "metrics.serviceMonitor.enabled=true",
                                                   "--set", "resourceNames={10de:2335=GH100_H200_SXM_141GB}"],
                                                  ["-f", "values-dra.yaml", "--set", "dra.bindOnPrepare=true"]]:
        proc, _ = template(args, extra)
        c.check(proc.returncode == 0, f"{' '.join(extra)}: refused ({proc.stderr.strip()})")


def run_manifest_checks(c, name, spec, docs, help_info, liveness_service):
    before = len(c.failures)
    cm.check_overlay(c, name, spec, docs, help_info, liveness_service)
    return len(c.failures) == before


def cmd_render(c, args):
    help_info = cm.parse_run_help(args.agent)
    header = os.path.join(os.path.dirname(os.path.abspath(args.daemonset_dir)), "src", "daemon", "health_server.h")
    liveness = cm.liveness_service_name(header)
    c.check(bool(help_info[0]), f"`{args.agent} run --help` listed no options")
    c.check(liveness is not None, f"no kLivenessService in {header}")

    def render(name, extra, spec=None):
        proc, docs = template(args, extra)
        if not c.check(docs is not None, f"[{name}] helm template {' '.join(extra)} failed: {proc.stderr.strip()}"):
            return None
        if spec is not None:
            cm.check_overlay(c, f"chart {name}", spec, docs, help_info, liveness)
        print(f"[{name}] {len(docs)} objects")
        return docs

    own = {"namespace": "vfio-gpu-agent", "owns_namespace": True, "cdi": False}
    for variant in VARIANTS:
        spec = dict(own, dra=variant == "values-dra.yaml", vgpu=variant == "values-vgpu.yaml",
                    label_mode=variant == "values-label.yaml")
        if variant == "values-cozystack.yaml":
            spec.update(namespace="cozy-gpu-operator", owns_namespace=False)
        docs = render(variant, ["-f", variant], spec)
        if docs is None:
            continue
        args_ = container(docs)["args"]
        c.check(("--nvswitches" in args_) == (variant == "values-hgx.yaml"),
                f"[{variant}] --nvswitches in args is {'--nvswitches' in args_}, the variant says otherwise")
        c.check("--bind-on-prepare" not in args_, f"[{variant}] --bind-on-prepare without dra.bindOnPrepare")
        c.check("--binding-conditions" not in args_,
                f"[{variant}] --binding-conditions without dra.bindingConditions.enabled")
    for role in NODE_ROLES:
        render(f"cozystack+{role}", ["-f", "values-cozystack.yaml", "-f", role],
               {"namespace": "cozy-gpu-operator", "owns_namespace": False, "cdi": False,
                "dra": role == "values-dra.yaml", "vgpu": role == "values-vgpu.yaml",
                "label_mode": role == "values-label.yaml"})

    # A namespace of one's own: every namespaced object, the binding's subject and the policy's CEL follow it.
    docs = render("namespace gpu-system", ["--set", "namespace.name=gpu-system"],
                  {"namespace": "gpu-system", "owns_namespace": True, "cdi": False})
    if docs:
        # check_overlay looks at the objects it knows; any other namespace field left behind shows up here.
        found = []

        def walk(node, path):
            if isinstance(node, dict):
                for k, v in node.items():
                    if k in ("namespace", "matchNames") and v != "gpu-system" and v != ["gpu-system"]:
                        found.append(f"{path}.{k}={v}")
                    walk(v, f"{path}.{k}")
            elif isinstance(node, list):
                for i, v in enumerate(node):
                    walk(v, f"{path}[{i}]")
        for d in docs:
            walk(d, f"{d['kind']}/{d['metadata']['name']}")
        c.check(not found, f"[namespace gpu-system] namespaces not moved: {found}")

    # The release's namespace when namespace.name is empty.
    proc = subprocess.run([args.helm, "template", "vfio-gpu-agent", chart_dir(args), "--namespace", "gpu-ops",
                           "--set", "namespace.name=", "--set", "namespace.create=false"],
                          capture_output=True, text=True, timeout=120)
    if c.check(proc.returncode == 0, f"[release namespace] {proc.stderr.strip()}"):
        docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
        cm.check_overlay(c, "chart release namespace", {"namespace": "gpu-ops", "owns_namespace": False, "cdi": False},
                         docs, help_info, liveness)

    docs = render("cdi", ["--set", "cdi.enabled=true"], {"namespace": "vfio-gpu-agent", "owns_namespace": True, "cdi": True})

    # vGPU profiles from a ConfigMap, and the config a node without nvidia.com/vgpu.config gets.
    docs = render("vgpu profiles", ["-f", "values-vgpu.yaml", "--set", "vgpu.configMap=vgpu-profiles",
                                    "--set", "vgpu.configKey=profiles.yaml", "--set", "vgpu.defaultConfig=A10-4Q"],
                  dict(own, vgpu=True))
    if docs:
        ctr = container(docs)
        volumes = [v for d in docs if d["kind"] == "DaemonSet" for v in d["spec"]["template"]["spec"]["volumes"]]
        c.check({"name": "vgpu-profiles", "items": [{"key": "profiles.yaml", "path": "profiles.yaml"}]}
                in [v.get("configMap") for v in volumes], f"[vgpu profiles] no volume of ConfigMap vgpu-profiles: {volumes}")
        c.check("--vgpu-config=A10-4Q" in ctr["args"] and any(a.endswith("/profiles.yaml") for a in ctr["args"]),
                f"[vgpu profiles] args {ctr['args']}")

    # No metrics: the agent is told 0 (off), and the pod has no metrics port.
    docs = render("no metrics", ["--set", "metrics.enabled=false"])
    if docs:
        ctr = container(docs)
        c.check(cm.agent_setting(ctr, "--metrics-port", help_info[2]) == "0",
                f"[no metrics] --metrics-port is {cm.agent_setting(ctr, '--metrics-port', help_info[2])}, want 0")
        c.check(all(p["name"] != "metrics" for p in ctr.get("ports", [])), "[no metrics] a metrics port on the pod")
        c.check(not [d for d in docs if d["kind"] in ("Service", "ServiceMonitor")], "[no metrics] a Service or ServiceMonitor")

    # Values that reach the agent's command line and env.
    docs = render("values", ["--set", "healthPort=8181", "--set", "metrics.port=9500", "--set", "logLevel=debug",
                             "--set", "resourceDomain=example.com", "--set", "nvswitches=true",
                             "--set", "resourceNames={10de:2335=H200,10de:2236=A10}",
                             "--set", "extraArgs={--write-timeout=10s,--parallelism=2}",
                             "--set", "image.repository=registry.example/agent", "--set", "image.tag=9.9",
                             "--set", "nodeSelector.label=example.com/role", "--set", "nodeSelector.value=gpu-vm",
                             "--set", "priorityClassName=", "--set", "tolerations=null"])
    if docs:
        ctr = container(docs)
        pod = [d for d in docs if d["kind"] == "DaemonSet"][0]["spec"]["template"]["spec"]
        defaults = help_info[2]
        want = {"--health-port": "8181", "--metrics-port": "9500", "--log-level": "debug",
                "--resource-domain": "example.com", "--nvswitches": "true",
                "--resource-name": "10de:2335=H200,10de:2236=A10", "--write-timeout": "10s", "--parallelism": "2"}
        for option, value in want.items():
            got = cm.agent_setting(ctr, option, defaults)
            c.check(got == value, f"[values] the agent's {option} is {got}, the values say {value}")
        for arg in ctr["args"][1:]:
            c.check(arg.split("=", 1)[0] in help_info[0], f"[values] arg {arg}: `run --help` lists no such option")
        ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
        c.check(ports == {"health": 8181, "metrics": 9500}, f"[values] ports {ports}")
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            c.check(ctr[probe]["grpc"]["port"] == 8181, f"[values] {probe} on port {ctr[probe]['grpc']['port']}")
        c.check(ctr["image"] == "registry.example/agent:9.9", f"[values] image {ctr['image']}")
        c.check(pod["nodeSelector"] == {"example.com/role": "gpu-vm"}, f"[values] nodeSelector {pod['nodeSelector']}")
        c.check("priorityClassName" not in pod and "tolerations" not in pod,
                f"[values] empty priorityClassName/tolerations still rendered: {pod.get('priorityClassName')} {pod.get('tolerations')}")

    # ServiceMonitor: a headless Service on the pods' metrics port, and a monitor that selects it.
    docs = render("serviceMonitor", ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.port=9500",
                                     "--set", "metrics.serviceMonitor.labels.release=prom"])
    if docs:
        svc = [d for d in docs if d["kind"] == "Service"]
        mon = [d for d in docs if d["kind"] == "ServiceMonitor"]
        if c.check(len(svc) == 1 and len(mon) == 1, f"[serviceMonitor] {len(svc)} Services, {len(mon)} ServiceMonitors"):
            svc, mon = svc[0], mon[0]
            ds = [d for d in docs if d["kind"] == "DaemonSet"][0]
            pod_labels = ds["spec"]["template"]["metadata"]["labels"]
            c.check(svc["spec"].get("clusterIP") == "None", "[serviceMonitor] the Service is not headless")
            c.check(all(pod_labels.get(k) == v for k, v in svc["spec"]["selector"].items()),
                    f"[serviceMonitor] Service selector {svc['spec']['selector']} misses the pods {pod_labels}")
            c.check(svc["spec"]["ports"] == [{"name": "metrics", "port": 9500, "targetPort": "metrics", "protocol": "TCP"}],
                    f"[serviceMonitor] Service ports {svc['spec']['ports']}")
            sel = mon["spec"]["selector"]["matchLabels"]
            c.check(all(svc["metadata"]["labels"].get(k) == v for k, v in sel.items()),
                    f"[serviceMonitor] monitor selector {sel} misses the Service")
            c.check(mon["spec"]["namespaceSelector"] == {"matchNames": ["vfio-gpu-agent"]},
                    f"[serviceMonitor] namespaceSelector {mon['spec']['namespaceSelector']}")
            c.check([e["port"] for e in mon["spec"]["endpoints"]] == ["metrics"], "[serviceMonitor] endpoint port")
            c.check(mon["metadata"]["labels"].get("release") == "prom", "[serviceMonitor] extra label missing")
    docs = render("serviceMonitor without metrics", ["--set", "metrics.serviceMonitor.enabled=true",
                                                     "--set", "metrics.enabled=false"])
    if docs:
        c.check(not [d for d in docs if d["kind"] in ("Service", "ServiceMonitor")],
                "[serviceMonitor without metrics] a monitor of a port nobody listens on")

    # DRA with values of one's own: the driver name, the directories and the domain reach the args, the mounts
    # and every DeviceClass (check_overlay holds them to each other).
    docs = render("dra values", ["--set", "kubeletApi=dra", "--set", "dra.driverName=gpus.example.org",
                                 "--set", "dra.registryDir=/var/lib/kubelet/plugins_registry",
                                 "--set", "dra.deviceClasses={H200,A10}", "--set", "resourceDomain=example.com"],
                  dict(own, dra=True))
    if docs:
        classes = sorted(d["metadata"]["name"] for d in docs if d["kind"] == "DeviceClass")
        c.check(classes == ["a10-iommufd.gpus.example.org", "a10.gpus.example.org", "h200-iommufd.gpus.example.org",
                            "h200.gpus.example.org"], f"[dra values] DeviceClasses {classes}")
    # dra.bindOnPrepare: the flag, once, after --kubelet-api=dra (run refuses it without).
    docs = render("dra bindOnPrepare", ["-f", "values-dra.yaml", "--set", "dra.bindOnPrepare=true"], dict(own, dra=True))
    if docs:
        args_ = container(docs)["args"]
        c.check(args_.count("--bind-on-prepare") == 1 and "--kubelet-api=dra" in args_
                and args_.index("--kubelet-api=dra") < args_.index("--bind-on-prepare"),
                f"[dra bindOnPrepare] args {args_}")

    # dra.bindingConditions: the claim router's Deployment and RBAC, and the agent's RBAC grows exactly by the claim
    # watch and the status write (issue 32). Off (every variant above): none of it.
    docs = render("dra bindingConditions", ["-f", "values-dra.yaml", "--set", "dra.bindingConditions.enabled=true"])
    if docs:
        cm.check_claim_router(c, "[dra bindingConditions]", docs, pdb=True)
        # The agent itself must be told: without the flag it publishes no binding conditions and never watches.
        args_ = container(docs)["args"]
        c.check(args_.count("--binding-conditions") == 1 and "--kubelet-api=dra" in args_
                and args_.index("--kubelet-api=dra") < args_.index("--binding-conditions"),
                f"[dra bindingConditions] args {args_}")
    docs = render("dra bindingConditions without PDB", ["-f", "values-dra.yaml", "--set",
                                                        "dra.bindingConditions.enabled=true", "--set",
                                                        "dra.bindingConditions.router.podDisruptionBudget=false"])
    if docs:
        cm.check_claim_router(c, "[dra bindingConditions without PDB]", docs, pdb=False)

    docs = render("no admission policy", ["--set", "admissionPolicy.enabled=false"])
    if docs:
        kinds = {d["kind"] for d in docs}
        c.check(not kinds & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"},
                f"[no admission policy] kinds {sorted(kinds)}")
        c.check({"DaemonSet", "ClusterRole", "ClusterRoleBinding", "ServiceAccount", "Namespace"} <= kinds,
                f"[no admission policy] kinds {sorted(kinds)}")


def cmd_same(c, args):
    for tree, extra in TREES.items():
        out, err = cm.render(args.kubectl, args.daemonset_dir, tree)
        if not c.check(err is None, err or ""):
            continue
        kust = by_key(strip_helm_labels([d for d in yaml.safe_load_all(out) if d]))
        proc, docs = template(args, extra)
        if not c.check(docs is not None, f"[{tree}] helm template failed: {proc.stderr.strip()}"):
            continue
        chart = by_key(strip_helm_labels(docs))
        c.check(set(kust) == set(chart), f"[{tree}] kustomize renders {sorted(set(kust) - set(chart))} beyond the chart "
                                         f"and lacks {sorted(set(chart) - set(kust))}")
        for key in sorted(set(kust) & set(chart)):
            c.check(kust[key] == chart[key], f"[{tree}] {key} differs between kubectl kustomize and helm template")
        c.check(all(k not in (d["metadata"].get("labels") or {}) for d in yaml.safe_load_all(out) if d for k in HELM_LABELS),
                f"[{tree}] the kustomize output carries Helm's labels: kubectl apply -k is not Helm")
        print(f"[{tree}] {len(kust)} objects, same as helm template {' '.join(extra)}")


def cmd_kustomize(c, args):
    dirs = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(args.daemonset_dir, "**", "kustomization.yaml"),
                                                         recursive=True))
    c.check(len(dirs) >= 4, f"only {len(dirs)} kustomizations under {args.daemonset_dir}")
    for d in dirs:
        proc = subprocess.run([args.kubectl, "kustomize", d], capture_output=True, text=True, timeout=120)
        c.check(proc.returncode == 0 and proc.stderr == "",
                f"{args.kubectl} kustomize {d}: rc {proc.returncode}, stderr {proc.stderr.strip()!r}")
        with open(os.path.join(d, "kustomization.yaml")) as f:
            k = yaml.safe_load(f) or {}
        old = sorted(set(k) & {"bases", "patchesStrategicMerge", "patchesJson6902", "commonLabels", "vars"})
        c.check(not old, f"{d}: deprecated kustomization fields {old}")
        print(f"kustomize {os.path.relpath(d, args.daemonset_dir)}: rc {proc.returncode}, stderr {len(proc.stderr)} bytes")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["lint", "schema", "render", "same", "kustomize"])
    parser.add_argument("--daemonset-dir", required=True)
    parser.add_argument("--helm")
    parser.add_argument("--kubectl")
    parser.add_argument("--agent")
    args = parser.parse_args()
    need = {"lint": ["helm"], "schema": ["helm"], "render": ["helm", "agent"], "same": ["helm", "kubectl"],
            "kustomize": ["kubectl"]}[args.mode]
    for n in need:
        if not getattr(args, n):
            parser.error(f"{args.mode} needs --{n} (scripts/install-deps.sh installs helm and kubectl)")
    c = cm.Checker()
    {"lint": cmd_lint, "schema": cmd_schema, "render": cmd_render, "same": cmd_same, "kustomize": cmd_kustomize}[args.mode](c, args)
    for f in c.failures:
        print("FAIL", f)
    print(f"{len(c.failures)} failed check(s)")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
