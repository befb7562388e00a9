#include "vfio_gpu_agent/validation/validate.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "check_builder.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/node/snapshot.h"
#include "vfio_gpu_agent/vgpu/catalog.h"

namespace vfio_agent::validation {
namespace {

namespace rpt = report::v1;

constexpr Layer kAllLayers[] = {Layer::kPlatform, Layer::kDevices, Layer::kPlugin, Layer::kKubelet,
                                Layer::kKubevirt, Layer::kApi,     Layer::kFabric,  Layer::kVgpu};

rpt::Layer ToReport(Layer layer) {
  switch (layer) {
    case Layer::kPlatform: return rpt::PLATFORM;
    case Layer::kDevices: return rpt::DEVICES;
    case Layer::kPlugin: return rpt::PLUGIN;
    case Layer::kKubelet: return rpt::KUBELET;
    case Layer::kKubevirt: return rpt::KUBEVIRT;
    case Layer::kApi: return rpt::API;
    case Layer::kFabric: return rpt::FABRIC;
    case Layer::kVgpu: return rpt::VGPU;
  }
  return rpt::LAYER_UNSPECIFIED;
}

rpt::Result ToReport(Result result) {
  switch (result) {
    case Result::kPass: return rpt::PASS;
    case Result::kWarn: return rpt::WARN;
    case Result::kFail: return rpt::FAIL;
    case Result::kSkip: return rpt::SKIP;
  }
  return rpt::RESULT_UNSPECIFIED;
}

bool IsHostLayer(Layer layer) { return layer == Layer::kPlatform || layer == Layer::kDevices; }

std::string CountsText(const rpt::Counts& c) {
  return absl::StrFormat("%d passed, %d warning(s), %d failed, %d skipped", c.pass(), c.warn(), c.fail(), c.skip());
}

// What the vGPU side of a run reads once: the discovery (with the agent's remembered catalogs, never written
// here), the snapshot the agent would advertise from it, and the profiles config.
struct VgpuNode {
  vgpu::Discovery discovery;
  VgpuView view;
};

// Fills `out` in place: its view points into it.
void ReadVgpuNode(const ValidateOptions& options, const pci::Inventory& inventory, VgpuNode& out) {
  out.discovery = DiscoverVgpusReadOnly(options.paths.sysfs_root, inventory, options.vgpu_catalog_file);
  out.view.discovery = &out.discovery;
  out.view.domain = options.resource_domain;
  if (options.vgpu_config_file) {
    out.view.config_source = absl::StrCat(options.vgpu_config_file->string(), " config ", options.vgpu_config);
    absl::StatusOr<vgpu::VgpuConfigFile> file = vgpu::LoadVgpuConfig(*options.vgpu_config_file);
    out.view.desired = file.ok() ? vgpu::DesiredTypes(*file, options.vgpu_config, ConfigGpus(inventory))
                                 : absl::StatusOr<std::map<std::string, std::map<std::string, int>>>(file.status());
  }
}

// Layer 2 judges GPUs on vfio-pci; on a vm-vgpu node they stay on nvidia and the vgpu layer judges them.
std::vector<Check> DevicesOnVgpuNode() {
  return {Check{.id = "device.driver", .layer = Layer::kDevices, .subject = "node", .result = Result::kSkip,
                .message = "not checked: a vm-vgpu node keeps its GPUs on nvidia (the vGPU manager); see the vgpu "
                           "layer"}};
}

}  // namespace

vgpu::Discovery DiscoverVgpusReadOnly(const std::filesystem::path& sysfs_root, const pci::Inventory& inventory,
                                      const std::filesystem::path& catalog_file) {
  std::vector<vgpu::DeviceError> errors;
  vgpu::CatalogStore remembered(catalog_file);
  if (!catalog_file.empty()) {
    if (absl::Status status = remembered.Load(); !status.ok()) {
      errors.push_back({.device = "", .path = catalog_file, .status = status});
    }
  }
  vgpu::CatalogStore catalog = remembered.InMemory();
  absl::StatusOr<vgpu::Discovery> discovery = vgpu::Discover(sysfs_root, inventory, catalog);
  vgpu::Discovery out;
  if (discovery.ok()) {
    out = *std::move(discovery);
  } else {
    errors.push_back({.device = "", .path = sysfs_root / "bus/mdev/devices", .status = discovery.status()});
  }
  out.errors.insert(out.errors.end(), errors.begin(), errors.end());
  return out;
}

absl::StatusOr<std::set<Layer>> ParseLayers(std::string_view text) {
  std::set<Layer> layers;
  for (absl::string_view item : absl::StrSplit(absl::string_view(text.data(), text.size()), ',', absl::SkipWhitespace())) {
    const std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(item));
    if (name == "all") {
      layers.insert(std::begin(kAllLayers), std::end(kAllLayers));
      continue;
    }
    auto it = std::find_if(std::begin(kAllLayers), std::end(kAllLayers), [&](Layer l) { return name == LayerName(l); });
    if (it == std::end(kAllLayers)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown layer \"", name,
                                                     "\" (want platform, devices, plugin, kubelet, kubevirt, api, fabric, vgpu or all)"));
    }
    layers.insert(*it);
  }
  if (layers.empty()) return absl::InvalidArgumentError("no layer named");
  return layers;
}

bool HostReady(const std::vector<Check>& checks) {
  return std::none_of(checks.begin(), checks.end(),
                      [](const Check& c) { return IsHostLayer(c.layer) && c.result == Result::kFail; });
}

rpt::ValidateReport MakeReport(const std::vector<Check>& checks, const std::set<Layer>& layers, const HostPaths& paths) {
  rpt::ValidateReport report;
  report.set_schema(kValidateSchema);
  report.set_sysfs_root(paths.sysfs_root.string());
  for (Layer layer : layers) report.add_layers(LayerName(layer));
  rpt::Counts* counts = report.mutable_counts();
  for (const Check& check : checks) {
    rpt::Check* out = report.add_checks();
    out->set_id(check.id);
    out->set_layer(ToReport(check.layer));
    out->set_subject(check.subject);
    out->set_result(ToReport(check.result));
    out->set_message(check.message);
    for (const Evidence& e : check.evidence) {
      rpt::Evidence* ev = out->add_evidence();
      ev->set_source(e.source);
      ev->set_value(e.value);
    }
    out->set_fix(check.fix);
    switch (check.result) {
      case Result::kPass: counts->set_pass(counts->pass() + 1); break;
      case Result::kWarn: counts->set_warn(counts->warn() + 1); break;
      case Result::kFail: counts->set_fail(counts->fail() + 1); break;
      case Result::kSkip: counts->set_skip(counts->skip() + 1); break;
    }
  }
  const bool host_layers = layers.contains(Layer::kPlatform) && layers.contains(Layer::kDevices);
  report.set_host_ready(host_layers && HostReady(checks));
  report.set_ok(counts->fail() == 0);
  std::string summary = absl::StrCat(CountsText(*counts), ": ");
  if (report.ok()) {
    absl::StrAppend(&summary, counts->warn() > 0 ? "passthrough chain OK, see the warnings" : "passthrough chain OK");
  } else {
    std::vector<std::string> failed;
    for (const Check& check : checks) {
      if (check.result == Result::kFail && std::find(failed.begin(), failed.end(), check.id) == failed.end()) {
        failed.push_back(check.id);
      }
    }
    absl::StrAppend(&summary, "BROKEN at ", absl::StrJoin(failed, ", "));
  }
  report.set_summary(summary);
  return report;
}

absl::StatusOr<rpt::ValidateReport> Validate(const ValidateOptions& options) {
  auto inventory = pci::Scan(options.paths.sysfs_root, {.detail_vendor = options.policy.vendor_id});
  if (!inventory.ok()) return inventory.status();
  const pci::Selection selection = pci::Select(*inventory, options.policy);
  const names::NameResolver names(options.pci_ids, options.resource_domain, options.name_overrides);
  const bool vgpu_node = options.workload == Workload::kVmVgpu;
  VgpuNode vgpu_state;
  if (vgpu_node) ReadVgpuNode(options, *inventory, vgpu_state);
  // The node's model by the rules the agent itself applies (names, health; no config read of a GPU in D3cold).
  const node::Snapshot model =
      node::Build(options.paths, *inventory, selection, names, vgpu_node ? &vgpu_state.discovery : nullptr);
  // What it serves of it: `validate` remembers no earlier scan, so a GPU counts once it is on vfio (the device plugin
  // advertises it from then on).
  const node::ServedDevices served = node::ServedOf(model, node::WholeDevices::kOnVfio);
  NodeView node{.paths = options.paths, .inventory = &*inventory, .selection = &selection, .model = &model,
                .served = &served, .workload = options.workload};
  if (vgpu_node) node.vgpu = &vgpu_state.view;
  if (!options.dra) node.vfio_backend = options.vfio_backend;

  // --bind-on-prepare: layer 2 wants on vfio only what a prepared claim holds.
  std::optional<absl::StatusOr<dra::CheckpointRead>> checkpoint;
  if (options.dra && options.dra->driver.bind_on_prepare && !vgpu_node) {
    dra::DriverOptions driver = options.dra->driver;
    driver.paths = options.paths;
    checkpoint = dra::ReadCheckpoint(driver);
    node.bind_on_prepare = &*checkpoint;
  }

  std::vector<Check> checks;
  auto run = [&](Layer layer, auto&& layer_checks) {
    if (!options.layers.contains(layer)) return;
    for (Check& check : layer_checks()) checks.push_back(std::move(check));
  };
  run(Layer::kPlatform, [&] { return PlatformChecks(node); });
  run(Layer::kDevices, [&] { return vgpu_node ? DevicesOnVgpuNode() : DeviceChecks(node); });
  run(Layer::kVgpu, [&] { return VgpuChecks(node); });
  run(Layer::kPlugin, [&] {
    return options.dra ? DraDriverChecks(*options.dra, options.rpc_wait) : PluginChecks(node, options.rpc_wait);
  });
  run(Layer::kKubelet, [&] {
    return options.dra ? DraSliceChecks(ExpectedDraDevices(node, *options.dra, names, options.pci_ids), *options.dra)
                       : KubeletChecks(node, options.paths.pod_resources_socket, options.rpc_wait);
  });
  run(Layer::kKubevirt, [&] {
    std::vector<Check> kubevirt;
    if (options.kubevirt_cr_unavailable) {
      kubevirt = KubevirtUnavailableChecks(*options.kubevirt_cr_unavailable);
    } else {
      kubevirt = vgpu_node ? VgpuKubevirtChecks(node, options.kubevirt_cr) : KubevirtChecks(node, options.kubevirt_cr, names);
    }
    if (options.dra) {
      for (Check& check : DraKubevirtChecks(options.kubevirt_cr_unavailable ? std::nullopt : options.kubevirt_cr)) {
        kubevirt.push_back(std::move(check));
      }
    }
    return kubevirt;
  });
  run(Layer::kApi, [&] { return ApiChecks(options.admission_policy); });
  run(Layer::kFabric, [&] { return FabricChecks(node, options.fabric); });

  rpt::ValidateReport report = MakeReport(checks, options.layers, options.paths);
  report.set_workload(WorkloadName(options.workload));
  if (vgpu_node) {
    report.set_summary(absl::StrReplaceAll(report.summary(), {{"passthrough chain OK", "vGPU chain OK"}}));
    report.set_vgpu_manager_ready(options.layers.contains(Layer::kPlatform) && options.layers.contains(Layer::kVgpu) &&
                                  VgpuManagerReady(checks));
    report.set_vgpu_devices_ready(report.vgpu_manager_ready() && VgpuDevicesReady(checks));
  }
  if (options.status_dir && vgpu_node) {
    if (!options.layers.contains(Layer::kPlatform) || !options.layers.contains(Layer::kVgpu)) {
      return absl::InvalidArgumentError("--status-dir on a vm-vgpu node needs the platform and vgpu layers");
    }
    if (auto status = WriteVgpuStatusFiles(*options.status_dir, report.vgpu_manager_ready(), report.vgpu_devices_ready());
        !status.ok()) {
      return status;
    }
    report.set_status_dir(options.status_dir->string());
  } else if (options.status_dir) {
    if (!options.layers.contains(Layer::kPlatform) || !options.layers.contains(Layer::kDevices)) {
      return absl::InvalidArgumentError("--status-dir needs the platform and devices layers");
    }
    if (auto status = WriteStatusFiles(*options.status_dir, report.host_ready()); !status.ok()) return status;
    report.set_status_dir(options.status_dir->string());
  }
  return report;
}

std::string FormatValidateText(const rpt::ValidateReport& report) {
  std::string text = absl::StrFormat("vfio-gpu-agent validate: sysfs root %s, layers %s\n", report.sysfs_root(),
                                     absl::StrJoin(report.layers(), ","));
  rpt::Layer current = rpt::LAYER_UNSPECIFIED;
  for (const rpt::Check& check : report.checks()) {
    if (check.layer() != current) {
      current = check.layer();
      absl::StrAppend(&text, "\n", absl::AsciiStrToLower(rpt::Layer_Name(current)), "\n");
    }
    const std::string result = check.result() == rpt::PASS ? "pass" : rpt::Result_Name(check.result());
    absl::StrAppend(&text, absl::StrFormat("  %-4s  %-26s %-14s %s\n", result, check.id(), check.subject(),
                                           check.message()));
    if (check.result() == rpt::PASS || check.result() == rpt::SKIP) continue;
    for (const rpt::Evidence& e : check.evidence()) {
      absl::StrAppend(&text, absl::StrFormat("          evidence: %s = %s\n", e.source(), e.value()));
    }
    if (!check.fix().empty()) absl::StrAppend(&text, "          fix: ", check.fix(), "\n");
  }
  absl::StrAppend(&text, "\n", report.summary(), "\n");
  if (!report.status_dir().empty() && report.workload() == WorkloadName(Workload::kVmVgpu)) {
    absl::StrAppend(&text, "status files in ", report.status_dir(), ": workload-type",
                    report.vgpu_manager_ready() ? ", vgpu-manager-ready" : " (vgpu-manager-ready removed)",
                    report.vgpu_devices_ready() ? ", vgpu-devices-ready" : " (vgpu-devices-ready removed)", "\n");
  } else if (!report.status_dir().empty()) {
    absl::StrAppend(&text, "status files in ", report.status_dir(), ": workload-type",
                    report.host_ready() ? ", vfio-pci-ready" : " (vfio-pci-ready removed: layers 1-2 failed)", "\n");
  }
  return text;
}

std::string FormatValidateJson(const rpt::ValidateReport& report) {
  google::protobuf::util::JsonPrintOptions json;
  json.add_whitespace = true;
  json.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(report, &out, json);
  return out;
}

}  // namespace vfio_agent::validation
