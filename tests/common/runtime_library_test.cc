#include "vfio_gpu_agent/common/runtime_library.h"

#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vfio_agent {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(RuntimeLibraryTest, ResolvedSymbolsAreTheLibrarysOwn) {
  absl::StatusOr<RuntimeLibrary> libc = RuntimeLibrary::Open("libc.so.6");
  ASSERT_TRUE(libc.ok()) << libc.status();
  decltype(&::getpid) getpid_fn = nullptr;
  libc->Resolve(getpid_fn, "getpid");
  ASSERT_TRUE(libc->Complete().ok()) << libc->Complete();
  ASSERT_NE(getpid_fn, nullptr);
  EXPECT_EQ(getpid_fn(), ::getpid());
}

TEST(RuntimeLibraryTest, EveryMissingSymbolIsNamedWithTheLibrary) {
  absl::StatusOr<RuntimeLibrary> libc = RuntimeLibrary::Open("libc.so.6");
  ASSERT_TRUE(libc.ok()) << libc.status();
  decltype(&::getpid) present = nullptr, absent = nullptr, also_absent = nullptr;
  libc->Resolve(absent, "vfio_agent_no_such_symbol");
  libc->Resolve(present, "getpid");
  libc->Resolve(also_absent, "vfio_agent_no_such_symbol_either");
  EXPECT_EQ(absent, nullptr);
  EXPECT_NE(present, nullptr);
  const absl::Status complete = libc->Complete();
  EXPECT_EQ(complete.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(complete.message(), AllOf(HasSubstr("libc.so.6 lacks vfio_agent_no_such_symbol, "),
                                        HasSubstr("vfio_agent_no_such_symbol_either")));
  EXPECT_THAT(complete.message(), ::testing::Not(HasSubstr("getpid")));
}

TEST(RuntimeLibraryTest, AnAbsentLibraryIsAnErrorNamingIt) {
  absl::StatusOr<RuntimeLibrary> missing = RuntimeLibrary::Open("libvfio-agent-absent.so.9");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.status().message(), HasSubstr("libvfio-agent-absent.so.9"));
}

}  // namespace
}  // namespace vfio_agent
