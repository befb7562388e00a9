#include "vfio_gpu_agent/vgpu/catalog.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "vfio_gpu_agent/common/fs.h"

namespace vfio_agent::vgpu {
namespace {

constexpr char kHeader[] = "# vfio-gpu-agent vGPU type catalog v1: <PF BDF> <vendor:device> <driver version|-> <id> <name>";
constexpr char kNoVersion[] = "-";

// Debian's abseil has its own string_view, which does not mix with std's: these few splits are done by hand.
std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> lines;
  for (size_t end; (end = text.find('\n')) != std::string_view::npos; text.remove_prefix(end + 1)) {
    lines.push_back(text.substr(0, end));
  }
  lines.push_back(text);
  return lines;
}

std::string_view Trim(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t\r\n\v\f");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\r\n\v\f") - first + 1);
}

std::optional<int> ParseTypeId(std::string_view text) {
  int id = 0;
  if (text.empty()) return std::nullopt;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (ec != std::errc() || ptr != text.data() + text.size() || id < 0) return std::nullopt;
  return id;
}

std::optional<uint16_t> ParseHex16(std::string_view text) {
  unsigned value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  if (text.size() != 4 || ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return static_cast<uint16_t>(value);
}

// "<bdf> <vvvv:dddd> <version|-> <id> <name...>"
std::optional<std::pair<CardKey, std::pair<int, std::string>>> ParseLine(std::string_view line) {
  std::string_view fields[4];
  for (std::string_view& field : fields) {
    const size_t space = line.find(' ');
    if (space == std::string_view::npos) return std::nullopt;
    field = line.substr(0, space);
    line.remove_prefix(space + 1);
  }
  const size_t colon = fields[1].find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  std::optional<uint16_t> vendor = ParseHex16(fields[1].substr(0, colon));
  std::optional<uint16_t> device = ParseHex16(fields[1].substr(colon + 1));
  std::optional<int> id = ParseTypeId(fields[3]);
  std::string_view name = Trim(line);
  if (fields[0].empty() || !vendor || !device || !id || name.empty()) return std::nullopt;
  CardKey key{.pf_bdf = std::string(fields[0]), .vendor_id = *vendor, .device_id = *device,
              .driver_version = fields[2] == kNoVersion ? "" : std::string(fields[2])};
  return std::make_pair(std::move(key), std::make_pair(*id, std::string(name)));
}

}  // namespace

std::string CardKey::ToString() const {
  return absl::StrFormat("%s %04x:%04x %s", pf_bdf, vendor_id, device_id,
                         driver_version.empty() ? kNoVersion : driver_version);
}

std::map<int, std::string> ParseCreatableTypes(std::string_view text) {
  std::map<int, std::string> types;
  for (std::string_view line : Lines(text)) {
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::optional<int> id = ParseTypeId(Trim(line.substr(0, colon)));
    std::string_view name = Trim(line.substr(colon + 1));
    if (!id || name.empty()) continue;  // the "ID : vGPU Name" header, or a line the driver may add
    types[*id] = std::string(name);
  }
  return types;
}

CatalogStore::CatalogStore(std::filesystem::path file) : file_(std::move(file)) {}

CatalogStore CatalogStore::InMemory() const {
  CatalogStore copy{std::filesystem::path()};
  copy.cards_ = cards_;
  return copy;
}

absl::StatusOr<std::map<CardKey, std::map<int, std::string>>> CatalogStore::ReadFile() const {
  std::map<CardKey, std::map<int, std::string>> cards;
  if (file_.empty()) return cards;
  absl::StatusOr<std::string> text = fs::ReadTrimmed(file_);
  if (absl::IsNotFound(text.status())) return cards;
  if (!text.ok()) return text.status();
  int number = 0;
  for (std::string_view line : Lines(*text)) {
    ++number;
    if (line.empty() || line.front() == '#') continue;
    auto entry = ParseLine(line);
    if (!entry) {
      return absl::DataLossError(absl::StrCat("vGPU catalog ", file_.string(), " line ", number,
                                              ": not \"<PF BDF> <vendor:device> <driver version> <id> <name>\""));
    }
    cards[entry->first][entry->second.first] = std::move(entry->second.second);
  }
  return cards;
}

absl::Status CatalogStore::Load() {
  cards_.clear();
  absl::StatusOr<std::map<CardKey, std::map<int, std::string>>> cards = ReadFile();
  if (!cards.ok()) return cards.status();
  cards_ = *std::move(cards);
  return absl::OkStatus();
}

absl::Status CatalogStore::Refresh() {
  absl::StatusOr<std::map<CardKey, std::map<int, std::string>>> cards = ReadFile();
  if (!cards.ok()) return cards.status();
  for (auto& [file_key, types] : *cards) {
    const CardKey& key = file_key;
    const bool other_key = std::any_of(cards_.begin(), cards_.end(), [&key](const auto& known) {
      return known.first.pf_bdf == key.pf_bdf && !(known.first == key);
    });
    if (other_key) continue;
    cards_[key].merge(types);  // what this store already has wins
  }
  return absl::OkStatus();
}

bool CatalogStore::Merge(const CardKey& key, const std::map<int, std::string>& listed) {
  bool changed = false;
  for (auto it = cards_.begin(); it != cards_.end();) {
    if (it->first.pf_bdf == key.pf_bdf && !(it->first == key)) {
      it = cards_.erase(it);
      changed = true;
    } else {
      ++it;
    }
  }
  // Kept even while empty: the key is what tells Refresh that the file's maps of this PF BDF are stale.
  std::map<int, std::string>& known = cards_[key];
  for (const auto& [id, name] : listed) {
    auto [it, inserted] = known.try_emplace(id, name);
    if (!inserted && it->second == name) continue;
    it->second = name;
    changed = true;
  }
  return changed;
}

std::optional<std::string> CatalogStore::Lookup(const CardKey& key, int type_id) const {
  auto card = cards_.find(key);
  if (card == cards_.end()) return std::nullopt;
  auto type = card->second.find(type_id);
  if (type == card->second.end()) return std::nullopt;
  return type->second;
}

std::map<int, std::string> CatalogStore::Types(const CardKey& key) const {
  auto card = cards_.find(key);
  return card == cards_.end() ? std::map<int, std::string>() : card->second;
}

absl::Status CatalogStore::Save() {
  if (file_.empty()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(file_.parent_path(), ec);
  if (ec) return fs::ErrnoStatus(ec.value(), "create directory", file_.parent_path());
  // The file itself is replaced by rename, so the lock is a sibling that stays.
  const std::filesystem::path lock_path = file_.string() + ".lock";
  const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0) return fs::ErrnoStatus(errno, "open", lock_path);
  absl::Status status;
  if (::flock(lock, LOCK_EX) != 0) {
    status = fs::ErrnoStatus(errno, "flock", lock_path);
  } else {
    // A malformed file is replaced rather than merged (Load said so when it was read).
    (void)Refresh();
    std::string text = absl::StrCat(kHeader, "\n");
    for (const auto& [key, types] : cards_) {
      for (const auto& [id, name] : types) absl::StrAppend(&text, key.ToString(), " ", id, " ", name, "\n");
    }
    status = fs::WriteFileAtomically(file_, text);
  }
  ::close(lock);  // releases the lock
  return status;
}

}  // namespace vfio_agent::vgpu
