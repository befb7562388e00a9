#include "vfio_gpu_agent/cli/inspect.h"

#include <google/protobuf/util/json_util.h>

#include <iostream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "vfio_gpu_agent/binding/plan.h"
#include "vfio_gpu_agent/cli/commands.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/plugin/devices.h"
#include "vfio_gpu_agent/vgpu/catalog.h"
#include "vfio_gpu_agent/vgpu/discovery.h"
#include "vfio_gpu_agent/vgpu/served.h"

namespace vfio_agent::cli {
namespace {

namespace rpt = report::v1;

std::string Hex4(uint16_t v) { return absl::StrFormat("%04x", v); }

rpt::Role ToReportRole(pci::Role role) {
  switch (role) {
    case pci::Role::kGpu: return rpt::GPU;
    case pci::Role::kCompanion: return rpt::COMPANION;
    case pci::Role::kNvSwitch: return rpt::NVSWITCH;
    case pci::Role::kBridge: return rpt::BRIDGE;
    case pci::Role::kForeign: return rpt::FOREIGN;
  }
  return rpt::ROLE_UNSPECIFIED;
}

rpt::Action ToReportAction(binding::Action action) {
  switch (action) {
    case binding::Action::kAlreadyBound: return rpt::ALREADY_BOUND;
    case binding::Action::kBind: return rpt::WOULD_BIND;
    case binding::Action::kBlocked: return rpt::BLOCKED;
    case binding::Action::kStays: return rpt::STAYS;
  }
  return rpt::ACTION_UNSPECIFIED;
}

std::string RoleText(rpt::Role role) { return absl::AsciiStrToLower(rpt::Role_Name(role)); }

std::string ActionText(const rpt::Function& fn) {
  switch (fn.action()) {
    case rpt::ALREADY_BOUND: return absl::StrCat("already on ", fn.driver());
    case rpt::WOULD_BIND: return absl::StrCat("would bind -> ", fn.target_driver());
    case rpt::BLOCKED: return absl::StrCat("blocked: ", fn.reason());
    case rpt::STAYS: return fn.reason().empty() ? "stays" : absl::StrCat("stays: ", fn.reason());
    default: return "?";
  }
}

// vm-vgpu: the vGPUs as the frontends serve them (vgpu::ServedVgpusOf, the one rule of the device plugin and the
// DRA driver), discovered with an in-memory copy of the catalog so that nothing is written.
void AddServedVgpus(const CommonOptions& options, const pci::Inventory& inventory,
                    const std::filesystem::path& catalog_file, rpt::InspectReport& report) {
  vgpu::CatalogStore file_store(catalog_file);
  if (!catalog_file.empty()) {
    if (absl::Status loaded = file_store.Load(); !loaded.ok()) {
      report.add_vgpu_problems(absl::StrCat("vGPU catalog ", catalog_file.string(), ": ", loaded.message()));
    }
  }
  vgpu::CatalogStore catalog = file_store.InMemory();
  absl::StatusOr<vgpu::Discovery> discovery = vgpu::Discover(options.paths.sysfs_root, inventory, catalog);
  if (!discovery.ok()) {
    report.add_vgpu_problems(std::string(discovery.status().message()));
    return;
  }
  const vgpu::ServedVgpus served = vgpu::ServedVgpusOf(*discovery, inventory, options.resource_domain);
  for (const vgpu::ServedMdev& mdev : served.mdevs) {
    rpt::Vgpu* out = report.add_vgpus();
    out->set_id(mdev.mdev->uuid);
    out->set_framework("mdev");
    out->set_type_name(mdev.mdev->type_name);
    out->set_resource_name(mdev.resource_name);
    out->set_dra_device(dra::MdevDeviceName(mdev.mdev->uuid));
    out->set_parent(mdev.mdev->parent_bdf);
    if (mdev.parent != nullptr) out->set_gpu(mdev.parent->physfn.value_or(mdev.parent->bdf));
    out->set_iommu_group(mdev.mdev->iommu_group.value_or(-1));
  }
  for (const vgpu::ServedVf& vf : served.vfs) {
    rpt::Vgpu* out = report.add_vgpus();
    out->set_id(vf.vgpu->bdf);
    out->set_framework("sriov");
    out->set_type_name(vf.vgpu->type_name);
    out->set_resource_name(vf.resource_name);
    out->set_dra_device(dra::VfDeviceName(vf.vgpu->bdf));
    out->set_gpu(vf.vgpu->pf_bdf);
    out->set_iommu_group(vf.vf->iommu_group.value_or(-1));
  }
  for (const std::string& problem : served.problems) report.add_vgpu_problems(problem);
}

}  // namespace

std::filesystem::path VgpuCatalogFile(const FlagValues& flags) {
  return std::filesystem::path(flags.Get(kStateDirFlag, "/var/lib/vfio-gpu-agent")) / "vgpu-catalog.txt";
}

absl::StatusOr<rpt::InspectReport> BuildInspectReport(const CommonOptions& options, const names::PciIdsDatabase* db,
                                                      const std::filesystem::path& vgpu_catalog_file) {
  auto inventory = pci::Scan(options.paths.sysfs_root, {.detail_vendor = options.policy.vendor_id});
  if (!inventory.ok()) return inventory.status();
  pci::Selection selection = pci::Select(*inventory, options.policy);

  auto chooser = binding::TargetDriverChooser::FromHost(options.paths);
  if (!chooser.ok()) return chooser.status();
  binding::Plan plan = binding::MakePlan(*inventory, selection, *chooser);

  // Over the GPUs and NVSwitches exactly as `serve` resolves them, so both print the same names.
  names::NameResolver resolver(db, options.resource_domain, options.name_overrides);
  const auto resolved = resolver.Resolve(plugin::AdvertisableIds(*inventory, selection));

  rpt::InspectReport report;
  report.set_schema(kInspectSchema);
  report.set_sysfs_root(options.paths.sysfs_root.string());
  report.set_iommu_enabled(inventory->iommu_enabled());
  report.set_pci_ids(db != nullptr ? db->source() : "");

  std::vector<std::string> listed = selection.gpus;
  listed.insert(listed.end(), selection.companions.begin(), selection.companions.end());
  std::sort(listed.begin(), listed.end());
  int blocked = 0, to_bind = 0, bound = 0;
  for (const auto& bdf : listed) {
    const pci::Function* fn = inventory->Find(bdf);
    auto* out = report.add_functions();
    out->set_bdf(fn->bdf);
    out->set_vendor_id(Hex4(fn->vendor_id));
    out->set_device_id(Hex4(fn->device_id));
    out->set_subsystem_vendor_id(Hex4(fn->subsystem_vendor_id));
    out->set_subsystem_device_id(Hex4(fn->subsystem_device_id));
    out->set_class_code(fn->ClassHex());
    pci::Role role = selection.RoleOf(bdf);
    out->set_role(ToReportRole(role));
    if (db != nullptr) out->set_pci_ids_name(db->DeviceName(fn->vendor_id, fn->device_id).value_or(""));
    if (role == pci::Role::kGpu || role == pci::Role::kNvSwitch) {
      auto it = resolved.find((uint32_t{fn->vendor_id} << 16) | fn->device_id);
      if (it != resolved.end()) out->set_resource_name(it->second.resource_name);
    }
    out->set_driver(fn->driver);
    out->set_driver_override(fn->driver_override);
    out->set_iommu_group(fn->iommu_group.value_or(-1));
    out->set_numa_node(fn->numa_node.value_or(-1));
    out->set_physfn(fn->physfn.value_or(""));
    if (const binding::PlannedFunction* planned = plan.Find(bdf)) {
      out->set_action(ToReportAction(planned->action));
      out->set_target_driver(planned->target_driver);
      out->set_reason(planned->reason);
    }
    switch (out->action()) {
      case rpt::BLOCKED: ++blocked; break;
      case rpt::WOULD_BIND: ++to_bind; break;
      case rpt::ALREADY_BOUND: ++bound; break;
      default: break;
    }
  }

  for (const auto& group : selection.groups) {
    auto* out = report.add_groups();
    out->set_id(group.id);
    for (const auto& member : group.members) {
      const pci::Function* fn = inventory->Find(member.bdf);
      auto* m = out->add_members();
      m->set_bdf(member.bdf);
      m->set_role(ToReportRole(member.role));
      if (fn == nullptr) continue;
      m->set_vendor_id(Hex4(fn->vendor_id));
      m->set_device_id(Hex4(fn->device_id));
      m->set_class_code(fn->ClassHex());
      m->set_driver(fn->driver);
    }
    out->set_viable(group.viable);
    for (const auto& blocker : group.blockers) out->add_blockers(blocker);
  }

  for (const auto& error : inventory->errors()) {
    auto* out = report.add_errors();
    out->set_bdf(error.bdf);
    out->set_path(error.path.string());
    out->set_message(std::string(error.status.message()));
  }
  for (const auto& [key, name] : resolved) {
    if (name.issue.empty()) continue;
    auto* out = report.add_name_issues();
    out->set_device_id(absl::StrCat(Hex4(name.vendor_id), ":", Hex4(name.device_id)));
    if (db != nullptr) out->set_raw_name(db->DeviceName(name.vendor_id, name.device_id).value_or(""));
    out->set_resource_name(name.resource_name);
    out->set_message(name.issue);
  }

  const size_t selected = selection.gpus.size();
  report.set_workload(WorkloadName(options.workload));
  if (options.workload == Workload::kVmVgpu) {
    // Nothing is bound on a vm-vgpu node: the GPUs stay on (or `run` moves them back to) nvidia, the vGPU manager,
    // and what the kubelet sees are their vGPUs.
    for (rpt::Function& fn : *report.mutable_functions()) {
      fn.set_action(rpt::STAYS);
      fn.set_target_driver("");
      fn.set_resource_name("");
      fn.set_reason(fn.driver() == "nvidia" ? "vm-vgpu: on nvidia, the vGPU manager"
                                            : absl::StrCat("vm-vgpu: `run` moves it to nvidia, the vGPU manager (now on ",
                                                           fn.driver().empty() ? "no driver" : fn.driver(), ")"));
    }
    AddServedVgpus(options, *inventory, vgpu_catalog_file, report);
    std::set<std::string> gpus, resources;
    for (const rpt::Vgpu& vgpu : report.vgpus()) {
      gpus.insert(vgpu.gpu());
      resources.insert(vgpu.resource_name());
    }
    report.set_ready(report.vgpus_size() > 0);
    report.set_summary(absl::StrFormat(
        "vm-vgpu: %d vGPU(s) on %d GPU(s) served under %d resource name(s); nothing is bound on a vm-vgpu node%s",
        report.vgpus_size(), gpus.size(), resources.size(),
        report.vgpu_problems_size() > 0 ? absl::StrCat("; ", report.vgpu_problems_size(), " problem(s)") : ""));
    return report;
  }
  report.set_ready(blocked == 0);
  if (selected == 0) {
    report.set_summary(absl::StrFormat(
        "no PCI function of vendor %04x in classes %s under %s: nothing to pass through", options.policy.vendor_id,
        absl::StrJoin(options.policy.classes, ",",
                      [](std::string* s, const pci::ClassPrefix& c) {
                        absl::StrAppend(s, absl::StrFormat("%0*x", c.bits / 4, c.value >> (24 - c.bits)));
                      }),
        options.paths.sysfs_root.string()));
  } else {
    report.set_summary(absl::StrFormat("%d GPU function(s), %d companion(s): %d already bound, %d would bind, %d blocked%s",
                                       selected, selection.companions.size(), bound, to_bind, blocked,
                                       inventory->iommu_enabled() ? "" : "; the IOMMU is off (no IOMMU groups)"));
  }
  return report;
}

std::string FormatInspectText(const rpt::InspectReport& report) {
  std::string text = absl::StrFormat("sysfs root: %s   IOMMU: %s   pci.ids: %s\n", report.sysfs_root(),
                                     report.iommu_enabled() ? "on" : "off (no IOMMU groups)",
                                     report.pci_ids().empty() ? "(none)" : report.pci_ids());
  if (report.functions_size() > 0) {
    absl::StrAppend(&text, absl::StrFormat("\n%-13s %-9s %-6s %-10s %-28s %-36s %-14s %5s %4s  %s\n", "BDF",
                                           "VID:DID", "CLASS", "ROLE", "PCI.IDS NAME", "RESOURCE", "DRIVER", "GROUP",
                                           "NUMA", "BINDING"));
    for (const auto& fn : report.functions()) {
      absl::StrAppend(
          &text, absl::StrFormat("%-13s %-9s %-6s %-10s %-28s %-36s %-14s %5s %4s  %s\n", fn.bdf(),
                                 absl::StrCat(fn.vendor_id(), ":", fn.device_id()), fn.class_code(), RoleText(fn.role()),
                                 fn.pci_ids_name().empty() ? "-" : fn.pci_ids_name(),
                                 fn.resource_name().empty() ? "-" : fn.resource_name(),
                                 fn.driver().empty() ? "(none)" : fn.driver(),
                                 fn.iommu_group() < 0 ? "-" : absl::StrCat(fn.iommu_group()),
                                 fn.numa_node() < 0 ? "-" : absl::StrCat(fn.numa_node()), ActionText(fn)));
    }
  }
  bool header = false;
  for (const auto& group : report.groups()) {
    if (group.members_size() < 2) continue;
    if (!header) {
      absl::StrAppend(&text, "\nIOMMU groups with several members:\n");
      header = true;
    }
    absl::StrAppend(&text, absl::StrFormat("  group %d (%s)\n", group.id(),
                                           group.viable() ? "viable now" : "not viable now"));
    for (const auto& m : group.members()) {
      absl::StrAppend(&text, absl::StrFormat("    %-13s %s:%s %s %-10s %s\n", m.bdf(), m.vendor_id(), m.device_id(),
                                             m.class_code(), RoleText(m.role()),
                                             m.driver().empty() ? "(no driver)" : m.driver()));
    }
    for (const auto& b : group.blockers()) absl::StrAppend(&text, "    blocker: ", b, "\n");
  }
  if (report.name_issues_size() > 0) {
    absl::StrAppend(&text, "\nresource names fixed:\n");
    for (const auto& issue : report.name_issues()) {
      absl::StrAppend(&text, "  ", issue.device_id(), " -> ", issue.resource_name(), ": ", issue.message(), "\n");
    }
  }
  if (report.errors_size() > 0) {
    absl::StrAppend(&text, "\nscan errors:\n");
    for (const auto& e : report.errors()) absl::StrAppend(&text, "  ", e.bdf(), ": ", e.message(), "\n");
  }
  if (report.workload() == "vm-vgpu") {
    absl::StrAppend(&text, FormatVgpusText(report), "\n", report.summary(), "\n");
    absl::StrAppend(&text, report.ready() ? "ready: the node serves its vGPUs; nothing to bind\n"
                                          : "NOT ready: no vGPU to serve (create them: --vgpu-config of `run`)\n");
    return text;
  }
  absl::StrAppend(&text, "\n", report.summary(), "\n");
  if (report.functions_size() > 0) {
    absl::StrAppend(&text, report.ready() ? "ready: every selected device can be passed through\n"
                                          : "NOT ready: see the blocked devices above\n");
  }
  return text;
}

std::string FormatVgpusText(const rpt::InspectReport& report) {
  std::string text;
  if (report.vgpus_size() > 0) {
    absl::StrAppend(&text, absl::StrFormat("\nvGPUs served:\n%-36s %-6s %-22s %-32s %-43s %-13s %5s\n", "VGPU", "KIND",
                                           "TYPE", "RESOURCE (device plugin)", "DRA DEVICE", "GPU", "GROUP"));
    for (const rpt::Vgpu& vgpu : report.vgpus()) {
      absl::StrAppend(&text, absl::StrFormat("%-36s %-6s %-22s %-32s %-43s %-13s %5s\n", vgpu.id(), vgpu.framework(),
                                             vgpu.type_name(), vgpu.resource_name(), vgpu.dra_device(),
                                             vgpu.gpu().empty() ? "-" : vgpu.gpu(),
                                             vgpu.iommu_group() < 0 ? "-" : absl::StrCat(vgpu.iommu_group())));
    }
  } else {
    absl::StrAppend(&text, "\nvGPUs served: none\n");
  }
  if (report.vgpu_problems_size() > 0) {
    absl::StrAppend(&text, "\nvGPUs not served:\n");
    for (const std::string& problem : report.vgpu_problems()) absl::StrAppend(&text, "  ", problem, "\n");
  }
  return text;
}

std::string FormatInspectJson(const rpt::InspectReport& report) {
  google::protobuf::util::JsonPrintOptions json;
  json.add_whitespace = true;
  json.always_print_primitive_fields = true;
  json.always_print_enums_as_ints = false;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(report, &out, json);
  return out;
}

int RunInspect(const std::vector<std::string>& args, std::ostream& out) {
  ParsedCommand cmd;
  if (auto exit = ParseCommand("inspect",
                               "Describes every selected PCI function: ids, class, pci.ids name, resource name, driver,\n"
                               "IOMMU group, NUMA node and what `bind` would do. Read-only.\n"
                               "Exit 0 when every selected device can be passed through, 1 otherwise.\n"
                               "With --workload vm-vgpu nothing is bound: the GPUs stay on nvidia (the vGPU manager), and\n"
                               "the report lists the vGPUs the node serves (mdev UUID or VF BDF, type, the device plugin's\n"
                               "resource name, the DRA driver's device name); exit 0 when it serves at least one.",
                               {{kStateDirFlag, "DIR",
                                 "--workload vm-vgpu: the agent's state dir, whose vgpu-catalog.txt names the vGPUs of full "
                                 "SR-IOV cards (read only)",
                                 "/var/lib/vfio-gpu-agent"}},
                               args, out, &cmd)) {
    return *exit;
  }
  auto db = LoadNameDatabase(cmd.common);
  auto report = BuildInspectReport(cmd.common, db.get(), VgpuCatalogFile(cmd.flags));
  if (!report.ok()) {
    std::cerr << "vfio-gpu-agent inspect: " << report.status().message() << "\n";
    return kExitError;
  }
  out << (cmd.common.json ? FormatInspectJson(*report) : FormatInspectText(*report));
  return report->ready() ? kExitOk : kExitNotReady;
}

}  // namespace vfio_agent::cli
