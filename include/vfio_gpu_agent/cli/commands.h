// The subcommands of the vfio-gpu-agent binary. Each takes the arguments after its name and returns the
// process exit code; output goes to `out` (reports) and logs to stderr.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "vfio_gpu_agent/binding/binder.h"
#include "vfio_gpu_agent/dra/driver.h"
#include "vfio_gpu_agent/cli/common_options.h"
#include "vfio_gpu_agent/cli/flags.h"
#include "vfio_gpu_agent/plugin/agent.h"

namespace vfio_agent::cli {

// Exit codes shared by every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitNotReady = 1;  // the command ran, and some device is not where it should be
inline constexpr int kExitUsage = 2;     // bad flags or arguments
inline constexpr int kExitError = 3;     // the host could not be read or the command could not run

struct ParsedCommand {
  FlagValues flags;
  CommonOptions common;
};

// Parses common + command flags, handles --help, sets up logging. Returns the exit code to stop with
// (help printed or usage error), or nullopt to go on.
std::optional<int> ParseCommand(std::string_view name, std::string_view summary, std::vector<FlagSpec> extra,
                                const std::vector<std::string>& args, std::ostream& out, ParsedCommand* parsed);

int RunInspect(const std::vector<std::string>& args, std::ostream& out);
int RunBind(const std::vector<std::string>& args, std::ostream& out);
int RunUnbind(const std::vector<std::string>& args, std::ostream& out);
int RunServe(const std::vector<std::string>& args, std::ostream& out);
int RunRun(const std::vector<std::string>& args, std::ostream& out);
int RunKubevirtConfig(const std::vector<std::string>& args, std::ostream& out);
int RunValidate(const std::vector<std::string>& args, std::ostream& out);
int RunClaimRouter(const std::vector<std::string>& args, std::ostream& out);

// Shared by `bind`/`serve` and `run` (which is bind, then serve).
std::vector<FlagSpec> BindFlags();
std::vector<FlagSpec> ServeFlags();
absl::StatusOr<binding::BinderOptions> BinderOptionsFromFlags(const ParsedCommand& cmd);
absl::StatusOr<plugin::ServeOptions> ServeOptionsFromFlags(const ParsedCommand& cmd, const names::PciIdsDatabase* db);
// --kubelet-api and the DRA driver's flags, shared by serve and run (each has its own --kubeconfig, --node-name,
// --cdi-dir and --rescan-interval, which the DRA options also read).
std::vector<FlagSpec> DraFlags();
// Whether --kubelet-api is dra; InvalidArgument for a value other than device-plugin or dra.
absl::StatusOr<bool> DraSelected(const ParsedCommand& cmd);
// With the Kubernetes API (--kubeconfig, else in-cluster) claims are read and the node's ResourceSlices kept;
// without one, every claim is refused and no slice is written.
absl::StatusOr<dra::DriverOptions> DraOptionsFromFlags(const ParsedCommand& cmd, const names::PciIdsDatabase* db);
// --fabric-manager and its mode, shared by serve, run and validate; address "" = off.
std::vector<FlagSpec> FabricFlags();
absl::StatusOr<fabric::FabricOptions> FabricOptionsFromFlags(const ParsedCommand& cmd);

}  // namespace vfio_agent::cli
