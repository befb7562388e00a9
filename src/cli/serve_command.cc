#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/cli/commands.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/kube/resource_claim_reader.h"
#include "vfio_gpu_agent/kube/resource_slices.h"
#include "vfio_gpu_agent/fabric/fm_client.h"
#include "vfio_gpu_agent/plugin/agent.h"

namespace vfio_agent::cli {

std::vector<FlagSpec> ServeFlags() {
  std::vector<FlagSpec> specs = {
      {"kubelet-socket", "PATH", "the kubelet's registration socket", "<kubelet-dir>/kubelet.sock"},
      {"rescan-interval", "MS", "safety-net rescan of sysfs, in milliseconds", "60000"},
      {"udev", "", "watch udev PCI events (--no-udev on a simulated sysfs)", "on"},
      {"cdi", "", "also return CDI device names and write CDI specs", "off"},
      {"cdi-dir", "DIR", "where CDI specs are written", "/var/run/cdi"},
      {"vfio-backend", "legacy|iommufd|auto",
       "the VFIO nodes Allocate hands a VM: legacy (/dev/vfio/vfio, /dev/vfio/<group>), iommufd (the cdevs "
       "/dev/vfio/devices/vfioN, /dev/iommu), or auto: what KubeVirt's own PCI device plugin hands out for the release "
       "its CR shows (legacy before v1.9, the legacy nodes and the cdevs from v1.9 on or while unknown); the device "
       "plugin only (in DRA the claim's DeviceClass picks)",
       "auto"},
      {"pod-resources-socket", "PATH",
       "the kubelet's pod-resources socket (which devices pods hold: readiness, partition release)",
       "/var/lib/kubelet/pod-resources/kubelet.sock"},
      {"fabric-interval", "MS", "with --fabric-manager: how often FM is read and unheld partitions released", "5000"},
      {"state-dir", "DIR",
       "kept across restarts: the vGPU type catalogs of SR-IOV cards (vm-vgpu; a full card lists no names), and with "
       "--fabric-manager FM's partition table, to tell a restarted FM what is active before it answers a read",
       "/var/lib/vfio-gpu-agent"},
  };
  for (FlagSpec& spec : FabricFlags()) specs.push_back(std::move(spec));
  return specs;
}

std::vector<FlagSpec> FabricFlags() {
  return {
      {"fabric-manager", "ADDRESS",
       "HGX shared-NVSwitch mode: Fabric Manager's command address (unix:/run/nvidia-fabricmanager/socket or "
       "host:port); a GPU is advertised only in a supported partition and Allocate activates one",
       "off"},
      {"fabric-fail-mode", "closed|open",
       "when FM cannot vouch for a GPU: closed = Unhealthy and no allocation; open = advertised, with a warning",
       "closed"},
      {"fabric-library", "PATH", "Fabric Manager's client library", "libnvfm.so.1"},
  };
}

absl::StatusOr<fabric::FabricOptions> FabricOptionsFromFlags(const ParsedCommand& cmd) {
  fabric::FabricOptions options;
  options.address = cmd.flags.Get("fabric-manager");
  if (options.address.empty()) return options;
  if (absl::StatusOr<fabric::FmAddress> address = fabric::ParseFmAddress(options.address); !address.ok()) {
    return address.status();
  }
  if (cmd.common.policy.include_nvswitches) {
    return absl::InvalidArgumentError(
        "--fabric-manager and --nvswitches exclude each other: in shared-NVSwitch mode the NVSwitches stay on the "
        "host driver with Fabric Manager; --nvswitches is the full-passthrough mode, where the VM runs FM");
  }
  const std::string mode = cmd.flags.Get("fabric-fail-mode", "closed");
  if (mode != "closed" && mode != "open") {
    return absl::InvalidArgumentError(absl::StrCat("--fabric-fail-mode \"", mode, "\": closed or open"));
  }
  options.fail_open = mode == "open";
  return options;
}

absl::StatusOr<plugin::ServeOptions> ServeOptionsFromFlags(const ParsedCommand& cmd,
                                                           const names::PciIdsDatabase* db) {
  plugin::ServeOptions options;
  options.paths = cmd.common.paths;
  options.policy = cmd.common.policy;
  options.domain = cmd.common.resource_domain;
  options.overrides = cmd.common.name_overrides;
  options.pci_ids = db;
  options.kubelet_socket = cmd.flags.Get("kubelet-socket");
  std::string interval = cmd.flags.Get("rescan-interval", "60000");
  int ms = 0;
  auto [ptr, ec] = std::from_chars(interval.data(), interval.data() + interval.size(), ms);
  if (ec != std::errc() || ptr != interval.data() + interval.size() || ms < 10) {
    return absl::InvalidArgumentError("--rescan-interval must be a whole number of milliseconds, at least 10");
  }
  options.rescan_interval = std::chrono::milliseconds(ms);
  options.udev = cmd.flags.Get("udev", "true") == "true";
  options.cdi = cmd.flags.GetBool("cdi");
  options.cdi_dir = cmd.flags.Get("cdi-dir", "/var/run/cdi");
  options.paths.pod_resources_socket =
      cmd.flags.Get("pod-resources-socket", options.paths.pod_resources_socket.string());
  const std::string backend = cmd.flags.Get("vfio-backend", "auto");
  const std::optional<plugin::VfioBackendChoice> choice = plugin::ParseVfioBackendChoice(backend);
  if (!choice) return absl::InvalidArgumentError(absl::StrCat("--vfio-backend \"", backend, "\": legacy, iommufd or auto"));
  options.vfio_backend = *choice;
  absl::StatusOr<fabric::FabricOptions> fabric = FabricOptionsFromFlags(cmd);
  if (!fabric.ok()) return fabric.status();
  options.fabric = *std::move(fabric);
  options.workload = cmd.common.workload;
  const std::filesystem::path state_dir = cmd.flags.Get("state-dir", "/var/lib/vfio-gpu-agent");
  options.vgpu_catalog_file = state_dir / "vgpu-catalog.txt";
  if (!options.fabric.address.empty()) options.fabric.checkpoint = state_dir / "fabric-partitions.txt";
  if (options.workload == Workload::kVmVgpu && !options.fabric.address.empty()) {
    return absl::InvalidArgumentError(
        "--fabric-manager is the shared-NVSwitch mode of vm-passthrough; --workload vm-vgpu does not use it");
  }
  options.fabric_library = cmd.flags.Get("fabric-library", "libnvfm.so.1");
  const std::string fabric_interval = cmd.flags.Get("fabric-interval", "5000");
  int fabric_ms = 0;
  auto [fptr, fec] = std::from_chars(fabric_interval.data(), fabric_interval.data() + fabric_interval.size(), fabric_ms);
  if (fec != std::errc() || fptr != fabric_interval.data() + fabric_interval.size() || fabric_ms < 10 ||
      fabric_ms > 10000) {
    return absl::InvalidArgumentError("--fabric-interval must be a whole number of milliseconds from 10 to 10000");
  }
  options.fabric_interval = std::chrono::milliseconds(fabric_ms);
  return options;
}

std::vector<FlagSpec> DraFlags() {
  return {
      {"kubelet-api", "device-plugin|dra",
       "which kubelet API serves the GPUs: the device plugin, or a DRA driver (one at a time, never both)",
       "device-plugin"},
      {"dra-driver-name", "NAME", "with --kubelet-api dra: the DRA driver name (a DNS subdomain)",
       std::string(dra::kDefaultDriverName)},
      {"kubelet-registry-dir", "DIR", "with --kubelet-api dra: the kubelet's plugin registration directory",
       "/var/lib/kubelet/plugins_registry"},
      {"kubelet-plugins-dir", "DIR", "with --kubelet-api dra: where the driver's dra.sock lives, under <NAME>/",
       "/var/lib/kubelet/plugins"},
      {"bind-on-prepare", "",
       "with --kubelet-api dra: GPUs stay on their host driver until a claim needs them; Prepare binds the claim's "
       "IOMMU groups to vfio-pci and Unprepare returns each function to the driver it had before",
       "off"},
      {"binding-conditions", "",
       "with --kubelet-api dra and --bind-on-prepare or --fabric-manager: GPUs carry binding conditions, and the "
       "agent binds a claim's IOMMU groups (and activates its partition) before the scheduler binds the pod, which "
       "is placed elsewhere when that fails; ignored, with a warning, by a Kubernetes < 1.36 API server",
       "off"},
      {"dra-taint-no-execute", "",
       "with --kubelet-api dra: a GPU that is gone (left sysfs, or its config space reads 0xffff) is tainted "
       "NoExecute, which evicts the VMs holding it, instead of NoSchedule",
       "off"},
  };
}

absl::StatusOr<bool> DraSelected(const ParsedCommand& cmd) {
  const std::string api = cmd.flags.Get("kubelet-api", "device-plugin");
  if (api != "device-plugin" && api != "dra") {
    return absl::InvalidArgumentError(absl::StrCat("--kubelet-api \"", api, "\": device-plugin or dra"));
  }
  if (api != "dra" && cmd.flags.GetBool("bind-on-prepare")) {
    return absl::InvalidArgumentError("--bind-on-prepare is a policy of the DRA driver: it needs --kubelet-api dra");
  }
  if (api != "dra" && cmd.flags.GetBool("binding-conditions")) {
    return absl::InvalidArgumentError("--binding-conditions is a policy of the DRA driver: it needs --kubelet-api dra");
  }
  if (api == "dra" && cmd.flags.Has("vfio-backend")) {
    return absl::InvalidArgumentError(
        "--vfio-backend is the device plugin's: the claim's DeviceClass picks the backend in DRA "
        "(<model>.<driver> legacy, <model>-iommufd.<driver> iommufd)");
  }
  return api == "dra";
}

namespace {

}  // namespace

absl::StatusOr<dra::DriverOptions> DraOptionsFromFlags(const ParsedCommand& cmd, const names::PciIdsDatabase* db) {
  dra::DriverOptions options;
  options.driver_name = cmd.flags.Get("dra-driver-name", options.driver_name);
  if (absl::Status name = dra::ValidateDriverName(options.driver_name); !name.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--dra-driver-name: ", name.message()));
  }
  options.registry_dir = cmd.flags.Get("kubelet-registry-dir", options.registry_dir.string());
  options.plugins_dir = cmd.flags.Get("kubelet-plugins-dir", options.plugins_dir.string());
  options.cdi_dir = cmd.flags.Get("cdi-dir", options.cdi_dir.string());
  options.bind_on_prepare = cmd.flags.GetBool("bind-on-prepare");
  options.binding_conditions = cmd.flags.GetBool("binding-conditions");
  options.taints.no_execute_when_gone = cmd.flags.GetBool("dra-taint-no-execute");
  options.paths = cmd.common.paths;
  options.policy = cmd.common.policy;
  // The pool's name is the Node's: slices published under a host name that is not the Node's serve no pod.
  absl::StatusOr<std::string> node_name = NodeName(cmd.flags);
  options.pci_ids = db;
  options.domain = cmd.common.resource_domain;
  options.overrides = cmd.common.name_overrides;
  absl::StatusOr<plugin::ServeOptions> serve = ServeOptionsFromFlags(cmd, db);  // --rescan-interval, one parser
  if (!serve.ok()) return serve.status();
  options.rescan_interval = serve->rescan_interval;
  options.workload = serve->workload;
  if (absl::Status modes = dra::ValidateModes(options); !modes.ok()) return modes;
  options.vgpu_catalog_file = serve->vgpu_catalog_file;
  // --fabric-manager and its flags, parsed and checked as for the device plugin.
  options.fabric = serve->fabric;
  options.fabric_library = serve->fabric_library;
  options.fabric_interval = serve->fabric_interval;
  const std::filesystem::path kubeconfig = cmd.flags.Get("kubeconfig");
  absl::StatusOr<std::shared_ptr<kube::ResourceClaimReader>> reader =
      kube::ConnectResourceClaimReader({.kubeconfig = kubeconfig});
  if (reader.ok()) {
    if (!node_name.ok()) return absl::InvalidArgumentError(absl::StrCat("--kubelet-api dra: ", node_name.status().message()));
    options.node_name = *node_name;
  }
  if (!reader.ok()) {
    if (reader.status().code() != absl::StatusCode::kNotFound) return reader.status();
    spdlog::warn("no Kubernetes API ({}): every DRA claim is refused and no ResourceSlice is published until the "
                 "agent runs in a cluster or gets --kubeconfig", std::string(reader.status().message()));
    return options;
  }
  options.get_claim = [reader = *std::move(reader)](const std::string& ns, const std::string& name) {
    // Well inside the kubelet's 45 s for the whole Prepare call.
    return reader->Get(ns, name, std::chrono::seconds(10));
  };
  absl::StatusOr<std::unique_ptr<kube::ResourceSlicePublisher>> publisher = kube::ConnectResourceSlicePublisher(
      kubeconfig, kube::ClaimReaderOptions().service_account_dir,
      {.driver = options.driver_name, .node_name = options.node_name});
  if (!publisher.ok()) return publisher.status();
  std::shared_ptr<kube::ResourceSlicePublisher> shared(*std::move(publisher));
  options.publish_slices = [shared](std::vector<kube::SliceDevice> devices) {
    return shared->Publish(std::move(devices));
  };
  options.watch_slices = [shared](std::function<void()> changed) { return shared->Watch(std::move(changed)); };
  if (options.binding_conditions) {
    absl::StatusOr<std::unique_ptr<kube::ResourceClaimClient>> claims = kube::ConnectResourceClaimClient(
        kubeconfig, kube::ClaimReaderOptions().service_account_dir,
        {.node_name = options.node_name, .driver = options.driver_name});
    if (!claims.ok()) return claims.status();
    std::shared_ptr<kube::ResourceClaimClient> client(*std::move(claims));
    options.watch_claims = [client](kube::ResourceClaimWatch::Handlers handlers) {
      return client->Watch(std::move(handlers));
    };
    options.write_claim_status = [client](const kube::ResourceClaim& claim,
                                          const std::vector<kube::DeviceStatus>& devices) {
      return client->ApplyDeviceStatus(claim, devices);
    };
  }
  return options;
}

namespace {

std::vector<FlagSpec> ServeCommandFlags() {
  std::vector<FlagSpec> specs = ServeFlags();
  for (FlagSpec& spec : DraFlags()) specs.push_back(std::move(spec));
  specs.push_back({"kubeconfig", "FILE",
                   "with --kubelet-api dra: kubeconfig to read ResourceClaims and write ResourceSlices outside a "
                   "cluster", "in-cluster service account"});
  specs.push_back({"node-name", "NAME",
                   "with --kubelet-api dra: this node's name, the devices' pool (also env NODE_NAME)", "$NODE_NAME"});
  return specs;
}

}  // namespace

int RunServe(const std::vector<std::string>& args, std::ostream& out) {
  ParsedCommand cmd;
  if (auto exit = ParseCommand("serve",
                               "Advertises every vfio-bound GPU to the kubelet (Device Plugin API v1beta1), one resource\n"
                               "per name, and keeps the device list live (--workload vm-vgpu: every vGPU, one resource per\n"
                               "vGPU type); with --kubelet-api dra, serves as a kubelet DRA driver instead. Runs until\n"
                               "SIGTERM; never binds or unbinds anything.",
                               ServeCommandFlags(), args, out, &cmd)) {
    return *exit;
  }
  absl::StatusOr<bool> use_dra = DraSelected(cmd);
  if (!use_dra.ok()) {
    std::cerr << "vfio-gpu-agent serve: " << use_dra.status().message() << "\n";
    return kExitUsage;
  }
  if (*use_dra) {
    auto db = LazyNameDatabase(cmd.common);
    absl::StatusOr<dra::DriverOptions> dra_options = DraOptionsFromFlags(cmd, db.get());
    if (!dra_options.ok()) {
      std::cerr << "vfio-gpu-agent serve: " << dra_options.status().message() << "\n";
      return kExitUsage;
    }
    // The device-plugin servers are not started: the same GPU is never offered through both kubelet APIs.
    if (absl::Status status = dra::Serve(*dra_options); !status.ok()) {
      std::cerr << "vfio-gpu-agent serve: " << status.message() << "\n";
      return kExitError;
    }
    return kExitOk;
  }
  auto db = LazyNameDatabase(cmd.common);
  auto options = ServeOptionsFromFlags(cmd, db.get());
  if (!options.ok()) {
    std::cerr << "vfio-gpu-agent serve: " << options.status().message() << "\n";
    return kExitUsage;
  }
  if (auto status = plugin::Serve(*options); !status.ok()) {
    std::cerr << "vfio-gpu-agent serve: " << status.message() << "\n";
    return kExitError;
  }
  return kExitOk;
}

}  // namespace vfio_agent::cli
