#include "vfio_gpu_agent/common/thread_name.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace vfio_agent {
namespace {

// What ps and the soak read, rather than what the library hands back.
std::string CommOfThisThread() {
  std::ifstream comm("/proc/self/task/" + std::to_string(::syscall(SYS_gettid)) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

TEST(ThreadName, NamesTheCallingThreadOnly) {
  const std::string main_name = CommOfThisThread();
  std::string seen, read_back;
  std::thread([&] {
    NameThisThread("va-test");
    seen = CommOfThisThread();
    read_back = ThisThreadName();
  }).join();
  EXPECT_EQ(seen, "va-test");
  EXPECT_EQ(read_back, "va-test");
  EXPECT_EQ(CommOfThisThread(), main_name);
}

TEST(ThreadName, LongNameIsCutAtFifteenBytes) {
  std::string seen;
  std::thread([&] {
    NameThisThread("va-a-name-longer-than-fifteen");
    seen = CommOfThisThread();
  }).join();
  EXPECT_EQ(seen, "va-a-name-longe");
}

}  // namespace
}  // namespace vfio_agent
