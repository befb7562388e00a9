// kubelet-dra-sim: the kubelet DRA simulator as a command, for the demo and manual runs. It registers the driver
// found in the registry directory (GetInfo, NotifyRegistrationStatus), waits for its health stream's first device
// list, prepares each claim named (through the service version it chose) and prints each answer as JSON.
//   kubelet-dra-sim --registry-dir D --driver NAME [--prepare NAMESPACE/NAME/UID ...] [--timeout-ms T]
//                   [--kubelet 1.36|1.37]   (which DRAResourceHealth version it opens; 1.36 by default)
// Exits 0 when the driver registered and every claim was prepared without an error, 1 otherwise, 2 on usage.
#include <iostream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "kubelet_dra_sim.h"

namespace ds = vfio_agent::kubeletsim::dra;

namespace {

constexpr char kUsage[] =
    "usage: kubelet-dra-sim --registry-dir D --driver NAME [--prepare NAMESPACE/NAME/UID ...] [--timeout-ms T]\n"
    "                       [--kubelet 1.36|1.37]\n";

struct Args {
  std::filesystem::path registry_dir;
  std::string driver;
  std::vector<ds::drav1::Claim> claims;
  int64_t timeout_ms = 10000;
  ds::Options::HealthApi health_api = ds::Options::HealthApi::k136;
};

bool Parse(int argc, char** argv, Args* args, std::string* error) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      *error = flag + ": missing value";
      return false;
    }
    const std::string value = argv[++i];
    if (flag == "--registry-dir") {
      args->registry_dir = value;
    } else if (flag == "--driver") {
      args->driver = value;
    } else if (flag == "--timeout-ms") {
      if (!absl::SimpleAtoi(value, &args->timeout_ms)) {
        *error = "--timeout-ms: not a number: " + value;
        return false;
      }
    } else if (flag == "--kubelet") {
      if (value != "1.36" && value != "1.37") {
        *error = "--kubelet: 1.36 or 1.37, not " + value;
        return false;
      }
      args->health_api = value == "1.37" ? ds::Options::HealthApi::k137 : ds::Options::HealthApi::k136;
    } else if (flag == "--prepare") {
      std::vector<std::string> parts = absl::StrSplit(value, '/');
      if (parts.size() != 3) {
        *error = "--prepare: not NAMESPACE/NAME/UID: " + value;
        return false;
      }
      args->claims.push_back(ds::MakeClaim(parts[0], parts[1], parts[2]));
    } else {
      *error = "unknown flag " + flag;
      return false;
    }
  }
  if (args->registry_dir.empty() || args->driver.empty()) {
    *error = "--registry-dir and --driver are required";
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  std::string error;
  if (!Parse(argc, argv, &args, &error)) {
    std::cerr << "kubelet-dra-sim: " << error << "\n" << kUsage;
    return 2;
  }
  ds::KubeletDraSim kubelet({.registry_dir = args.registry_dir, .health_api = args.health_api});
  if (absl::Status started = kubelet.Start(); !started.ok()) {
    std::cerr << "kubelet-dra-sim: " << started << "\n";
    return 1;
  }
  const std::chrono::milliseconds timeout(args.timeout_ms);
  const std::string& driver = args.driver;
  if (!kubelet.WaitFor([&](const ds::KubeletDraSim& k) { return k.LatestHealth(driver).has_value(); }, timeout)) {
    std::cerr << "kubelet-dra-sim: driver " << driver << " did not register and report its devices within "
              << args.timeout_ms << " ms\n";
    return 1;
  }
  const ds::Plugin plugin = kubelet.Plugins().at(driver);
  std::cout << "registered " << driver << " at " << plugin.endpoint << " (" << plugin.service << "); health: "
            << kubelet.LatestHealth(driver)->devices_size() << " devices over " << plugin.health_service << "\n";
  bool failed = false;
  for (const ds::drav1::Claim& claim : args.claims) {
    absl::StatusOr<ds::drav1::NodePrepareResourcesResponse> response = kubelet.Prepare(driver, {claim});
    if (!response.ok()) {
      std::cerr << "kubelet-dra-sim: NodePrepareResources " << claim.namespace_() << "/" << claim.name() << ": "
                << response.status() << "\n";
      failed = true;
      continue;
    }
    for (const auto& [uid, answer] : response->claims()) failed = failed || !answer.error().empty();
    std::string json;
    google::protobuf::util::JsonPrintOptions print;
    print.add_whitespace = true;
    (void)google::protobuf::util::MessageToJsonString(*response, &json, print);
    std::cout << "NodePrepareResources " << claim.namespace_() << "/" << claim.name() << ":\n" << json;
  }
  return failed ? 1 : 0;
}
