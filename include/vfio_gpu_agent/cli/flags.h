// GNU-style long flags shared by every subcommand. Each flag can also come from an environment variable
// VFIO_GPU_AGENT_<FLAG_UPPER_SNAKE> (e.g. --sysfs-root <- VFIO_GPU_AGENT_SYSFS_ROOT), which is how the
// DaemonSet configures the agent; a flag on the command line wins over the environment.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace vfio_agent::cli {

struct FlagSpec {
  std::string name;          // "sysfs-root" (without dashes)
  std::string value_name;    // "DIR"; empty for boolean switches
  std::string help;
  std::string default_text;  // shown in --help
  bool repeatable = false;
};

// Parsed values: every occurrence, in order; boolean switches hold "true"/"false".
class FlagValues {
 public:
  bool Has(std::string_view name) const;
  // Last value, or `fallback` when absent.
  std::string Get(std::string_view name, std::string_view fallback = "") const;
  const std::vector<std::string>& All(std::string_view name) const;
  bool GetBool(std::string_view name) const;
  const std::vector<std::string>& positional() const { return positional_; }

  void Add(const std::string& name, std::string value);
  void AddPositional(std::string value) { positional_.push_back(std::move(value)); }

 private:
  std::map<std::string, std::vector<std::string>, std::less<>> values_;
  std::vector<std::string> positional_;
};

// "sysfs-root" -> "VFIO_GPU_AGENT_SYSFS_ROOT".
std::string EnvVarName(std::string_view flag);

// Parses `args` (after the subcommand) against `specs`. `--flag=value`, `--flag value` and `--switch`
// forms; `--help` is reported through `help_requested`. Environment variables fill flags absent from args;
// repeatable flags take a comma-separated environment value. `getenv` is injectable for tests.
absl::Status ParseFlags(const std::vector<std::string>& args, const std::vector<FlagSpec>& specs,
                        FlagValues* out, bool* help_requested,
                        const std::function<const char*(const char*)>& getenv = nullptr);

std::string FormatHelp(std::string_view command, std::string_view summary, const std::vector<FlagSpec>& specs);

}  // namespace vfio_agent::cli
