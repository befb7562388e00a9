#include <iostream>

#include "vfio_gpu_agent/cli/commands.h"
#include "vfio_gpu_agent/common/log.h"

namespace vfio_agent::cli {

std::optional<int> ParseCommand(std::string_view name, std::string_view summary, std::vector<FlagSpec> extra,
                                const std::vector<std::string>& args, std::ostream& out, ParsedCommand* parsed) {
  std::vector<FlagSpec> specs = CommonFlagSpecs();
  specs.insert(specs.end(), extra.begin(), extra.end());
  bool help = false;
  if (auto status = ParseFlags(args, specs, &parsed->flags, &help); !status.ok()) {
    std::cerr << "vfio-gpu-agent " << name << ": " << status.message() << "\n";
    return kExitUsage;
  }
  if (help) {
    out << FormatHelp(name, summary, specs);
    return kExitOk;
  }
  auto common = CommonOptionsFromFlags(parsed->flags);
  if (!common.ok()) {
    std::cerr << "vfio-gpu-agent " << name << ": " << common.status().message() << "\n";
    return kExitUsage;
  }
  parsed->common = *std::move(common);
  InitLogging(parsed->common.log_level);
  return std::nullopt;
}

}  // namespace vfio_agent::cli
