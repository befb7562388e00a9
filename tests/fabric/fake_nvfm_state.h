// The state of the fake Fabric Manager (fake_nvfm.cc, built as a libnvfm.so.1 stand-in): one text file, which
// is also the fake's address (`--fabric-manager unix:<file>`), so the agent under test, in this process or
// another, and the test see the same FM. Every access holds flock on the file.
//
//   mode shared | not-configured | not-supported | version-mismatch
//   epoch N             an FM restart bumps it: older connections get FM_ST_CONNECTION_NOT_VALID
//   gpu <module> <bdf>  the board's GPUs, any order (module ids are not PCI order)
//   active <id>...      active partitions
//   unsupported <id>... partitions fmGetUnsupportedFabricPartitions lists
//   fail <id> <code>    every activation of partition <id> returns <code>
//   count <call> <n>    calls made (activate, deactivate, set_activated, connect, get_supported)
//   told <id>...        the last fmSetActivatedFabricPartitions list
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace vfio_agent::testing {

struct FakeFmState {
  std::string mode = "shared";
  int epoch = 0;
  std::map<uint32_t, std::string> gpus;  // module id -> BDF
  std::set<uint32_t> active;
  std::set<uint32_t> unsupported;
  std::map<uint32_t, int> fail;
  std::map<std::string, int> counts;
  std::vector<uint32_t> told;
  bool told_any = false;
};

// The HGX 8-GPU table: P0 = all 8; P1, P2 = modules 1-4, 5-8; P3..P6 = pairs (1,2) (3,4) (5,6) (7,8); P7..P14 =
// module 1..8 alone.
std::vector<std::vector<uint32_t>> FakeHgxPartitions();

FakeFmState ReadFakeFm(const std::filesystem::path& file);
void WriteFakeFm(const std::filesystem::path& file, const FakeFmState& state);
// Read-modify-write under one lock.
template <typename Fn>
void UpdateFakeFm(const std::filesystem::path& file, Fn&& fn);

// Locked helpers: the whole update is done under flock.
class FakeFmLock {
 public:
  explicit FakeFmLock(const std::filesystem::path& file);
  ~FakeFmLock();
  FakeFmLock(const FakeFmLock&) = delete;
  FakeFmLock& operator=(const FakeFmLock&) = delete;

 private:
  int fd_;
};

template <typename Fn>
void UpdateFakeFm(const std::filesystem::path& file, Fn&& fn) {
  FakeFmLock lock(file);
  FakeFmState state = ReadFakeFm(file);
  fn(state);
  WriteFakeFm(file, state);
}

// What the fake holds now, read under the lock (the fake rewrites the file in place).
inline FakeFmState SnapshotFakeFm(const std::filesystem::path& file) {
  FakeFmLock lock(file);
  return ReadFakeFm(file);
}

// An FM restart: older connections die and the active partitions are forgotten.
inline void RestartFakeFm(const std::filesystem::path& file) {
  UpdateFakeFm(file, [](FakeFmState& state) {
    ++state.epoch;
    state.active.clear();
  });
}

}  // namespace vfio_agent::testing
