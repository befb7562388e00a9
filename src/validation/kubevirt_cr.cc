#include "kubevirt_cr.h"

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <charconv>

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

std::string ScalarOr(const YAML::Node& node, std::string fallback = "") {
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

absl::StatusOr<KubevirtCr> Describe(const YAML::Node& object, int objects) {
  KubevirtCr cr;
  cr.objects = objects;
  cr.name = ScalarOr(Walk(object, {"metadata", "name"}));
  cr.namespace_ = ScalarOr(Walk(object, {"metadata", "namespace"}));

  const YAML::Node gates = Walk(object, {"spec", "configuration", "developerConfiguration", "featureGates"});
  if (gates.IsDefined()) {
    if (!gates.IsSequence()) {
      return absl::InvalidArgumentError("spec.configuration.developerConfiguration.featureGates is not a list");
    }
    for (const YAML::Node& gate : gates) {
      if (gate.IsScalar()) cr.feature_gates.push_back(gate.Scalar());
    }
  }

  const YAML::Node permitted = Walk(object, {"spec", "configuration", "permittedHostDevices"});
  cr.has_permitted_host_devices = permitted.IsDefined();
  const YAML::Node pci = Walk(object, {"spec", "configuration", "permittedHostDevices", "pciHostDevices"});
  if (!pci.IsDefined()) return cr;
  if (!pci.IsSequence()) {
    return absl::InvalidArgumentError("spec.configuration.permittedHostDevices.pciHostDevices is not a list");
  }
  int index = 0;
  for (const YAML::Node& item : pci) {
    PciHostDeviceEntry entry;
    entry.index = index++;
    if (!item.IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat("pciHostDevices[", entry.index, "] is not an object"));
    }
    entry.pci_vendor_selector = ScalarOr(item["pciVendorSelector"]);
    entry.resource_name = ScalarOr(item["resourceName"]);
    const YAML::Node external = item["externalResourceProvider"];
    if (external.IsDefined() && !external.IsNull()) {
      bool value = false;
      // YAML 1.2 / JSON booleans only: KubeVirt's API server rejects "yes", and so does a Go bool.
      const std::string text = ScalarOr(external);
      if (text == "true" || text == "True" || text == "TRUE") {
        value = true;
      } else if (!(text == "false" || text == "False" || text == "FALSE")) {
        return absl::InvalidArgumentError(absl::StrCat("pciHostDevices[", entry.index,
                                                       "].externalResourceProvider is not a boolean: \"", text,
                                                       "\""));
      }
      entry.external_resource_provider = value;
    }
    cr.pci_host_devices.push_back(std::move(entry));
  }
  return cr;
}

// yaml-cpp 0.7 loops forever on some text that is neither kubectl's YAML nor its JSON, e.g. a flow entry ',' at a
// document's top level (",", "{a: 1}, x", "\"x\","; found by tests/fuzz). kubectl prints a document either as
// JSON (starting with '{' or '[') or as block YAML starting with a plain key or a '-' item, so a document that
// starts like JSON must be valid JSON (checked by nlohmann's parser, which always ends) and one that starts with
// anything else (',', a quote, a tag) is refused before yaml-cpp sees it, as is text with control characters.
// True if a ',' starts a token outside every flow collection: not YAML (no plain scalar starts with ','), and
// yaml-cpp 0.7 loops forever on it ("  a: b\n  , c", "x: {a: 1} ,"). Quoted scalars, comments and the lines of
// block scalars are skipped; a quote opens a quoted scalar only where a token starts.
bool HasBlockFlowEntry(std::string_view text) {
  int depth = 0;
  bool token_start = true;  // nothing but blanks since the line start, an indicator, or the end of a token
  int block_scalar_indent = -1;  // skipping the lines of a block scalar more indented than this
  int line_indent = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (i == 0 || text[i - 1] == '\n') {
      line_indent = 0;
      while (i + line_indent < text.size() && text[i + line_indent] == ' ') ++line_indent;
      const bool blank = i + line_indent >= text.size() || text[i + line_indent] == '\n';
      if (block_scalar_indent >= 0 && (blank || line_indent > block_scalar_indent)) {
        while (i < text.size() && text[i] != '\n') ++i;
        continue;
      }
      block_scalar_indent = -1;
      token_start = true;
      // A document marker ends every flow collection a document left open: no collection spans documents.
      if (line_indent == 0 && (text.substr(i, 3) == "---" || text.substr(i, 3) == "...")) depth = 0;
    }
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      if (c == '\n') token_start = true;
      continue;
    }
    if (c == '#' && (i == 0 || std::string_view(" \t\n").find(text[i - 1]) != std::string_view::npos)) {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      continue;
    }
    if ((c == '"' || c == '\'') && token_start) {
      for (++i; i < text.size() && text[i] != c; ++i) {
        if (c == '"' && text[i] == '\\') ++i;
      }
      token_start = true;  // what follows a quoted scalar starts a new token
      continue;
    }
    if (c == ',' && depth == 0 && token_start) return true;
    if ((c == '!' || c == '&' || c == '*') && token_start) {
      // A tag, anchor or alias ends at a blank or a flow indicator, and what follows starts a token: the ','
      // of "x\n!, y" is then a flow entry outside every flow collection.
      while (i + 1 < text.size() && std::string_view(" \t\r\n,[]{}").find(text[i + 1]) == std::string_view::npos) ++i;
      token_start = true;
      continue;
    }
    if ((c == '{' || c == '[') && (token_start || depth > 0)) {  // "v1[a" is a plain scalar
      ++depth;
      token_start = true;
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
      token_start = true;
    } else if ((c == '|' || c == '>') && token_start && depth == 0) {
      block_scalar_indent = line_indent;
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
    } else {
      // ':', '-' and '?' followed by a blank are indicators: the next token starts after the blanks.
      const bool indicator = (c == ':' || c == '-' || c == '?' || c == ',') &&
                             (i + 1 >= text.size() || std::string_view(" \t\r\n").find(text[i + 1]) != std::string_view::npos);
      token_start = indicator;
    }
  }
  return false;
}

bool SafeForYamlCpp(std::string_view text) {
  // Control characters other than tab and line ends are not allowed in YAML at all (yaml-cpp skips NULs).
  for (unsigned char c : text) {
    if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f) return false;
  }
  if (HasBlockFlowEntry(text)) return false;
  size_t doc_start = 0;
  while (doc_start <= text.size()) {
    size_t doc_end = text.find("\n---", doc_start);
    if (doc_end == std::string_view::npos) doc_end = text.size();
    std::string_view doc = text.substr(doc_start, doc_end - doc_start);
    size_t i = 0;
    while (i < doc.size()) {  // blanks, comments, directives and the document marker itself
      if (std::string_view(" \t\r\n").find(doc[i]) != std::string_view::npos) {
        ++i;
      } else if (doc[i] == '#' || doc[i] == '%') {
        while (i < doc.size() && doc[i] != '\n') ++i;
      } else if (doc.substr(i, 3) == "---" || doc.substr(i, 3) == "...") {
        i += 3;
      } else {
        break;
      }
    }
    if (i < doc.size()) {
      const char first = doc[i];
      const bool plain_key = std::isalnum(static_cast<unsigned char>(first)) || first == '_' || first == '-';
      if (!plain_key && first != '{' && first != '[') return false;
      if ((first == '{' || first == '[') && !nlohmann::json::accept(doc.substr(i))) return false;
    }
    doc_start = doc_end + 1;
  }
  return true;
}

}  // namespace

absl::StatusOr<KubevirtCr> ParseKubevirtCr(std::string_view text) {
  if (!SafeForYamlCpp(text)) {
    return absl::InvalidArgumentError(
        "not kubectl's YAML or JSON: control characters, a document that starts with neither a plain key, a '-' "
        "nor '{' or '[', or one that starts like JSON and is not JSON");
  }
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(std::string(text));
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
