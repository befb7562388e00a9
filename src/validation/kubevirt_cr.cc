#include "kubevirt_cr.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <functional>
#include <charconv>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace vfio_agent::validation {
namespace {

// The node at `path` below `root`, or an undefined node when any step is missing or not a map.
YAML::Node Walk(const YAML::Node& root, std::initializer_list<const char*> path) {
  YAML::Node node = root;
  for (const char* key : path) {
    if (!node.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    // reset, not assignment: assigning one YAML::Node to another overwrites the referenced node in the tree.
    node.reset(node[key]);
    if (!node.IsDefined() || node.IsNull()) return YAML::Node(YAML::NodeType::Undefined);
  }
  return node;
}

std::string ScalarOr(const YAML::Node& node, const std::string& fallback = "") {
  return node.IsDefined() && node.IsScalar() ? node.Scalar() : fallback;
}

bool IsKubevirt(const YAML::Node& node) { return node.IsMap() && ScalarOr(node["kind"]) == "KubeVirt"; }

// Every KubeVirt object in a document: the object itself, or the items of a List (kind List or KubeVirtList).
void Collect(const YAML::Node& doc, std::vector<YAML::Node>* out) {
  if (IsKubevirt(doc)) {
    out->push_back(doc);
    return;
  }
  if (!doc.IsMap()) return;
  const YAML::Node items = doc["items"];
  if (!items.IsDefined() || !items.IsSequence()) return;
  for (const YAML::Node& item : items) {
    if (IsKubevirt(item)) out->push_back(item);
  }
}

// `externalResourceProvider` of entry `where`: nullopt when absent.
absl::StatusOr<std::optional<bool>> ExternalProvider(const YAML::Node& item, const std::string& where) {
  const YAML::Node external = item["externalResourceProvider"];
  if (!external.IsDefined() || external.IsNull()) return std::nullopt;
  // YAML 1.2 / JSON booleans only: KubeVirt's API server rejects "yes", and so does a Go bool.
  const std::string text = ScalarOr(external);
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  return absl::InvalidArgumentError(
      absl::StrCat(where, ".externalResourceProvider is not a boolean: \"", text, "\""));
}

// The entries of permittedHostDevices.<list>, each map handed to `add` with its index; a list that is absent is
// empty.
absl::Status ForEachEntry(const YAML::Node& object, const char* list,
                          const std::function<absl::Status(const YAML::Node&, int)>& add) {
  const YAML::Node entries = Walk(object, {"spec", "configuration", "permittedHostDevices", list});
  if (!entries.IsDefined()) return absl::OkStatus();
  if (!entries.IsSequence()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.configuration.permittedHostDevices.", list, " is not a list"));
  }
  int index = 0;
  for (const YAML::Node& item : entries) {
    if (!item.IsMap()) return absl::InvalidArgumentError(absl::StrCat(list, "[", index, "] is not an object"));
    if (absl::Status status = add(item, index); !status.ok()) return status;
    ++index;
  }
  return absl::OkStatus();
}

absl::Status ParsePciHostDevices(const YAML::Node& object, KubevirtCr* cr) {
  return ForEachEntry(object, "pciHostDevices", [&](const YAML::Node& item, int index) -> absl::Status {
    PciHostDeviceEntry entry{.index = index, .pci_vendor_selector = ScalarOr(item["pciVendorSelector"]),
                             .resource_name = ScalarOr(item["resourceName"])};
    absl::StatusOr<std::optional<bool>> external = ExternalProvider(item, absl::StrCat("pciHostDevices[", index, "]"));
    if (!external.ok()) return external.status();
    entry.external_resource_provider = *external;
    cr->pci_host_devices.push_back(std::move(entry));
    return absl::OkStatus();
  });
}

absl::Status ParseMediatedDevices(const YAML::Node& object, KubevirtCr* cr) {
  return ForEachEntry(object, "mediatedDevices", [&](const YAML::Node& item, int index) -> absl::Status {
    MediatedDeviceEntry entry{.index = index, .mdev_name_selector = ScalarOr(item["mdevNameSelector"]),
                              .resource_name = ScalarOr(item["resourceName"])};
    absl::StatusOr<std::optional<bool>> external = ExternalProvider(item, absl::StrCat("mediatedDevices[", index, "]"));
    if (!external.ok()) return external.status();
    entry.external_resource_provider = *external;
    cr->mediated_devices.push_back(std::move(entry));
    return absl::OkStatus();
  });
}

absl::StatusOr<KubevirtCr> Describe(const YAML::Node& object, int objects) {
  KubevirtCr cr;
  cr.objects = objects;
  cr.name = ScalarOr(Walk(object, {"metadata", "name"}));
  cr.namespace_ = ScalarOr(Walk(object, {"metadata", "namespace"}));

  cr.observed_version = ScalarOr(Walk(object, {"status", "observedKubeVirtVersion"}));
  for (auto [field, into] : {std::pair{"featureGates", &cr.feature_gates},
                             std::pair{"disabledFeatureGates", &cr.disabled_feature_gates}}) {
    const YAML::Node gates = Walk(object, {"spec", "configuration", "developerConfiguration", field});
    if (!gates.IsDefined()) continue;
    if (!gates.IsSequence()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.configuration.developerConfiguration.", field, " is not a list"));
    }
    for (const YAML::Node& gate : gates) {
      if (gate.IsScalar()) into->push_back(gate.Scalar());
    }
  }

  const YAML::Node permitted = Walk(object, {"spec", "configuration", "permittedHostDevices"});
  cr.has_permitted_host_devices = permitted.IsDefined();
  if (absl::Status status = ParsePciHostDevices(object, &cr); !status.ok()) return status;
  if (absl::Status status = ParseMediatedDevices(object, &cr); !status.ok()) return status;
  return cr;
}

// yaml-cpp 0.7's LoadAll loops forever, allocating, on a document that ends at a token no rule consumes (a ','
// outside every flow collection: ",", "x: {a: 1} ,", "x\n!, y"; found by tests/fuzz): the parser then hands back an
// empty document at that same token, again and again (fixed upstream after 0.8, jbeder/yaml-cpp#1319). Walking the
// documents with a handler that builds nothing, the loop is a document that starts where the previous one did.
class DocumentStarts final : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override { start = mark.pos; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
  int start = -1;
};

// False when LoadAll would never return; throws YAML::Exception as LoadAll would on other malformed text.
bool LoadAllEnds(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts handler;
  int previous = -1;
  while (parser.HandleNextDocument(handler)) {
    if (handler.start <= previous) return false;
    previous = handler.start;
  }
  return true;
}

// Control characters other than tab and line ends are not YAML at all (yaml-cpp would skip NULs).
bool HasControlCharacters(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](unsigned char c) {
    return (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f;
  });
}

}  // namespace

absl::StatusOr<KubevirtCr> ParseKubevirtCr(std::string_view text) {
  if (HasControlCharacters(text)) return absl::InvalidArgumentError("not YAML or JSON: control characters");
  std::vector<YAML::Node> docs;
  try {
    const std::string input(text);
    if (!LoadAllEnds(input)) {
      return absl::InvalidArgumentError("not YAML or JSON: a token no YAML rule accepts (e.g. a ',' outside [] or {})");
    }
    docs = YAML::LoadAll(input);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not YAML or JSON: line ", e.mark.line + 1, " column ",
                                                   e.mark.column + 1, ": ", e.msg));
  }
  try {
    std::vector<YAML::Node> objects;
    for (const YAML::Node& doc : docs) Collect(doc, &objects);
    if (objects.empty()) return absl::NotFoundError("no object of kind KubeVirt in the text");
    return Describe(objects.front(), static_cast<int>(objects.size()));
  } catch (const YAML::Exception& e) {
    // Reached only through shapes the walk does not expect (e.g. a key that is itself a map).
    return absl::InvalidArgumentError(absl::StrCat("unexpected KubeVirt CR shape: ", e.msg));
  }
}

std::optional<std::pair<uint16_t, uint16_t>> ParsePciVendorSelector(std::string_view selector) {
  const size_t colon = selector.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  const std::string_view parts[2] = {selector.substr(0, colon), selector.substr(colon + 1)};
  uint16_t ids[2];
  for (int i = 0; i < 2; ++i) {
    std::string_view part = parts[i];
    if (part.size() != 4) return std::nullopt;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), ids[i], 16);
    if (ec != std::errc() || end != part.data() + part.size()) return std::nullopt;
  }
  return std::make_pair(ids[0], ids[1]);
}

}  // namespace vfio_agent::validation
