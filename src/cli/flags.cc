#include "vfio_gpu_agent/cli/flags.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace vfio_agent::cli {
namespace {

const std::vector<std::string>& EmptyList() {
  static const std::vector<std::string> empty;
  return empty;
}

const FlagSpec* FindSpec(const std::vector<FlagSpec>& specs, std::string_view name) {
  for (const auto& spec : specs) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

bool ParseBoolText(std::string_view text, bool* value) {
  std::string lower = absl::AsciiStrToLower(std::string(text));
  if (lower == "1" || lower == "true" || lower == "yes" || lower == "on") {
    *value = true;
    return true;
  }
  if (lower == "0" || lower == "false" || lower == "no" || lower == "off" || lower.empty()) {
    *value = false;
    return true;
  }
  return false;
}

}  // namespace

bool FlagValues::Has(std::string_view name) const { return values_.find(name) != values_.end(); }

std::string FlagValues::Get(std::string_view name, std::string_view fallback) const {
  auto it = values_.find(name);
  if (it == values_.end() || it->second.empty()) return std::string(fallback);
  return it->second.back();
}

const std::vector<std::string>& FlagValues::All(std::string_view name) const {
  auto it = values_.find(name);
  return it == values_.end() ? EmptyList() : it->second;
}

bool FlagValues::GetBool(std::string_view name) const { return Get(name, "false") == "true"; }

void FlagValues::Add(const std::string& name, std::string value) { values_[name].push_back(std::move(value)); }

std::string EnvVarName(std::string_view flag) {
  std::string name = "VFIO_GPU_AGENT_";
  for (char c : flag) name.push_back(c == '-' ? '_' : absl::ascii_toupper(static_cast<unsigned char>(c)));
  return name;
}

absl::Status ParseFlags(const std::vector<std::string>& args, const std::vector<FlagSpec>& specs, FlagValues* out,
                        bool* help_requested, const std::function<const char*(const char*)>& getenv) {
  *help_requested = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      *help_requested = true;
      continue;
    }
    if (arg == "--") {
      for (++i; i < args.size(); ++i) out->AddPositional(args[i]);
      break;
    }
    if (!arg.starts_with("--")) {
      if (arg.starts_with("-") && arg.size() > 1) {
        return absl::InvalidArgumentError(absl::StrCat("unknown option ", arg, " (options are --long-form)"));
      }
      out->AddPositional(arg);
      continue;
    }
    std::string body = arg.substr(2);
    std::optional<std::string> inline_value;
    if (auto eq = body.find('='); eq != std::string_view::npos) {
      inline_value = body.substr(eq + 1);
      body.resize(eq);
    }
    bool negated = false;
    const FlagSpec* spec = FindSpec(specs, body);
    if (spec == nullptr && body.starts_with("no-")) {
      spec = FindSpec(specs, body.substr(3));
      negated = spec != nullptr && spec->value_name.empty();
      if (!negated) spec = nullptr;
    }
    if (spec == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown option --", body));
    if (spec->value_name.empty()) {
      bool value = !negated;
      if (inline_value && !ParseBoolText(*inline_value, &value)) {
        return absl::InvalidArgumentError(absl::StrCat("--", body, " takes no value or a boolean, got \"",
                                                       *inline_value, "\""));
      }
      out->Add(spec->name, value ? "true" : "false");
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", body, " needs a value (", spec->value_name, ")"));
      }
      inline_value = args[++i];
    }
    if (!spec->repeatable && out->Has(spec->name)) {
      return absl::InvalidArgumentError(absl::StrCat("--", body, " given more than once"));
    }
    out->Add(spec->name, *inline_value);
  }
  auto env = getenv ? getenv : [](const char* name) -> const char* { return std::getenv(name); };
  for (const auto& spec : specs) {
    if (out->Has(spec.name)) continue;
    const char* value = env(EnvVarName(spec.name).c_str());
    if (value == nullptr) continue;
    if (spec.value_name.empty()) {
      bool b = false;
      if (!ParseBoolText(value, &b)) {
        return absl::InvalidArgumentError(absl::StrCat(EnvVarName(spec.name), "=\"", value, "\" is not a boolean"));
      }
      out->Add(spec.name, b ? "true" : "false");
    } else if (spec.repeatable) {
      for (auto part : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
        out->Add(spec.name, std::string(absl::StripAsciiWhitespace(part)));
      }
    } else {
      out->Add(spec.name, value);
    }
  }
  return absl::OkStatus();
}

std::string FormatHelp(std::string_view command, std::string_view summary, const std::vector<FlagSpec>& specs) {
  std::string text = absl::StrCat("usage: vfio-gpu-agent ", std::string(command), " [options]\n\n",
                                  std::string(summary), "\n\noptions:\n");
  for (const auto& spec : specs) {
    std::string head = absl::StrCat("  --", spec.name, spec.value_name.empty() ? "" : absl::StrCat(" ", spec.value_name));
    if (head.size() < 34) head.resize(34, ' ');
    absl::StrAppend(&text, head, spec.help);
    if (!spec.default_text.empty()) absl::StrAppend(&text, " (default: ", spec.default_text, ")");
    if (spec.repeatable) absl::StrAppend(&text, " [repeatable]");
    absl::StrAppend(&text, "\n", std::string(36, ' '), "env ", EnvVarName(spec.name), "\n");
  }
  absl::StrAppend(&text, "  --help                            this text\n");
  return text;
}

}  // namespace vfio_agent::cli
