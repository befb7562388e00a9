#include "vfio_gpu_agent/vgpu/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <regex>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::vgpu {
namespace {

// vgpu-device-manager's two type-name shapes: time-sliced <gpu>-<GB><series> ("A10-4Q", "M60-0Q") and MIG-backed
// <gpu>-<instances>-<GB><series>[ME] ("A100-1-5C", "H200X-1-18CME").
const std::regex& TimeSlicedType() {
  static const std::regex re("^[A-Z0-9]+-(0|[1-9][0-9]*)[ABCQ]$");
  return re;
}
const std::regex& MigBackedType() {
  static const std::regex re("^[A-Z0-9]+-[1-9]-(0|[1-9][0-9]*)[ABCQ](ME)?$");
  return re;
}

// Go's strconv.ParseUint(s, 0, 32), which vgpu-device-manager reads a device filter with: 0x hex, 0 octal, decimal.
std::optional<uint32_t> ParseDeviceId(const std::string& text) {
  if (text.empty() || text[0] == '-' || text[0] == '+' || absl::ascii_isspace(text[0])) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 0);
  if (errno != 0 || end == text.c_str() || *end != '\0' || value > UINT32_MAX) return std::nullopt;
  return static_cast<uint32_t>(value);
}

absl::StatusOr<ConfigEntry> ParseEntry(const YAML::Node& node, const std::string& where) {
  if (!node.IsMap()) return absl::InvalidArgumentError(absl::StrCat(where, ": not a mapping"));
  ConfigEntry entry;
  bool has_devices = false;
  bool has_types = false;
  for (const auto& field : node) {
    const std::string key = field.first.as<std::string>();
    const YAML::Node& value = field.second;
    if (key == "devices") {
      has_devices = true;
      if (value.IsScalar() && value.as<std::string>() == "all") continue;
      if (!value.IsSequence()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": devices must be \"all\" or a list of GPU indices"));
      }
      std::vector<int> indices;
      for (const YAML::Node& index : value) {
        int parsed = -1;
        if (!index.IsScalar() || !YAML::convert<int>::decode(index, parsed) || parsed < 0) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": devices: '", YAML::Dump(index),
                                                         "' is not a GPU index"));
        }
        indices.push_back(parsed);
      }
      entry.devices = std::move(indices);
    } else if (key == "device-filter") {
      std::vector<std::string> ids;
      if (value.IsScalar()) {
        if (!value.as<std::string>().empty()) ids.push_back(value.as<std::string>());
      } else if (value.IsSequence()) {
        for (const YAML::Node& id : value) {
          if (!id.IsScalar()) return absl::InvalidArgumentError(absl::StrCat(where, ": device-filter: not a string"));
          ids.push_back(id.as<std::string>());
        }
      } else {
        return absl::InvalidArgumentError(absl::StrCat(where, ": device-filter must be a PCI id or a list of them"));
      }
      for (const std::string& id : ids) {
        const std::optional<uint32_t> parsed = ParseDeviceId(id);
        if (!parsed) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": device-filter '", id,
                                                         "' is not a PCI id (device << 16 | vendor, e.g. 0x1EB810DE)"));
        }
        entry.device_filter.push_back(*parsed);
      }
    } else if (key == "vgpu-devices") {
      has_types = true;
      if (value.IsNull()) continue;
      if (!value.IsMap()) return absl::InvalidArgumentError(absl::StrCat(where, ": vgpu-devices must be a mapping"));
      bool time_sliced = false;
      bool mig_backed = false;
      for (const auto& type : value) {
        const std::string name = type.first.as<std::string>();
        int count = 0;
        if (!type.second.IsScalar() || !YAML::convert<int>::decode(type.second, count)) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": vgpu-devices: ", name, ": not a count"));
        }
        if (std::regex_match(name, TimeSlicedType())) {
          time_sliced = true;
        } else if (std::regex_match(name, MigBackedType())) {
          mig_backed = true;
        } else {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": vgpu-devices: '", name, "' is not a vGPU type (<gpu>-<GB><series> or <gpu>-<g>-<GB><series>)"));
        }
        if (count < 1) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": vgpu-devices: ", name, ": count ", count,
                                                         " (at least 1; leave the type out for none)"));
        }
        entry.vgpu_devices[name] = count;
      }
      if (time_sliced && mig_backed) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": time-sliced and MIG-backed vGPU types cannot share a GPU"));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unexpected field '", key, "'"));
    }
  }
  if (!has_devices) return absl::InvalidArgumentError(absl::StrCat(where, ": missing required field devices"));
  if (!has_types) return absl::InvalidArgumentError(absl::StrCat(where, ": missing required field vgpu-devices"));
  return entry;
}

absl::StatusOr<VgpuConfigFile> ParseDocument(const YAML::Node& root) {
  if (!root.IsMap()) return absl::InvalidArgumentError("vGPU config: not a mapping");
  VgpuConfigFile file;
  bool has_version = false;
  for (const auto& field : root) {
    const std::string key = field.first.as<std::string>();
    if (key == "version") {
      has_version = true;
      if (!field.second.IsScalar() || field.second.as<std::string>() != "v1") {
        return absl::InvalidArgumentError(absl::StrCat("vGPU config: unknown version '", YAML::Dump(field.second),
                                                       "' (v1 is known)"));
      }
    } else if (key == "vgpu-configs") {
      if (!field.second.IsMap() || field.second.size() == 0) {
        return absl::InvalidArgumentError("vGPU config: vgpu-configs needs at least one config");
      }
      for (const auto& config : field.second) {
        const std::string name = config.first.as<std::string>();
        if (!config.second.IsSequence() || config.second.size() == 0) {
          return absl::InvalidArgumentError(absl::StrCat("vGPU config ", name, ": needs at least one entry"));
        }
        std::vector<ConfigEntry>& entries = file.configs[name];
        for (size_t i = 0; i < config.second.size(); ++i) {
          absl::StatusOr<ConfigEntry> entry =
              ParseEntry(config.second[i], absl::StrCat("vGPU config ", name, " entry ", i));
          if (!entry.ok()) return entry.status();
          entries.push_back(*std::move(entry));
        }
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("vGPU config: unexpected field '", key, "'"));
    }
  }
  if (!has_version && !file.configs.empty()) {
    return absl::InvalidArgumentError("vGPU config: missing version field");
  }
  return file;
}

bool Matches(const ConfigEntry& entry, const ConfigGpu& gpu) {
  if (entry.devices && std::find(entry.devices->begin(), entry.devices->end(), gpu.index) == entry.devices->end()) {
    return false;
  }
  if (entry.device_filter.empty()) return true;
  const uint32_t id = (static_cast<uint32_t>(gpu.device_id) << 16) | gpu.vendor_id;
  return std::find(entry.device_filter.begin(), entry.device_filter.end(), id) != entry.device_filter.end();
}

}  // namespace

absl::StatusOr<VgpuConfigFile> ParseVgpuConfig(std::string_view yaml) {
  try {
    return ParseDocument(YAML::Load(std::string(yaml)));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("vGPU config: not YAML: ", e.what()));
  }
}

absl::StatusOr<VgpuConfigFile> LoadVgpuConfig(const std::filesystem::path& file) {
  absl::StatusOr<std::string> text = fs::ReadTrimmed(file);
  if (!text.ok()) return text.status();
  absl::StatusOr<VgpuConfigFile> parsed = ParseVgpuConfig(*text);
  if (!parsed.ok()) return absl::Status(parsed.status().code(), absl::StrCat(file.string(), ": ", parsed.status().message()));
  return parsed;
}

std::string ShortTypeName(std::string_view type_name) {
  const std::string trimmed(absl::StripAsciiWhitespace(std::string(type_name)));
  const size_t space = trimmed.find_last_of(" \t");
  return space == std::string::npos ? trimmed : trimmed.substr(space + 1);
}

absl::StatusOr<std::map<std::string, std::map<std::string, int>>> DesiredTypes(const VgpuConfigFile& file,
                                                                              std::string_view name,
                                                                              const std::vector<ConfigGpu>& gpus) {
  const std::string config_name(name);
  auto config = file.configs.find(config_name);
  if (config == file.configs.end()) {
    std::vector<std::string> known;
    for (const auto& [known_name, entries] : file.configs) known.push_back(known_name);
    return absl::NotFoundError(absl::StrCat("vGPU config '", config_name, "' is not in the file (it has: ",
                                            absl::StrJoin(known, ", "), ")"));
  }
  std::map<std::string, std::map<std::string, int>> desired;
  for (const ConfigGpu& gpu : gpus) {
    std::optional<size_t> matched;
    for (size_t i = 0; i < config->second.size(); ++i) {
      if (!Matches(config->second[i], gpu)) continue;
      if (matched) {
        return absl::InvalidArgumentError(absl::StrCat("vGPU config '", config_name, "': GPU ", gpu.index, " (", gpu.bdf,
                                                       ") is matched by entries ", *matched, " and ", i));
      }
      matched = i;
    }
    if (matched) desired[gpu.bdf] = config->second[*matched].vgpu_devices;
  }
  return desired;
}

GpuChange PlanGpu(const std::vector<ExistingVgpu>& existing, const std::map<std::string, int>& desired) {
  std::map<std::string, std::vector<const ExistingVgpu*>> by_type;
  for (const ExistingVgpu& vgpu : existing) by_type[vgpu.type].push_back(&vgpu);
  GpuChange change;
  for (auto& [type, vgpus] : by_type) {
    auto want_it = desired.find(type);
    const int want = want_it == desired.end() ? 0 : want_it->second;
    int surplus = static_cast<int>(vgpus.size()) - want;
    // Free ones go first; among equals the order is the ids', so a repeated pass plans the same.
    std::sort(vgpus.begin(), vgpus.end(), [](const ExistingVgpu* a, const ExistingVgpu* b) {
      return std::tie(a->held, a->id) < std::tie(b->held, b->id);
    });
    for (const ExistingVgpu* vgpu : vgpus) {
      if (surplus <= 0) break;
      (vgpu->held ? change.deferred : change.remove).push_back(vgpu->id);
      --surplus;
    }
  }
  // A held vGPU of an unwanted type still takes the room (and, on most GPUs, the one type a GPU runs at a time)
  // the new ones need: create once it is freed.
  if (change.deferred.empty()) {
    for (const auto& [type, want] : desired) {
      auto have = by_type.find(type);
      const int count = have == by_type.end() ? 0 : static_cast<int>(have->second.size());
      if (want > count) change.create[type] = want - count;
    }
  }
  std::sort(change.remove.begin(), change.remove.end());
  std::sort(change.deferred.begin(), change.deferred.end());
  return change;
}

}  // namespace vfio_agent::vgpu
