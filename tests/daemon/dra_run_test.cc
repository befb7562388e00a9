// `vfio-gpu-agent run --kubelet-api dra` as a process on the simulated 8x H200 node: it binds as always, then
// serves the GPUs as a DRA driver (registered with kubelet-dra-sim, health stream, ResourceSlices on the fake API
// server) and never starts the device plugin; with --bind-on-prepare it binds nothing at start; on a vm-vgpu node it
// publishes the vGPUs and binds nothing; with --fabric-manager it publishes Fabric Manager's state as the device
// plugin's mode does (events, metrics, fabric.reachable).
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "fabric_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kube_api_sim.h"
#include "kubelet_dra_sim.h"
#include "run_harness.h"
#include "vfio_gpu_agent/dra/device_names.h"
#include "vgpu/profile_configs.h"

namespace vfio_agent::daemon::testing {
namespace {

using plugin::testing::kH200Gpus;
using plugin::testing::Node;
using vfio_agent::testing::Module;

constexpr char kDraDriver[] = "gpu.vfio-agent.cozystack.io";

// A simulated node (by default the 8x H200 one, every GPU on nvidia), the fake API server and kubelet-dra-sim, and
// `run --kubelet-api dra` on them with `extra_args`.
struct DraNode {
  std::unique_ptr<Node> node;
  std::unique_ptr<sim::KubeApiSim> api;
  std::unique_ptr<kubeletsim::dra::KubeletDraSim> kubelet;
  std::unique_ptr<RunProcess> run;
  std::filesystem::path dir;

  void Start(const std::vector<std::string>& extra_args = {}) {
    ASSERT_NO_FATAL_FAILURE(Create("hgx-h200-8gpu.json"));
    for (const std::string& bdf : kH200Gpus) ASSERT_EQ(DriverOf(*node, bdf), "nvidia");
    ASSERT_NO_FATAL_FAILURE(Run(extra_args));
  }

  void Create(const std::string& node_file) {
    auto created = Node::Create(node_file);
    ASSERT_TRUE(created.ok()) << created.status();
    node = *std::move(created);
    ASSERT_TRUE(node->StartKubelet({.pod_resources_socket = PodResourcesSocket(*node)}).ok());
    dir = node->kubelet_dir().parent_path();
    auto started = sim::KubeApiSim::Start(dir, {.nodes = {"node-a"}});
    ASSERT_TRUE(started.ok()) << started.status();
    api = *std::move(started);
    auto kubeconfig = api->WriteKubeconfig(dir / "kubeconfig");
    ASSERT_TRUE(kubeconfig.ok()) << kubeconfig.status();
    kubelet = std::make_unique<kubeletsim::dra::KubeletDraSim>(
        kubeletsim::dra::Options{.registry_dir = dir / "plugins_registry"});
    ASSERT_TRUE(kubelet->Start().ok());
  }

  void Run(const std::vector<std::string>& extra_args) {
    std::vector<std::string> args = {"--kubelet-api", "dra", "--kubelet-registry-dir",
                                     (dir / "plugins_registry").string(), "--kubelet-plugins-dir",
                                     (dir / "plugins").string(), "--cdi-dir", (dir / "cdi").string(), "--kubeconfig",
                                     (dir / "kubeconfig").string(), "--node-name", "node-a"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    auto process = RunProcess::Start(*node, args);
    ASSERT_TRUE(process.ok()) << process.status();
    run = *std::move(process);
  }

  // One kubelet API a node: no device-plugin socket, nothing registered with the device-plugin kubelet.
  void ExpectNoDevicePlugin() const {
    for (const auto& entry : std::filesystem::directory_iterator(node->kubelet_dir())) {
      EXPECT_FALSE(entry.path().filename().string().starts_with("kubevirt-")) << entry.path();
    }
  }

  // The stored Events with this reason whose note holds `about`.
  std::vector<std::string> EventNotes(const std::string& reason, const std::string& about) const {
    std::vector<std::string> notes;
    auto events = api->Events();
    if (!events.ok()) return notes;
    for (const nlohmann::json& event : *events) {
      const std::string note = event.value("note", "");
      if (event.value("reason", "") == reason && note.find(about) != std::string::npos) notes.push_back(note);
    }
    return notes;
  }

  // node-a's GPUPassthroughReady condition holds this status and reason.
  bool ConditionIs(const std::string& status, const std::string& reason) const {
    auto node = api->Node("node-a");
    if (!node.ok()) return false;
    for (const auto& c : (*node)["status"].value("conditions", nlohmann::json::array())) {
      if (c.value("type", "") != "GPUPassthroughReady") continue;
      return c.value("status", "") == status && c.value("reason", "") == reason;
    }
    return false;
  }

  // Every GPU healthy on the health stream, under its address-derived name.
  bool AllHealthy() const {
    auto health = kubelet->LatestHealth(kDraDriver);
    if (!health || health->devices_size() != static_cast<int>(kH200Gpus.size())) return false;
    for (int i = 0; i < health->devices_size(); ++i) {
      if (health->devices(i).health() != ::v1alpha1::HEALTHY ||
          health->devices(i).device().device_name() != dra::DeviceName(kH200Gpus[static_cast<size_t>(i)])) {
        return false;
      }
    }
    return true;
  }
};

TEST(DraRunTest, BindsEveryGpuAndServesItAsADraDriverInsteadOfTheDevicePlugin) {
  DraNode dra;
  ASSERT_NO_FATAL_FAILURE(dra.Start());
  RunProcess* run = dra.run.get();
  EXPECT_TRUE(run->WaitReady()) << run->Log();
  for (const std::string& bdf : kH200Gpus) EXPECT_EQ(DriverOf(*dra.node, bdf), "vfio-pci");
  ASSERT_TRUE(dra.kubelet->WaitFor(
      [](const kubeletsim::dra::KubeletDraSim& k) { return k.Count("register") == 1; }, kPatience));
  EXPECT_TRUE(WaitUntil([&] { return dra.AllHealthy(); })) << run->Log();
  EXPECT_TRUE(WaitUntil([&] {
    auto slices = dra.api->Slices();
    return slices.ok() && slices->size() == 1 && (*slices)[0]["spec"]["devices"].size() == kH200Gpus.size();
  }));
  dra.ExpectNoDevicePlugin();

  const int status = run->SignalAndWait(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << run->Log();
  EXPECT_FALSE(std::filesystem::exists(dra.dir / "plugins_registry" / (std::string(kDraDriver) + "-reg.sock")));
  for (const std::string& bdf : kH200Gpus) EXPECT_EQ(DriverOf(*dra.node, bdf), "vfio-pci");  // nothing unbound
}

// --bind-on-prepare: nothing is bound at start, yet every GPU is published healthy (a claim's Prepare can bind it)
// and the node is Ready.
TEST(DraRunTest, WithBindOnPrepareNothingIsBoundAtStartAndEveryGpuIsPublishedHealthy) {
  DraNode dra;
  ASSERT_NO_FATAL_FAILURE(dra.Start({"--bind-on-prepare"}));
  EXPECT_TRUE(dra.run->WaitReady()) << dra.run->Log();
  EXPECT_TRUE(WaitUntil([&] { return dra.AllHealthy(); })) << dra.run->Log();
  EXPECT_TRUE(WaitUntil([&] {
    auto slices = dra.api->Slices();
    return slices.ok() && slices->size() == 1 && (*slices)[0]["spec"]["devices"].size() == kH200Gpus.size();
  }));
  for (const std::string& bdf : kH200Gpus) EXPECT_EQ(DriverOf(*dra.node, bdf), "nvidia");

  // A claim binds its GPU and Unprepare returns it: the GPU was never lost, and no event says it was. Each move
  // is followed by a reconcile pass (its group node came or went) before the events are read.
  auto last_pass = [&] {
    const std::string metrics = dra.run->Metrics();
    const std::string name = "\nvfio_gpu_agent_last_reconcile_timestamp_seconds ";
    const size_t at = metrics.find(name);
    return at == std::string::npos ? 0.0 : std::strtod(metrics.c_str() + at + name.size(), nullptr);
  };
  auto now = [] { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); };
  const std::string gpu = kH200Gpus[0];
  nlohmann::json result = {{"request", "gpu"}, {"driver", kDraDriver}, {"pool", "node-a"}, {"device", dra::DeviceName(gpu)}};
  const nlohmann::json claim = {
      {"metadata", {{"namespace", "vms"}, {"name", "vm"}, {"uid", "uid-1"}}},
      {"spec", {{"devices", {{"requests", nlohmann::json::array()}}}}},
      {"status", {{"allocation", {{"devices", {{"results", nlohmann::json::array({result})}}}}}}}};
  ASSERT_TRUE(dra.api->Control("claim " + claim.dump()).ok());
  double moved = now();
  auto prepared = dra.kubelet->Prepare(kDraDriver, {kubeletsim::dra::MakeClaim("vms", "vm", "uid-1")});
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ(prepared->claims().at("uid-1").error(), "");
  EXPECT_EQ(DriverOf(*dra.node, gpu), "vfio-pci");
  EXPECT_TRUE(WaitUntil([&] { return last_pass() > moved; })) << dra.run->Log();
  moved = now();
  auto unprepared = dra.kubelet->Unprepare(kDraDriver, {kubeletsim::dra::MakeClaim("vms", "vm", "uid-1")});
  ASSERT_TRUE(unprepared.ok()) << unprepared.status();
  EXPECT_EQ(unprepared->claims().at("uid-1").error(), "");
  EXPECT_EQ(DriverOf(*dra.node, gpu), "nvidia");
  EXPECT_TRUE(WaitUntil([&] { return last_pass() > moved; })) << dra.run->Log();
  auto events = dra.api->Events();
  ASSERT_TRUE(events.ok()) << events.status();
  for (const nlohmann::json& event : *events) {
    EXPECT_NE(event.value("reason", ""), "DeviceLost") << event.dump();
    EXPECT_NE(event.value("reason", ""), "DeviceRecovered") << event.dump();
  }
  const int status = dra.run->SignalAndWait(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << dra.run->Log();
}

// `run --bind-on-prepare --binding-conditions` as a process: a claim allocated by the scheduler (the fake API server's
// `allocate`, which copies the slices' conditions and labels the claim as the router does) gets its GPU bound before
// any Prepare and its condition True; the Node Event names the claim and its wait, the histogram counts it; Prepare
// moves nothing more.
TEST(DraRunTest, WithBindingConditionsAClaimIsBoundBeforePrepareWithAnEventAndTheWaitObserved) {
  DraNode dra;
  ASSERT_NO_FATAL_FAILURE(dra.Start({"--bind-on-prepare", "--binding-conditions"}));
  EXPECT_TRUE(dra.run->WaitReady()) << dra.run->Log();
  EXPECT_TRUE(WaitUntil([&] {
    auto slices = dra.api->Slices();
    return slices.ok() && slices->size() == 1 &&
           (*slices)[0]["spec"]["devices"][0].contains("bindingConditions");
  })) << dra.run->Log();
  const std::string gpu = kH200Gpus[0];
  const nlohmann::json claim = {{"metadata", {{"namespace", "vms"}, {"name", "vm"}, {"uid", "uid-1"}}},
                                {"spec", {{"devices", {{"requests", nlohmann::json::array()}}}}}};
  ASSERT_TRUE(dra.api->Control("claim " + claim.dump()).ok());
  const nlohmann::json results = nlohmann::json::array(
      {{{"request", "gpu"}, {"driver", kDraDriver}, {"pool", "node-a"}, {"device", dra::DeviceName(gpu)}}});
  ASSERT_TRUE(dra.api->Control("allocate vms vm node-a [] " + results.dump()).ok());
  EXPECT_TRUE(WaitUntil([&] { return !dra.EventNotes("ClaimDevicesReady", "claim vms/vm (uid-1) ready").empty(); }))
      << dra.run->Log();
  EXPECT_EQ(DriverOf(*dra.node, gpu), "vfio-pci");
  EXPECT_EQ(DriverOf(*dra.node, kH200Gpus[1]), "nvidia");
  auto stored = dra.api->Control("get-claim vms vm");
  ASSERT_TRUE(stored.ok());
  const nlohmann::json condition = nlohmann::json::parse(*stored)["status"]["devices"][0]["conditions"][0];
  EXPECT_EQ(condition["type"], std::string(kDraDriver) + "/vfio-bound");
  EXPECT_EQ(condition["status"], "True");
  EXPECT_NE(dra.run->Metrics().find("vfio_gpu_agent_dra_binding_wait_seconds_count{result=\"ok\"} 1"),
            std::string::npos);
  auto prepared = dra.kubelet->Prepare(kDraDriver, {kubeletsim::dra::MakeClaim("vms", "vm", "uid-1")});
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ(prepared->claims().at("uid-1").error(), "");
  auto unprepared = dra.kubelet->Unprepare(kDraDriver, {kubeletsim::dra::MakeClaim("vms", "vm", "uid-1")});
  ASSERT_TRUE(unprepared.ok()) << unprepared.status();
  EXPECT_EQ(DriverOf(*dra.node, gpu), "nvidia");
  const int status = dra.run->SignalAndWait(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << dra.run->Log();
}

// HGX shared-NVSwitch mode with DRA: the fake Fabric Manager of tests/fabric (its state file into `fm`) behind the
// agent; `mode` is FM's at start.
void StartWithFabricManager(DraNode& dra, std::filesystem::path* fm, const std::string& mode = "shared") {
  ASSERT_NO_FATAL_FAILURE(dra.Create("hgx-h200-8gpu.json"));
  *fm = vfio_agent::testing::MakeFakeFm(dra.dir / "fm");
  vfio_agent::testing::UpdateFakeFm(*fm, [&](vfio_agent::testing::FakeFmState& state) { state.mode = mode; });
  ASSERT_NO_FATAL_FAILURE(dra.Run({"--fabric-manager", "unix:" + fm->string(), "--fabric-library", FAKE_NVFM_LIBRARY,
                                   "--fabric-interval", "50", "--registration-grace", "300"}));
}

// A claim's partition is announced as the device plugin's Allocate announces it (PartitionActivated naming the
// partition, its GPUs and here the claim) and counted; Unprepare's release likewise (PartitionReleased).
TEST(DraRunTest, WithFabricManagerAClaimsPartitionIsAnEventAndCountedWhenActivatedAndReleased) {
  DraNode dra;
  std::filesystem::path fm;
  ASSERT_NO_FATAL_FAILURE(StartWithFabricManager(dra, &fm));
  EXPECT_TRUE(dra.run->WaitReady()) << dra.run->Log();
  EXPECT_TRUE(dra.run->WaitMetric("vfio_gpu_agent_fabric{value=\"partitions_supported\"} 15")) << dra.run->Metrics();

  // Modules 1 and 2: the pair partition P3.
  nlohmann::json results = nlohmann::json::array();
  for (uint32_t module : {1u, 2u}) {
    results.push_back({{"request", absl::StrCat("gpu-", module)}, {"driver", kDraDriver}, {"pool", "node-a"},
                       {"device", dra::DeviceName(Module(module))}});
  }
  const nlohmann::json claim = {{"metadata", {{"namespace", "vms"}, {"name", "vm"}, {"uid", "uid-1"}}},
                                {"spec", {{"devices", {{"requests", nlohmann::json::array()}}}}},
                                {"status", {{"allocation", {{"devices", {{"results", results}}}}}}}};
  ASSERT_TRUE(dra.api->Control("claim " + claim.dump()).ok());
  auto prepared = dra.kubelet->Prepare(kDraDriver, {kubeletsim::dra::MakeClaim("vms", "vm", "uid-1")});
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ(prepared->claims().at("uid-1").error(), "");
  // The call's latency, from the driver's on_prepare.
  EXPECT_TRUE(dra.run->WaitMetric("vfio_gpu_agent_dra_prepare_duration_seconds_count{result=\"ok\"} 1"))
      << dra.run->Metrics();
  EXPECT_EQ(vfio_agent::testing::SnapshotFakeFm(fm).active, std::set<uint32_t>{3});
  const std::string p3 = absl::StrCat("P3 [", Module(1), ",", Module(2), "]");  // PCI order
  EXPECT_TRUE(WaitUntil([&] { return !dra.EventNotes("PartitionActivated", "of claim vms/vm (uid-1)").empty(); }))
      << dra.run->Log();
  EXPECT_THAT(dra.EventNotes("PartitionActivated", ""),
              ::testing::ElementsAre(absl::StrCat("Fabric Manager partition ", p3, " active for the GPUs [", Module(1),
                                                  ",", Module(2), "] of claim vms/vm (uid-1)")));
  EXPECT_TRUE(dra.run->WaitMetric(
      "vfio_gpu_agent_fabric_partition_activations_total{fm_status=\"FM_ST_SUCCESS\",result=\"ok\"} 1"))
      << dra.run->Metrics();
  EXPECT_TRUE(dra.run->WaitMetric("vfio_gpu_agent_fabric{value=\"partitions_active\"} 1")) << dra.run->Metrics();

  auto unprepared = dra.kubelet->Unprepare(kDraDriver, {kubeletsim::dra::MakeClaim("vms", "vm", "uid-1")});
  ASSERT_TRUE(unprepared.ok()) << unprepared.status();
  EXPECT_EQ(unprepared->claims().at("uid-1").error(), "");
  EXPECT_TRUE(vfio_agent::testing::SnapshotFakeFm(fm).active.empty());
  EXPECT_TRUE(WaitUntil([&] { return !dra.EventNotes("PartitionReleased", "").empty(); })) << dra.run->Log();
  EXPECT_THAT(dra.EventNotes("PartitionReleased", ""),
              ::testing::ElementsAre(absl::StrCat("Fabric Manager partition ", p3,
                                                  " deactivated: claim vms/vm (uid-1) released its GPUs")));
  EXPECT_TRUE(dra.run->WaitMetric("vfio_gpu_agent_fabric_partition_releases_total 1")) << dra.run->Metrics();
  EXPECT_TRUE(dra.run->WaitMetric("vfio_gpu_agent_fabric{value=\"partitions_active\"} 0")) << dra.run->Metrics();
  const int status = dra.run->SignalAndWait(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << dra.run->Log();
}

// Fabric Manager still initialising keeps a DRA node not ready on fabric.reachable (FabricManagerNotReady once the
// grace is over) with every GPU published Unhealthy, as in device-plugin mode; FM answering clears both. A GPU FM
// later drops from every partition is a lost device.
TEST(DraRunTest, WithFabricManagerNotAnsweringTheNodeIsNotReadyOnFabricReachableUntilItAnswers) {
  DraNode dra;
  std::filesystem::path fm;
  ASSERT_NO_FATAL_FAILURE(StartWithFabricManager(dra, &fm, "not-configured"));
  EXPECT_TRUE(dra.run->WaitMetric("vfio_gpu_agent_not_ready{check=\"fabric.reachable\"} 1")) << dra.run->Metrics();
  EXPECT_TRUE(WaitUntil([&] { return dra.ConditionIs("False", "FabricManagerNotReady"); })) << dra.run->Log();
  EXPECT_EQ(dra.run->Check(), std::optional<bool>(false));
  EXPECT_TRUE(dra.run->WaitMetric("vfio_gpu_agent_fabric{value=\"connected\"} 0")) << dra.run->Metrics();
  EXPECT_TRUE(WaitUntil([&] {
    auto health = dra.kubelet->LatestHealth(kDraDriver);
    if (!health || health->devices_size() != static_cast<int>(kH200Gpus.size())) return false;
    for (const auto& device : health->devices()) {
      if (device.health() != ::v1alpha1::UNHEALTHY) return false;
    }
    return true;
  })) << dra.run->Log();

  vfio_agent::testing::UpdateFakeFm(fm, [](vfio_agent::testing::FakeFmState& state) { state.mode = "shared"; });
  EXPECT_TRUE(dra.run->WaitReady()) << dra.run->Log();
  EXPECT_TRUE(WaitUntil([&] { return dra.ConditionIs("True", "AllDevicesReady"); })) << dra.run->Log();
  EXPECT_TRUE(WaitUntil([&] { return dra.AllHealthy(); })) << dra.run->Log();
  EXPECT_TRUE(dra.run->WaitMetric("vfio_gpu_agent_fabric{value=\"connected\"} 1")) << dra.run->Metrics();

  // Every partition holding module 1 unsupported (a degraded board): that GPU alone is unhealthy, as the device
  // plugin advertises it: DeviceLost, dra.healthy, and back.
  vfio_agent::testing::UpdateFakeFm(fm,
                                    [](vfio_agent::testing::FakeFmState& state) { state.unsupported = {0, 1, 3, 7}; });
  EXPECT_TRUE(WaitUntil([&] { return dra.ConditionIs("False", "DeviceUnhealthy"); })) << dra.run->Log();
  EXPECT_TRUE(dra.run->WaitMetric("vfio_gpu_agent_not_ready{check=\"dra.healthy\"} 1")) << dra.run->Metrics();
  EXPECT_TRUE(WaitUntil([&] { return !dra.EventNotes("DeviceLost", "").empty(); })) << dra.run->Log();
  EXPECT_THAT(dra.EventNotes("DeviceLost", ""),
              ::testing::ElementsAre(::testing::HasSubstr(
                  Module(1) + " nvidia.com/GH100_H200_SXM_141GB unhealthy: in no supported Fabric Manager partition")));
  vfio_agent::testing::UpdateFakeFm(fm, [](vfio_agent::testing::FakeFmState& state) { state.unsupported.clear(); });
  EXPECT_TRUE(dra.run->WaitReady()) << dra.run->Log();
  EXPECT_TRUE(WaitUntil([&] { return !dra.EventNotes("DeviceRecovered", Module(1)).empty(); })) << dra.run->Log();
  const int status = dra.run->SignalAndWait(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << dra.run->Log();
}

// The vGPU node's config making three H200X-1-18C on each H200, each a VF of its card.
std::vector<std::string> VgpuProfileArgs(const DraNode& dra) {
  std::ofstream(dra.dir / "vgpu-config.yaml") << vfio_agent::testing::kSimNodeProfileConfigs;
  return {"--vgpu-config-file", (dra.dir / "vgpu-config.yaml").string(), "--vgpu-config", "h200-small-3",
          "--state-dir", (dra.dir / "state").string()};
}

// The node's slice holds those six vGPUs, named from their VFs.
bool SixVgpusPublished(const DraNode& dra) {
  auto slices = dra.api->Slices();
  if (!slices.ok() || slices->size() != 1 || (*slices)[0]["spec"]["devices"].size() != 6) return false;
  for (const auto& device : (*slices)[0]["spec"]["devices"]) {
    if (!device["name"].get<std::string>().starts_with("vgpu-") ||
        device["attributes"][std::string(kDraDriver) + "/resourceName"]["string"] != "NVIDIA_H200X-1-18C") {
      return false;
    }
  }
  return true;
}

// vm-vgpu with DRA: the profiles of a config made, the vGPUs published one device each (never a GPU), nothing
// bound to vfio-pci and no device-plugin socket.
TEST(DraRunTest, VgpuWorkloadPublishesEachVgpuAsADraDeviceAndBindsNothing) {
  DraNode dra;
  ASSERT_NO_FATAL_FAILURE(dra.Create("vgpu-sriov-l40s-h200.json"));
  std::vector<std::string> args = VgpuProfileArgs(dra);
  args.insert(args.end(), {"--workload", "vm-vgpu"});
  ASSERT_NO_FATAL_FAILURE(dra.Run(args));
  EXPECT_TRUE(dra.run->WaitReady()) << dra.run->Log();
  EXPECT_TRUE(WaitUntil([&] { return SixVgpusPublished(dra); })) << dra.run->Log();
  dra.ExpectNoDevicePlugin();
  const int status = dra.run->SignalAndWait(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << dra.run->Log();
  for (const std::string& line : dra.node->SimLog()) {
    EXPECT_FALSE(line.starts_with("bind ") && line.ends_with("vfio-pci")) << line;  // nothing bound on vm-vgpu
  }
}

// The node label picks the driver's mode at the start (no --workload); a later change waits for a restart, said in
// a Warning, and the vGPUs stay published.
TEST(DraRunTest, TheDriverStartsInTheNodeLabelsModeAndKeepsItWhileRunning) {
  DraNode dra;
  ASSERT_NO_FATAL_FAILURE(dra.Create("vgpu-sriov-l40s-h200.json"));
  ASSERT_TRUE(dra.api->Control(R"(relabel node-a {"nvidia.com/gpu.workload.config": "vm-vgpu"})").ok());
  std::vector<std::string> args = VgpuProfileArgs(dra);
  args.insert(args.end(), {"--workload-label-interval", "200"});
  ASSERT_NO_FATAL_FAILURE(dra.Run(args));
  EXPECT_TRUE(WaitUntil([&] { return SixVgpusPublished(dra); })) << dra.run->Log();

  ASSERT_TRUE(dra.api->Control(R"(relabel node-a {"nvidia.com/gpu.workload.config": "vm-passthrough"})").ok());
  EXPECT_TRUE(WaitUntil([&] {
    auto events = dra.api->Events();
    if (!events.ok()) return false;
    for (const nlohmann::json& event : *events) {
      if (event.value("reason", "") == "WorkloadModeUnsupported" && event.value("type", "") == "Warning") return true;
    }
    return false;
  })) << dra.run->Log();
  EXPECT_TRUE(SixVgpusPublished(dra));
  for (const std::string& line : dra.node->SimLog()) {
    EXPECT_FALSE(line.starts_with("bind ") && line.ends_with("vfio-pci")) << line;
  }
  const int status = dra.run->SignalAndWait(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << dra.run->Log();
}

// A prepared claim's vGPU is the VM's from Prepare on, though virt-launcher opens its group only once its image is
// pulled: a profile change in between keeps it (the claim is in the driver's checkpoint, the group is not open), and
// the state label says pending, naming the claim; the other card changes.
TEST(DraRunTest, AProfileChangeKeepsTheVgpuOfAPreparedClaimWhoseVmHasNotOpenedIt) {
  DraNode dra;
  ASSERT_NO_FATAL_FAILURE(dra.Create("vgpu-sriov-l40s-h200.json"));
  std::vector<std::string> args = VgpuProfileArgs(dra);
  args.insert(args.end(), {"--workload", "vm-vgpu", "--resync-interval", "200"});
  ASSERT_NO_FATAL_FAILURE(dra.Run(args));
  ASSERT_TRUE(WaitUntil([&] { return SixVgpusPublished(dra); })) << dra.run->Log();
  auto slices = dra.api->Slices();
  ASSERT_TRUE(slices.ok()) << slices.status();
  const std::string device = (*slices)[0]["spec"]["devices"][0]["name"].get<std::string>();
  absl::StatusOr<dra::VgpuId> vgpu = dra::VgpuOfDevice(device);
  ASSERT_TRUE(vgpu.ok()) << vgpu.status();
  const std::string vf = vgpu->id;

  nlohmann::json result = {{"request", "vgpu"}, {"driver", kDraDriver}, {"pool", "node-a"}, {"device", device}};
  const nlohmann::json claim = {
      {"metadata", {{"namespace", "vms"}, {"name", "vm"}, {"uid", "uid-1"}}},
      {"spec", {{"devices", {{"requests", nlohmann::json::array()}}}}},
      {"status", {{"allocation", {{"devices", {{"results", nlohmann::json::array({result})}}}}}}}};
  ASSERT_TRUE(dra.api->Control("claim " + claim.dump()).ok());
  ASSERT_TRUE(dra.kubelet->WaitFor(
      [](const kubeletsim::dra::KubeletDraSim& k) { return k.Count("register") == 1; }, kPatience));
  auto prepared = dra.kubelet->Prepare(kDraDriver, {kubeletsim::dra::MakeClaim("vms", "vm", "uid-1")});
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ(prepared->claims().at("uid-1").error(), "");

  // The label changes before the VM starts: one whole-card vGPU per H200.
  ASSERT_TRUE(dra.api->Control(R"(relabel node-a {"nvidia.com/vgpu.config": "h200-whole"})").ok());
  auto state = [&] {
    auto node = dra.api->Node("node-a");
    return node.ok() ? (*node)["metadata"]["labels"].value("nvidia.com/vgpu.config.state", "") : "";
  };
  EXPECT_TRUE(WaitUntil([&] { return state() == "pending"; })) << state() << "\n" << dra.run->Log();
  EXPECT_TRUE(WaitUntil([&] { return !dra.EventNotes("VgpuConfigPending", "DRA claim vms/vm (uid-1)").empty(); }))
      << dra.run->Log();
  for (const std::string& line : dra.node->SimLog()) EXPECT_NE(line, "vgpu-type " + vf + " 0");
  const int status = dra.run->SignalAndWait(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << dra.run->Log();
}

// The same across an agent restart: the label changes while the agent is down, and the agent that starts finds the
// claim in the checkpoint before its first apply.
TEST(DraRunTest, AnAgentStartingAfterARelabelKeepsTheVgpuOfAPreparedClaim) {
  DraNode dra;
  ASSERT_NO_FATAL_FAILURE(dra.Create("vgpu-sriov-l40s-h200.json"));
  std::vector<std::string> args = VgpuProfileArgs(dra);
  args.insert(args.end(), {"--workload", "vm-vgpu"});
  ASSERT_NO_FATAL_FAILURE(dra.Run(args));
  ASSERT_TRUE(WaitUntil([&] { return SixVgpusPublished(dra); })) << dra.run->Log();
  auto slices = dra.api->Slices();
  ASSERT_TRUE(slices.ok()) << slices.status();
  const std::string device = (*slices)[0]["spec"]["devices"][0]["name"].get<std::string>();
  absl::StatusOr<dra::VgpuId> vgpu = dra::VgpuOfDevice(device);
  ASSERT_TRUE(vgpu.ok()) << vgpu.status();
  nlohmann::json result = {{"request", "vgpu"}, {"driver", kDraDriver}, {"pool", "node-a"}, {"device", device}};
  const nlohmann::json claim = {
      {"metadata", {{"namespace", "vms"}, {"name", "vm"}, {"uid", "uid-1"}}},
      {"spec", {{"devices", {{"requests", nlohmann::json::array()}}}}},
      {"status", {{"allocation", {{"devices", {{"results", nlohmann::json::array({result})}}}}}}}};
  ASSERT_TRUE(dra.api->Control("claim " + claim.dump()).ok());
  ASSERT_TRUE(dra.kubelet->WaitFor(
      [](const kubeletsim::dra::KubeletDraSim& k) { return k.Count("register") == 1; }, kPatience));
  auto prepared = dra.kubelet->Prepare(kDraDriver, {kubeletsim::dra::MakeClaim("vms", "vm", "uid-1")});
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ(prepared->claims().at("uid-1").error(), "");
  int status = dra.run->SignalAndWait(SIGTERM);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << dra.run->Log();

  ASSERT_TRUE(dra.api->Control(R"(relabel node-a {"nvidia.com/vgpu.config": "h200-whole"})").ok());
  ASSERT_NO_FATAL_FAILURE(dra.Run(args));
  EXPECT_TRUE(WaitUntil([&] { return !dra.EventNotes("VgpuConfigPending", "DRA claim vms/vm (uid-1)").empty(); }))
      << dra.run->Log();
  for (const std::string& line : dra.node->SimLog()) EXPECT_NE(line, "vgpu-type " + vgpu->id + " 0");
  status = dra.run->SignalAndWait(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << dra.run->Log();
}

class DraUsageTest : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(DraUsageTest, IsAUsageError) {
  auto node = Node::Create("hgx-h200-8gpu.json");
  ASSERT_TRUE(node.ok()) << node.status();
  auto run = RunProcess::Start(**node, GetParam());
  ASSERT_TRUE(run.ok()) << run.status();
  std::optional<int> exited;
  ASSERT_TRUE(WaitUntil([&] { return (exited = (*run)->ExitedOnItsOwn()).has_value(); }));
  const int status = *exited;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << (*run)->Log();
}

INSTANTIATE_TEST_SUITE_P(Flags, DraUsageTest,
                         // a policy of the DRA driver, meaningless to the device plugin
                         ::testing::Values(std::vector<std::string>{"--bind-on-prepare"},
                                           std::vector<std::string>{"--binding-conditions"}));

}  // namespace
}  // namespace vfio_agent::daemon::testing
