#include <cstdlib>
#include <iostream>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/cli/commands.h"
#include "vfio_gpu_agent/fabric/fm_client.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/kube/admission_policy_reader.h"
#include "vfio_gpu_agent/kube/dra_objects_reader.h"
#include "vfio_gpu_agent/kube/kubevirt_reader.h"
#include "vfio_gpu_agent/validation/validate.h"

namespace vfio_agent::cli {
namespace {

using Unavailable = validation::KubevirtCrUnavailable;

Unavailable::Reason ReasonOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound: return Unavailable::Reason::kNotInstalled;
    case absl::StatusCode::kUnauthenticated: return Unavailable::Reason::kUnauthorized;
    case absl::StatusCode::kPermissionDenied: return Unavailable::Reason::kForbidden;
    default: return Unavailable::Reason::kUnavailable;
  }
}

// Without --kubevirt-cr the KubeVirt layer reads the CR from the cluster `run` reports to (--kubeconfig, else
// in-cluster), so `kubectl exec ... validate` in the agent's pod checks every layer. No cluster: nothing changes
// (the layer says no CR was given). A --kubeconfig that cannot be loaded is a usage error, as for `run`; every
// answer of the API server becomes the layer's result, never an error of the command.
absl::Status ReadKubevirtFromCluster(const ParsedCommand& cmd, std::chrono::milliseconds timeout,
                                     validation::ValidateOptions* options) {
  kube::KubevirtReaderOptions reader_options;
  reader_options.kubeconfig = cmd.flags.Get("kubeconfig");
  auto reader = kube::ConnectKubevirtReader(reader_options);
  if (!reader.ok()) {
    if (!reader_options.kubeconfig.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--kubeconfig: ", reader.status().message()));
    }
    if (absl::IsNotFound(reader.status())) {
      spdlog::debug("validate: no cluster ({}); the KubeVirt layer needs --kubevirt-cr",
                    std::string(reader.status().message()));
      return absl::OkStatus();
    }
    options->kubevirt_cr_unavailable = Unavailable{
        .reason = Unavailable::Reason::kUnavailable,
        .request = absl::StrCat("GET ", kube::kKubevirtsPath),
        .detail = absl::StrCat("in-cluster configuration unusable: ", reader.status().message())};
    return absl::OkStatus();
  }
  absl::StatusOr<kube::KubevirtList> list = (*reader)->List(timeout);
  if (list.ok() && list->items > 0) {
    spdlog::info("validate: {} KubeVirt CR(s) from {} (credentials: {})", list->items, (*reader)->Request(),
                 (*reader)->ConfigSource());
    options->kubevirt_cr = std::move(list->json);
    return absl::OkStatus();
  }
  const std::string what = list.ok() ? "KubeVirtList with no items" : std::string(list.status().message());
  options->kubevirt_cr_unavailable = Unavailable{
      .reason = list.ok() ? Unavailable::Reason::kNoCr : ReasonOf(list.status()),
      .request = (*reader)->Request(),
      .detail = absl::StrCat(what, " (credentials: ", (*reader)->ConfigSource(), ")")};
  return absl::OkStatus();
}

validation::ApiObjectRead::Outcome OutcomeOf(const absl::Status& status) {
  using Outcome = validation::ApiObjectRead::Outcome;
  switch (status.code()) {
    case absl::StatusCode::kOk: return Outcome::kFound;
    case absl::StatusCode::kNotFound: return Outcome::kAbsent;
    case absl::StatusCode::kUnimplemented: return Outcome::kNotServed;
    case absl::StatusCode::kUnauthenticated: return Outcome::kUnauthorized;
    case absl::StatusCode::kPermissionDenied: return Outcome::kForbidden;
    default: return Outcome::kUnavailable;
  }
}

// The api layer reads the admission policy and its binding by name from the same cluster, found the same way as
// for the KubeVirt CR; no cluster leaves the layer skipped. Both objects are read whatever the first answered:
// the layer tells a missing binding from a missing policy, and each request is bounded by `timeout`.
absl::Status ReadAdmissionPolicyFromCluster(const ParsedCommand& cmd, std::chrono::milliseconds timeout,
                                            validation::ValidateOptions* options) {
  kube::AdmissionPolicyReaderOptions reader_options;
  reader_options.kubeconfig = cmd.flags.Get("kubeconfig");
  auto reader = kube::ConnectAdmissionPolicyReader(reader_options);
  if (!reader.ok()) {
    if (!reader_options.kubeconfig.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--kubeconfig: ", reader.status().message()));
    }
    if (!absl::IsNotFound(reader.status())) {
      const std::string why = absl::StrCat("in-cluster configuration unusable: ", reader.status().message());
      validation::ApiObjectRead unusable{.outcome = validation::ApiObjectRead::Outcome::kUnavailable,
                                         .request = absl::StrCat("GET ", kube::kAdmissionPoliciesPath, "/",
                                                                 kube::kAgentAdmissionPolicy),
                                         .body = why};
      options->admission_policy = validation::AdmissionPolicyRead{
          .name = kube::kAgentAdmissionPolicy, .policy = unusable, .binding = unusable, .credentials = "in-cluster"};
    }
    return absl::OkStatus();
  }
  auto read = [&](const char* collection) {
    absl::StatusOr<std::string> object = (*reader)->Get(collection, kube::kAgentAdmissionPolicy, timeout);
    const validation::ApiObjectRead::Outcome outcome = OutcomeOf(object.status());
    std::string request = (*reader)->Request(collection, kube::kAgentAdmissionPolicy);
    // The request is the evidence's source already: its value is what came back.
    std::string body = object.ok() ? *std::move(object) : std::string(object.status().message());
    if (absl::StartsWith(body, absl::StrCat(request, ": "))) body.erase(0, request.size() + 2);
    return validation::ApiObjectRead{.outcome = outcome, .request = std::move(request), .body = std::move(body)};
  };
  validation::AdmissionPolicyRead policy{.name = kube::kAgentAdmissionPolicy,
                                         .policy = read(kube::kAdmissionPoliciesPath),
                                         .binding = read(kube::kAdmissionPolicyBindingsPath),
                                         .credentials = (*reader)->ConfigSource()};
  spdlog::info("validate: admission policy {} from {} (credentials: {})", policy.name, policy.policy.request,
               policy.credentials);
  options->admission_policy = std::move(policy);
  return absl::OkStatus();
}

// --kubelet-api dra: the driver's names and directories as the agent runs with them, and the node's slices and the
// DeviceClasses from the cluster found as for the KubeVirt CR (no cluster: those checks are skipped).
absl::StatusOr<std::optional<validation::DraValidation>> DraFromFlags(const ParsedCommand& cmd,
                                                                      std::chrono::milliseconds timeout) {
  const std::string api = cmd.flags.Get("kubelet-api", "device-plugin");
  if (api != "device-plugin" && api != "dra") {
    return absl::InvalidArgumentError(absl::StrCat("--kubelet-api \"", api, "\": device-plugin or dra"));
  }
  if (api != "dra" && cmd.flags.GetBool("bind-on-prepare")) {
    return absl::InvalidArgumentError("--bind-on-prepare is a policy of the DRA driver: it needs --kubelet-api dra");
  }
  if (api == "dra" && cmd.flags.Has("vfio-backend")) {
    return absl::InvalidArgumentError(
        "--vfio-backend is the device plugin's: the claim's DeviceClass picks the backend in DRA");
  }
  if (api == "device-plugin") return std::nullopt;
  validation::DraValidation dra;
  dra.driver.bind_on_prepare = cmd.flags.GetBool("bind-on-prepare");
  dra.driver.driver_name = cmd.flags.Get("dra-driver-name", dra.driver.driver_name);
  if (absl::Status name = dra::ValidateDriverName(dra.driver.driver_name); !name.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--dra-driver-name: ", name.message()));
  }
  dra.driver.registry_dir = cmd.flags.Get("kubelet-registry-dir", dra.driver.registry_dir.string());
  dra.driver.plugins_dir = cmd.flags.Get("kubelet-plugins-dir", dra.driver.plugins_dir.string());
  dra.driver.cdi_dir = cmd.flags.Get("cdi-dir", dra.driver.cdi_dir.string());
  kube::KubevirtReaderOptions reader_options;
  reader_options.kubeconfig = cmd.flags.Get("kubeconfig");
  auto reader = kube::ConnectDraObjectsReader(reader_options);
  if (!reader.ok()) {
    if (!reader_options.kubeconfig.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--kubeconfig: ", reader.status().message()));
    }
    return dra;  // no cluster
  }
  absl::StatusOr<std::string> node = NodeName(cmd.flags);
  if (!node.ok()) return absl::InvalidArgumentError(absl::StrCat("--kubelet-api dra in a cluster: ", node.status().message()));
  dra.slices = validation::ApiListRead{.request = (*reader)->SlicesRequest(*node),
                                       .body = (*reader)->NodeSlices(*node, timeout)};
  dra.classes = validation::ApiListRead{.request = (*reader)->ClassesRequest(), .body = (*reader)->DeviceClasses(timeout)};
  return dra;
}

}  // namespace

std::vector<FlagSpec> ValidateFlags() {
  std::vector<FlagSpec> specs = {
      {"status-dir", "DIR", "write the GPU Operator's status files (workload-type, vfio-pci-ready; vm-vgpu: vgpu-manager-ready, vgpu-devices-ready) there", ""},
      {"kubevirt-cr", "FILE", "KubeVirt CR as YAML or JSON (e.g. `kubectl get kubevirt -A -o yaml`)", ""},
      {"pod-resources-socket", "PATH", "the kubelet's pod-resources socket",
       "/var/lib/kubelet/pod-resources/kubelet.sock"},
      {"layers", "LIST", "comma-separated: platform, devices, plugin, kubelet, kubevirt, api, fabric, or all", "all"},
      {"rpc-timeout", "MS", "bound on each plugin and pod-resources exchange, in milliseconds", "2000"},
      {"kubeconfig", "FILE",
       "without --kubevirt-cr: read the KubeVirt CRs from this cluster (needs get/list kubevirts.kubevirt.io); the "
       "api layer reads the admission policy vfio-gpu-agent-own-node and its binding there (needs get on both)",
       "in-cluster service account, if any"},
      {"api-timeout", "MS", "bound on each API request, connecting included, in milliseconds", "3000"},
      {"kubelet-api", "device-plugin|dra",
       "dra: the plugin and kubelet layers check the DRA driver (registration, the kubelet's answer, CDI "
       "directory, the node's ResourceSlices, a DeviceClass) and the kubevirt layer its feature gates",
       "device-plugin"},
      {"dra-driver-name", "NAME", "with --kubelet-api dra: the driver name the agent runs with",
       std::string(dra::kDefaultDriverName)},
      {"kubelet-registry-dir", "DIR", "with --kubelet-api dra: the kubelet's plugin registration directory",
       "/var/lib/kubelet/plugins_registry"},
      {"kubelet-plugins-dir", "DIR", "with --kubelet-api dra: the kubelet's plugins directory",
       "/var/lib/kubelet/plugins"},
      {"cdi-dir", "DIR", "with --kubelet-api dra: the CDI spec directory", "/var/run/cdi"},
      {"bind-on-prepare", "",
       "with --kubelet-api dra, as the agent runs: GPUs stay on their host driver until a claim's Prepare binds "
       "them, so the devices layer wants on vfio-pci only the groups a prepared claim holds (the driver's checkpoint)",
       "off"},
      {"node-name", "NAME", "with --kubelet-api dra: the node whose ResourceSlices are read", "$NODE_NAME"},
      {"vfio-backend", "legacy|iommufd|auto",
       "the device plugin's, as the agent runs: kubevirt.vfio_backend says what Allocate hands out under it and "
       "fails when KubeVirt cannot open that",
       "auto"},
      {"state-dir", "DIR", "--workload vm-vgpu: the agent's state dir, whose vgpu-catalog.txt names the vGPUs of "
                           "full SR-IOV cards (read, never written)", "/var/lib/vfio-gpu-agent"},
      {"vgpu-config-file", "FILE", "--workload vm-vgpu: vgpu-device-manager's config file; the vgpu layer compares "
                                   "each GPU's vGPUs with config --vgpu-config", ""},
      {"vgpu-config", "NAME", "the config of --vgpu-config-file to compare with (the node's nvidia.com/vgpu.config)",
       ""},
  };
  for (FlagSpec& spec : FabricFlags()) {
    if (spec.name != "fabric-fail-mode") specs.push_back(std::move(spec));
  }
  return specs;
}

int RunValidate(const std::vector<std::string>& args, std::ostream& out) {
  ParsedCommand cmd;
  if (auto exit = ParseCommand(
          "validate",
          "Checks every link of the GPU passthrough chain: platform (IOMMU, interrupt remapping, vfio), devices (driver,\n"
          "IOMMU group, BARs, power, reset, SR-IOV, NVSwitch, MMIO window), plugin sockets, the kubelet's view and the\n"
          "KubeVirt CR; names the evidence and the fix of each broken link. Read-only except --status-dir.\n"
          "The KubeVirt CR: --kubevirt-cr FILE; else read from the API server (--kubeconfig, or in a pod the\n"
          "service account, as `run`): a 404 (KubeVirt not installed), no CR, 401 or 403 (RBAC: get/list\n"
          "kubevirts.kubevirt.io) fail the layer; an API server that does not answer within --api-timeout skips it;\n"
          "no cluster at all skips it as without --kubevirt-cr.\n"
          "The api layer reads from the same cluster whether the admission policy that holds each agent to its own\n"
          "Node is installed and bound with Deny (daemonset/base/agent/admission-policy.yaml); without it, or on\n"
          "Kubernetes < 1.30, it warns, naming what is lost. No cluster skips it.\n"
          "The fabric layer (HGX shared-NVSwitch mode, --fabric-manager ADDRESS) asks Fabric Manager for its\n"
          "partitions: FM answering in FABRIC_MODE=1, partitions listed, every selected GPU in one, NVSwitches on\n"
          "the host driver. Without --fabric-manager it is skipped.\n"
          "On a DRA node (--kubelet-api dra) the plugin and kubelet layers check the DRA driver instead: its\n"
          "registration socket, the kubelet's answer, the CDI directory, the node's ResourceSlices and a DeviceClass;\n"
          "the kubevirt layer also GPUsWithDRA/HostDevicesWithDRA (docs/dra.md). With\n"
          "--bind-on-prepare a GPU on its host driver passes the devices layer unless a prepared claim holds it.\n"
          "With --workload vm-vgpu the vgpu layer replaces devices: GPUs on nvidia, the vGPU manager, one\n"
          "framework, SR-IOV VFs enabled, every vGPU named, the profiles of --vgpu-config-file; the plugin and\n"
          "kubelet layers expect the vGPUs, the KubeVirt layer their permittedHostDevices entries, and --status-dir\n"
          "gets vgpu-manager-ready and vgpu-devices-ready.\n"
          "Exit 0 when no check failed (warnings allowed), 1 when one did, 2 usage, 3 the host could not be read.",
          ValidateFlags(), args, out, &cmd)) {
    return *exit;
  }
  auto usage = [](absl::string_view message) {
    std::cerr << "vfio-gpu-agent validate: " << message << "\n";
    return kExitUsage;
  };
  validation::ValidateOptions options;
  options.paths = cmd.common.paths;
  options.paths.pod_resources_socket = cmd.flags.Get("pod-resources-socket", options.paths.pod_resources_socket.string());
  options.policy = cmd.common.policy;
  options.resource_domain = cmd.common.resource_domain;
  options.name_overrides = cmd.common.name_overrides;
  auto layers = validation::ParseLayers(cmd.flags.Get("layers", "all"));
  if (!layers.ok()) return usage(absl::StrCat("--layers: ", layers.status().message()));
  options.layers = *layers;
  if (cmd.flags.Has("status-dir")) options.status_dir = cmd.flags.Get("status-dir");
  const std::string timeout = cmd.flags.Get("rpc-timeout", "2000");
  int ms = 0;
  if (!absl::SimpleAtoi(timeout, &ms) || ms <= 0) return usage("--rpc-timeout must be a positive number of milliseconds");
  options.rpc_wait = std::chrono::milliseconds(ms);
  options.workload = cmd.common.workload;
  options.vgpu_catalog_file =
      std::filesystem::path(cmd.flags.Get("state-dir", "/var/lib/vfio-gpu-agent")) / "vgpu-catalog.txt";
  if (cmd.flags.Has("vgpu-config-file") != cmd.flags.Has("vgpu-config")) {
    return usage("--vgpu-config-file and --vgpu-config go together (the file and the config in it to compare with)");
  }
  if (cmd.flags.Has("vgpu-config-file")) {
    options.vgpu_config_file = cmd.flags.Get("vgpu-config-file");
    options.vgpu_config = cmd.flags.Get("vgpu-config");
  }
  if (cmd.flags.Has("kubevirt-cr")) {
    auto text = fs::ReadTrimmed(cmd.flags.Get("kubevirt-cr"));
    if (!text.ok()) return usage(absl::StrCat("--kubevirt-cr: ", text.status().message()));
    options.kubevirt_cr = *std::move(text);
  }
  const std::string api_timeout = cmd.flags.Get("api-timeout", "3000");
  int api_ms = 0;
  if (!absl::SimpleAtoi(api_timeout, &api_ms) || api_ms <= 0) {
    return usage("--api-timeout must be a positive number of milliseconds");
  }
  const std::string backend = cmd.flags.Get("vfio-backend", "auto");
  const std::optional<plugin::VfioBackendChoice> choice = plugin::ParseVfioBackendChoice(backend);
  if (!choice) return usage(absl::StrCat("--vfio-backend \"", backend, "\": legacy, iommufd or auto"));
  options.vfio_backend = *choice;
  auto dra = DraFromFlags(cmd, std::chrono::milliseconds(api_ms));
  if (!dra.ok()) return usage(dra.status().message());
  options.dra = *std::move(dra);
  const bool kubevirt_from_api = !cmd.flags.Has("kubevirt-cr") && options.layers.contains(validation::Layer::kKubevirt);
  const bool api_layer = options.layers.contains(validation::Layer::kApi);
  if (kubevirt_from_api || api_layer) {
    if (kubevirt_from_api) {
      if (absl::Status status = ReadKubevirtFromCluster(cmd, std::chrono::milliseconds(api_ms), &options); !status.ok()) {
        return usage(status.message());
      }
    }
    if (api_layer) {
      if (absl::Status status = ReadAdmissionPolicyFromCluster(cmd, std::chrono::milliseconds(api_ms), &options);
          !status.ok()) {
        return usage(status.message());
      }
    }
  }
  if (options.layers.contains(validation::Layer::kFabric) && cmd.flags.Has("fabric-manager")) {
    absl::StatusOr<fabric::FabricOptions> fabric = FabricOptionsFromFlags(cmd);
    if (!fabric.ok()) return usage(fabric.status().message());
    validation::FabricRead read{.address = fabric->address};
    absl::StatusOr<std::unique_ptr<fabric::FmClient>> client = fabric::ConnectNvfm(
        {.address = fabric->address, .library = cmd.flags.Get("fabric-library", "libnvfm.so.1"),
         .connect_timeout = options.rpc_wait});
    read.table = client.ok() ? (*client)->Partitions() : absl::StatusOr<fabric::PartitionTable>(client.status());
    options.fabric = std::move(read);
  }
  // Names come from pinned entries and overrides first; pci.ids is parsed only if a GPU needs it.
  auto db = LazyNameDatabase(cmd.common);
  options.pci_ids = db.get();
  auto report = validation::Validate(options);
  if (!report.ok()) {
    if (absl::IsInvalidArgument(report.status())) return usage(report.status().message());
    std::cerr << "vfio-gpu-agent validate: " << report.status().message() << "\n";
    return kExitError;
  }
  out << (cmd.common.json ? validation::FormatValidateJson(*report) : validation::FormatValidateText(*report));
  return report->ok() ? kExitOk : kExitNotReady;
}

}  // namespace vfio_agent::cli
