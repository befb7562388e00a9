// A fake Fabric Manager over the simulated HGX H200 board: its GPUs' BDFs, module ids deliberately out of PCI
// order (as NVIDIA's HGX guide maps them), and a state file in a fresh directory.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "fake_nvfm_state.h"

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
