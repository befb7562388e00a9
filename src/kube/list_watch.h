// One collection listed, then watched, on a thread of its own: what ResourceSliceWatch and ResourceClaimWatch
// share. The thread owns the connection: one long request, re-made from the last resourceVersion when the server
// ends it, a new list after a 410 Gone, a doubling backoff (1 s to 30 s) after an error, watches of a random 5 to 10
// minutes as client-go's reflector asks.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace vfio_agent::kube {

class ApiClient;
class StreamCanceller;

class ListWatcher {
 public:
  struct Handlers {
    // Every list's answer (the whole collection as the server has it now); `relisted` is false for the first one.
    std::function<void(const nlohmann::json& list, bool relisted)> listed;
    // Every ADDED, MODIFIED or DELETED event's type and object (never a BOOKMARK or an ERROR).
    std::function<void(const std::string& type, const nlohmann::json& object)> event;
  };

  // `path`: the collection, with its selector if any. `what` names it in logs ("ResourceSlices"). `list_page` > 0
  // lists in pages of that many objects (limit and continue, as client-go's pager; a continue token that expires
  // between pages starts the list over), handed to `listed` as one list: a cluster-wide collection.
  ListWatcher(std::shared_ptr<ApiClient> client, std::string path, std::string what, std::string thread_name,
              Handlers handlers, int list_page = 0);
  ~ListWatcher();  // stops the thread and waits for it
  ListWatcher(const ListWatcher&) = delete;
  ListWatcher& operator=(const ListWatcher&) = delete;

  uint64_t watches() const { return watches_.load(); }
  uint64_t lists() const { return lists_.load(); }

 private:
  void Run();
  // One whole list (every page), or the first error; `stopping_` ends it early with an error.
  absl::StatusOr<nlohmann::json> List();
  bool WaitBackoff(std::chrono::milliseconds backoff);  // false when stopping

  const std::shared_ptr<ApiClient> client_;
  const std::string path_;
  const std::string what_;
  const std::string thread_name_;
  const Handlers handlers_;
  const int list_page_;
  std::unique_ptr<StreamCanceller> cancel_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> watches_{0};
  std::atomic<uint64_t> lists_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

}  // namespace vfio_agent::kube
