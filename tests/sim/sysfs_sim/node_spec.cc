#include "node_spec.h"

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"
#include "sim/v1/node.pb.h"

namespace vfio_agent::sim {
namespace {

constexpr std::pair<absl::string_view, int> kErrnos[] = {
    {"0", 0},           {"EPERM", EPERM},   {"ENOENT", ENOENT}, {"EIO", EIO},         {"ENXIO", ENXIO},
    {"EAGAIN", EAGAIN}, {"ENOMEM", ENOMEM}, {"EACCES", EACCES}, {"EBUSY", EBUSY},     {"EEXIST", EEXIST},
    {"ENODEV", ENODEV}, {"EINVAL", EINVAL}, {"ENOSPC", ENOSPC}, {"ENOTSUP", ENOTSUP}, {"ETIMEDOUT", ETIMEDOUT},
    {"ERANGE", ERANGE}, {"EUSERS", EUSERS},
};

absl::StatusOr<uint32_t> ParseHex(absl::string_view text, uint32_t max, absl::string_view field,
                                  absl::string_view bdf) {
  absl::string_view digits = absl::StripAsciiWhitespace(text);
  if (absl::StartsWith(digits, "0x") || absl::StartsWith(digits, "0X")) digits.remove_prefix(2);
  uint32_t value = 0;
  if (digits.empty() || !absl::SimpleHexAtoi(digits, &value) || value > max) {
    return absl::InvalidArgumentError(absl::StrCat("device ", bdf, ": bad hex ", field, " \"", text, "\""));
  }
  return value;
}

absl::StatusOr<VgpuSpec> ConvertVgpu(const v1::Vgpu& v, absl::string_view bdf) {
  VgpuSpec spec;
  const auto where = absl::StrCat("device ", bdf, ": vgpu: ");
  if (v.framework().empty() && v.types().empty()) return spec;
  if (v.framework() == "mdev") {
    spec.framework = VgpuFramework::kMdev;
  } else if (v.framework() == "mdev_vf") {
    spec.framework = VgpuFramework::kMdevVf;
  } else if (v.framework() == "sriov") {
    spec.framework = VgpuFramework::kSriov;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(where, "framework is mdev, mdev_vf or sriov"));
  }
  if (v.has_one_type_at_a_time()) spec.one_type_at_a_time = v.one_type_at_a_time();
  std::set<std::string> ids;
  for (const auto& t : v.types()) {
    int numeric = 0;
    const bool id_ok = spec.framework == VgpuFramework::kSriov
                           ? absl::SimpleAtoi(t.id(), &numeric) && numeric > 0
                           : absl::StartsWith(t.id(), "nvidia-") && t.id().find('/') == std::string::npos;
    if (!id_ok || t.name().empty() || t.max_instances() == 0 || t.max_instances() > 64 || !ids.insert(t.id()).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, "type \"", t.id(),
                                                     "\" needs a unique id (nvidia-<N> for mdev, a number > 0 for "
                                                     "sriov), a name and max_instances 1-64"));
    }
    spec.types.push_back({t.id(), t.name(), static_cast<int>(t.max_instances()),
                          t.description().empty() ? absl::StrCat("max_instance=", t.max_instances())
                                                  : t.description()});
  }
  return spec;
}

absl::StatusOr<DeviceSpec> Convert(const v1::Device& d) {
  DeviceSpec s;
  s.bdf = absl::AsciiStrToLower(d.bdf());
  if (!IsValidBdf(s.bdf)) return absl::InvalidArgumentError(absl::StrCat("bad bdf \"", d.bdf(), "\""));
  auto hex16 = [&](const std::string& text, absl::string_view field, absl::string_view fallback,
                   uint16_t& out) -> absl::Status {
    auto v = ParseHex(text.empty() ? fallback : text, 0xffff, field, s.bdf);
    if (!v.ok()) return v.status();
    out = static_cast<uint16_t>(*v);
    return absl::OkStatus();
  };
  if (auto st = hex16(d.vendor(), "vendor", "", s.vendor); !st.ok()) return st;
  if (auto st = hex16(d.device(), "device", "", s.device); !st.ok()) return st;
  if (auto st = hex16(d.subsystem_vendor(), "subsystem_vendor", d.vendor(), s.subsystem_vendor); !st.ok()) return st;
  if (auto st = hex16(d.subsystem_device(), "subsystem_device", "0000", s.subsystem_device); !st.ok()) return st;
  auto cls = ParseHex(d.class_(), 0xffffff, "class", s.bdf);
  if (!cls.ok()) return cls.status();
  s.class_code = *cls;
  auto rev = ParseHex(d.revision().empty() ? "a1" : d.revision(), 0xff, "revision", s.bdf);
  if (!rev.ok()) return rev.status();
  s.revision = static_cast<uint8_t>(*rev);
  if (d.header_type() > 0xff) return absl::InvalidArgumentError(absl::StrCat("device ", s.bdf, ": bad header_type"));
  s.header_type = static_cast<uint8_t>(d.header_type());
  s.numa_node = d.has_numa_node() ? d.numa_node() : -1;
  s.iommu_group = d.has_iommu_group() ? d.iommu_group() : -1;
  if (s.numa_node < -1 || s.iommu_group < -1) {
    return absl::InvalidArgumentError(absl::StrCat("device ", s.bdf, ": numa_node/iommu_group below -1"));
  }
  s.driver = d.driver();
  s.default_driver = d.default_driver().empty() ? d.driver() : d.default_driver();
  s.parent = absl::AsciiStrToLower(d.parent());
  s.physfn = absl::AsciiStrToLower(d.physfn());
  for (const auto& c : d.consumers()) s.consumers.push_back(absl::AsciiStrToLower(c));
  s.unbind_delay_ms = d.faults().unbind_delay_ms();
  if (s.unbind_delay_ms < -1) return absl::InvalidArgumentError(absl::StrCat("device ", s.bdf, ": unbind_delay_ms < -1"));
  s.dead = d.faults().dead();
  s.removed = d.faults().removed();
  if (!d.faults().bind_errno().empty()) {
    auto err = ErrnoFromName(d.faults().bind_errno());
    if (!err) return absl::InvalidArgumentError(absl::StrCat("device ", s.bdf, ": unknown errno \"", d.faults().bind_errno(), "\""));
    s.bind_errno = *err;
  }
  for (const auto& bar : d.bars()) {
    const uint64_t size = bar.size();
    if (bar.index() > 5 || size == 0 || (size & (size - 1)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("device ", s.bdf, ": BAR ", bar.index(),
                                                     " needs index 0-5 and a power-of-two size"));
    }
    s.bars.push_back({static_cast<int>(bar.index()), size, bar.is_64bit(), bar.prefetchable(), bar.unassigned()});
  }
  if (!d.power_state().empty()) {
    if (d.power_state() != "D0" && d.power_state() != "D3hot" && d.power_state() != "D3cold") {
      return absl::InvalidArgumentError(absl::StrCat("device ", s.bdf, ": power_state is D0, D3hot or D3cold"));
    }
    s.power_state = d.power_state();
  }
  if (d.has_d3cold_allowed()) s.d3cold_allowed = d.d3cold_allowed();
  if (d.has_reset_method()) s.reset_method = d.reset_method();
  s.sriov_totalvfs = static_cast<int>(d.sriov_totalvfs());
  s.mdev = d.mdev();
  if (auto vgpu = ConvertVgpu(d.vgpu(), s.bdf); vgpu.ok()) {
    s.vgpu = *std::move(vgpu);
  } else {
    return vgpu.status();
  }
  if (d.has_sriov_vf_offset()) s.sriov_vf_offset = static_cast<int>(d.sriov_vf_offset());
  if (d.has_sriov_vf_stride()) s.sriov_vf_stride = static_cast<int>(d.sriov_vf_stride());
  if (s.sriov_vf_offset < 1 || s.sriov_vf_stride < 1 || s.sriov_totalvfs > 256) {
    return absl::InvalidArgumentError(absl::StrCat("device ", s.bdf, ": sriov_vf_offset/stride >= 1, sriov_totalvfs <= 256"));
  }
  return s;
}

// Cross-device rules; also orders parents before children so the tree can be built in one pass.
absl::Status Check(NodeSpec& node) {
  std::set<std::string> drivers(node.drivers.begin(), node.drivers.end());
  std::map<std::string, const DeviceSpec*> by_bdf;
  for (const auto& d : node.devices) {
    if (!by_bdf.emplace(d.bdf, &d).second) return absl::InvalidArgumentError(absl::StrCat("duplicate bdf ", d.bdf));
  }
  for (const auto& d : node.devices) {
    auto where = absl::StrCat("device ", d.bdf, ": ");
    if (!d.driver.empty() && !drivers.count(d.driver)) {
      return absl::InvalidArgumentError(absl::StrCat(where, "driver ", d.driver, " is not in drivers"));
    }
    if (!node.iommu && d.iommu_group >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, "iommu_group set but the node has iommu off"));
    }
    if (d.driver.find("vfio") != std::string::npos && (d.iommu_group < 0 || d.IsBridge())) {
      return absl::InvalidArgumentError(absl::StrCat(where, "bound to ", d.driver, " without an IOMMU group"));
    }
    if (!d.parent.empty()) {
      auto it = by_bdf.find(d.parent);
      if (it == by_bdf.end() || !it->second->IsBridge()) {
        return absl::InvalidArgumentError(absl::StrCat(where, "parent ", d.parent, " is not a bridge of this node"));
      }
    }
    if (!d.parent.empty() && by_bdf.at(d.parent)->removed && !d.removed) {
      return absl::InvalidArgumentError(absl::StrCat(where, "present below removed bridge ", d.parent));
    }
    if (!d.physfn.empty() && (!by_bdf.count(d.physfn) || d.physfn == d.bdf)) {
      return absl::InvalidArgumentError(absl::StrCat(where, "physfn ", d.physfn, " is not a device of this node"));
    }
    if (d.vgpu.framework != VgpuFramework::kNone && !d.physfn.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "vgpu belongs on the PF, not on a VF"));
    }
    if ((d.vgpu.framework == VgpuFramework::kMdevVf || d.vgpu.framework == VgpuFramework::kSriov) &&
        d.sriov_totalvfs == 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, "vgpu framework needs sriov_totalvfs > 0"));
    }
    for (const auto& c : d.consumers) {
      if (!by_bdf.count(c) || c == d.bdf) {
        return absl::InvalidArgumentError(absl::StrCat(where, "consumer ", c, " is not a device of this node"));
      }
    }
  }
  auto depth = [&](const DeviceSpec& d) {
    int n = 0;
    for (const DeviceSpec* p = &d; !p->parent.empty(); p = by_bdf.at(p->parent)) {
      if (++n > static_cast<int>(node.devices.size())) return -1;
    }
    return n;
  };
  for (const auto& d : node.devices) {
    if (depth(d) < 0) return absl::InvalidArgumentError(absl::StrCat("device ", d.bdf, ": parent cycle"));
  }
  std::stable_sort(node.devices.begin(), node.devices.end(),
                   [&](const DeviceSpec& a, const DeviceSpec& b) { return depth(a) < depth(b); });
  return absl::OkStatus();
}

}  // namespace

bool IsValidBdf(absl::string_view bdf) {
  if (bdf.size() != 12 || bdf[4] != ':' || bdf[7] != ':' || bdf[10] != '.') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9}) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(bdf[i]))) return false;
  }
  return bdf[11] >= '0' && bdf[11] <= '7';
}

std::optional<int> ErrnoFromName(absl::string_view name) {
  for (const auto& [n, e] : kErrnos) {
    if (n == name) return e;
  }
  return std::nullopt;
}

std::string ErrnoName(int err) {
  for (const auto& [n, e] : kErrnos) {
    if (e == err) return std::string(n);
  }
  return absl::StrCat("E", err);
}

std::string WithErrno(std::string line, int err) { return err ? absl::StrCat(line, " ", ErrnoName(err)) : line; }

absl::StatusOr<NodeSpec> ParseNode(absl::string_view json, absl::string_view origin) {
  v1::Node proto;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto parsed = google::protobuf::util::JsonStringToMessage(std::string(json), &proto, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", parsed.ToString()));
  }
  NodeSpec node;
  node.description = proto.description();
  node.iommu = proto.iommu();
  node.drivers.assign(proto.drivers().begin(), proto.drivers().end());
  const v1::Platform& platform = proto.platform();
  if (!platform.iommu_vendor().empty() && platform.iommu_vendor() != "intel" && platform.iommu_vendor() != "amd") {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": platform.iommu_vendor is intel or amd"));
  }
  node.platform.amd = platform.iommu_vendor() == "amd";
  if (platform.has_acpi_table()) node.platform.acpi_table = platform.acpi_table();
  if (platform.has_interrupt_remapping()) node.platform.interrupt_remapping = platform.interrupt_remapping();
  node.platform.allow_unsafe_interrupts = platform.allow_unsafe_interrupts();
  node.platform.disable_idle_d3 = platform.disable_idle_d3();
  node.platform.cmdline = platform.cmdline();
  if (node.platform.cmdline.empty()) {
    node.platform.cmdline = "BOOT_IMAGE=/boot/vmlinuz root=/dev/sda1 ro quiet";
    if (node.iommu) absl::StrAppend(&node.platform.cmdline, node.platform.amd ? " amd_iommu=on" : " intel_iommu=on", " iommu=pt");
  }
  if (platform.phys_bits() != 0) node.platform.phys_bits = static_cast<int>(platform.phys_bits());
  node.platform.iommufd = platform.iommufd();
  if (!platform.lockdown().empty()) node.platform.lockdown = platform.lockdown();
  node.platform.modules.assign(platform.modules().begin(), platform.modules().end());
  node.platform.missing_modules.assign(platform.missing_modules().begin(), platform.missing_modules().end());
  for (const auto& d : proto.devices()) {
    auto spec = Convert(d);
    if (!spec.ok()) return absl::InvalidArgumentError(absl::StrCat(origin, ": ", spec.status().message()));
    node.devices.push_back(*std::move(spec));
  }
  if (auto st = Check(node); !st.ok()) return absl::InvalidArgumentError(absl::StrCat(origin, ": ", st.message()));
  return node;
}

absl::StatusOr<NodeSpec> LoadNode(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read node file ", file.string()));
  std::stringstream text;
  text << in.rdbuf();
  return ParseNode(text.str(), file.string());
}

}  // namespace vfio_agent::sim
