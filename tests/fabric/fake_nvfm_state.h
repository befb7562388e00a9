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
//   resiliency 0|1      FABRIC_MODE_RESTART: 1 (default, the DRA driver's documented setting) = a restarted FM
//                       refuses every partition call (reads included) with FM_ST_NOT_CONFIGURED until
//                       fmSetActivatedFabricPartitions arrives, and exits if it has not within the timeout;
//                       0 = a restarted FM answers at once, with nothing active
//   awaiting <since-ms> FM restarted in resiliency mode and not yet told; since = CLOCK_MONOTONIC ms at restart
//   restart_timeout_ms N how long a restarted FM waits to be told before it exits (FM: 60 s); tests set it
//   dead                FM exited (not told in time): every connect and call fails as on a refused connection
//   is_active <id> <n>  the isActive value FM reports for partition <id> (FM's value is 1 for active, but the
//                       field is an unsigned int: a client must take only 1 as active)
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
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
  bool resiliency = true;
  std::optional<int64_t> awaiting_since_ms;  // in the refusal window after a restart
  int64_t restart_timeout_ms = 60000;
  bool dead = false;
  std::map<uint32_t, unsigned> is_active;
};

// CLOCK_MONOTONIC in ms: one clock for every process on the host, as the agent and the test share the state.
int64_t FakeFmNowMs();

// FM's own timer, applied whenever the state is looked at (the fake has no thread): a restarted FM in resiliency
// mode that has not been told within restart_timeout_ms exits.
void ApplyFakeFmClock(FakeFmState& state);

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

// What the fake holds now, FM's timer applied, read under the lock (the fake rewrites the file in place).
inline FakeFmState SnapshotFakeFm(const std::filesystem::path& file) {
  FakeFmState snapshot;
  UpdateFakeFm(file, [&](FakeFmState& state) {
    ApplyFakeFmClock(state);
    snapshot = state;
  });
  return snapshot;
}

// An FM restart (also of an FM that exited): older connections die and the active partitions are forgotten. In
// resiliency mode the new FM then waits restart_timeout_ms to be told which partitions are active.
inline void RestartFakeFm(const std::filesystem::path& file) {
  UpdateFakeFm(file, [](FakeFmState& state) {
    ++state.epoch;
    state.active.clear();
    state.dead = false;
    state.told.clear();
    state.told_any = false;
    if (state.resiliency) state.awaiting_since_ms = FakeFmNowMs();
  });
}

}  // namespace vfio_agent::testing
