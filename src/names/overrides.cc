// Operator overrides: "VENDOR:DEVICE=NAME", from --resource-name or a file with one per line.
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "string_views.h"
#include "vfio_gpu_agent/common/fs.h"
#include "vfio_gpu_agent/names/resource_names.h"

namespace vfio_agent::names {
namespace {

// Thousands of lines at most in practice; anything near this is not an override file.
constexpr size_t kMaxOverrideFileBytes = 1024 * 1024;
constexpr std::string_view kExpected = "expected VENDOR:DEVICE=NAME, e.g. 10de:2335=GH100_H200_SXM_141GB";

std::optional<uint16_t> ParseHexId(std::string_view text) {
  if (text.empty() || text.size() > 4) return std::nullopt;
  uint16_t value = 0;
  for (char c : text) {
    if (!absl::ascii_isxdigit(c)) return std::nullopt;
    int digit = absl::ascii_isdigit(c) ? c - '0' : absl::ascii_tolower(c) - 'a' + 10;
    value = static_cast<uint16_t>(value * 16 + digit);
  }
  return value;
}

absl::Status Bad(std::string_view text, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("resource name override \"", AsAbsl(text), "\": ", AsAbsl(why)));
}

}  // namespace

absl::StatusOr<NameOverride> ParseOverride(std::string_view text) {
  size_t equals = text.find('=');
  if (equals == std::string_view::npos) return Bad(text, kExpected);
  std::string_view ids = AsStd(absl::StripAsciiWhitespace(AsAbsl(text.substr(0, equals))));
  std::string_view name = AsStd(absl::StripAsciiWhitespace(AsAbsl(text.substr(equals + 1))));

  size_t colon = ids.find(':');
  if (colon == std::string_view::npos) return Bad(text, kExpected);
  std::optional<uint16_t> vendor = ParseHexId(ids.substr(0, colon));
  std::optional<uint16_t> device = ParseHexId(ids.substr(colon + 1));
  if (!vendor || !device) return Bad(text, "vendor and device must be 1-4 hex digits, e.g. 10de:2335");
  if (name.empty()) return Bad(text, "the name is empty");
  if (name.find('/') != std::string_view::npos) {
    return Bad(text, "give the name without the domain (the domain comes from --resource-domain)");
  }
  // Other defects (length, characters) are reported and fixed by NameResolver, like derived names.
  return NameOverride{*vendor, *device, std::string(name)};
}

absl::StatusOr<std::vector<NameOverride>> LoadOverrideFile(const std::filesystem::path& path) {
  absl::StatusOr<std::string> content = fs::ReadTrimmed(path, kMaxOverrideFileBytes);
  if (!content.ok()) {
    return absl::Status(content.status().code(),
                        absl::StrCat("resource name override file: ", content.status().message()));
  }
  std::vector<NameOverride> overrides;
  int line_number = 0;
  for (absl::string_view raw : absl::StrSplit(*content, '\n')) {
    ++line_number;
    // '#' can never be part of a valid name, so it always starts a comment.
    std::string_view line = AsStd(absl::StripAsciiWhitespace(raw.substr(0, raw.find('#'))));
    if (line.empty()) continue;
    absl::StatusOr<NameOverride> parsed = ParseOverride(line);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path.string(), ":", line_number, ": ", parsed.status().message()));
    }
    overrides.push_back(*std::move(parsed));
  }
  return overrides;
}

}  // namespace vfio_agent::names
