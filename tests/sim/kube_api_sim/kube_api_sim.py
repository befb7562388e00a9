#!/usr/bin/env python3
"""A fake kube-apiserver for the calls vfio-gpu-agent makes, strict where the real one is strict.

Serves GET/PATCH nodes/<node>(/status) (the node itself: metadata.labels only), the list of nodes with the
metadata.name field selector and its watch (?watch=1: chunked JSON lines, ADDED/MODIFIED/DELETED of the node as it
changes, changes between two looks folded into one event as a watch cache may; timeoutSeconds ends it; a
resourceVersion older than the last `compact` is an ERROR event with a 410 Status, as kube-apiserver answers after
etcd compaction), POST/PATCH events.k8s.io/v1 Events, GET kubevirt.io/v1 kubevirts, GET
of one resource.k8s.io/v1 ResourceClaim by namespace and name, the cluster-wide list and watch of ResourceClaims with a
labelSelector (an object that stops matching is DELETED to the watch, as the watch cache sends it), the claims'
status subresource (GET; PATCH by server-side apply or merge patch, validated as 1.36 validates status.devices), the
namespaced list and watch of claims and PATCH of their metadata.labels (merge patch: the claim router's write),
coordination.k8s.io/v1 Leases (get, create, update with 409 on a stale resourceVersion, delete; spec validated), GET of one admissionregistration.k8s.io/v1
ValidatingAdmissionPolicy(Binding) by name, the list of resource.k8s.io/v1 DeviceClasses, and resource.k8s.io/v1 ResourceSlices (list with the
spec.nodeName/spec.driver field selectors, watch with the same selectors (chunked JSON lines, 410 Gone for a
compacted resourceVersion, bookmarks), create, update, delete, validated as kube-apiserver validates them: the device
cap of 128, 64 with taints, consumesCounters or list attributes; the fields of disabled feature gates dropped) on
127.0.0.1 (http, or https with --tls-cert/--tls-key; --client-ca adds x509 client authentication). Prints "LISTENING <url>" on stdout once it accepts
connections. Every API request is appended to --log as one JSON line (method, path, content_type, status,
body) before the response is sent, so a test that sees the line knows the server decided.

Control: one command per line on stdin, answered by one line on stdout ("OK [json]" or "ERR <why>"):
  token T                         accept only bearer token T from now on
  node NAME [LABELS_JSON]         add (or replace) a node
  delete-node NAME                the node disappears (404)
  touch-node NAME                 another writer updated the node: its resourceVersion moves on
  relabel NAME LABELS_JSON        kubectl label: the node's labels become LABELS_JSON (status and conditions kept)
  get-node NAME                   OK <node json>
  events                          OK <json list of stored Events>
  fail METHOD PREFIX CODE COUNT [RETRY_AFTER]   answer the next COUNT (-1: all) matching requests with CODE
  deny-policy METHOD PREFIX CODE COUNT  a ValidatingAdmissionPolicy's denial (CODE 403 or 422), in kube-apiserver's words
  cut METHOD PREFIX COUNT         send half a response and close the connection
  hang METHOD PREFIX COUNT        hold matching requests until `release` (or 60 s), then close
  release                         let held requests go (their connections are closed)
  clear-faults
  kubevirts JSON_LIST_ITEMS       the KubeVirt CRs (a JSON list of objects, [] for none); until then, and after
                                  `no-kubevirt`, the CRD is not installed (404, as kube-apiserver without KubeVirt)
  deny VERB RESOURCE.GROUP        RBAC: 403 for that verb on that resource (list kubevirts.kubevirt.io); checked
                                  after the token and before the resource exists, as kube-apiserver authorizes
  allow VERB RESOURCE.GROUP       undo a deny
  admission KIND JSON_OBJECT      store a ValidatingAdmissionPolicy (KIND policy) or its binding (KIND binding),
                                  served at .../validatingadmissionpolicies(bindings)/<metadata.name>
  delete-admission KIND NAME      it is gone: 404 naming it, as kube-apiserver answers for a missing object
  claim JSON_OBJECT               store a resource.k8s.io/v1 ResourceClaim (metadata.namespace and .name required; uid,
                                  resourceVersion and creationTimestamp filled in when absent), served at
                                  /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>
  delete-claim NAMESPACE NAME     it is gone: 404 naming it (a DELETED event for its watches)
  get-claim NAMESPACE NAME        OK <claim json>
  allocate NS NAME NODE RESERVED_JSON RESULTS_JSON
                                  the scheduler allocates (RESULTS_JSON: [{request, driver, pool, device}], each given
                                  the bindingConditions/bindingFailureConditions of its slice device while the gates
                                  are on; allocationTimestamp, a nodeSelector for NODE, reservedFor RESERVED_JSON, e.g.
                                  [{"resource":"pods","name":"vm","uid":"p1"}], no spaces) and the claim router labels
                                  it gpu.vfio-agent.cozystack.io/node=<ClaimNodeLabelValue(NODE)>
  deallocate NAMESPACE NAME       the scheduler gives the allocation up: status emptied (the label stays)
  unlabel NAMESPACE NAME          the router takes its label off (a labelSelector watch sees DELETED)
  claim-status NAMESPACE NAME JSON  the scheduler writes the claim's status (status.allocation) through the status
                                  subresource: the status is replaced, labels and spec kept
  get-lease NAMESPACE NAME        OK <lease json>
  admission-api off|on            off: admissionregistration.k8s.io/v1 policies not served (Kubernetes < 1.30),
                                  a 404 that names no object; on (the default) serves them
  slices                          OK <json list of stored resource.k8s.io/v1 ResourceSlices>
  deviceclasses JSON_LIST_ITEMS   the resource.k8s.io/v1 DeviceClasses (a JSON list of objects; none until then)
  delete-slices NODE              what a kubelet does at its start: every ResourceSlice of NODE is deleted
  patch-slice NAME JSON_PATCH     another writer changes a slice (RFC 7386 merge patch; resourceVersion moves on)
  feature-gates GATE=BOOL[,...]   as --feature-gates, from now on (an apiserver restarted with other gates)
  compact                         etcd compaction: a watch from any resourceVersion before now gets 410 Gone, and
                                  every open watch of nodes ends with an ERROR event of code 410 (the client lists
                                  again)
  close-watches                   every open watch ends (an apiserver restart, a load balancer's idle cut)
  bookmark-interval SECONDS       how often an idle watch with allowWatchBookmarks gets a BOOKMARK (default 60)
METHOD may be * and PREFIX matches the start of the path. Stdin closing stops the server.
"""
import argparse
import copy
import datetime
import hashlib
import http.server
import json
import re
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import uuid

MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
SLICE_MAX_DEVICES = 128  # resource.k8s.io ResourceSliceMaxDevices
# ResourceSliceMaxDevicesWithAdvancedFeatures: the cap when any device of the slice has taints, consumes counters or
# has a list-type attribute (pkg/apis/resource/validation: haveDeviceTaints, haveConsumesCounters,
# haveListAttributes). Binding conditions and allowMultipleAllocations do not lower it.
SLICE_MAX_DEVICES_ADVANCED = 64
LIST_ATTRIBUTE_KINDS = ("ints", "bools", "strings", "versions")
BINDING_CONDITIONS_MAX = 4  # BindingConditionsMaxSize, BindingFailureConditionsMaxSize
DEVICE_STATUS_MAX_CONDITIONS = 8  # AllocatedDeviceStatusMaxConditions
# kube-apiserver v1.36's defaults for the gates whose fields the ResourceSlice strategy drops when they are off
# (pkg/registry/resource/resourceslice/strategy.go, dropDisabledFields). 1.34/1.35: the first four were alpha (off).
FEATURE_GATES_1_36 = {"DRADeviceTaints": True, "DRAPartitionableDevices": True, "DRADeviceBindingConditions": True,
                      "DRAResourceClaimDeviceStatus": True, "DRAConsumableCapacity": True,
                      "DRAListTypeAttributes": False, "DRANodeAllocatableResources": False}
WATCH_HISTORY = 1000  # events kept for watches from an older resourceVersion (the watch cache's window)
SLICE_MAX_ATTRIBUTES = 32  # attributes + capacities of one device
ATTRIBUTE_MAX_STRING = 64
QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")
NOTE_LIMIT = 1024
CONDITION_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
APPLY_PATCH = "application/apply-patch+yaml"
CLAIM_NODE_LABEL = "gpu.vfio-agent.cozystack.io/node"  # claim_routing.h kClaimNodeLabel
# Who every accepted token belongs to, for RBAC messages: the DaemonSet's ServiceAccount.
SERVICE_ACCOUNT_USER = "system:serviceaccount:vfio-gpu-agent:vfio-gpu-agent"


class ApiError(Exception):
    def __init__(self, code, reason, message, retry_after=None, details=None):
        super().__init__(message)
        self.code, self.reason, self.message, self.retry_after = code, reason, message, retry_after
        self.details = details


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target, patch):
    """RFC 7386: objects merge, null deletes, everything else (lists included) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge(target, patch, merge_keys):
    """Strategic merge for the lists the server knows a merge key of (conditions by type), else RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif key in merge_keys and isinstance(value, list):
            merge_key = merge_keys[key]
            merged = list(result.get(key) or [])
            for item in value:
                if not isinstance(item, dict) or merge_key not in item:
                    raise ApiError(400, "BadRequest", f"{key}: every item needs {merge_key}")
                for index, existing in enumerate(merged):
                    if existing.get(merge_key) == item[merge_key]:
                        merged[index] = strategic_merge(existing, item, {})
                        break
                else:
                    merged.append(copy.deepcopy(item))
            result[key] = merged
        else:
            result[key] = strategic_merge(result.get(key), value, merge_keys)
    return result


class State:
    def __init__(self, tokens, log_path):
        self.lock = threading.Lock()
        self.tokens = set(tokens)
        self.nodes = {}
        self.events = {}  # (namespace, name) -> event
        self.kubevirts = []
        self.device_classes = []
        self.kubevirt_installed = False
        self.denied = set()  # (verb, "resource.group")
        self.admission = {"validatingadmissionpolicies": {}, "validatingadmissionpolicybindings": {}}
        self.admission_served = True
        self.slices = {}  # name -> resource.k8s.io/v1 ResourceSlice
        self.feature_gates = dict(FEATURE_GATES_1_36)
        # Watches of resourceslices: every change as (resourceVersion, type, object), the last WATCH_HISTORY kept;
        # a watch from a resourceVersion older than oldest_rv gets 410 Gone. `changed` wakes the watches.
        self.slice_events = []
        self.oldest_rv = 0
        self.watch_generation = 0  # close-watches ends every open watch
        self.changed = threading.Condition(self.lock)
        self.bookmark_interval = 60.0
        self.claims = {}  # (namespace, name) -> ResourceClaim
        # Watches of resourceclaims: (resourceVersion, type, object, previous object or None), as slice_events.
        self.claim_events = []
        # status.devices entries each field manager applied (server-side apply), by claim: (ns, name) -> {manager:
        # set of (driver, pool, device, shareID)}.
        self.claim_managers = {}
        self.faults = []
        self.released = threading.Event()
        self.rv = 100
        self.log = open(log_path, "a", buffering=1) if log_path else None
        self.compacted_rv = 0  # watches of nodes: from an older resourceVersion, 410
        self.watch_epoch = 0  # `compact` ends the node watches of earlier epochs
        self.leases = {}  # (namespace, name) -> Lease

    def next_rv(self):
        self.rv += 1
        return str(self.rv)

    def slice_event(self, kind, obj):
        """Records a change of a ResourceSlice for the watches (held: self.lock)."""
        self.slice_events.append((int(obj["metadata"]["resourceVersion"]), kind, copy.deepcopy(obj)))
        if len(self.slice_events) > WATCH_HISTORY:
            dropped = self.slice_events[:len(self.slice_events) - WATCH_HISTORY]
            self.slice_events = self.slice_events[len(dropped):]
            self.oldest_rv = dropped[-1][0]
        self.changed.notify_all()

    def claim_event(self, kind, obj, old):
        """Records a change of a ResourceClaim for the watches (held: self.lock)."""
        self.claim_events.append((int(obj["metadata"]["resourceVersion"]), kind, copy.deepcopy(obj),
                                  copy.deepcopy(old) if old is not None else None))
        if len(self.claim_events) > WATCH_HISTORY:
            self.claim_events = self.claim_events[len(self.claim_events) - WATCH_HISTORY:]
            self.oldest_rv = max(self.oldest_rv, self.claim_events[0][0] - 1)
        self.changed.notify_all()

    def store_claim(self, claim):
        """Stores a new or changed claim with the next resourceVersion and its watch event."""
        key = (claim["metadata"]["namespace"], claim["metadata"]["name"])
        old = self.claims.get(key)
        claim["metadata"]["resourceVersion"] = self.next_rv()
        self.claims[key] = claim
        self.claim_event("MODIFIED" if old is not None else "ADDED", claim, old)

    def delete_claim(self, namespace, name):
        obj = self.claims.pop((namespace, name), None)
        if obj is None:
            return
        self.claim_managers.pop((namespace, name), None)
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = self.next_rv()
        self.claim_event("DELETED", gone, obj)

    def delete_slice(self, name):
        """Deletes a stored slice; its DELETED event carries the deletion's resourceVersion, as etcd's does."""
        obj = self.slices.pop(name)
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = self.next_rv()
        self.slice_event("DELETED", gone)

    def add_node(self, name, labels):
        self.nodes[name] = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": str(uuid.uuid4()), "resourceVersion": self.next_rv(),
                         "labels": labels, "creationTimestamp": now_rfc3339()},
            "status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                 "lastHeartbeatTime": now_rfc3339(), "lastTransitionTime": now_rfc3339()}],
                "capacity": {"nvidia.com/GH100_H200": "8"}},
        }

    def take_fault(self, method, path):
        for fault in self.faults:
            if fault["method"] in ("*", method) and path.startswith(fault["prefix"]) and fault["count"] != 0:
                if fault["count"] > 0:
                    fault["count"] -= 1
                return dict(fault)
        return None

    def write_log(self, entry):
        if self.log:
            self.log.write(json.dumps(entry, sort_keys=True) + "\n")


def validate_event(event, namespace):
    errors = []
    meta = event.get("metadata") or {}
    if not meta.get("name"):
        errors.append("metadata.name: Required value")
    if meta.get("namespace", namespace) != namespace:
        errors.append("metadata.namespace: does not match the namespace of the request")
    if not isinstance(event.get("eventTime"), str) or not MICRO_TIME.match(event["eventTime"]):
        errors.append("eventTime: Required value (RFC3339 with microseconds)")
    for field in ("reportingController", "reportingInstance", "action", "reason"):
        value = event.get(field)
        if not isinstance(value, str) or not value:
            errors.append(f"{field}: Required value")
        elif len(value) > 128:
            errors.append(f"{field}: Too long: may not be longer than 128")
    controller = event.get("reportingController")
    if isinstance(controller, str) and controller and not QUALIFIED_NAME.match(controller):
        errors.append("reportingController: Invalid value: must be a qualified name")
    if event.get("type") not in ("Normal", "Warning"):
        errors.append("type: Unsupported value: supported values: \"Normal\", \"Warning\"")
    if len((event.get("note") or "").encode()) > NOTE_LIMIT:
        errors.append(f"note: Too long: may not be longer than {NOTE_LIMIT}")
    regarding = event.get("regarding")
    if not isinstance(regarding, dict) or not regarding.get("kind") or not regarding.get("name"):
        errors.append("regarding: Required value (kind and name)")
    elif regarding.get("kind") == "Node" and namespace != "default":
        errors.append("metadata.namespace: events of a cluster-scoped object live in namespace default")
    series = event.get("series")
    if series is not None:
        if not isinstance(series.get("count"), int) or series["count"] < 2:
            errors.append("series.count: Invalid value: should be at least 2")
        if not isinstance(series.get("lastObservedTime"), str) or not MICRO_TIME.match(series["lastObservedTime"]):
            errors.append("series.lastObservedTime: Required value")
    if errors:
        raise ApiError(422, "Invalid", "Event is invalid: " + "; ".join(errors))


def validate_conditions(node):
    for condition in node.get("status", {}).get("conditions", []):
        if not condition.get("type"):
            raise ApiError(422, "Invalid", "status.conditions.type: Required value")
        if condition.get("status") not in ("True", "False", "Unknown"):
            raise ApiError(422, "Invalid", "status.conditions.status: Unsupported value")
        for field in ("lastHeartbeatTime", "lastTransitionTime"):
            if field in condition and not TIME.match(str(condition[field])):
                raise ApiError(400, "BadRequest", f"status.conditions.{field}: not RFC3339")


def invalid_slice(message):
    # The object's name is filled in by validate_slice, which knows it.
    return ApiError(422, "Invalid", message)


CAUSE_REASONS = (("Too many", "FieldValueTooMany"), ("Too long", "FieldValueTooLong"),
                 ("Required value", "FieldValueRequired"), ("Duplicate value", "FieldValueDuplicate"),
                 ("Unsupported value", "FieldValueNotSupported"), ("Invalid value", "FieldValueInvalid"))


def validate_slice(obj, name):
    """kube-apiserver's ResourceSlice validation, answered as it answers: 422 Invalid, the message
    `ResourceSlice.resource.k8s.io "<name>" is invalid: <field>: <what>` and a StatusDetails cause."""
    try:
        check_slice(obj)
    except ApiError as error:
        if error.code != 422:
            raise
        field, _, what = error.message.partition(": ")
        reason = next((r for prefix, r in CAUSE_REASONS if what.startswith(prefix)), "FieldValueInvalid")
        raise ApiError(422, "Invalid", f'ResourceSlice.resource.k8s.io "{name}" is invalid: {error.message}',
                       details={"name": name, "group": "resource.k8s.io", "kind": "ResourceSlice",
                                "causes": [{"reason": reason, "message": what, "field": field}]})


def slice_uses_advanced_features(spec):
    """pkg/apis/resource/validation: haveDeviceTaints || haveConsumesCounters || haveListAttributes."""
    for device in spec.get("devices") or []:
        if device.get("taints") or device.get("consumesCounters"):
            return True
        for value in (device.get("attributes") or {}).values():
            if isinstance(value, dict) and any(value.get(kind) is not None for kind in LIST_ATTRIBUTE_KINDS):
                return True
    return False


def drop_disabled_fields(state, new, old):
    """The ResourceSlice strategy's dropDisabledFields: a field of a disabled gate is silently dropped from what is
    stored, unless the stored object (an update's old one) already uses it."""
    gates = state.feature_gates
    new_spec, old_spec = new.get("spec") or {}, (old or {}).get("spec") or {}
    new_devices, old_devices = new_spec.get("devices") or [], old_spec.get("devices") or []

    def in_use(spec, devices, device_fields, spec_fields=()):
        return any(spec.get(f) is not None for f in spec_fields) or \
            any(device.get(f) not in (None, [], {}) for device in devices for f in device_fields)

    def drop(device_fields, spec_fields=()):
        for f in spec_fields:
            new_spec.pop(f, None)
        for device in new_devices:
            for f in device_fields:
                device.pop(f, None)

    if not gates["DRADeviceTaints"] and not in_use(old_spec, old_devices, ("taints",)):
        drop(("taints",))
    partitionable = ("consumesCounters", "nodeName", "nodeSelector", "allNodes")
    if not gates["DRAPartitionableDevices"] and \
            not in_use(old_spec, old_devices, partitionable, ("sharedCounters", "perDeviceNodeSelection")):
        drop(partitionable, ("sharedCounters", "perDeviceNodeSelection"))
    binding = ("bindingConditions", "bindingFailureConditions", "bindsToNode")
    if not (gates["DRADeviceBindingConditions"] and gates["DRAResourceClaimDeviceStatus"]) and \
            not in_use(old_spec, old_devices, binding):
        drop(binding)
    if not gates["DRAConsumableCapacity"] and not in_use(old_spec, old_devices, ("allowMultipleAllocations",)) and \
            not any("requestPolicy" in c for d in old_devices for c in (d.get("capacity") or {}).values()):
        drop(("allowMultipleAllocations",))
        for device in new_devices:
            for capacity in (device.get("capacity") or {}).values():
                capacity.pop("requestPolicy", None)
    if not gates["DRANodeAllocatableResources"] and not in_use(old_spec, old_devices, ("nodeAllocatableResources",)):
        drop(("nodeAllocatableResources",))
    lists_in_use = any(isinstance(v, dict) and any(k in v for k in LIST_ATTRIBUTE_KINDS)
                       for d in old_devices for v in (d.get("attributes") or {}).values())
    if not gates["DRAListTypeAttributes"] and not lists_in_use:
        for device in new_devices:
            for value in (device.get("attributes") or {}).values():
                for kind in LIST_ATTRIBUTE_KINDS:
                    if isinstance(value, dict):
                        value.pop(kind, None)


def qualified_name_error(name):
    """apimachinery IsQualifiedName (metav1validation.ValidateLabelName): [prefix/]name, the prefix a DNS subdomain
    of at most 253, the name at most 63 alphanumerics, '-', '_', '.', starting and ending alphanumeric."""
    if not isinstance(name, str):
        return "must be a string"
    prefix, _, base = name.rpartition("/")
    if "/" in prefix:
        return "a qualified name must consist of alphanumeric characters, '-', '_' or '.', ... with an optional DNS subdomain prefix and '/'"
    if name.count("/") == 1 and (not prefix or len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)):
        return "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"
    if not base or len(base) > 63 or not re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", base):
        return ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                "alphanumeric character (at most 63)")
    return None


def check_binding_parameters(conditions, failures, where):
    """validateDeviceBindingParameters (1.36): at most 4 of each, qualified names, no duplicates, no type in both
    lists, both lists or neither. Shared by slices' devices and claims' allocation results."""
    conditions, failures = conditions or [], failures or []
    for field, values in (("bindingConditions", conditions), ("bindingFailureConditions", failures)):
        if len(values) > BINDING_CONDITIONS_MAX:
            raise invalid_slice(f"{where}.{field}: Too many: {len(values)}: must have at most {BINDING_CONDITIONS_MAX} items")
        seen = set()
        for j, value in enumerate(values):
            error = qualified_name_error(value)
            if error:
                raise invalid_slice(f"{where}.{field}[{j}]: Invalid value: {value!r}: {error}")
            if value in seen:
                raise invalid_slice(f"{where}.{field}[{j}]: Duplicate value: {value!r}")
            seen.add(value)
    for j, value in enumerate(failures):
        if value in conditions:
            raise invalid_slice(f"{where}.bindingFailureConditions[{j}]: Invalid value: {value!r}: "
                                "bindingFailureConditions must not overlap with bindingConditions")
    if failures and not conditions:
        raise invalid_slice(f"{where}.bindingConditions: Invalid value: null: bindingConditions are required to use "
                            "bindingFailureConditions")
    if conditions and not failures:
        raise invalid_slice(f"{where}.bindingFailureConditions: Invalid value: null: bindingFailureConditions are "
                            "required to use bindingConditions")


def check_slice(obj):
    """The checks of kube-apiserver's ResourceSlice validation that a node-local driver can run into."""
    if not isinstance(obj, dict) or obj.get("apiVersion") != "resource.k8s.io/v1" or obj.get("kind") != "ResourceSlice":
        raise ApiError(400, "BadRequest", "expected apiVersion resource.k8s.io/v1, kind ResourceSlice")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise invalid_slice("spec: Required value")
    driver = spec.get("driver")
    if not isinstance(driver, str) or not DNS_SUBDOMAIN.match(driver) or len(driver) > 63:
        raise invalid_slice(f"spec.driver: Invalid value: {driver!r}: a lowercase DNS subdomain of at most 63 characters")
    pool = spec.get("pool") or {}
    if not isinstance(pool.get("name"), str) or not pool["name"]:
        raise invalid_slice("spec.pool.name: Required value")
    if not isinstance(pool.get("generation"), int) or pool["generation"] < 0:
        raise invalid_slice("spec.pool.generation: Invalid value: must be greater than or equal to 0")
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] < 1:
        raise invalid_slice("spec.pool.resourceSliceCount: Invalid value: must be greater than zero")
    selectors = [key for key in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(key)]
    if len(selectors) != 1:
        raise invalid_slice("spec: Invalid value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                            "`perDeviceNodeSelection` is required")
    devices = spec.get("devices") or []
    max_devices = SLICE_MAX_DEVICES_ADVANCED if slice_uses_advanced_features(spec) else SLICE_MAX_DEVICES
    if len(devices) > max_devices:
        raise invalid_slice(f"spec.devices: Too many: {len(devices)}: must have at most {max_devices} items")
    names = set()
    for i, device in enumerate(devices):
        where = f"spec.devices[{i}]"
        name = device.get("name")
        if not isinstance(name, str) or not DNS_LABEL.match(name) or len(name) > 63:
            raise invalid_slice(f"{where}.name: Invalid value: {name!r}: a lowercase RFC 1123 label")
        if name in names:
            raise invalid_slice(f"{where}.name: Duplicate value: {name!r}")
        names.add(name)
        attributes = device.get("attributes") or {}
        if len(attributes) + len(device.get("capacity") or {}) > SLICE_MAX_ATTRIBUTES:
            raise invalid_slice(f"{where}: Too many: attributes and capacities must be at most {SLICE_MAX_ATTRIBUTES}")
        for key, value in attributes.items():
            if not QUALIFIED_NAME.match(key):
                raise invalid_slice(f"{where}.attributes[{key}]: Invalid value: not a qualified name")
            kinds = [k for k in ("int", "bool", "string", "version") if k in value]
            if len(kinds) != 1 or len(value) != 1:
                raise invalid_slice(f"{where}.attributes[{key}]: Invalid value: exactly one value must be specified")
            kind = kinds[0]
            if kind == "int" and (not isinstance(value[kind], int) or isinstance(value[kind], bool)) or \
                    kind == "bool" and not isinstance(value[kind], bool) or \
                    kind in ("string", "version") and not isinstance(value[kind], str):
                raise ApiError(400, "BadRequest", f"{where}.attributes[{key}].{kind}: wrong type")
            if kind == "string" and len(value[kind]) > ATTRIBUTE_MAX_STRING:
                raise invalid_slice(f"{where}.attributes[{key}].string: Too long: may not be more than "
                                    f"{ATTRIBUTE_MAX_STRING} bytes")
            if kind == "version" and not re.match(r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$", value[kind]):
                raise invalid_slice(f"{where}.attributes[{key}].version: Invalid value: must be a semantic version")
        for j, taint in enumerate(device.get("taints") or []):
            if taint.get("effect") not in ("NoSchedule", "NoExecute", "None"):
                raise invalid_slice(f"{where}.taints[{j}].effect: Unsupported value: {taint.get('effect')!r}")
            if not isinstance(taint.get("key"), str) or not QUALIFIED_NAME.match(taint["key"]):
                raise invalid_slice(f"{where}.taints[{j}].key: Invalid value: not a qualified name")
        check_binding_parameters(device.get("bindingConditions"), device.get("bindingFailureConditions"), where)


def label_selector(path):
    """The labelSelector of a request as a predicate on labels: `k=v`, `k==v`, `k!=v`, `k` and `!k` terms joined by
    commas (set-based `in`/`notin` are not needed by the agent and refused with 400, as a typo would be)."""
    query = urllib.parse.parse_qs(path.split("?", 1)[1] if "?" in path else "")
    text = query.get("labelSelector", [""])[0]
    terms = []
    for term in [t.strip() for t in text.split(",") if t.strip()]:
        if " in " in term or " notin " in term or "(" in term:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term}: set-based terms not served here")
        if "!=" in term:
            key, _, value = term.partition("!=")
            terms.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif "=" in term:
            key, _, value = term.replace("==", "=").partition("=")
            if not LABEL_VALUE.fullmatch(value):
                raise ApiError(400, "BadRequest", f"unable to parse requirement: invalid label value: \"{value}\"")
            terms.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif term.startswith("!"):
            terms.append(lambda labels, k=term[1:]: k not in labels)
        else:
            terms.append(lambda labels, k=term: k in labels)
    return lambda obj: all(term((obj.get("metadata") or {}).get("labels") or {}) for term in terms)


def claim_node_label_value(node):
    """include/vfio_gpu_agent/kube/claim_routing.h ClaimNodeLabelValue, as the claim router labels a claim."""
    if node and len(node) <= 63 and LABEL_VALUE.fullmatch(node):
        return node
    return "h-" + hashlib.sha256(node.encode()).hexdigest()[:40]


def device_key(entry):
    return (entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID"))


def check_claim_status(claim):
    """ValidateResourceClaimStatusUpdate's checks of status.devices (1.36): each entry names an allocated result
    (driver, pool, device, shareID), once; at most 8 conditions, each valid as metav1 conditions are."""
    name = claim["metadata"]["name"]
    status = claim.get("status") or {}
    allocated = {device_key(r) for r in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []}
    seen = set()
    for i, entry in enumerate(status.get("devices") or []):
        where = f"status.devices[{i}]"
        key = device_key(entry)
        for field in ("driver", "pool", "device"):
            if not isinstance(entry.get(field), str) or not entry[field]:
                raise invalid_claim(name, f"{where}.{field}: Required value")
        if key in seen:
            raise invalid_claim(name, f"{where}: Duplicate value: {'/'.join(key[:3])}")
        seen.add(key)
        if key not in allocated:
            raise invalid_claim(name, f"{where}: Invalid value: \"{'/'.join(key[:3])}\": must be an allocated device "
                                      "in the claim")
        conditions = entry.get("conditions") or []
        if len(conditions) > DEVICE_STATUS_MAX_CONDITIONS:
            raise invalid_claim(name, f"{where}.conditions: Too many: {len(conditions)}: must have at most "
                                      f"{DEVICE_STATUS_MAX_CONDITIONS} items")
        types = set()
        for j, condition in enumerate(conditions):
            at = f"{where}.conditions[{j}]"
            error = qualified_name_error(condition.get("type"))
            if error:
                raise invalid_claim(name, f"{at}.type: Invalid value: {condition.get('type')!r}: {error}")
            if condition["type"] in types:
                raise invalid_claim(name, f"{at}.type: Duplicate value: {condition['type']!r}")
            types.add(condition["type"])
            if condition.get("status") not in ("True", "False", "Unknown"):
                raise invalid_claim(name, f"{at}.status: Unsupported value: {condition.get('status')!r}")
            if not isinstance(condition.get("lastTransitionTime"), str) or \
                    not TIME.match(condition["lastTransitionTime"]):
                raise invalid_claim(name, f"{at}.lastTransitionTime: Required value: must be set")
            reason = condition.get("reason")
            if not isinstance(reason, str) or not CONDITION_REASON.match(reason) or len(reason) > 1024:
                raise invalid_claim(name, f"{at}.reason: Invalid value: {reason!r}: a condition reason must start "
                                          "with alphabetic character, optionally followed by a string of alphanumeric "
                                          "characters or '_,:', and must end with an alphanumeric character or '_'")
            if len(condition.get("message") or "") > 32768:
                raise invalid_claim(name, f"{at}.message: Too long: may not be more than 32768 bytes")
            if not isinstance(condition.get("observedGeneration", 0), int) or condition.get("observedGeneration", 0) < 0:
                raise invalid_claim(name, f"{at}.observedGeneration: Invalid value: must be greater than or equal to 0")


def invalid_claim(name, message):
    field, _, what = message.partition(": ")
    reason = next((r for prefix, r in CAUSE_REASONS if what.startswith(prefix)), "FieldValueInvalid")
    return ApiError(422, "Invalid", f'ResourceClaim.resource.k8s.io "{name}" is invalid: {message}',
                    details={"name": name, "group": "resource.k8s.io", "kind": "ResourceClaim",
                             "causes": [{"reason": reason, "message": what, "field": field}]})


def validate_lease(lease, name):
    """pkg/apis/coordination/validation ValidateLeaseSpec: a positive leaseDurationSeconds, a non-negative
    leaseTransitions; the times are metav1.MicroTime (RFC 3339 with microseconds) or the decode fails (400)."""
    spec = lease.get("spec") or {}
    for field in ("acquireTime", "renewTime"):
        if field in spec and spec[field] is not None and \
                (not isinstance(spec[field], str) or not MICRO_TIME.match(spec[field])):
            raise ApiError(400, "BadRequest", f"Lease in version \"v1\" cannot be handled as a Lease: spec.{field}: "
                                              f"parsing time {spec[field]!r}: not RFC 3339 with microseconds")
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and (not isinstance(duration, int) or duration <= 0):
        raise ApiError(422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid: spec.leaseDurationSeconds: '
                                       f"Invalid value: {duration}: must be greater than 0")
    transitions = spec.get("leaseTransitions")
    if transitions is not None and (not isinstance(transitions, int) or transitions < 0):
        raise ApiError(422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid: spec.leaseTransitions: '
                                       f"Invalid value: {transitions}: must be greater than or equal to 0")


def field_selector(path):
    """{field: value} of a list request's fieldSelector (only `=`/`==` terms, as the agent sends)."""
    query = path.split("?", 1)[1] if "?" in path else ""
    terms = {}
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if key != "fieldSelector":
            continue
        for term in urllib.parse.unquote(value).split(","):
            field, _, wanted = term.replace("==", "=").partition("=")
            terms[field] = wanted
    return terms


class NodeWatch:
    """A watch request on nodes: the node (metadata.name field selector), from which resourceVersion, how long."""
    def __init__(self, name, query):
        self.name = name
        self.rv = int(query.get("resourceVersion", ["0"])[0] or 0)
        self.timeout = int(query.get("timeoutSeconds", ["1800"])[0])


def seen_through(selected, rv, kind, obj, old=None):
    """An event as a watch with this selector delivers it (the watch cache's rule): an object that starts matching is
    ADDED, one that stops matching is DELETED (its previous state at the new resourceVersion), one that never
    matched is not sent."""
    now = selected(obj)
    before = old is not None and selected(old)
    if kind == "DELETED":
        return (rv, kind, obj) if now or before else None
    if now and not before and old is not None:
        return (rv, "ADDED", obj)
    if before and not now:
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = str(rv)
        return (rv, "DELETED", gone)
    return (rv, kind, obj) if now else None


class WatchStream:
    """What a watch request asked for: its selector, resourceVersion, timeoutSeconds and allowWatchBookmarks, of
    which collection (`resource`: "slices" or "claims", the State's dict and its event list)."""
    def __init__(self, selected, query, resource="slices", kind="ResourceSlice"):
        self.selected = selected
        self.resource, self.kind = resource, kind
        self.resource_version = query.get("resourceVersion", [""])[0]
        # kube-apiserver's default is a random 30 to 60 minutes (--min-request-timeout 1800).
        self.timeout = float(query.get("timeoutSeconds", ["1800"])[0])
        self.bookmarks = query.get("allowWatchBookmarks", [""])[0] in ("true", "1")


def make_handler(state):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            self.handle_api("GET")

        def do_PATCH(self):
            self.handle_api("PATCH")

        def do_POST(self):
            self.handle_api("POST")

        def do_PUT(self):
            self.handle_api("PUT")

        def do_DELETE(self):
            self.handle_api("DELETE")

        def handle_api(self, method):
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            entry = {"method": method, "path": path, "content_type": content_type}
            try:
                entry["body"] = json.loads(raw) if raw else None
            except ValueError:
                entry["body"] = raw.decode(errors="replace")
            with state.lock:
                fault = state.take_fault(method, path)
                if fault is None:
                    try:
                        code, body = self.serve(method, path, content_type, raw)
                        headers = {}
                    except ApiError as error:
                        code, body, headers = self.status_object(error)
                elif fault["kind"] == "fail":
                    code, body, headers = self.status_object(
                        ApiError(fault["code"], "Injected", f"injected {fault['code']}", fault.get("retry_after")))
                elif fault["kind"] == "deny-policy":
                    code, body, headers = self.status_object(ApiError(
                        fault["code"], "Forbidden" if fault["code"] == 403 else "Invalid",
                        f"{path.rsplit('/', 1)[-1]} is forbidden: ValidatingAdmissionPolicy 'vfio-gpu-agent-own-node' "
                        "with binding 'vfio-gpu-agent-own-node' denied request: the agent may write only its own node"))
                entry["status"] = code if fault is None or fault["kind"] in ("fail", "deny-policy") else fault["kind"]
                if fault is None and isinstance(body, WatchStream):
                    entry["watch"] = True
                state.write_log(entry)
                state.changed.notify_all()  # a node watch sees the change this request made
            if fault is not None and fault["kind"] == "cut":
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n{\"kind\"")
                self.wfile.flush()
                self.cut()
                return
            if fault is not None and fault["kind"] == "hang":
                state.released.wait(60)
                self.cut()
                return
            if fault is None and isinstance(body, WatchStream):
                self.stream_watch(body)
                return
            if fault is None and isinstance(body, NodeWatch):
                self.stream_node_watch(body)
                return
            payload = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        def stream_node_watch(self, watch):
            """The events of one node from watch.rv on, one JSON line per chunk, until timeoutSeconds, `compact` or
            the client going away."""
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            deadline = time.monotonic() + watch.timeout

            def send(event):
                data = (json.dumps(event) + "\n").encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            try:
                with state.lock:
                    epoch = state.watch_epoch
                    seen = state.nodes.get(watch.name)
                    known = seen is not None and int(seen["metadata"]["resourceVersion"]) <= watch.rv
                    sent_rv = watch.rv
                    too_old = watch.rv < state.compacted_rv
                while True:
                    events, done = [], too_old
                    with state.lock:
                        if too_old or state.watch_epoch != epoch:
                            events.append({"type": "ERROR", "object": {
                                "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired",
                                "code": 410, "message": f"too old resource version: {watch.rv} ({state.compacted_rv})"}})
                            done = True
                        else:
                            node = state.nodes.get(watch.name)
                            if node is not None and int(node["metadata"]["resourceVersion"]) > sent_rv:
                                events.append({"type": "MODIFIED" if known else "ADDED", "object": copy.deepcopy(node)})
                                sent_rv, known = int(node["metadata"]["resourceVersion"]), True
                            elif node is None and known:
                                events.append({"type": "DELETED", "object": copy.deepcopy(seen)})
                                known = False
                            seen = node if node is not None else seen
                            remaining = deadline - time.monotonic()
                            if not events:
                                if remaining <= 0:
                                    break
                                state.changed.wait(min(remaining, 1.0))
                                continue
                    for event in events:
                        send(event)
                    if done:
                        break
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError, OSError):
                self.close_connection = True

        def cut(self):
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        @staticmethod
        def status_object(error):
            headers = {}
            if error.retry_after is not None:
                headers["Retry-After"] = str(error.retry_after)
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": error.message,
                      "reason": error.reason, "code": error.code}
            if error.details is not None:
                status["details"] = error.details
            return error.code, status, headers

        def serve(self, method, path, content_type, raw):
            auth = self.headers.get("Authorization") or ""
            token_ok = auth.startswith("Bearer ") and auth[len("Bearer "):] in state.tokens
            # x509 client authentication: a certificate the --client-ca verified (and no bearer token at all).
            cert_ok = not auth and hasattr(self.connection, "getpeercert") and bool(self.connection.getpeercert())
            if not token_ok and not cert_ok:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            body = None
            if raw:
                try:
                    body = json.loads(raw)
                except ValueError as error:
                    raise ApiError(400, "BadRequest", f"invalid JSON: {error}")
            parts = [p for p in path.split("/") if p]
            if parts == ["api", "v1", "nodes"] and method == "GET":
                name = field_selector(self.path).get("metadata.name")
                query = urllib.parse.parse_qs(self.path.split("?", 1)[1] if "?" in self.path else "")
                if query.get("watch", ["false"])[0] in ("1", "true"):
                    return 200, NodeWatch(name, query)
                items = [node for node_name, node in sorted(state.nodes.items()) if name in (None, node_name)]
                return 200, {"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": str(state.rv)},
                             "items": items}
            if parts[:3] == ["api", "v1", "nodes"] and len(parts) in (4, 5):
                return self.node(method, parts[3], len(parts) == 5 and parts[4] == "status", content_type, body)
            if parts[:3] == ["apis", "events.k8s.io", "v1"] and len(parts) in (6, 7) and parts[3] == "namespaces" \
                    and parts[5] == "events":
                return self.event(method, parts[4], parts[6] if len(parts) == 7 else None, content_type, body)
            if parts == ["apis", "kubevirt.io", "v1", "kubevirts"] and method == "GET":
                self.authorize("list", "kubevirts", "kubevirt.io")
                if not state.kubevirt_installed:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                return 200, {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirtList", "metadata": {"resourceVersion": str(state.rv)},
                             "items": state.kubevirts}
            routed = self.claim_router_objects(method, parts, content_type, body)
            if routed is not None:
                return routed
            if parts[:4] == ["apis", "resource.k8s.io", "v1", "namespaces"] and len(parts) == 7 \
                    and parts[5] == "resourceclaims" and method == "GET":
                self.authorize("get", "resourceclaims", "resource.k8s.io", parts[6])
                return 200, self.stored_claim(parts[4], parts[6])
            if parts[:4] == ["apis", "resource.k8s.io", "v1", "namespaces"] and len(parts) == 8 \
                    and parts[5] == "resourceclaims" and parts[7] == "status":
                return self.claim_status(method, parts[4], parts[6], content_type, body)
            if parts[:3] == ["apis", "admissionregistration.k8s.io", "v1"] and len(parts) == 5 \
                    and parts[3] in state.admission and method == "GET":
                self.authorize("get", parts[3], "admissionregistration.k8s.io", parts[4])
                if not state.admission_served:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                obj = state.admission[parts[3]].get(parts[4])
                if obj is None:
                    raise ApiError(404, "NotFound", f'{parts[3]}.admissionregistration.k8s.io "{parts[4]}" not found',
                                   details={"name": parts[4], "group": "admissionregistration.k8s.io", "kind": parts[3]})
                return 200, obj
            if parts == ["apis", "resource.k8s.io", "v1", "deviceclasses"] and method == "GET":
                self.authorize("list", "deviceclasses", "resource.k8s.io")
                return 200, {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClassList",
                             "metadata": {"resourceVersion": str(state.rv)}, "items": state.device_classes}
            if parts[:4] == ["apis", "resource.k8s.io", "v1", "resourceslices"] and len(parts) in (4, 5):
                return self.resource_slice(method, parts[4] if len(parts) == 5 else None, content_type, body)
            raise ApiError(404, "NotFound", "the server could not find the requested resource")

        @staticmethod
        def stored_claim(namespace, name):
            claim = state.claims.get((namespace, name))
            if claim is None:
                raise ApiError(404, "NotFound", f'resourceclaims.resource.k8s.io "{name}" not found',
                               details={"name": name, "group": "resource.k8s.io", "kind": "resourceclaims"})
            return claim

        def claim_status(self, method, namespace, name, content_type, body):
            """The status subresource: GET, and PATCH by server-side apply (application/apply-patch+yaml, JSON
            being YAML; fieldManager required; a manager's status.devices entries are the ones it applied last,
            keyed by driver/pool/device/shareID as the listType=map says) or by merge patch (the whole list
            replaced). Only status changes; the result is validated as ValidateResourceClaimStatusUpdate does."""
            verb = {"GET": "get", "PATCH": "patch"}.get(method)
            if verb is None:
                raise ApiError(405, "MethodNotAllowed", f"{method} not allowed here")
            self.authorize(verb, "resourceclaims/status", "resource.k8s.io", name)
            claim = self.stored_claim(namespace, name)
            if verb == "get":
                return 200, claim
            query = urllib.parse.parse_qs(self.path.split("?", 1)[1] if "?" in self.path else "")
            if content_type not in PATCH_TYPES + (APPLY_PATCH,):
                raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: "
                                                            f"{content_type}")
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "patch must be a JSON object")
            meta = body.get("metadata") or {}
            if meta.get("uid") and meta["uid"] != claim["metadata"]["uid"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on resourceclaims.resource.k8s.io '
                                                f'"{name}": Precondition failed: UID in precondition: {meta["uid"]}, '
                                                f'UID in object meta: {claim["metadata"]["uid"]}')
            updated = copy.deepcopy(claim)
            status = updated.setdefault("status", {})
            if content_type == APPLY_PATCH:
                manager = query.get("fieldManager", [""])[0]
                if not manager:
                    raise ApiError(400, "BadRequest", "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: "
                                                      "Required value: is required for apply patch")
                if body.get("apiVersion") != "resource.k8s.io/v1" or body.get("kind") != "ResourceClaim" or \
                        meta.get("name") != name:
                    raise ApiError(400, "BadRequest", "apply: apiVersion, kind and metadata.name must name the claim")
                owned = state.claim_managers.setdefault((namespace, name), {})
                applied = list((body.get("status") or {}).get("devices") or [])
                mine = {device_key(entry) for entry in applied}
                entries = [e for e in status.get("devices") or []
                           if device_key(e) not in owned.get(manager, set()) or device_key(e) in mine]
                for entry in applied:
                    for index, existing in enumerate(entries):
                        if device_key(existing) == device_key(entry):
                            entries[index] = copy.deepcopy(entry)
                            break
                    else:
                        entries.append(copy.deepcopy(entry))
                if entries:
                    status["devices"] = entries
                else:
                    status.pop("devices", None)
                owned[manager] = mine
            else:
                updated = merge_patch(updated, {"status": body.get("status") or {}})
            check_claim_status(updated)
            if updated != claim:
                state.store_claim(updated)
            return 200, state.claims[(namespace, name)]

        # --- The claim router's objects: claims listed, watched and labeled cluster-wide, and Leases. ---

        def claim_router_objects(self, method, parts, content_type, body):
            """Serves what the claim router and the label-selected claim watches use; None for other paths."""
            query = urllib.parse.parse_qs(self.path.split("?", 1)[1] if "?" in self.path else "")
            if parts == ["apis", "resource.k8s.io", "v1", "resourceclaims"] and method == "GET":
                return self.claim_collection(None, query)
            if parts[:4] == ["apis", "resource.k8s.io", "v1", "namespaces"] and len(parts) == 6 \
                    and parts[5] == "resourceclaims" and method == "GET":
                return self.claim_collection(parts[4], query)
            if parts[:4] == ["apis", "resource.k8s.io", "v1", "namespaces"] and len(parts) == 7 \
                    and parts[5] == "resourceclaims" and method == "PATCH":
                return self.claim_labels(parts[4], parts[6], content_type, body)
            if parts[:4] == ["apis", "coordination.k8s.io", "v1", "namespaces"] and len(parts) in (6, 7) \
                    and parts[5] == "leases":
                return self.lease(method, parts[4], parts[6] if len(parts) == 7 else None, content_type, body)
            return None

        def claim_collection(self, namespace, query):
            watching = query.get("watch", [""])[0] in ("true", "1")
            self.authorize("watch" if watching else "list", "resourceclaims", "resource.k8s.io")
            if field_selector(self.path):
                raise ApiError(400, "BadRequest", "field label not supported: ResourceClaims have no field selectors "
                                                  "but metadata.name and metadata.namespace")
            matches = label_selector(self.path)

            def selected(obj):
                return obj is not None and (namespace is None or obj["metadata"]["namespace"] == namespace) and \
                    matches(obj)
            if watching:
                return 200, WatchStream(selected, query, "claims", "ResourceClaim")
            items = [obj for _, obj in sorted(state.claims.items()) if selected(obj)]
            return 200, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimList",
                         "metadata": {"resourceVersion": str(state.rv)}, "items": items}

        def claim_labels(self, namespace, name, content_type, body):
            """PATCH of the claim object (not its status): the claim router writes metadata.labels, merge patch."""
            self.authorize("patch", "resourceclaims", "resource.k8s.io", name)
            claim = self.stored_claim(namespace, name)
            if content_type not in PATCH_TYPES:
                raise ApiError(415, "UnsupportedMediaType",
                               f"the body of the request was in an unknown format: {content_type}")
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "patch must be a JSON object")
            if set(body) - {"metadata"} or set(body.get("metadata") or {}) - {"labels", "uid", "resourceVersion"}:
                # The router writes labels only; anything else through this path would be a status or spec
                # change this simulator does not model.
                raise ApiError(422, "Invalid", f'ResourceClaim.resource.k8s.io "{name}" is invalid: only '
                                               "metadata.labels may be patched here (status: the status subresource)")
            meta = body.get("metadata") or {}
            if "uid" in meta and meta["uid"] != claim["metadata"]["uid"]:
                raise ApiError(422, "Invalid", f'ResourceClaim.resource.k8s.io "{name}" is invalid: metadata.uid: '
                                               f'Invalid value: "{meta["uid"]}": field is immutable')
            if "resourceVersion" in meta and meta["resourceVersion"] != claim["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on resourceclaims.resource.k8s.io '
                                                f'"{name}": the object has been modified; please apply your changes '
                                                "to the latest version and try again")
            for key, value in (meta.get("labels") or {}).items():
                if not QUALIFIED_NAME.match(key) or len(key.rpartition("/")[2]) > 63:
                    raise ApiError(422, "Invalid", f'ResourceClaim.resource.k8s.io "{name}" is invalid: '
                                                   f'metadata.labels: Invalid value: "{key}": not a qualified name')
                if value is not None and (not isinstance(value, str) or not LABEL_VALUE.fullmatch(value)):
                    raise ApiError(422, "Invalid", f'ResourceClaim.resource.k8s.io "{name}" is invalid: '
                                                   f'metadata.labels: Invalid value: "{value}": a valid label must be '
                                                   "an empty string or consist of alphanumeric characters, '-', '_' "
                                                   "or '.', and must start and end with an alphanumeric character "
                                                   "(at most 63)")
            updated = merge_patch(claim, {"metadata": {"labels": meta.get("labels") or {}}})
            if updated == claim:
                return 200, claim  # a no-op patch writes nothing: no new resourceVersion, no event
            updated["metadata"]["resourceVersion"] = state.next_rv()
            state.claims[(namespace, name)] = updated
            state.claim_event("MODIFIED", updated, claim)
            return 200, updated

        def lease(self, method, namespace, name, content_type, body):
            """coordination.k8s.io/v1 Leases: get, create, update (with the resourceVersion it read: 409 when it
            moved on, as kube-apiserver's optimistic concurrency), delete."""
            verb = {"GET": "get", "POST": "create", "PUT": "update", "DELETE": "delete"}.get(method)
            if verb is None or (name is None) != (verb == "create"):
                raise ApiError(405, "MethodNotAllowed", f"{method} not allowed here")
            self.authorize(verb, "leases", "coordination.k8s.io", name)
            if verb == "get":
                lease = state.leases.get((namespace, name))
                if lease is None:
                    raise ApiError(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found',
                                   details={"name": name, "group": "coordination.k8s.io", "kind": "leases"})
                return 200, lease
            if verb == "delete":
                if state.leases.pop((namespace, name), None) is None:
                    raise ApiError(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
                return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
            if content_type != "application/json":
                raise ApiError(415, "UnsupportedMediaType", f"unsupported content type {content_type}")
            if not isinstance(body, dict) or body.get("apiVersion") != "coordination.k8s.io/v1" or \
                    body.get("kind") != "Lease":
                raise ApiError(400, "BadRequest", "expected apiVersion coordination.k8s.io/v1, kind Lease")
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            lease_name = meta.get("name") or name
            if meta.get("namespace", namespace) != namespace:
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                                                  "sent on the request")
            validate_lease(obj, lease_name)
            key = (namespace, lease_name)
            if verb == "create":
                if key in state.leases:
                    raise ApiError(409, "AlreadyExists", f'leases.coordination.k8s.io "{lease_name}" already exists')
                meta.update({"name": lease_name, "namespace": namespace, "uid": str(uuid.uuid4()),
                             "resourceVersion": state.next_rv(), "creationTimestamp": now_rfc3339()})
                state.leases[key] = obj
                return 201, obj
            existing = state.leases.get(key)
            if existing is None:
                raise ApiError(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
            if lease_name != name:
                raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
            if meta.get("resourceVersion") != existing["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": '
                                                "the object has been modified; please apply your changes to the latest "
                                                "version and try again")
            meta.update({"namespace": namespace, "uid": existing["metadata"]["uid"],
                         "creationTimestamp": existing["metadata"]["creationTimestamp"]})
            if obj.get("spec") != existing.get("spec") or meta.get("labels") != existing["metadata"].get("labels"):
                meta["resourceVersion"] = state.next_rv()
            state.leases[key] = obj
            return 200, obj

        def resource_slice(self, method, name, content_type, body):
            verb = {"GET": "get" if name else "list", "POST": "create", "PUT": "update", "DELETE": "delete"}.get(method)
            if verb is None or (name is None) != (verb in ("create", "list")):
                raise ApiError(405, "MethodNotAllowed", f"{method} not allowed here")
            query = urllib.parse.parse_qs(self.path.split("?", 1)[1] if "?" in self.path else "")
            if verb == "list" and query.get("watch", [""])[0] in ("true", "1"):
                verb = "watch"
            self.authorize(verb, "resourceslices", "resource.k8s.io", name)
            if verb in ("list", "watch"):
                wanted = field_selector(self.path)
                unknown = set(wanted) - {"spec.nodeName", "spec.driver", "metadata.name"}
                if unknown:
                    raise ApiError(400, "BadRequest", f'field label not supported: {sorted(unknown)[0]}')
                def selected(obj):
                    values = {"spec.nodeName": obj["spec"].get("nodeName", ""), "spec.driver": obj["spec"]["driver"],
                              "metadata.name": obj["metadata"]["name"]}
                    return all(values[field] == value for field, value in wanted.items())
                if verb == "watch":
                    return 200, WatchStream(selected, query)
                items = [obj for _, obj in sorted(state.slices.items()) if selected(obj)]
                return 200, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                             "metadata": {"resourceVersion": str(state.rv)}, "items": items}
            if verb == "get":
                if name not in state.slices:
                    raise ApiError(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found')
                return 200, state.slices[name]
            if verb == "delete":
                existing = state.slices.get(name)
                if existing is None:
                    raise ApiError(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found')
                preconditions = (body or {}).get("preconditions") or {}
                for field in ("uid", "resourceVersion"):
                    if field in preconditions and preconditions[field] != existing["metadata"][field]:
                        raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on resourceslices.resource.k8s.io '
                                                        f'"{name}": the precondition on {field} failed')
                state.delete_slice(name)
                return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
            if content_type != "application/json":
                raise ApiError(415, "UnsupportedMediaType", f"unsupported content type {content_type}")
            if not isinstance(body, dict) or body.get("apiVersion") != "resource.k8s.io/v1" or \
                    body.get("kind") != "ResourceSlice" or not isinstance(body.get("spec"), dict):
                raise ApiError(400, "BadRequest", "expected apiVersion resource.k8s.io/v1, kind ResourceSlice")
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            if verb == "create":
                # As kube-apiserver: the name is generated, then the strategy drops disabled fields, then the
                # object is validated (so a 422 names the generated name).
                if not meta.get("name"):
                    if not meta.get("generateName"):
                        raise invalid_slice("metadata.name: Required value: name or generateName is required")
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                drop_disabled_fields(state, obj, None)
                validate_slice(obj, meta["name"])
                self.stamp_taints(obj, None)
                if meta["name"] in state.slices:
                    raise ApiError(409, "AlreadyExists", f'resourceslices.resource.k8s.io "{meta["name"]}" already exists')
                meta.update({"uid": str(uuid.uuid4()), "resourceVersion": state.next_rv(),
                             "creationTimestamp": now_rfc3339()})
                state.slices[meta["name"]] = obj
                state.slice_event("ADDED", obj)
                return 201, obj
            existing = state.slices.get(name)
            if existing is None:
                raise ApiError(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found')
            if meta.get("name") != name:
                raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
            if meta.get("resourceVersion") != existing["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on resourceslices.resource.k8s.io "{name}": '
                                                "the object has been modified; please apply your changes to the latest "
                                                "version and try again")
            drop_disabled_fields(state, obj, existing)
            validate_slice(obj, name)
            if obj["spec"].get("nodeName") != existing["spec"].get("nodeName") or \
                    obj["spec"]["driver"] != existing["spec"]["driver"]:
                raise invalid_slice("spec.nodeName: Invalid value: field is immutable")
            self.stamp_taints(obj, existing)
            meta.update({"uid": existing["metadata"]["uid"], "resourceVersion": state.next_rv(),
                         "creationTimestamp": existing["metadata"]["creationTimestamp"]})
            state.slices[name] = obj
            state.slice_event("MODIFIED", obj)
            return 200, obj

        @staticmethod
        def stamp_taints(obj, old):
            # The server sets timeAdded of a taint that has none (kept from the stored taint when it is the same).
            before = {}
            for device in ((old or {}).get("spec") or {}).get("devices") or []:
                for taint in device.get("taints") or []:
                    before[(device.get("name"), taint.get("key"), taint.get("value"), taint.get("effect"))] = \
                        taint.get("timeAdded")
            for device in obj["spec"].get("devices") or []:
                for taint in device.get("taints") or []:
                    if "timeAdded" not in taint:
                        key = (device.get("name"), taint.get("key"), taint.get("value"), taint.get("effect"))
                        taint["timeAdded"] = before.get(key) or now_rfc3339()

        def stream_watch(self, watch):
            """Serves a watch: chunked JSON lines, one event each, until timeoutSeconds, a close-watches or the
            client goes away. A resourceVersion older than the kept history is an ERROR event with a 410 Status."""
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.close_connection = True
            def send(event):
                data = (json.dumps(event) + "\n").encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            deadline = time.monotonic() + watch.timeout
            try:
                with state.lock:
                    generation = state.watch_generation
                    rv_text = watch.resource_version
                    stored = state.slices if watch.resource == "slices" else state.claims
                    history = state.slice_events if watch.resource == "slices" else state.claim_events
                    if rv_text in ("", "0"):
                        pending = [{"type": "ADDED", "object": obj} for _, obj in sorted(stored.items())
                                   if watch.selected(obj)]
                        last = state.rv
                    elif not rv_text.isdigit():
                        pending = [{"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "message": f"invalid resource version: {rv_text}", "reason": "BadRequest", "code": 400}}]
                        last = None
                    elif int(rv_text) < state.oldest_rv:
                        pending = [{"type": "ERROR", "object": {
                            "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
                            "message": f"too old resource version: {rv_text} ({state.oldest_rv})"}}]
                        last = None
                    else:
                        last = int(rv_text)
                        pending = []
                for event in pending:
                    send(event)
                next_bookmark = time.monotonic() + state.bookmark_interval
                while last is not None:
                    with state.lock:
                        while True:
                            events = [event for event in (seen_through(watch.selected, *e) for e in history
                                                          if e[0] > last) if event is not None]
                            now = time.monotonic()
                            if events or state.watch_generation != generation or now >= deadline or \
                                    (watch.bookmarks and now >= next_bookmark):
                                break
                            state.changed.wait(min(deadline, next_bookmark if watch.bookmarks else deadline) - now)
                        if state.watch_generation != generation or (not events and now >= deadline):
                            break
                        if not events:
                            last = max(last, state.rv)
                            bookmark = {"type": "BOOKMARK", "object": {"kind": watch.kind,
                                        "apiVersion": "resource.k8s.io/v1", "metadata": {"resourceVersion": str(last)}}}
                    if events:
                        for rv, kind, obj in events:
                            send({"type": kind, "object": obj})
                            last = rv
                    else:
                        send(bookmark)
                        next_bookmark = time.monotonic() + state.bookmark_interval
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass

        @staticmethod
        def authorize(verb, resource, group, name=None):
            if (verb, f"{resource}.{group}") in state.denied:
                what = f'{resource}.{group} "{name}"' if name else f"{resource}.{group}"
                raise ApiError(403, "Forbidden",
                               f'{what} is forbidden: User "{SERVICE_ACCOUNT_USER}" cannot {verb} resource '
                               f'"{resource}" in API group "{group}" at the cluster scope')

        def node(self, method, name, status, content_type, body):
            node = state.nodes.get(name)
            if node is None:
                raise ApiError(404, "NotFound", f'nodes "{name}" not found')
            if method == "GET":
                return 200, node
            if method != "PATCH":
                raise ApiError(405, "MethodNotAllowed", f"{method} not allowed here")
            if content_type not in PATCH_TYPES:
                raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}")
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "patch must be a JSON object")
            if not status:
                return self.node_labels(name, node, body)
            wanted_rv = (body.get("metadata") or {}).get("resourceVersion")
            if wanted_rv is not None and wanted_rv != node["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": the object has been '
                                                f"modified; please apply your changes to the latest version and try again")
            # The status subresource ignores everything but status.
            patch = {"status": body.get("status", {})}
            if content_type == PATCH_TYPES[1]:
                updated = strategic_merge(node, patch, {"conditions": "type"})
            else:
                updated = merge_patch(node, patch)
            validate_conditions(updated)
            updated["metadata"]["resourceVersion"] = state.next_rv()
            state.nodes[name] = updated
            return 200, updated

        @staticmethod
        def node_labels(name, node, body):
            # The agent patches only metadata.labels of the node itself (nvidia.com/vgpu.config.state); a label is
            # validated as kube-apiserver validates it, and null deletes it (merge patch).
            if set(body) != {"metadata"} or set(body["metadata"] or {}) != {"labels"} or \
                    not isinstance(body["metadata"]["labels"], dict):
                raise ApiError(422, "Invalid", f'Node "{name}" is invalid: only metadata.labels may be patched here')
            for key, value in body["metadata"]["labels"].items():
                if value is not None and (not isinstance(value, str) or not LABEL_VALUE.fullmatch(value)):
                    raise ApiError(422, "Invalid", f'Node "{name}" is invalid: metadata.labels: Invalid value: '
                                                   f'"{value}": a valid label must be an empty string or consist of '
                                                   "alphanumeric characters, '-', '_' or '.', and must start and end "
                                                   "with an alphanumeric character (at most 63)")
            updated = merge_patch(node, {"metadata": {"labels": body["metadata"]["labels"]}})
            updated["metadata"]["resourceVersion"] = state.next_rv()
            state.nodes[name] = updated
            return 200, updated

        def event(self, method, namespace, name, content_type, body):
            if method == "POST" and name is None:
                if content_type != "application/json":
                    raise ApiError(415, "UnsupportedMediaType", f"unsupported content type {content_type}")
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "body must be an Event")
                if body.get("apiVersion") != "events.k8s.io/v1" or body.get("kind") != "Event":
                    raise ApiError(400, "BadRequest", "expected apiVersion events.k8s.io/v1, kind Event")
                validate_event(body, namespace)
                key = (namespace, body["metadata"]["name"])
                if key in state.events:
                    raise ApiError(409, "AlreadyExists", f'events.events.k8s.io "{key[1]}" already exists')
                event = copy.deepcopy(body)
                event["metadata"].update({"namespace": namespace, "uid": str(uuid.uuid4()),
                                          "resourceVersion": state.next_rv()})
                state.events[key] = event
                return 201, event
            if method == "PATCH" and name is not None:
                if content_type not in PATCH_TYPES:
                    raise ApiError(415, "UnsupportedMediaType", f"unsupported content type {content_type}")
                event = state.events.get((namespace, name))
                if event is None:
                    raise ApiError(404, "NotFound", f'events.events.k8s.io "{name}" not found')
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "patch must be a JSON object")
                wanted_rv = (body.get("metadata") or {}).get("resourceVersion")
                if wanted_rv is not None and wanted_rv != event["metadata"]["resourceVersion"]:
                    raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on events "{name}"')
                updated = merge_patch(event, body)
                validate_event(updated, namespace)
                for field in ("eventTime", "reportingController", "reportingInstance", "action", "reason", "note",
                              "type", "regarding"):
                    if updated.get(field) != event.get(field):
                        raise ApiError(422, "Invalid", f"Event is invalid: {field}: Invalid value: field is immutable")
                updated["metadata"]["resourceVersion"] = state.next_rv()
                state.events[(namespace, name)] = updated
                return 200, updated
            if method == "GET" and name is not None:
                event = state.events.get((namespace, name))
                if event is None:
                    raise ApiError(404, "NotFound", f'events.events.k8s.io "{name}" not found')
                return 200, event
            raise ApiError(405, "MethodNotAllowed", f"{method} not allowed here")

    return Handler


def set_feature_gates(state, spec):
    """kube-apiserver's --feature-gates syntax: Gate=true|false[,Gate=...]; only the gates the strategy reads."""
    for term in spec.split(","):
        gate, _, value = term.partition("=")
        if gate not in state.feature_gates or value not in ("true", "false"):
            raise ValueError(f"unknown feature gate or value: {term}")
        state.feature_gates[gate] = value == "true"


def control(state, line):
    words = line.split()
    if not words:
        return "ERR empty command"
    command, args = words[0], words[1:]
    with state.lock:
        if command == "token" and len(args) == 1:
            state.tokens = {args[0]}
        elif command == "node" and len(args) >= 1:
            labels = json.loads(line.split(None, 2)[2]) if len(args) > 1 else {}
            state.add_node(args[0], labels)
        elif command == "delete-node" and len(args) == 1:
            state.nodes.pop(args[0], None)
        elif command == "relabel" and len(args) >= 2 and args[0] in state.nodes:
            state.nodes[args[0]]["metadata"]["labels"] = json.loads(line.split(None, 2)[2])
            state.nodes[args[0]]["metadata"]["resourceVersion"] = state.next_rv()
        elif command == "touch-node" and len(args) == 1 and args[0] in state.nodes:
            state.nodes[args[0]]["metadata"]["resourceVersion"] = state.next_rv()
        elif command == "get-node" and len(args) == 1 and args[0] in state.nodes:
            return "OK " + json.dumps(state.nodes[args[0]])
        elif command == "events":
            return "OK " + json.dumps(list(state.events.values()))
        elif command == "fail" and len(args) in (4, 5):
            fault = {"kind": "fail", "method": args[0], "prefix": args[1], "code": int(args[2]), "count": int(args[3])}
            if len(args) == 5:
                fault["retry_after"] = int(args[4])
            state.faults.append(fault)
        elif command == "deny-policy" and len(args) == 4:
            state.faults.append({"kind": "deny-policy", "method": args[0], "prefix": args[1], "code": int(args[2]),
                                 "count": int(args[3])})
        elif command in ("cut", "hang") and len(args) == 3:
            state.released.clear()
            state.faults.append({"kind": command, "method": args[0], "prefix": args[1], "count": int(args[2])})
        elif command == "release":
            state.released.set()
        elif command == "clear-faults":
            state.faults.clear()
        elif command == "deviceclasses" and args:
            state.device_classes = json.loads(line.split(None, 1)[1])
        elif command == "kubevirts" and args:
            state.kubevirts = json.loads(line.split(None, 1)[1])
            state.kubevirt_installed = True
        elif command == "no-kubevirt":
            state.kubevirt_installed = False
        elif command == "admission" and len(args) >= 2 and args[0] in ("policy", "binding"):
            obj = json.loads(line.split(None, 2)[2])
            collection = "validatingadmissionpolicies" if args[0] == "policy" else "validatingadmissionpolicybindings"
            state.admission[collection][obj["metadata"]["name"]] = obj
        elif command == "delete-admission" and len(args) == 2 and args[0] in ("policy", "binding"):
            collection = "validatingadmissionpolicies" if args[0] == "policy" else "validatingadmissionpolicybindings"
            state.admission[collection].pop(args[1], None)
        elif command == "claim" and args:
            claim = json.loads(line.split(None, 1)[1])
            meta = claim.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", now_rfc3339())
            meta.setdefault("generation", 1)
            claim.setdefault("apiVersion", "resource.k8s.io/v1")
            claim.setdefault("kind", "ResourceClaim")
            state.store_claim(claim)
        elif command == "delete-claim" and len(args) == 2:
            state.delete_claim(args[0], args[1])
        elif command == "get-claim" and len(args) == 2 and (args[0], args[1]) in state.claims:
            return "OK " + json.dumps(state.claims[(args[0], args[1])])
        elif command == "allocate" and len(args) >= 4 and (args[0], args[1]) in state.claims:
            # What the scheduler writes in one status update (Reserve, then PreBind): the allocation, each result
            # with the bindingConditions and bindingFailureConditions of its device in the stored slices (when the
            # gates are on), the allocationTimestamp and the reservation; then the router's label (claim_routing.h).
            results = json.loads(line.split(None, 5)[5]) if len(args) > 4 else []
            reserved = json.loads(args[3])
            claim = copy.deepcopy(state.claims[(args[0], args[1])])
            gates_on = state.feature_gates["DRADeviceBindingConditions"] and \
                state.feature_gates["DRAResourceClaimDeviceStatus"]
            for result in results:
                for obj in state.slices.values():
                    if obj["spec"]["driver"] != result["driver"] or obj["spec"]["pool"]["name"] != result["pool"]:
                        continue
                    for device in obj["spec"].get("devices") or []:
                        if device["name"] == result["device"] and gates_on:
                            for field in ("bindingConditions", "bindingFailureConditions"):
                                if device.get(field):
                                    result[field] = list(device[field])
            claim.setdefault("status", {})["allocation"] = {
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [args[2]]}]}]},
                "allocationTimestamp": now_rfc3339()}
            claim["status"]["reservedFor"] = reserved
            claim["metadata"].setdefault("labels", {})[CLAIM_NODE_LABEL] = claim_node_label_value(args[2])
            state.store_claim(claim)
        elif command == "deallocate" and len(args) == 2 and (args[0], args[1]) in state.claims:
            # The scheduler giving the allocation up (a failure condition, the binding timeout, the pod deleted):
            # allocation, reservedFor and devices go in one status update; the router's label stays until it runs.
            claim = copy.deepcopy(state.claims[(args[0], args[1])])
            claim["status"] = {}
            state.claim_managers.pop((args[0], args[1]), None)
            state.store_claim(claim)
        elif command == "unlabel" and len(args) == 2 and (args[0], args[1]) in state.claims:
            claim = copy.deepcopy(state.claims[(args[0], args[1])])
            (claim["metadata"].get("labels") or {}).pop(CLAIM_NODE_LABEL, None)
            state.store_claim(claim)
        elif command == "claim-status" and len(args) >= 3 and (args[0], args[1]) in state.claims:
            # The scheduler's write through the status subresource: the status is replaced, labels and spec kept.
            claim = copy.deepcopy(state.claims[(args[0], args[1])])
            claim["status"] = json.loads(line.split(None, 3)[3])
            state.store_claim(claim)
        elif command == "get-lease" and len(args) == 2 and (args[0], args[1]) in state.leases:
            return "OK " + json.dumps(state.leases[(args[0], args[1])])
        elif command == "admission-api" and args in (["on"], ["off"]):
            state.admission_served = args[0] == "on"
        elif command == "slices":
            return "OK " + json.dumps([obj for _, obj in sorted(state.slices.items())])
        elif command == "delete-slices" and len(args) == 1:
            for name in [n for n, obj in state.slices.items() if obj["spec"].get("nodeName") == args[0]]:
                state.delete_slice(name)
        elif command == "patch-slice" and len(args) >= 2 and args[0] in state.slices:
            updated = merge_patch(state.slices[args[0]], json.loads(line.split(None, 2)[2]))
            updated["metadata"]["resourceVersion"] = state.next_rv()
            state.slices[args[0]] = updated
            state.slice_event("MODIFIED", updated)
        elif command == "feature-gates" and len(args) == 1:
            set_feature_gates(state, args[0])
        elif command == "compact":
            # The store moves on and is compacted there: a list answers the new resourceVersion, which can be
            # watched from; any earlier one is 410 Gone.
            state.oldest_rv = int(state.next_rv())
            state.slice_events.clear()
            state.claim_events.clear()
            state.compacted_rv = state.rv
            state.watch_epoch += 1
        elif command == "close-watches":
            state.watch_generation += 1
            state.changed.notify_all()
        elif command == "bookmark-interval" and len(args) == 1:
            state.bookmark_interval = float(args[0])
            state.changed.notify_all()
        elif command in ("deny", "allow") and len(args) == 2 and "." in args[1]:
            (state.denied.add if command == "deny" else state.denied.discard)((args[0], args[1]))
        else:
            return f"ERR unknown or malformed command: {line}"
        state.changed.notify_all()
    return "OK"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", action="append", default=[])
    parser.add_argument("--node", action="append", default=[])
    parser.add_argument("--log", default="")
    parser.add_argument("--feature-gates", default="",
                        help="Gate=true|false,... as kube-apiserver takes them (defaults: v1.36's); e.g. "
                             "DRADeviceTaints=false drops devices[].taints as 1.34/1.35 do")
    parser.add_argument("--tls-cert", default="")
    parser.add_argument("--tls-key", default="")
    parser.add_argument("--client-ca", default="", help="accept client certificates this CA signed (with --tls-cert)")
    args = parser.parse_args()

    state = State(args.token, args.log)
    for name in args.node:
        state.add_node(name, {})
    if args.feature_gates:
        set_feature_gates(state, args.feature_gates)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(state))
    server.daemon_threads = True
    scheme = "http"
    if args.tls_cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls_cert, args.tls_key or None)
        if args.client_ca:
            context.load_verify_locations(args.client_ca)
            context.verify_mode = ssl.CERT_OPTIONAL
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    print(f"LISTENING {scheme}://127.0.0.1:{server.server_address[1]}", flush=True)
    for line in sys.stdin:
        try:
            reply = control(state, line.strip())
        except (ValueError, KeyError) as error:
            reply = f"ERR {error}"
        print(reply, flush=True)
    state.released.set()
    server.shutdown()


if __name__ == "__main__":
    main()
