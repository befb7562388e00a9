// KEP-5304's reader side, written from the format and not from the driver: the file is a stream of JSON objects,
// one per metadata version; the first one of the version the reader knows is taken (as KubeVirt's decoder does).
#pragma once

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "nlohmann/json.hpp"

namespace vfio_agent::testing {

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline std::optional<nlohmann::json> ReadDeviceMetadata(const std::filesystem::path& path) {
  std::istringstream in(ReadFile(path));
  while ((in >> std::ws) && !in.eof()) {
    nlohmann::json object;
    try {
      in >> object;
    } catch (const nlohmann::json::exception&) {
      return std::nullopt;
    }
    if (object.value("apiVersion", "") == "metadata.resource.k8s.io/v1alpha1" &&
        object.value("kind", "") == "DeviceMetadata") {
      return object;
    }
  }
  return std::nullopt;
}

}  // namespace vfio_agent::testing
