#include <sys/stat.h>

#include <filesystem>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "names_testdata.h"
#include "vfio_gpu_agent/names/resource_names.h"

extern "C" {
#include <pci/pci.h>
}

namespace vfio_agent::names {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Optional;


std::unique_ptr<PciIdsDatabase> MustLoad(const std::filesystem::path& path) {
  absl::StatusOr<std::unique_ptr<PciIdsDatabase>> db = LoadPciIds(path);
  EXPECT_TRUE(db.ok()) << db.status();
  return db.ok() ? *std::move(db) : nullptr;
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("va_names_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path Write(const std::string& name, const std::string& content) {
    std::ofstream(dir_ / name) << content;
    return dir_ / name;
  }
  std::filesystem::path dir_;
};

TEST(LoadPciIdsTest, LooksUpDeviceNamesUnderTheVendor) {
  auto db = MustLoad(testdata::kDir / "pci.ids.new");
  ASSERT_NE(db, nullptr);
  EXPECT_EQ(db->source(), (testdata::kDir / "pci.ids.new").string());
  EXPECT_THAT(db->DeviceName(0x10de, 0x2335), Optional(std::string("GH100 [H200 SXM 141GB]")));
  EXPECT_THAT(db->DeviceName(0x10de, 0x2342), Optional(std::string("GH100 [GH200 120GB / 480GB]")));
  EXPECT_THAT(db->DeviceName(0x1234, 0x2335), Optional(std::string("Other Vendor Accelerator With Id 2335")));
  EXPECT_THAT(db->DeviceName(0x8086, 0x2335), Optional(std::string("DH89xxCC USB2 Enhanced Host Controller #1")));
}

TEST(LoadPciIdsTest, NeverMatchesAnotherVendorOrASubsystemLine) {
  auto db = MustLoad(testdata::kDir / "pci.ids.new");
  ASSERT_NE(db, nullptr);
  // 10de:233a appears only as a subsystem line under 10de:2236 and as an Intel device.
  EXPECT_EQ(db->DeviceName(0x10de, 0x233a), std::nullopt);
  EXPECT_THAT(db->DeviceName(0x8086, 0x233a), Optional(std::string("Intel Device With Id 233a")));
  // 10de:12a2 and 10de:1482 are subsystem ids only.
  EXPECT_EQ(db->DeviceName(0x10de, 0x12a2), std::nullopt);
  EXPECT_EQ(db->DeviceName(0x10de, 0x1482), std::nullopt);
  EXPECT_EQ(db->DeviceName(0x10de, 0xffff), std::nullopt);
  EXPECT_EQ(db->DeviceName(0xabcd, 0x2335), std::nullopt);
}

TEST(LoadPciIdsTest, DebianSnapshotLacksH200AndKeepsIntelsId) {
  if (!std::filesystem::exists(testdata::kDebianPciIds)) GTEST_SKIP() << testdata::kDebianPciIds << " not installed (package pci.ids)";
  auto db = MustLoad(testdata::kDebianPciIds);
  ASSERT_NE(db, nullptr);
  // Debian 12 (2023.04.10): 2335 exists only under Intel, 26b9 not at all, 2330 without the space.
  EXPECT_EQ(db->DeviceName(0x10de, 0x2335), std::nullopt);
  EXPECT_TRUE(db->DeviceName(0x8086, 0x2335).has_value());
  EXPECT_EQ(db->DeviceName(0x10de, 0x26b9), std::nullopt);
  EXPECT_THAT(db->DeviceName(0x10de, 0x2330), Optional(std::string("GH100[H100 SXM5 80GB]")));
  EXPECT_THAT(db->DeviceName(0x10de, 0x2236), Optional(std::string("GA102GL [A10]")));
}

// LoadPciIds hands libpci a copy without subsystem lines; every device name must stay what libpci
// reads from the untouched file.
TEST(LoadPciIdsTest, SkippingSubsystemLinesKeepsEveryDeviceName) {
  if (!std::filesystem::exists(testdata::kDebianPciIds)) GTEST_SKIP() << testdata::kDebianPciIds << " not installed (package pci.ids)";
  auto db = MustLoad(testdata::kDebianPciIds);
  ASSERT_NE(db, nullptr);
  pci_access* raw = pci_alloc();
  raw->id_lookup_mode = PCI_LOOKUP_NO_HWDB;
  pci_set_name_list_path(raw, strdup(testdata::kDebianPciIds.c_str()), 1);
  ASSERT_EQ(pci_load_name_list(raw), 1);

  std::ifstream in(testdata::kDebianPciIds);
  std::string line;
  int vendor = -1, devices = 0;
  while (std::getline(in, line)) {
    if (line.starts_with("C ")) break;  // the class section ends the vendor list
    if (line.size() > 5 && std::isxdigit(static_cast<unsigned char>(line[0]))) {
      vendor = std::stoi(line.substr(0, 4), nullptr, 16);
    }
    if (vendor < 0 || line.size() < 6 || line[0] != '\t' || line[1] == '\t' || line[1] == '#') continue;
    const int device = std::stoi(line.substr(1, 4), nullptr, 16);
    char buf[1024];
    const char* expected =
        pci_lookup_name(raw, buf, sizeof buf, PCI_LOOKUP_DEVICE | PCI_LOOKUP_NO_NUMBERS, vendor, device);
    ASSERT_NE(expected, nullptr) << line;
    EXPECT_EQ(db->DeviceName(vendor, device).value_or("<none>"), expected) << line;
    ++devices;
  }
  pci_cleanup(raw);
  EXPECT_GT(devices, 10000);
}

TEST(LoadPciIdsTest, EmptyPathPicksAUsualLocation) {
  const auto locations = DefaultPciIdsLocations();
  ASSERT_FALSE(locations.empty());
  EXPECT_EQ(locations.front(), std::filesystem::path("/usr/share/misc/pci.ids"));
  bool any = false;
  for (const auto& location : locations) any = any || std::filesystem::exists(location);
  absl::StatusOr<std::unique_ptr<PciIdsDatabase>> db = LoadPciIds("");
  if (!any) {
    EXPECT_EQ(db.status().code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(db.status().message(), HasSubstr("/usr/share/misc/pci.ids"));
    return;
  }
  ASSERT_TRUE(db.ok()) << db.status();
  EXPECT_TRUE(std::filesystem::exists((*db)->source()));
}

using LoadPciIdsErrorTest = TempDir;

TEST_F(LoadPciIdsErrorTest, MissingFileIsNotFoundWithThePath) {
  const std::filesystem::path missing = dir_ / "no-such.ids";
  absl::StatusOr<std::unique_ptr<PciIdsDatabase>> db = LoadPciIds(missing);
  EXPECT_EQ(db.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(db.status().message(), HasSubstr(missing.string()));
}

TEST_F(LoadPciIdsErrorTest, DirectoryIsRejected) {
  absl::StatusOr<std::unique_ptr<PciIdsDatabase>> db = LoadPciIds(dir_);
  EXPECT_FALSE(db.ok());
  EXPECT_THAT(db.status().message(), HasSubstr(dir_.string()));
}

// `--pci-ids /dev/zero` used to read until std::bad_alloc aborted the agent; a FIFO blocked it forever.
TEST_F(LoadPciIdsErrorTest, EndlessDeviceAndFifoAreRefusedWithThePath) {
  absl::StatusOr<std::unique_ptr<PciIdsDatabase>> zero = LoadPciIds("/dev/zero");
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), AllOf(HasSubstr("/dev/zero"), HasSubstr("not a regular file")));
  const std::filesystem::path fifo = dir_ / "pci.ids.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<std::unique_ptr<PciIdsDatabase>> piped = LoadPciIds(fifo);
  EXPECT_EQ(piped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(piped.status().message(), AllOf(HasSubstr(fifo.string()), HasSubstr("FIFO")));
  // The lazy database of `serve` finds nothing instead of failing or hanging.
  EXPECT_EQ(LazyPciIds("/dev/zero")->DeviceName(0x10de, 0x2236), std::nullopt);
}

TEST_F(LoadPciIdsErrorTest, MalformedFileNamesPathAndLineInsteadOfExiting) {
  absl::StatusOr<std::unique_ptr<PciIdsDatabase>> db = LoadPciIds(testdata::kDir / "pci.ids.malformed");
  EXPECT_EQ(db.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(db.status().message(), HasSubstr("pci.ids.malformed"));
  EXPECT_THAT(db.status().message(), HasSubstr("line 3"));
}

TEST_F(LoadPciIdsErrorTest, ErrorLineCountsTheSubsystemLinesSkippedForSpeed) {
  auto path = Write("late.ids", "10de  NVIDIA\n\t2236  A10\n\t\t10de 1482  A\n\t\t10de 1483  B\nzzzz  broken\n");
  absl::StatusOr<std::unique_ptr<PciIdsDatabase>> db = LoadPciIds(path);
  EXPECT_EQ(db.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(db.status().message(), HasSubstr("line 5"));
  EXPECT_THAT(db.status().message(), HasSubstr(path.string()));
}

TEST_F(LoadPciIdsErrorTest, GzipFileIsReadByLibpci) {
  const std::filesystem::path gz = dir_ / "pci.ids.gz";
  const std::string command = "gzip -c '" + (testdata::kDir / "pci.ids.new").string() + "' > '" + gz.string() + "'";
  if (std::system(command.c_str()) != 0) GTEST_SKIP() << "gzip not available";
  auto db = MustLoad(gz);
  ASSERT_NE(db, nullptr);
  EXPECT_THAT(db->DeviceName(0x10de, 0x2335), Optional(std::string("GH100 [H200 SXM 141GB]")));
  EXPECT_EQ(db->DeviceName(0x10de, 0x233a), std::nullopt);
}

TEST_F(LoadPciIdsErrorTest, DuplicateEntryIsAnError) {
  auto path = Write("dup.ids", "10de  NVIDIA\n\t2236  A\n\t2236  B\n");
  absl::StatusOr<std::unique_ptr<PciIdsDatabase>> db = LoadPciIds(path);
  EXPECT_EQ(db.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(db.status().message(), HasSubstr("Duplicate entry"));
}

TEST_F(LoadPciIdsErrorTest, FileWithoutEntriesIsAnError) {
  auto path = Write("empty.ids", "# nothing here\n");
  absl::StatusOr<std::unique_ptr<PciIdsDatabase>> db = LoadPciIds(path);
  EXPECT_EQ(db.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(db.status().message(), HasSubstr("no entries"));
}

TEST_F(LoadPciIdsErrorTest, ALoadErrorLeavesLaterLoadsWorking) {
  EXPECT_FALSE(LoadPciIds(testdata::kDir / "pci.ids.malformed").ok());
  auto db = MustLoad(testdata::kDir / "pci.ids.old");
  ASSERT_NE(db, nullptr);
  EXPECT_THAT(db->DeviceName(0x10de, 0x2321), Optional(std::string("GH100")));
}

using LazyPciIdsTest = TempDir;

TEST_F(LazyPciIdsTest, ReadsTheFileAtTheFirstLookupNotBefore) {
  auto path = Write("lazy.ids", "10de  NVIDIA\n\t2236  Before\n");
  std::unique_ptr<PciIdsDatabase> db = LazyPciIds(path);
  Write("lazy.ids", "10de  NVIDIA\n\t2236  GA102GL [A10]\n");
  EXPECT_THAT(db->DeviceName(0x10de, 0x2236), Optional(std::string("GA102GL [A10]")));
  EXPECT_EQ(db->source(), path.string());
  // Loaded once: a later change of the file is not seen.
  Write("lazy.ids", "10de  NVIDIA\n\t2236  After\n");
  EXPECT_THAT(db->DeviceName(0x10de, 0x2236), Optional(std::string("GA102GL [A10]")));
}

TEST_F(LazyPciIdsTest, ABrokenFileFindsNothingInsteadOfFailing) {
  std::unique_ptr<PciIdsDatabase> db = LazyPciIds(testdata::kDir / "pci.ids.malformed");
  EXPECT_EQ(db->DeviceName(0x10de, 0x2236), std::nullopt);
  EXPECT_EQ(db->source(), "");
  EXPECT_EQ(LazyPciIds(dir_ / "missing.ids")->DeviceName(0x10de, 0x2236), std::nullopt);
}

}  // namespace
}  // namespace vfio_agent::names
