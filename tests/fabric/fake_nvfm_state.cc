#include "fake_nvfm_state.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <ctime>
#include <fstream>
#include <sstream>

namespace vfio_agent::testing {

std::vector<std::vector<uint32_t>> FakeHgxPartitions() {
  std::vector<std::vector<uint32_t>> out = {{1, 2, 3, 4, 5, 6, 7, 8}, {1, 2, 3, 4}, {5, 6, 7, 8},
                                            {1, 2}, {3, 4}, {5, 6}, {7, 8}};
  for (uint32_t module = 1; module <= 8; ++module) out.push_back({module});
  return out;
}

int64_t FakeFmNowMs() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000 + now.tv_nsec / 1000000;
}

void ApplyFakeFmClock(FakeFmState& state) {
  if (!state.awaiting_since_ms) return;
  // FM's wait starts once it has initialised: while it is still initialising its timer has not begun.
  if (state.mode == "not-configured") state.awaiting_since_ms = FakeFmNowMs();
  if (FakeFmNowMs() - *state.awaiting_since_ms < state.restart_timeout_ms) return;
  state.awaiting_since_ms.reset();
  state.dead = true;
  state.active.clear();
}

FakeFmLock::FakeFmLock(const std::filesystem::path& file) : fd_(::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
  if (fd_ >= 0) ::flock(fd_, LOCK_EX);
}

FakeFmLock::~FakeFmLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

FakeFmState ReadFakeFm(const std::filesystem::path& file) {
  FakeFmState state;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key;
    words >> key;
    if (key == "mode") {
      words >> state.mode;
    } else if (key == "epoch") {
      words >> state.epoch;
    } else if (key == "gpu") {
      uint32_t module = 0;
      std::string bdf;
      words >> module >> bdf;
      state.gpus[module] = bdf;
    } else if (key == "active" || key == "unsupported" || key == "told") {
      if (key == "told") state.told_any = true;
      for (uint32_t id; words >> id;) {
        if (key == "active") state.active.insert(id);
        if (key == "unsupported") state.unsupported.insert(id);
        if (key == "told") state.told.push_back(id);
      }
    } else if (key == "fail") {
      uint32_t id = 0;
      int code = 0;
      words >> id >> code;
      state.fail[id] = code;
    } else if (key == "resiliency") {
      words >> state.resiliency;
    } else if (key == "awaiting") {
      int64_t since = 0;
      words >> since;
      state.awaiting_since_ms = since;
    } else if (key == "restart_timeout_ms") {
      words >> state.restart_timeout_ms;
    } else if (key == "dead") {
      state.dead = true;
    } else if (key == "is_active") {
      uint32_t id = 0;
      unsigned value = 0;
      words >> id >> value;
      state.is_active[id] = value;
    } else if (key == "count") {
      std::string call;
      int n = 0;
      words >> call >> n;
      state.counts[call] = n;
    }
  }
  return state;
}

void WriteFakeFm(const std::filesystem::path& file, const FakeFmState& state) {
  std::ostringstream out;
  out << "mode " << state.mode << "\nepoch " << state.epoch << "\n";
  for (const auto& [module, bdf] : state.gpus) out << "gpu " << module << " " << bdf << "\n";
  out << "active";
  for (uint32_t id : state.active) out << " " << id;
  out << "\nunsupported";
  for (uint32_t id : state.unsupported) out << " " << id;
  out << "\n";
  for (const auto& [id, code] : state.fail) out << "fail " << id << " " << code << "\n";
  out << "resiliency " << (state.resiliency ? 1 : 0) << "\nrestart_timeout_ms " << state.restart_timeout_ms << "\n";
  if (state.awaiting_since_ms) out << "awaiting " << *state.awaiting_since_ms << "\n";
  if (state.dead) out << "dead\n";
  for (const auto& [id, value] : state.is_active) out << "is_active " << id << " " << value << "\n";
  for (const auto& [call, n] : state.counts) out << "count " << call << " " << n << "\n";
  if (state.told_any) {
    out << "told";
    for (uint32_t id : state.told) out << " " << id;
    out << "\n";
  }
  // Rewritten in place (not renamed): the lock is on this inode.
  std::ofstream(file, std::ios::trunc) << out.str();
}

}  // namespace vfio_agent::testing
