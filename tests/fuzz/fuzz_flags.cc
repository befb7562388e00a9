// The flag parser and VFIO_GPU_AGENT_* environment variables, through to the common options every command
// builds from them (roots, vendor, classes, names, domain, log level).
// Input: NUL-separated arguments; after an empty argument, NAME=VALUE environment entries.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "vfio_gpu_agent/cli/common_options.h"
#include "vfio_gpu_agent/cli/flags.h"

using namespace vfio_agent;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  std::map<std::string, std::string> env;
  std::string text(reinterpret_cast<const char*>(data), size);
  bool in_env = false;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\0', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    start = end + 1;
    if (!in_env && item.empty()) {
      in_env = true;
    } else if (in_env) {
      auto eq = item.find('=');
      if (eq != std::string::npos) env[item.substr(0, eq)] = item.substr(eq + 1);
    } else {
      args.push_back(item);
    }
  }
  auto getenv = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  // A command's own flags, as bind and serve declare theirs, beside the common ones.
  std::vector<cli::FlagSpec> specs = cli::CommonFlagSpecs();
  specs.push_back({"rescan-interval", "MS", "", "60000"});
  specs.push_back({"device", "BDF", "", "", true});
  specs.push_back({"dry-run", "", "", "off"});
  cli::FlagValues flags;
  bool help = false;
  if (!cli::ParseFlags(args, specs, &flags, &help, getenv).ok() || help) return 0;
  // The override file is read by path: a fuzzed path could name /dev/zero or a FIFO; its parser has its own target.
  if (flags.Has("resource-name-file")) return 0;
  (void)cli::CommonOptionsFromFlags(flags);
  return 0;
}
