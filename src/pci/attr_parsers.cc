#include "attr_parsers.h"

#include <charconv>
#include <iterator>
#include <utility>

namespace vfio_agent::pci::internal {
namespace {

// Takes `tag` and exactly `digits` hex digits after it off the front of `text`.
std::optional<uint32_t> TakeModaliasField(std::string_view* text, std::string_view tag, size_t digits) {
  if (!text->starts_with(tag) || text->size() < tag.size() + digits) return std::nullopt;
  const char* first = text->data() + tag.size();
  uint32_t value = 0;
  auto [ptr, ec] = std::from_chars(first, first + digits, value, 16);
  if (ec != std::errc() || ptr != first + digits) return std::nullopt;
  text->remove_prefix(tag.size() + digits);
  return value;
}

}  // namespace

std::string_view TrimWhitespace(std::string_view text) {
  constexpr std::string_view kWhitespace = " \t\n\r\f\v";
  const auto first = text.find_first_not_of(kWhitespace);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(kWhitespace) - first + 1);
}

std::optional<uint32_t> ParseHex(std::string_view text) {
  text = TrimWhitespace(text);
  if (text.starts_with("0x") || text.starts_with("0X")) text.remove_prefix(2);
  uint32_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<int> ParseDecimal(std::string_view text) {
  text = TrimWhitespace(text);
  int value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 10);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

bool ParseModalias(std::string_view text, Function* fn) {
  text = TrimWhitespace(text);
  if (!text.starts_with("pci:")) return false;
  text.remove_prefix(4);
  constexpr std::pair<std::string_view, size_t> kFields[] = {{"v", 8},  {"d", 8},  {"sv", 8}, {"sd", 8},
                                                             {"bc", 2}, {"sc", 2}, {"i", 2}};
  uint32_t values[std::size(kFields)];
  for (size_t i = 0; i < std::size(kFields); ++i) {
    auto value = TakeModaliasField(&text, kFields[i].first, kFields[i].second);
    if (!value || (i < 4 && *value > 0xffff)) return false;
    values[i] = *value;
  }
  if (!text.empty()) return false;
  fn->vendor_id = static_cast<uint16_t>(values[0]);
  fn->device_id = static_cast<uint16_t>(values[1]);
  fn->subsystem_vendor_id = static_cast<uint16_t>(values[2]);
  fn->subsystem_device_id = static_cast<uint16_t>(values[3]);
  fn->class_code = values[4] << 16 | values[5] << 8 | values[6];
  return true;
}

std::string LinkBasename(std::string_view target) {
  while (target.size() > 1 && target.back() == '/') target.remove_suffix(1);
  auto slash = target.rfind('/');
  return std::string(slash == std::string_view::npos ? target : target.substr(slash + 1));
}

}  // namespace vfio_agent::pci::internal
