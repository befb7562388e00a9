// Waiting for the other side to get there: a condition polled until it holds, with a limit generous enough for a
// loaded machine (a test waits on what it can observe, never for a fixed time).
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace vfio_agent::testing {

inline constexpr auto kGenerousWait = std::chrono::seconds(30);

inline bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds limit = kGenerousWait) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace vfio_agent::testing
