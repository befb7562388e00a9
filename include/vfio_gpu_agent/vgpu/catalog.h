// The vGPU type catalogs of SR-IOV vGPU cards (vGPU 17+), remembered across scans and restarts.
//
// A card lists its creatable types (`nvidia/creatable_vgpu_types`: "<id> : <name>") only while it can still
// create them: once it is full the file shrinks to its header on every function, and the names of the vGPUs
// that exist must come from what was read before. Type ids are only unique per card and change with the driver,
// so the map is kept per card key (PF BDF, vendor:device, driver version), never across keys.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vfio_agent::vgpu {

struct CardKey {
  std::string pf_bdf;          // "0000:3b:00.0"
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  std::string driver_version;  // <sysfs>/module/nvidia/version; "" when absent

  std::string ToString() const;  // "0000:3b:00.0 10de:2335 550.54.14" ("-" for no version)
  auto operator<=>(const CardKey&) const = default;
};

// The "<id> : <name>" lines of a creatable_vgpu_types file; the header and any line whose first field is not a
// number are skipped.
std::map<int, std::string> ParseCreatableTypes(std::string_view text);

class CatalogStore {
 public:
  // `file` empty: kept in memory only (lost on restart).
  explicit CatalogStore(std::filesystem::path file);

  // Reads the file; a missing one is an empty store. A malformed file is an error naming its path and line (the
  // store then stays empty and the next Save replaces the file).
  absl::Status Load();
  // Adds what the file holds and this store does not (another store of the same file saved it: the profile
  // applier reads a card's catalog while it is empty, the plugin may see the card only once it is full). A card
  // this store knows under another key keeps its own key. A malformed file changes nothing.
  absl::Status Refresh();
  // Adds what the card lists now to its map. A card seen under a new key (another driver version, another card
  // in the slot) first forgets every map of its PF BDF: those ids mean nothing any more. True when the store
  // changed.
  bool Merge(const CardKey& key, const std::map<int, std::string>& listed);
  std::optional<std::string> Lookup(const CardKey& key, int type_id) const;
  // Every type id -> name known for the card; empty when none.
  std::map<int, std::string> Types(const CardKey& key) const;
  // Refreshes from the file, then writes the store to a temporary file beside `file` and renames it over `file`,
  // so a crash never leaves a truncated catalog; under an flock(2) of `<file>.lock`, so that two stores of one
  // file (the plugin's and the profile applier's) never drop what the other saved. No-op without a file.
  absl::Status Save();

  const std::filesystem::path& file() const { return file_; }
  // The same maps, kept in memory only: what a reader that must not write the file (`validate`) discovers with.
  CatalogStore InMemory() const;

 private:
  absl::StatusOr<std::map<CardKey, std::map<int, std::string>>> ReadFile() const;

  std::filesystem::path file_;
  std::map<CardKey, std::map<int, std::string>> cards_;
};

}  // namespace vfio_agent::vgpu
