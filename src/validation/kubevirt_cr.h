// The parts of a KubeVirt CR the validator reads, from its text (YAML or JSON: `kubectl get kubevirt -A -o yaml`,
// `-o json`, one object or a List). A pure function of the text, so it can be fuzzed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace vfio_agent::validation {

// One spec.configuration.permittedHostDevices.pciHostDevices entry, as written.
struct PciHostDeviceEntry {
  int index = 0;                   // position in the list, for evidence ("pciHostDevices[3]")
  std::string pci_vendor_selector;  // "10DE:2335" (any case)
  std::string resource_name;
  std::optional<bool> external_resource_provider;  // nullopt when the field is absent (KubeVirt: false)
};

// One spec.configuration.permittedHostDevices.mediatedDevices entry, as written. KubeVirt compares the selector
// with each mdev's mdev_type/name after turning every space of both into '_' (virt-handler device_controller.go
// removeSelectorSpaces, mediated_device.go getMdevTypeName).
struct MediatedDeviceEntry {
  int index = 0;
  std::string mdev_name_selector;  // "GRID T4-1Q" or "GRID_T4-1Q"
  std::string resource_name;
  std::optional<bool> external_resource_provider;
};

struct KubevirtCr {
  std::string name;       // metadata.name
  std::string namespace_;  // metadata.namespace
  int objects = 0;        // KubeVirt objects found in the text; the first is the one described here
  bool has_permitted_host_devices = false;  // spec.configuration.permittedHostDevices present
  std::vector<PciHostDeviceEntry> pci_host_devices;
  std::vector<MediatedDeviceEntry> mediated_devices;
  std::vector<std::string> feature_gates;  // spec.configuration.developerConfiguration.featureGates
  // spec.configuration.developerConfiguration.disabledFeatureGates: turns off a Beta gate (on by default)
  std::vector<std::string> disabled_feature_gates;
  std::string observed_version;  // status.observedKubeVirtVersion ("v1.9.0"); "" before the operator reports one
};

// InvalidArgument for text that is not YAML/JSON (with the parser's line), NotFound when it holds no object of
// kind KubeVirt, InvalidArgument when a field the validator reads has the wrong shape (with its path).
absl::StatusOr<KubevirtCr> ParseKubevirtCr(std::string_view text);

// "10DE:2335" / "10de:2335" -> (0x10de, 0x2335); nullopt for anything else.
std::optional<std::pair<uint16_t, uint16_t>> ParsePciVendorSelector(std::string_view selector);

}  // namespace vfio_agent::validation
