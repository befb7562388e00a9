#!/usr/bin/env python3
"""Renders daemonset/ with kubectl kustomize and checks what a cluster would be given.
(The trees are generated from the Helm chart by scripts/render-manifests.sh; tests/deploy/check_chart.py checks
the chart's other values.)

  check_manifests.py render    --daemonset-dir DIR --kubectl KUBECTL [--kubectl KUBECTL]...
  check_manifests.py manifests --daemonset-dir DIR --kubectl KUBECTL --agent AGENT_BINARY

`render`: every overlay renders with every kubectl given (plus those in $VA_KUBECTL_EXTRA, colon-separated, e.g.
Debian's kubectl 1.20 with kustomize v2.0.3), and all of them render the same objects.
`manifests`: the rendered objects carry what issue 10 asks for: Pod Security labels, hostPath types that work
on Talos's read-only root, probes and ports on the ports `run` listens on, RBAC verbs exactly those `run`
needs, and args/env naming only options that `vfio-gpu-agent run --help` lists; and issue 24's admission
policy: bound with Deny, matched to this overlay's ServiceAccount exactly, covering every resource the
ClusterRole grants a write verb on, its CEL well-formed as far as can be told without an API server
(tests/deploy/realcluster_policy.sh runs it against one).
Every failed check is printed; exit 1 if any failed.
"""
import argparse
import os
import re
import subprocess
import sys

import yaml

# overlay dir (under daemonset/) -> namespace its objects go to, whether it ships the Namespace, CDI on
OVERLAYS = {
    "base": {"namespace": "vfio-gpu-agent", "owns_namespace": True, "cdi": False},
    "overlays/cozystack": {"namespace": "cozy-gpu-operator", "owns_namespace": False, "cdi": False},
    "overlays/cdi": {"namespace": "vfio-gpu-agent", "owns_namespace": True, "cdi": True},
    "overlays/hgx": {"namespace": "vfio-gpu-agent", "owns_namespace": True, "cdi": False},
    "overlays/dra": {"namespace": "vfio-gpu-agent", "owns_namespace": True, "cdi": False, "dra": True},
    # DRA binding conditions: the agent's claim grants, and the claim router (checked by check_claim_router).
    "overlays/dra-binding": {"namespace": "vfio-gpu-agent", "owns_namespace": True, "cdi": False, "dra": True,
                             "binding": True},
    "overlays/vgpu": {"namespace": "vfio-gpu-agent", "owns_namespace": True, "cdi": False, "vgpu": True},
}

# (apiGroup, resource, verb): what `run` does through the API, and the KubeVirt CR `validate` lists in the pod
# (`kubectl exec ... validate`; its 403 fix names this rule), nothing else (issue 9).
RBAC_NEEDED = {
    ("", "nodes", "get"),
    ("", "nodes", "list"),   # the watch of its own Node's labels: a list, then a watch, by field selector
    ("", "nodes", "watch"),
    ("", "nodes/status", "patch"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
    ("kubevirt.io", "kubevirts", "get"),
    ("kubevirt.io", "kubevirts", "list"),
}
# With --kubelet-api dra, what the DRA driver does (its node's ResourceSlices, the claim named in a Prepare) and
# `validate`'s DRA layer reads (the DeviceClasses), nothing else: no claim status, no pods.
RBAC_NEEDED_DRA = {
    ("resource.k8s.io", "resourceslices", verb) for verb in ("get", "list", "watch", "create", "update", "delete")
} | {
    ("resource.k8s.io", "resourceclaims", "get"),
    ("resource.k8s.io", "deviceclasses", "list"),
}
# With --workload vm-vgpu, the profiles' state label nvidia.com/vgpu.config.state on its own Node (the admission
# policy lets that one label through).
RBAC_NEEDED_VGPU = {("", "nodes", "patch")}
# The `run` options a DRA manifest sets (the driver's directories are checked to be on mounts).
# (apiGroup, resource, verb, resourceName): `validate`'s api layer reads the admission policy and its binding by
# name, and nothing else of admissionregistration.k8s.io.
POLICY_NAME = "vfio-gpu-agent-own-node"
RBAC_NAMED = {
    ("admissionregistration.k8s.io", "validatingadmissionpolicies", "get", POLICY_NAME),
    ("admissionregistration.k8s.io", "validatingadmissionpolicybindings", "get", POLICY_NAME),
}
# DRA binding conditions: the agent's own node's claims (by the router's label), their status, and 1.36's
# DRAResourceClaimGranularStatusAuthorization check of status.devices writes, for the driver's name.
RBAC_NEEDED_BINDING = {("resource.k8s.io", "resourceclaims", "list"), ("resource.k8s.io", "resourceclaims", "watch"),
                       ("resource.k8s.io", "resourceclaims/status", "patch")}
RBAC_NAMED_BINDING = {("resource.k8s.io", "resourceclaims/driver", "associated-node:patch", "gpu.vfio-agent.cozystack.io")}
# RBAC write verb -> the admission operation a request with it is seen as.
WRITE_VERBS = {"create": "CREATE", "update": "UPDATE", "patch": "UPDATE", "delete": "DELETE",
               "deletecollection": "DELETE"}
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
POD_NAME_CLAIM = "authentication.kubernetes.io/pod-name"  # a Node-bound token names a node but no pod
SA_USERNAME = re.compile(r"^request\.userInfo\.username == '(system:serviceaccount:[^':]+:[^':]+)'$")

# hostPath -> type. Talos's root is read-only: an *OrCreate type only where the host has a writable tmpfs or
# /var; everything the kubelet or the OS provides must exist already (Directory).
HOST_PATHS = {
    "/sys": "Directory",
    "/dev": "Directory",
    "/lib/modules": "Directory",
    "/var/lib/kubelet/device-plugins": "Directory",
    "/var/lib/kubelet/pod-resources": "Directory",
    "/run/nvidia/validations": "DirectoryOrCreate",
}
CDI_HOST_PATHS = {"/var/run/cdi": "DirectoryOrCreate"}
# The kubelet makes both at its start; the CDI directory is the runtime's, made if missing (the claims' specs).
DRA_HOST_PATHS = {"/var/lib/kubelet/plugins_registry": "Directory", "/var/lib/kubelet/plugins": "Directory",
                  **CDI_HOST_PATHS}
# vm-vgpu: the state directory (vgpu-catalog.txt), made if missing.
VGPU_HOST_PATHS = {"/var/lib/vfio-gpu-agent": "DirectoryOrCreate"}
WRITABLE_ON_TALOS = ("/run/", "/var/")

PSA_LABELS = ("enforce", "audit", "warn")


class Checker:
    def __init__(self):
        self.failures = []

    def check(self, ok, what):
        if not ok:
            self.failures.append(what)
        return ok


def kubectls(args):
    found = list(args.kubectl or [])
    found += [k for k in os.environ.get("VA_KUBECTL_EXTRA", "").split(":") if k]
    return found


def render(kubectl, daemonset_dir, overlay):
    proc = subprocess.run([kubectl, "kustomize", os.path.join(daemonset_dir, overlay)],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return None, f"{kubectl} kustomize {overlay} failed ({proc.returncode}): {proc.stderr.strip()}"
    return proc.stdout, None


def parse_run_help(agent):
    """Options and env names of `run`, and each option's default, from its --help."""
    proc = subprocess.run([agent, "run", "--help"], capture_output=True, text=True, timeout=30)
    text = proc.stdout + proc.stderr
    options, envs, defaults = set(), set(), {}
    for line in text.splitlines():
        m = re.match(r"^\s+(--[a-z0-9][a-z0-9-]*)\b(.*)$", line)
        if m:
            options.add(m.group(1))
            d = re.search(r"\(default: ([^)]*)\)", m.group(2))
            if d:
                defaults[m.group(1)] = d.group(1)
        m = re.match(r"^\s+env (VFIO_GPU_AGENT_[A-Z0-9_]+)\s*$", line)
        if m:
            envs.add(m.group(1))
    return options, envs, defaults


def option_env(option):
    return "VFIO_GPU_AGENT_" + option[2:].upper().replace("-", "_")


def agent_setting(container, option, defaults):
    """The value `run` will use for an option: the command line wins over the env, the env over the default."""
    for arg in container.get("args", [])[1:]:
        if arg == option:
            return "true"
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    for env in container.get("env", []):
        if env["name"] == option_env(option) and "value" in env:
            return env["value"]
    return defaults.get(option)


def under(path, mount_paths):
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mount_paths)


def liveness_service_name(health_header):
    """The service name the agent's health server answers liveness on (src/daemon/health_server.h)."""
    try:
        with open(health_header) as f:
            m = re.search(r'kLivenessService\[\]\s*=\s*"([^"]*)"', f.read())
    except OSError:
        return None
    return m.group(1) if m else None


ROUTER = "vfio-gpu-agent-claim-router"


def rule_set(role):
    granted = set()
    for rule in role.get("rules", []):
        for g in rule.get("apiGroups", []):
            for r in rule.get("resources", []):
                for v in rule.get("verbs", []):
                    granted.add((g, r, v, tuple(rule.get("resourceNames", []))))
    return granted


def check_claim_router(c, where, docs, pdb):
    """The claim router with dra.bindingConditions: a Deployment of 2 non-privileged replicas that the restricted
    Pod Security profile admits, its own ServiceAccount with exactly resourceclaims get/list/watch/patch and the
    Lease in its namespace, and the agent's ClusterRole grown by exactly resourceclaims list/watch and
    resourceclaims/status patch."""
    named = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment"):
        c.check((kind, ROUTER) in named, f"{where} no {kind} {ROUTER}")
    c.check((("PodDisruptionBudget", ROUTER) in named) == pdb, f"{where} PodDisruptionBudget present != {pdb}")
    if not all((k, ROUTER) in named for k in ("ClusterRole", "Role", "Deployment", "RoleBinding", "ClusterRoleBinding")):
        return
    c.check(rule_set(named[("ClusterRole", ROUTER)]) ==
            {("resource.k8s.io", "resourceclaims", v, ()) for v in ("get", "list", "watch", "patch")},
            f"{where} router ClusterRole rules {named[('ClusterRole', ROUTER)].get('rules')}")
    c.check(rule_set(named[("Role", ROUTER)]) ==
            {("coordination.k8s.io", "leases", "create", ()),
             ("coordination.k8s.io", "leases", "get", (ROUTER,)), ("coordination.k8s.io", "leases", "update", (ROUTER,))},
            f"{where} router Role rules {named[('Role', ROUTER)].get('rules')}")
    ns = named[("Deployment", ROUTER)]["metadata"]["namespace"]
    c.check(named[("Role", ROUTER)]["metadata"]["namespace"] == ns, f"{where} the Lease Role is not in the router's namespace")
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        c.check(named[(kind, ROUTER)]["subjects"] == [{"kind": "ServiceAccount", "name": ROUTER, "namespace": ns}],
                f"{where} {kind} subjects {named[(kind, ROUTER)]['subjects']}")
    agent = named.get(("ClusterRole", "vfio-gpu-agent"))
    if c.check(agent is not None, f"{where} no agent ClusterRole"):
        claims = {(g, r, v, n) for g, r, v, n in rule_set(agent) if r.startswith("resourceclaims")}
        c.check(claims == {("resource.k8s.io", "resourceclaims", v, ()) for v in ("get", "list", "watch")} |
                {("resource.k8s.io", "resourceclaims/status", "patch", ()),
                 # 1.36's DRAResourceClaimGranularStatusAuthorization: status.devices of the driver, own node only.
                 ("resource.k8s.io", "resourceclaims/driver", "associated-node:patch", ("gpu.vfio-agent.cozystack.io",))},
                f"{where} agent claim rules {sorted(claims)}")
    deployment = named[("Deployment", ROUTER)]
    c.check(deployment["spec"]["replicas"] == 2, f"{where} replicas {deployment['spec']['replicas']}")
    pod = deployment["spec"]["template"]["spec"]
    c.check(pod.get("serviceAccountName") == ROUTER, f"{where} serviceAccountName {pod.get('serviceAccountName')}")
    # The restricted profile (pod-security-admission policy/check_*.go, v1.36).
    psc = pod.get("securityContext", {})
    c.check(psc.get("runAsNonRoot") is True and psc.get("seccompProfile", {}).get("type") == "RuntimeDefault",
            f"{where} pod securityContext {psc}")
    for key in ("hostPID", "hostIPC", "hostNetwork", "volumes"):
        c.check(key not in pod, f"{where} pod sets {key}")
    for container in pod["containers"]:
        sc = container.get("securityContext", {})
        c.check(sc.get("allowPrivilegeEscalation") is False and sc.get("capabilities", {}).get("drop") == ["ALL"] and
                not sc.get("privileged") and "add" not in sc.get("capabilities", {}),
                f"{where} container securityContext {sc}")
        c.check(container["args"][0] == "claim-router" and "--identity=$(POD_NAME)" in container["args"] and
                "--lease-namespace=$(POD_NAMESPACE)" in container["args"], f"{where} args {container['args']}")
    policy = named.get(("ValidatingAdmissionPolicy", "vfio-gpu-agent-own-node"))
    if c.check(policy is not None, f"{where} no own-node policy"):
        text = yaml.safe_dump(policy)
        c.check("resourceclaims/status" in text and "variables.isClaim" in text,
                f"{where} the own-node policy does not hold the agent's claim status writes")


def check_overlay(c, name, spec, docs, help_info, liveness_service):
    options, envs, defaults = help_info
    where = f"[{name}]"
    router_docs = [d for d in docs if d["metadata"].get("name") == ROUTER]
    if spec.get("binding"):
        check_claim_router(c, where, docs, pdb=True)
    else:
        c.check(not router_docs, f"{where} claim router objects without dra.bindingConditions")
    docs = [d for d in docs if d["metadata"].get("name") != ROUTER]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)

    # Namespace and Pod Security
    namespaces = by_kind.get("Namespace", [])
    if spec["owns_namespace"]:
        if c.check(len(namespaces) == 1, f"{where} one Namespace expected, got {len(namespaces)}"):
            ns = namespaces[0]
            c.check(ns["metadata"]["name"] == spec["namespace"],
                    f"{where} Namespace is {ns['metadata']['name']}, objects go to {spec['namespace']}")
            labels = ns["metadata"].get("labels", {})
            for mode in PSA_LABELS:
                key = f"pod-security.kubernetes.io/{mode}"
                c.check(labels.get(key) == "privileged", f"{where} Namespace label {key}={labels.get(key)}, want privileged")
    else:
        c.check(not namespaces, f"{where} ships a Namespace object, but the namespace is not this overlay's to delete")
    for d in docs:
        if d["kind"] in ("ServiceAccount", "DaemonSet"):
            c.check(d["metadata"].get("namespace") == spec["namespace"],
                    f"{where} {d['kind']} in namespace {d['metadata'].get('namespace')}, want {spec['namespace']}")
    c.check(not by_kind.get("Role") and not by_kind.get("RoleBinding"), f"{where} unexpected namespaced Role/RoleBinding")

    # RBAC
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"):
        c.check(len(by_kind.get(kind, [])) == 1, f"{where} one {kind} expected, got {len(by_kind.get(kind, []))}")
    if any(len(by_kind.get(k, [])) != 1 for k in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet")):
        return
    sa = by_kind["ServiceAccount"][0]
    role = by_kind["ClusterRole"][0]
    binding = by_kind["ClusterRoleBinding"][0]
    ds = by_kind["DaemonSet"][0]
    granted, named = set(), set()
    for rule in role.get("rules", []):
        c.check("nonResourceURLs" not in rule, f"{where} unexpected rule shape {rule}")
        for g in rule.get("apiGroups", []):
            for r in rule.get("resources", []):
                for v in rule.get("verbs", []):
                    if "resourceNames" in rule:
                        named.update((g, r, v, n) for n in rule["resourceNames"])
                    else:
                        granted.add((g, r, v))
    needed = RBAC_NEEDED | (RBAC_NEEDED_DRA if spec.get("dra") else set()) | (RBAC_NEEDED_VGPU if serves_vgpu(spec) else set())
    needed |= RBAC_NEEDED_BINDING if spec.get("binding") else set()
    named_needed = RBAC_NAMED | (RBAC_NAMED_BINDING if spec.get("binding") else set())
    c.check(granted == needed,
            f"{where} ClusterRole grants {sorted(granted - needed)} beyond what run needs and lacks {sorted(needed - granted)}")
    c.check(named == named_needed,
            f"{where} ClusterRole grants by name {sorted(named - named_needed)} beyond the policy's get and lacks {sorted(named_needed - named)}")
    c.check(binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                   "name": role["metadata"]["name"]}, f"{where} binding roleRef {binding['roleRef']}")
    c.check(binding.get("subjects") == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                         "namespace": spec["namespace"]}],
            f"{where} binding subjects {binding.get('subjects')}, want the ServiceAccount in {spec['namespace']}")

    check_admission_policy(c, where, by_kind, sa, role)

    # DaemonSet scheduling and lifecycle
    pod = ds["spec"]["template"]["spec"]
    c.check(pod.get("serviceAccountName") == sa["metadata"]["name"], f"{where} pod serviceAccountName {pod.get('serviceAccountName')}")
    if spec.get("label_mode"):
        # Both label values, so that a node whose label flips keeps its agent.
        terms = pod.get("affinity", {}).get("nodeAffinity", {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms")
        c.check(not pod.get("nodeSelector") and terms == [{"matchExpressions": [
                    {"key": "nvidia.com/gpu.workload.config", "operator": "In", "values": ["vm-passthrough", "vm-vgpu"]}]}],
                f"{where} label mode: nodeSelector {pod.get('nodeSelector')}, node affinity terms {terms}")
    else:
        mode = "vm-vgpu" if spec.get("vgpu") else "vm-passthrough"
        c.check(pod.get("nodeSelector") == {"nvidia.com/gpu.workload.config": mode},
                f"{where} nodeSelector {pod.get('nodeSelector')}")
    tolerated = {(t.get("key"), t.get("operator"), t.get("effect")) for t in pod.get("tolerations", [])}
    for effect in ("NoSchedule", "NoExecute"):
        c.check(("nvidia.com/gpu", "Exists", effect) in tolerated, f"{where} no toleration of nvidia.com/gpu:{effect}")
    c.check(pod.get("priorityClassName") == "system-node-critical", f"{where} priorityClassName {pod.get('priorityClassName')}")
    c.check(pod.get("hostPID") is True, f"{where} hostPID not set: holders of a GPU could not be named")
    c.check(not pod.get("hostNetwork"), f"{where} hostNetwork: the health and metrics ports need no host network")
    strategy = ds["spec"].get("updateStrategy", {})
    c.check(strategy.get("type") == "RollingUpdate"
            and strategy.get("rollingUpdate") == {"maxUnavailable": 1, "maxSurge": 0},
            f"{where} updateStrategy {strategy}")

    containers = pod.get("containers", [])
    if not c.check(len(containers) == 1, f"{where} one container expected, got {len(containers)}"):
        return
    ctr = containers[0]
    c.check(ctr.get("securityContext", {}).get("privileged") is True, f"{where} container not privileged")
    c.check(bool(ctr.get("image")), f"{where} no image")

    # args and env name only what `run --help` lists
    args = ctr.get("args", [])
    c.check(args[:1] == ["run"], f"{where} args {args[:1]}, want the run command first")
    for arg in args[1:]:
        option = arg.split("=", 1)[0]
        c.check(option in options, f"{where} arg {arg}: `run --help` lists no {option}")
    env_names = [e["name"] for e in ctr.get("env", [])]
    c.check(len(env_names) == len(set(env_names)), f"{where} env names repeated: {env_names}")
    for env in env_names:
        if env.startswith("VFIO_GPU_AGENT_"):
            c.check(env in envs, f"{where} env {env}: `run --help` lists no such variable")
    node_env = [e for e in ctr.get("env", []) if e["name"] == "NODE_NAME"]
    c.check(len(node_env) == 1 and node_env[0].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName",
            f"{where} NODE_NAME not from the downward API (spec.nodeName)")
    node_name = agent_setting(ctr, "--node-name", {})
    c.check(node_name == "$(NODE_NAME)" or "NODE_NAME" in env_names,
            f"{where} the agent is not told its node name (--node-name=$(NODE_NAME) or NODE_NAME)")
    nvv = [e.get("value") for e in ctr.get("env", []) if e["name"] == "NVIDIA_VISIBLE_DEVICES"]
    c.check(nvv == ["void"], f"{where} NVIDIA_VISIBLE_DEVICES={nvv}, want void (no nvidia runtime hook)")

    # Probes and ports on the ports the agent listens on
    health = agent_setting(ctr, "--health-port", defaults)
    metrics = agent_setting(ctr, "--metrics-port", defaults)
    ports = {p.get("name"): p for p in ctr.get("ports", [])}
    if c.check(health is not None and health.isdigit(),
               f"{where} `run --help` gives no --health-port (value {health}): the probes have no port the agent listens on"):
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            got = ctr.get(probe, {}).get("grpc", {}).get("port")
            c.check(got == int(health), f"{where} {probe} gRPC port {got}, the agent's health port is {health}")
        # Readiness asks the overall service ""; liveness and startup the agent's liveness service, or a node
        # whose GPU is not bound would have its agent restarted forever.
        got = ctr.get("readinessProbe", {}).get("grpc", {}).get("service", "")
        c.check(got == "", f"{where} readinessProbe asks service {got!r}, readiness is the overall service ''")
        for probe in ("livenessProbe", "startupProbe"):
            got = ctr.get(probe, {}).get("grpc", {}).get("service", "")
            c.check(liveness_service is not None and got == liveness_service,
                    f"{where} {probe} asks service {got!r}, the agent's liveness service is {liveness_service!r}")
        c.check(ports.get("health", {}).get("containerPort") == int(health), f"{where} port 'health' is not {health}")
    if c.check(metrics is not None and metrics.isdigit() and metrics != "0",
               f"{where} `run --help` gives no --metrics-port (value {metrics}): nothing listens on the metrics port"):
        c.check(ports.get("metrics", {}).get("containerPort") == int(metrics), f"{where} port 'metrics' is not {metrics}")
    for p in ports.values():
        c.check(p.get("protocol", "TCP") == "TCP" and "hostPort" not in p, f"{where} port {p} must be plain TCP without hostPort")

    # hostPath volumes and their mounts
    want_paths = dict(HOST_PATHS)
    if spec["cdi"]:
        want_paths.update(CDI_HOST_PATHS)
    if spec.get("dra"):
        want_paths.update(DRA_HOST_PATHS)
    if serves_vgpu(spec):
        want_paths.update(VGPU_HOST_PATHS)
    volumes = {v["name"]: v for v in pod.get("volumes", []) if not is_vgpu_config(spec, v)}
    got_paths = {}
    for v in volumes.values():
        hp = v.get("hostPath")
        if not c.check(hp is not None, f"{where} volume {v['name']} is not a hostPath"):
            continue
        got_paths[hp["path"]] = hp.get("type")
        if hp.get("type", "").endswith("OrCreate"):
            c.check(hp["path"].startswith(WRITABLE_ON_TALOS),
                    f"{where} hostPath {hp['path']} is {hp['type']}: the kubelet cannot create it on Talos's read-only root")
    c.check(got_paths == want_paths, f"{where} hostPaths {got_paths}, want {want_paths}")
    mounts = {m["mountPath"]: m for m in ctr.get("volumeMounts", [])
              if m["name"] not in {v["name"] for v in pod.get("volumes", []) if is_vgpu_config(spec, v)}}
    for m in mounts.values():
        c.check(m["name"] in volumes, f"{where} mount {m['mountPath']} of a missing volume {m['name']}")
        if m["name"] in volumes:
            c.check(m["mountPath"] == volumes[m["name"]]["hostPath"]["path"],
                    f"{where} {volumes[m['name']]['hostPath']['path']} mounted at {m['mountPath']}: the agent's defaults are host paths")
    c.check(len(mounts) == len(volumes), f"{where} {len(volumes)} volumes but {len(mounts)} mounts")
    c.check(mounts.get("/var/lib/kubelet/pod-resources", {}).get("readOnly") is True, f"{where} pod-resources mounted writable")
    c.check(mounts.get("/lib/modules", {}).get("readOnly") is True, f"{where} /lib/modules mounted writable")

    # Paths the agent is given live on the mounts
    mount_paths = list(mounts)
    for option in ("--status-dir", "--pod-resources-socket", "--kubelet-dir", "--sysfs-root", "--dev-root", "--modules-root"):
        value = agent_setting(ctr, option, defaults)
        if option in ("--status-dir", "--pod-resources-socket"):
            c.check(value is not None, f"{where} `run` has no {option} (help lists none and the manifest sets none)")
        if value:
            c.check(under(value, mount_paths), f"{where} {option}={value} is on no hostPath mount")
    cdi = agent_setting(ctr, "--cdi", defaults)
    if spec["cdi"]:
        c.check(cdi == "true", f"{where} CDI overlay without --cdi (VFIO_GPU_AGENT_CDI={cdi})")
        cdi_dir = agent_setting(ctr, "--cdi-dir", defaults)
        c.check(cdi_dir is not None and under(cdi_dir, mount_paths), f"{where} --cdi-dir {cdi_dir} is on no hostPath mount")
    else:
        c.check(cdi in (None, "false", "off"), f"{where} --cdi set outside the CDI overlay ({cdi})")
    check_dra(c, where, spec, ctr, by_kind, mount_paths, defaults)
    check_vgpu(c, where, spec, ctr, pod, mount_paths, defaults)

    # Termination grace covers deregistration and the longest write in flight
    grace = pod.get("terminationGracePeriodSeconds", 30)
    write_timeout = agent_setting(ctr, "--write-timeout", defaults) or "5s"
    m = re.match(r"^(\d+)(ms|s)$", write_timeout)
    write_s = (int(m.group(1)) / (1000 if m.group(2) == "ms" else 1)) if m else 5
    c.check(grace > write_s, f"{where} terminationGracePeriodSeconds {grace} does not cover a {write_timeout} write in flight")

    # Resources set (figures justified in the manifest from bench_plugin's RSS)
    res = ctr.get("resources", {})
    req_mem = res.get("requests", {}).get("memory")
    lim_mem = res.get("limits", {}).get("memory")
    c.check(bool(res.get("requests", {}).get("cpu")) and bool(req_mem) and bool(lim_mem),
            f"{where} resources {res}: cpu and memory requests and a memory limit expected")
    c.check("cpu" not in res.get("limits", {}), f"{where} CPU limit: throttling would delay Allocate")


def serves_vgpu(spec):
    """workloadMode vm-vgpu, or label (the node label may turn the node vm-vgpu under the running agent)."""
    return bool(spec.get("vgpu") or spec.get("label_mode"))


def is_vgpu_config(spec, volume):
    """The one volume that is not a hostPath: a vGPU node's profiles ConfigMap."""
    return serves_vgpu(spec) and "configMap" in volume


def check_vgpu(c, where, spec, ctr, pod, mount_paths, defaults):
    """A vGPU overlay runs `run --workload vm-vgpu` with its state directory on a host mount (a restarted agent
    still names the vGPUs of full SR-IOV cards), and its profiles config, when given, from a read-only ConfigMap;
    the others run vm-passthrough."""
    workload = agent_setting(ctr, "--workload", defaults) or "vm-passthrough"
    if not serves_vgpu(spec):
        c.check(workload == "vm-passthrough", f"{where} --workload {workload} outside the vGPU overlay")
        return
    want = "vm-passthrough" if spec.get("label_mode") else "vm-vgpu"
    c.check(workload == want, f"{where} runs --workload {workload}, want {want}")
    state = agent_setting(ctr, "--state-dir", defaults)
    c.check(state is not None and under(state, mount_paths), f"{where} --state-dir={state} is on no hostPath mount")
    config = agent_setting(ctr, "--vgpu-config-file", defaults)
    if config is not None and not config.startswith("/"):
        config = None  # the help's "(default: none)"
    maps = {v["name"]: v["configMap"] for v in pod.get("volumes", []) if "configMap" in v}
    mounts = {m["name"]: m for m in ctr.get("volumeMounts", []) if m["name"] in maps}
    if not config:
        c.check(not maps, f"{where} a ConfigMap volume {sorted(maps)} but no --vgpu-config-file reads it")
        return
    found = [m for m in mounts.values() if under(config, [m["mountPath"]])]
    if c.check(len(found) == 1, f"{where} --vgpu-config-file={config} is on no ConfigMap mount"):
        c.check(found[0].get("readOnly") is True and "subPath" not in found[0],
                f"{where} the profiles ConfigMap is mounted writable or with subPath (subPath never sees an update)")


def check_dra(c, where, spec, ctr, by_kind, mount_paths, defaults):
    """A DRA overlay runs the agent as the DRA driver, with its sockets and CDI specs on host mounts, and ships a
    DeviceClass per model selecting exactly that driver's devices of that model; the others ship no class."""
    classes = by_kind.get("DeviceClass", [])
    api = agent_setting(ctr, "--kubelet-api", defaults) or "device-plugin"
    if not spec.get("dra"):
        c.check(api == "device-plugin", f"{where} --kubelet-api {api} outside the DRA overlay")
        c.check(not classes, f"{where} DeviceClasses outside the DRA overlay: nobody publishes their devices")
        return
    c.check(api == "dra", f"{where} the DRA overlay runs --kubelet-api {api}")
    for option in ("--kubelet-registry-dir", "--kubelet-plugins-dir", "--cdi-dir"):
        value = agent_setting(ctr, option, defaults)
        c.check(value is not None and under(value, mount_paths), f"{where} {option}={value} is on no hostPath mount")
    driver = agent_setting(ctr, "--dra-driver-name", defaults)
    domain = agent_setting(ctr, "--resource-domain", defaults) or "nvidia.com"
    c.check(bool(driver), f"{where} no --dra-driver-name: the DeviceClasses cannot be checked against the driver")
    c.check(len(classes) > 0, f"{where} no DeviceClass: no claim can name the driver's devices")
    names, extended, legacy, iommufd = set(), set(), set(), set()
    cel = re.compile(r'^device\.driver == "([^"]+)" && device\.attributes\["([^"]+)"\]\.resourceName == "([^"]+)"$')
    for dc in classes:
        name = dc["metadata"]["name"]
        c.check(dc["apiVersion"] == "resource.k8s.io/v1", f"{where} DeviceClass {name} is {dc['apiVersion']}")
        c.check(name.endswith("." + str(driver)), f"{where} DeviceClass {name} is not named under the driver {driver}")
        names.add(name)
        selectors = dc.get("spec", {}).get("selectors", [])
        m = cel.match(selectors[0].get("cel", {}).get("expression", "")) if len(selectors) == 1 else None
        if c.check(m is not None, f"{where} DeviceClass {name}: want one CEL selector on the driver and resourceName, got {selectors}"):
            c.check(m.group(1) == driver and m.group(2) == driver,
                    f"{where} DeviceClass {name} selects driver {m.group(1)}/{m.group(2)}, the agent is {driver}")
            want = f"{domain}/{m.group(3)}"
            got = dc["spec"].get("extendedResourceName")
            # Two classes a model: <model>.<driver> (legacy VFIO, the model's extended resource) and
            # <model>-iommufd.<driver> (iommufd), which has none: one extended resource names one class.
            if name.endswith("-iommufd." + str(driver)):
                c.check(got is None, f"{where} DeviceClass {name}: an iommufd class with extendedResourceName {got}")
                iommufd.add(name[:-len("-iommufd." + str(driver))])
            else:
                c.check(got == want, f"{where} DeviceClass {name}: extendedResourceName {got}, the model's resource is {want}")
                extended.add(got)
                legacy.add(name[:-len("." + str(driver))])
    c.check(len(names) == len(classes) and len(extended) == len(legacy),
            f"{where} DeviceClass names or extended resources repeated: one legacy class per model")
    c.check(iommufd == legacy, f"{where} models without both a legacy and an iommufd class: {sorted(iommufd ^ legacy)}")


def cel_well_formed(expression):
    """What can be told of a CEL expression without a CEL compiler: quotes closed, brackets balanced."""
    stack, quote, i = [], None, 0
    pairs = {")": "(", "]": "[", "}": "{"}
    while i < len(expression):
        ch = expression[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            stack.append(ch)
        elif ch in ")]}":
            if not stack or stack.pop() != pairs[ch]:
                return False
        i += 1
    return quote is None and not stack and bool(expression.strip())


def rule_covers(rule, group, resource, operation):
    """A policy resourceRule matches requests on group/resource (a subresource too) with that operation."""
    base = resource.split("/")[0]
    resources = rule.get("resources", [])
    return ((group in rule.get("apiGroups", []) or "*" in rule.get("apiGroups", []))
            and (resource in resources or "*" in resources or f"{base}/*" in resources
                 or ("/" not in resource and "*/*" in resources))
            and (operation in rule.get("operations", []) or "*" in rule.get("operations", []))
            and bool(rule.get("apiVersions")))


def check_admission_policy(c, where, by_kind, sa, role):
    """Issue 24: one ValidatingAdmissionPolicy and its binding, holding this overlay's ServiceAccount to its node."""
    policies = by_kind.get("ValidatingAdmissionPolicy", [])
    bindings = by_kind.get("ValidatingAdmissionPolicyBinding", [])
    if not c.check(len(policies) == 1 and len(bindings) == 1,
                   f"{where} one ValidatingAdmissionPolicy and one binding expected, got {len(policies)} and {len(bindings)}"):
        return
    policy, binding = policies[0], bindings[0]
    for obj in (policy, binding):
        c.check(obj["apiVersion"] == "admissionregistration.k8s.io/v1",
                f"{where} {obj['kind']} is {obj['apiVersion']}, want admissionregistration.k8s.io/v1 (GA since 1.30)")
        c.check(obj["metadata"]["name"] == POLICY_NAME,
                f"{where} {obj['kind']} is named {obj['metadata']['name']}: the ClusterRole grants get on {POLICY_NAME}")
    bspec = binding.get("spec", {})
    c.check(bspec.get("policyName") == policy["metadata"]["name"],
            f"{where} binding names policy {bspec.get('policyName')}, not {policy['metadata']['name']}")
    c.check(bspec.get("validationActions") == ["Deny"], f"{where} binding validationActions {bspec.get('validationActions')}, want [Deny]")
    c.check("paramRef" not in bspec and "matchResources" not in bspec,
            f"{where} binding narrows or parametrises the policy: {sorted(bspec)}")

    spec = policy.get("spec", {})
    c.check(spec.get("failurePolicy") == "Fail", f"{where} failurePolicy {spec.get('failurePolicy')}: an error must deny")
    constraints = spec.get("matchConstraints", {})
    c.check(constraints.get("matchPolicy", "Equivalent") == "Equivalent",
            f"{where} matchPolicy {constraints.get('matchPolicy')}: core v1 Events would slip past the events.k8s.io rule")
    c.check("paramKind" not in spec, f"{where} the policy takes parameters: the binding gives none")

    # Matched to exactly this overlay's ServiceAccount, and no other account named anywhere in the policy.
    want_user = f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
    conditions = spec.get("matchConditions", [])
    users = [m.group(1) for m in (SA_USERNAME.match(mc.get("expression", "").strip()) for mc in conditions) if m]
    c.check(len(conditions) == 1 and users == [want_user],
            f"{where} matchConditions {conditions}: want one, request.userInfo.username == '{want_user}'")
    text = yaml.safe_dump(spec)
    for other in sorted(set(re.findall(r"system:serviceaccount:[A-Za-z0-9.-]+:[A-Za-z0-9.-]+", text)) - {want_user}):
        c.check(False, f"{where} the policy names {other}, the agent here is {want_user}")

    # Every write the ClusterRole grants passes through the policy.
    rules = constraints.get("resourceRules", [])
    for rule in role.get("rules", []):
        for verb in rule.get("verbs", []):
            if verb not in WRITE_VERBS and verb != "*":
                continue
            ops = set(WRITE_VERBS.values()) if verb == "*" else {WRITE_VERBS[verb]}
            for g in rule.get("apiGroups", []):
                for r in rule.get("resources", []):
                    for op in sorted(ops):
                        c.check(any(rule_covers(pr, g, r, op) for pr in rules),
                                f"{where} the ClusterRole grants {verb} on {r}.{g or 'core'} but the policy does not match {op} on it")
                    # ... and an expression of the policy looks at that resource.
                    c.check(f"'{r.split('/')[0]}'" in text,
                            f"{where} no expression of the policy tests request.resource.resource == '{r.split('/')[0]}'")

    # The node comes from the pod-bound token, and a token without one writes nothing.
    variables = {v.get("name"): v.get("expression", "") for v in spec.get("variables", [])}
    for claim in (NODE_NAME_CLAIM, POD_NAME_CLAIM):
        c.check(any(claim in e for e in variables.values()), f"{where} no variable reads request.userInfo.extra['{claim}']")
    validations = spec.get("validations", [])
    c.check(any(v.get("expression", "").strip() == "variables.nodeName != ''" for v in validations),
            f"{where} no validation refuses a token without a node name")
    for v in validations:
        expression = v.get("expression", "")
        c.check(v.get("reason") == "Forbidden",
                f"{where} validation {expression[:60]!r} has reason {v.get('reason')}: Forbidden (403) is what the agent takes for a policy's no")
        c.check(bool(v.get("message")), f"{where} validation {expression[:60]!r} has no static message (messageExpression can fail)")
    for what, expression in ([("matchCondition", mc.get("expression", "")) for mc in conditions]
                             + [(f"variable {n}", e) for n, e in variables.items()]
                             + [("validation", v.get("expression", "")) for v in validations]
                             + [("messageExpression", v["messageExpression"]) for v in validations if "messageExpression" in v]):
        c.check(cel_well_formed(expression), f"{where} {what} is not well-formed CEL (quotes/brackets): {expression!r}")
        for name in re.findall(r"variables\.([A-Za-z_][A-Za-z0-9_]*)", expression):
            c.check(name in variables, f"{where} {what} uses variables.{name}, which the policy does not define")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["render", "manifests"])
    parser.add_argument("--daemonset-dir", required=True)
    parser.add_argument("--kubectl", action="append")
    parser.add_argument("--agent")
    args = parser.parse_args()

    c = Checker()
    tools = kubectls(args)
    if not tools:
        print("no kubectl given (scripts/install-deps.sh installs one)", file=sys.stderr)
        return 1
    rendered = {}
    for overlay in OVERLAYS:
        outputs = {}
        for kubectl in tools:
            out, err = render(kubectl, args.daemonset_dir, overlay)
            if c.check(err is None, err or ""):
                outputs[kubectl] = [d for d in yaml.safe_load_all(out) if d]
        if outputs:
            first_tool, first = next(iter(outputs.items()))
            for tool, docs in outputs.items():
                c.check(docs == first, f"[{overlay}] {tool} renders other objects than {first_tool}")
            c.check(all("kind" in d and "apiVersion" in d for d in first), f"[{overlay}] an object without kind/apiVersion")
            rendered[overlay] = first
            print(f"[{overlay}] rendered by {len(outputs)} kubectl(s): {len(first)} objects")

    if args.mode == "manifests":
        if not args.agent:
            parser.error("manifests needs --agent")
        help_info = parse_run_help(args.agent)
        header = os.path.join(os.path.dirname(os.path.abspath(args.daemonset_dir)), "src", "daemon", "health_server.h")
        liveness_service = liveness_service_name(header)
        c.check(liveness_service is not None, f"no kLivenessService in {header}: which service answers liveness?")
        if c.check(help_info[0], f"`{args.agent} run --help` listed no options"):
            for overlay, docs in rendered.items():
                check_overlay(c, overlay, OVERLAYS[overlay], docs, help_info, liveness_service)

    for f in c.failures:
        print("FAIL", f)
    print(f"{len(c.failures)} failed check(s)")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
