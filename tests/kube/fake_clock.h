// A clock the test moves by hand, so rate limits, backoff and Retry-After run without waiting real seconds.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>

#include "reporter.h"

namespace vfio_agent::kube::testing {

class FakeClock final : public Clock {
 public:
  TimePoint Now() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return now_;
  }
  std::chrono::system_clock::time_point WallNow() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return wall_start_ + std::chrono::duration_cast<std::chrono::system_clock::duration>(now_ - TimePoint());
  }
  void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, TimePoint deadline) override {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      if (deadline <= now_) return;
      sleeping_until_ = deadline;
      waiter_ = &cv;
    }
    // Advance() notifies; the short real wait covers a notification that raced with going to sleep.
    cv.wait_for(lock, std::chrono::milliseconds(20));
    std::lock_guard<std::mutex> guard(mutex_);
    sleeping_until_.reset();
    waiter_ = nullptr;
  }

  void Advance(std::chrono::steady_clock::duration by) {
    std::condition_variable* waiter;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      now_ += by;
      waiter = waiter_;
    }
    if (waiter != nullptr) waiter->notify_all();
  }
  // The time the worker waits for right now (TimePoint::max(): idle, nothing to do); nullopt while it runs.
  std::optional<TimePoint> SleepingUntil() {
    std::lock_guard<std::mutex> lock(mutex_);
    return sleeping_until_;
  }
  // Since the clock was made (it starts at the steady clock's epoch).
  std::chrono::steady_clock::duration Elapsed() { return Now() - TimePoint(); }

 private:
  std::mutex mutex_;
  TimePoint now_{};
  const std::chrono::system_clock::time_point wall_start_ = std::chrono::system_clock::now();
  std::optional<TimePoint> sleeping_until_;
  std::condition_variable* waiter_ = nullptr;
};

}  // namespace vfio_agent::kube::testing
