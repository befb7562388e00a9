#include "vfio_gpu_agent/common/thread_name.h"

#include <pthread.h>

#include <algorithm>
#include <array>

namespace vfio_agent {

namespace {
constexpr size_t kCommBytes = 16;  // TASK_COMM_LEN, the terminating NUL included
}  // namespace

void NameThisThread(std::string_view name) {
  std::array<char, kCommBytes> comm{};
  std::copy_n(name.begin(), std::min(name.size(), kCommBytes - 1), comm.begin());
  // Fails only for a name over 15 bytes, which the copy has cut; a thread without its name still works.
  (void)pthread_setname_np(pthread_self(), comm.data());
}

std::string ThisThreadName() {
  std::array<char, kCommBytes> comm{};
  if (pthread_getname_np(pthread_self(), comm.data(), comm.size()) != 0) return {};
  return comm.data();
}

}  // namespace vfio_agent
