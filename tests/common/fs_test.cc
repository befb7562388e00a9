#include "vfio_gpu_agent/common/fs.h"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <fstream>
#include <utility>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/sysfs_tree.h"

// The test binary's own readdir, ahead of libc's for every caller (std::filesystem included): once armed, the
// listing fails after its first entry with the given errno, at exactly that point however fast or slow the
// machine is. glibc itself turns ENOENT (a /proc/<pid>/fd whose process exited) into a quiet end of the
// listing, but not ENOTCONN or EIO (a FUSE mount such as the sysfs simulator whose daemon went away).
namespace {
int fail_after_first_entry = 0;
bool first_entry_returned = false;
}  // namespace

extern "C" struct dirent* readdir(DIR* dir) {
  using Real = struct dirent* (*)(DIR*);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "readdir"));
  if (fail_after_first_entry != 0 && first_entry_returned) {
    errno = std::exchange(fail_after_first_entry, 0);
    return nullptr;
  }
  struct dirent* entry = real(dir);
  first_entry_returned = entry != nullptr;
  return entry;
}

// And its fsync, counted, so the tests can tell a durable write from a boot-scoped one.
namespace {
int fsync_calls = 0;
}  // namespace

extern "C" int fsync(int fd) {
  using Real = int (*)(int);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "fsync"));
  ++fsync_calls;
  return real(fd);
}

namespace vfio_agent::fs {
namespace {

using ::testing::HasSubstr;

class FsTest : public ::testing::Test {
 protected:
  vfio_agent::testing::TempDir tmp_{"va-fs"};
};

TEST_F(FsTest, ReadsARegularFileAndAProcfsAttribute) {
  std::ofstream(tmp_.path() / "attr") << "0x10de\n";
  EXPECT_EQ(ReadTrimmed(tmp_.path() / "attr").value_or("?"), "0x10de");
  EXPECT_EQ(ReadHex(tmp_.path() / "attr").value_or(0), 0x10deu);
  // procfs reports size 0 for content it has: the bound is on what is read, not on st_size.
  absl::StatusOr<std::string> comm = ReadTrimmed("/proc/self/comm");
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_FALSE(comm->empty());
}

TEST_F(FsTest, AnEndlessDeviceIsRefusedNotReadUntilMemoryRunsOut) {
  absl::StatusOr<std::string> zero = ReadTrimmed("/dev/zero");
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), HasSubstr("/dev/zero"));
  EXPECT_THAT(zero.status().message(), HasSubstr("character device"));
}

TEST_F(FsTest, AFifoIsRefusedWithoutWaitingForAWriter) {
  const std::filesystem::path fifo = tmp_.path() / "fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // Without a writer, a blocking open or read would never return (ctest's timeout would end the test).
  absl::StatusOr<std::string> read = ReadTrimmed(fifo);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr("FIFO"));
  EXPECT_THAT(read.status().message(), HasSubstr(fifo.string()));
}

TEST_F(FsTest, ADirectoryIsRefused) {
  absl::StatusOr<std::string> read = ReadTrimmed(tmp_.path());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr("directory"));
}

TEST_F(FsTest, AFileLargerThanTheBoundIsAnErrorNamingTheBound) {
  std::ofstream(tmp_.path() / "big") << std::string(5000, 'x');
  EXPECT_TRUE(ReadTrimmed(tmp_.path() / "big", 5000).ok());
  absl::StatusOr<std::string> read = ReadTrimmed(tmp_.path() / "big", 4999);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(read.status().message(), HasSubstr("4999 bytes"));
}

TEST_F(FsTest, ListDirIsSortedAndMissingIsNotFound) {
  for (const char* name : {"b", "a", "c"}) std::ofstream(tmp_.path() / name) << "";
  EXPECT_EQ(ListDir(tmp_.path()).value_or(std::vector<std::string>{}), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ListDir(tmp_.path() / "missing").status().code(), absl::StatusCode::kNotFound);
}

// A listing that fails midway must come back as a status, not as std::filesystem_error out of the
// iterator's increment (which a range-for over a directory_iterator throws).
TEST_F(FsTest, AListingThatFailsMidwayIsAnErrorNotAnException) {
  for (const char* name : {"a", "b", "c"}) std::ofstream(tmp_.path() / name) << "";
  first_entry_returned = false;
  fail_after_first_entry = ENOTCONN;
  absl::StatusOr<std::vector<std::string>> listed;
  EXPECT_NO_THROW(listed = ListDir(tmp_.path()));
  EXPECT_EQ(fail_after_first_entry, 0) << "the listing never reached its second entry";
  fail_after_first_entry = 0;
  EXPECT_FALSE(listed.ok());
  EXPECT_THAT(listed.status().message(), HasSubstr(tmp_.path().string()));
  EXPECT_THAT(listed.status().message(), HasSubstr("not connected"));
}

TEST_F(FsTest, AnAtomicWriteReplacesTheFileAndFsyncsOnlyWhatMustOutliveTheBoot) {
  const std::filesystem::path path = tmp_.path() / "claim.json";
  std::ofstream(path) << "old";
  const int before = fsync_calls;
  ASSERT_TRUE(WriteFileAtomically(path, "durable", 0600).ok());
  EXPECT_EQ(fsync_calls, before + 1);
  EXPECT_EQ(ReadTrimmed(path).value_or("?"), "durable");
  EXPECT_EQ(std::filesystem::status(path).permissions(),
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);

  ASSERT_TRUE(WriteFileAtomically(path, "this boot", 0644, Durability::kThisBoot).ok());
  EXPECT_EQ(fsync_calls, before + 1);
  EXPECT_EQ(ReadTrimmed(path).value_or("?"), "this boot");
  // No temporary file is left beside it.
  EXPECT_THAT(ListDir(tmp_.path()).value_or(std::vector<std::string>{}), ::testing::ElementsAre("claim.json"));
}

TEST_F(FsTest, AnAtomicWriteIntoAMissingDirectoryNamesIt) {
  absl::Status status = WriteFileAtomically(tmp_.path() / "gone" / "claim.json", "x", 0644, Durability::kThisBoot);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr((tmp_.path() / "gone").string()));
}

}  // namespace
}  // namespace vfio_agent::fs
