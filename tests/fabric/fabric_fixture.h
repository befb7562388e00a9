// A fake Fabric Manager over the simulated HGX H200 board: its GPUs' BDFs, module ids deliberately out of PCI
// order (as NVIDIA's HGX guide maps them), and a state file in a fresh directory.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "fake_nvfm_state.h"
#include "vfio_gpu_agent/fabric/partitions.h"

namespace vfio_agent::testing {

// The simulated node's GPUs in PCI order (tests/sim/nodes/hgx-h200-8gpu.json).
inline const std::vector<std::string>& HgxGpus() {
  static const std::vector<std::string> gpus = {"0000:18:00.0", "0000:2a:00.0", "0000:3b:00.0", "0000:5d:00.0",
                                                "0000:9a:00.0", "0000:ab:00.0", "0000:bb:00.0", "0000:db:00.0"};
  return gpus;
}

// Module id -> PCI index, from the HGX guide's map {1:4, 2:6, 3:5, 4:7, 5:0, 6:2, 7:1, 8:3}.
inline std::map<uint32_t, std::string> HgxModules() {
  static const int kPciIndex[] = {4, 6, 5, 7, 0, 2, 1, 3};
  std::map<uint32_t, std::string> modules;
  for (uint32_t module = 1; module <= 8; ++module) modules[module] = HgxGpus()[kPciIndex[module - 1]];
  return modules;
}

inline std::string Module(uint32_t module) { return HgxModules().at(module); }

// The id of the fake's partition whose GPUs are exactly `gpus`, or -1.
template <typename Gpus>
int PartitionOf(const Gpus& gpus) {
  const std::set<std::string> wanted(gpus.begin(), gpus.end());
  const auto layout = FakeHgxPartitions();
  for (size_t id = 0; id < layout.size(); ++id) {
    std::set<std::string> members;
    for (uint32_t module : layout[id]) members.insert(Module(module));
    if (members == wanted) return static_cast<int>(id);
  }
  return -1;
}

// The fake's table as the agent's client builds it from FM's answer.
inline fabric::PartitionTable HgxTable(const std::set<uint32_t>& active = {}) {
  std::vector<fabric::Partition> partitions;
  const auto layout = FakeHgxPartitions();
  for (uint32_t id = 0; id < layout.size(); ++id) {
    fabric::Partition partition;
    partition.id = id;
    partition.active = active.contains(id);
    for (uint32_t module : layout[id]) {
      partition.gpus.push_back(Module(module));
      partition.module_ids.push_back(module);
    }
    partitions.push_back(partition);
  }
  return fabric::PartitionTable(partitions);
}

// Creates the state file for an FM in shared mode with nothing active; returns its path (the FM address is
// "unix:" + path).
inline std::filesystem::path MakeFakeFm(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const std::filesystem::path file = dir / "fm.state";
  FakeFmState state;
  state.gpus = HgxModules();
  WriteFakeFm(file, state);
  return file;
}

}  // namespace vfio_agent::testing
