#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/sysfs_tree.h"
#include "names_testdata.h"
#include "vfio_gpu_agent/names/resource_names.h"

namespace vfio_agent::names {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr uint16_t kNvidia = 0x10de;

// An in-memory pci.ids for inputs no real snapshot has (adversarial collisions, long names).
class FakePciIds : public PciIdsDatabase {
 public:
  explicit FakePciIds(std::map<uint32_t, std::string> names) : names_(std::move(names)) {}
  std::optional<std::string> DeviceName(uint16_t vendor_id, uint16_t device_id) const override {
    looked_up.insert(NameKey(vendor_id, device_id));
    auto it = names_.find(NameKey(vendor_id, device_id));
    if (it == names_.end()) return std::nullopt;
    return it->second;
  }
  std::string source() const override { return ""; }

  mutable std::set<uint32_t> looked_up;

 private:
  std::map<uint32_t, std::string> names_;
};


std::vector<std::pair<uint16_t, uint16_t>> Nvidia(std::initializer_list<uint16_t> devices) {
  std::vector<std::pair<uint16_t, uint16_t>> ids;
  for (uint16_t d : devices) ids.emplace_back(kNvidia, d);
  return ids;
}

TEST(NameResolverTest, LooksUpPciIdsOnlyForIdsWithoutAnOverrideOrPinnedName) {
  FakePciIds db({{NameKey(kNvidia, 0x2335), "GH100 [H200 SXM 141GB]"}, {NameKey(kNvidia, 0x2342), "GH100 [GH200]"},
                 {NameKey(kNvidia, 0x1234), "GX [Thing]"}});
  auto r = NameResolver(&db, "nvidia.com", {{kNvidia, 0x1234, "MINE"}}).Resolve(Nvidia({0x2335, 0x2342, 0x1234}));
  EXPECT_EQ(db.looked_up, std::set<uint32_t>{NameKey(kNvidia, 0x2342)});
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2335)).name, "GH100_H200_SXM_141GB");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2342)).name, "GH100_GH200");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2342)).pci_ids_name, "GH100 [GH200]");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x1234)).name, "MINE");
}

// What every resolution must guarantee, whatever the input.
void ExpectRegistrable(const std::map<uint32_t, ResolvedName>& resolved) {
  std::set<std::string> seen;
  for (const auto& [key, r] : resolved) {
    EXPECT_EQ(key, NameKey(r.vendor_id, r.device_id));
    EXPECT_TRUE(ValidateExtendedResourceName(r.resource_name).ok()) << ValidateExtendedResourceName(r.resource_name);
    EXPECT_EQ(r.resource_name, "nvidia.com/" + r.name);
    EXPECT_TRUE(seen.insert(r.name).second) << "name " << r.name << " registered twice";
  }
}

struct CozystackEntry {
  uint16_t device;
  const char* resource_name;
};

// Section 4.1 of sandbox-components.md, verbatim.
const CozystackEntry kCozystack[] = {
    {0x2335, "nvidia.com/GH100_H200_SXM_141GB"},         {0x2330, "nvidia.com/GH100_H100_SXM5_80GB"},
    {0x2331, "nvidia.com/GH100_H100_PCIE"},              {0x2321, "nvidia.com/GH100_H100L_94GB"},
    {0x26b9, "nvidia.com/AD102GL_L40S"},                 {0x26b5, "nvidia.com/AD102GL_L40"},
    {0x27b8, "nvidia.com/AD104GL_L4"},                   {0x20b2, "nvidia.com/GA100_A100_SXM4_80GB"},
    {0x20b0, "nvidia.com/GA100_A100_SXM4_40GB"},         {0x20b5, "nvidia.com/GA100_A100_PCIE_80GB"},
    {0x20f1, "nvidia.com/GA100_A100_PCIE_40GB"},         {0x20b7, "nvidia.com/GA100GL_A30_PCIE"},
    {0x2235, "nvidia.com/GA102GL_A40"},                  {0x2236, "nvidia.com/GA102GL_A10"},
    {0x1eb8, "nvidia.com/TU104GL_TESLA_T4"},             {0x1db1, "nvidia.com/GV100GL_TESLA_V100_SXM2_16GB"},
    {0x1db5, "nvidia.com/GV100GL_TESLA_V100_SXM2_32GB"}, {0x1db4, "nvidia.com/GV100GL_TESLA_V100_PCIE_16GB"},
    {0x1df6, "nvidia.com/GV100GL_TESLA_V100S_PCIE_32GB"},
};

// The pinned table is Cozystack's, as the reference lists it (not as the code spells it).
TEST(CozystackTableTest, PinnedTableIsTheReferenceTable) {
  std::map<uint16_t, std::string> reference;
  for (const auto& e : kCozystack) reference[e.device] = std::string(e.resource_name).substr(strlen("nvidia.com/"));
  EXPECT_EQ(PinnedNames(), reference);
}

// A pci.ids holding `names` under vendor 10de, one device line each, written as the file is.
std::filesystem::path WritePciIds(const std::filesystem::path& path, const std::vector<std::pair<uint16_t, std::string>>& names) {
  std::ofstream out(path);
  out << "# test pci.ids\n10de  NVIDIA Corporation\n";
  for (const auto& [device, name] : names) out << "\t" << absl::StrFormat("%04x", device) << "  " << name << "\n";
  return path;
}

// Unpinned ids, so that the names below come from the pci.ids text (loader and NVIDIA's rule), not the table.
constexpr uint16_t kFirstUnpinnedId = 0xf000;

class CozystackNamesFromPciIdsTest : public ::testing::Test {
 protected:
  // Writes each text as a device line of its own unpinned id, loads the file and returns the resource name
  // NVIDIA's rule gives each device line as read back by the loader.
  std::vector<std::string> NamesFromText(const std::vector<std::string>& texts) {
    std::vector<std::pair<uint16_t, std::string>> lines;
    for (size_t i = 0; i < texts.size(); ++i) lines.emplace_back(kFirstUnpinnedId + i, texts[i]);
    absl::StatusOr<std::unique_ptr<PciIdsDatabase>> db = LoadPciIds(WritePciIds(dir_.path() / "pci.ids", lines));
    EXPECT_TRUE(db.ok()) << db.status();
    std::vector<std::string> out;
    if (!db.ok()) return out;
    for (const auto& [device, text] : lines) {
      std::optional<std::string> read = (*db)->DeviceName(kNvidia, device);
      EXPECT_TRUE(read.has_value()) << text;
      out.push_back("nvidia.com/" + Slug(read.value_or("")));
    }
    return out;
  }
  vfio_agent::testing::TempDir dir_{"va-names"};
};

// pci.ids as it spells Cozystack's 19 models today: NVIDIA's rule turns each text into the name Cozystack
// lists, so the pinned table and the peer plugin agree on an up-to-date host.
TEST_F(CozystackNamesFromPciIdsTest, TodaysSpellingsGiveCozystacksNames) {
  absl::StatusOr<std::unique_ptr<PciIdsDatabase>> today = LoadPciIds(testdata::kDir / "pci.ids.new");
  ASSERT_TRUE(today.ok()) << today.status();
  std::vector<std::string> texts;
  for (const auto& e : kCozystack) {
    std::optional<std::string> text = (*today)->DeviceName(kNvidia, e.device);
    ASSERT_TRUE(text.has_value()) << std::hex << e.device;
    texts.push_back(*text);
  }
  const std::vector<std::string> names = NamesFromText(texts);
  ASSERT_EQ(names.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(names[i], kCozystack[i].resource_name) << texts[i];

  // Through the resolver, such a text under an id of its own takes the suffix: the pinned name is taken.
  absl::StatusOr<std::unique_ptr<PciIdsDatabase>> db =
      LoadPciIds(WritePciIds(dir_.path() / "one.ids", {{kFirstUnpinnedId, texts[0]}}));
  ASSERT_TRUE(db.ok()) << db.status();
  const ResolvedName moved =
      NameResolver(db->get(), "nvidia.com", {}).Resolve(Nvidia({kFirstUnpinnedId})).at(NameKey(kNvidia, kFirstUnpinnedId));
  EXPECT_EQ(moved.source, NameSource::kPciIds);
  EXPECT_EQ(moved.pci_ids_name, texts[0]);
  EXPECT_EQ(moved.resource_name, absl::StrCat(kCozystack[0].resource_name, "_F000"));
}

// Spellings pci.ids has used or could use: case, runs of blanks, tabs, trailing blanks, punctuation.
TEST_F(CozystackNamesFromPciIdsTest, OddSpellingsGiveTheExpectedNames) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"GH100  [H200   SXM 141GB]", "nvidia.com/GH100_H200_SXM_141GB"},
      {"GH100 [H200\tSXM\t\t141GB]", "nvidia.com/GH100_H200_SXM_141GB"},
      {"gh100 [h200 sxm 141gb]", "nvidia.com/GH100_H200_SXM_141GB"},
      {"GA100 [A100 PCIe 40GB]   ", "nvidia.com/GA100_A100_PCIE_40GB"},
      {"GV100GL [Tesla V100S PCIe 32GB]", "nvidia.com/GV100GL_TESLA_V100S_PCIE_32GB"},
      {"GA100 [A100-PCIe-80GB]", "nvidia.com/GA100_A100PCIE80GB"},
      {"GH100 [GH200 120GB / 480GB]", "nvidia.com/GH100_GH200_120GB___480GB"},
      // "." and the blank after it are two characters the rule maps to "_" each.
      {"AD102GL [L40S] (rev. a1)", "nvidia.com/AD102GL_L40S_REV__A1"},
      {"GH100[H100 SXM5 80GB]", "nvidia.com/GH100H100_SXM5_80GB"},
  };
  std::vector<std::string> texts;
  for (const auto& [text, expected] : cases) texts.push_back(text);
  const std::vector<std::string> names = NamesFromText(texts);
  ASSERT_EQ(names.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(names[i], cases[i].second) << texts[i];
}

// Debian 12's pci.ids spells two of the models otherwise ("GH100", "GH100[H100 SXM5 80GB]") and lacks the
// H200 and L40S: by NVIDIA's rule those give other names, which is why the table is pinned. Pinned ids
// resolve as Cozystack lists with that database, today's, the host's, or none.
TEST_F(CozystackNamesFromPciIdsTest, OldSpellingsGiveOtherNamesSoTheTableIsPinned) {
  absl::StatusOr<std::unique_ptr<PciIdsDatabase>> old = LoadPciIds(testdata::kDir / "pci.ids.old");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ((*old)->DeviceName(kNvidia, 0x2335), std::nullopt);
  const std::vector<std::string> drifted =
      NamesFromText({*(*old)->DeviceName(kNvidia, 0x2321), *(*old)->DeviceName(kNvidia, 0x2330)});
  ASSERT_EQ(drifted.size(), 2u);
  EXPECT_EQ(drifted[0], "nvidia.com/GH100");
  EXPECT_EQ(drifted[1], "nvidia.com/GH100H100_SXM5_80GB");

  std::vector<std::unique_ptr<PciIdsDatabase>> databases;
  databases.push_back(*std::move(old));
  databases.push_back(nullptr);
  for (const std::filesystem::path& path : {testdata::kDir / "pci.ids.new", testdata::kDebianPciIds}) {
    if (!std::filesystem::exists(path)) continue;  // the host's copy is optional here
    absl::StatusOr<std::unique_ptr<PciIdsDatabase>> db = LoadPciIds(path);
    ASSERT_TRUE(db.ok()) << db.status();
    databases.push_back(*std::move(db));
  }
  for (const auto& db : databases) {
    for (const auto& e : kCozystack) {
      const auto alone = NameResolver(db.get(), "nvidia.com", {}).Resolve(Nvidia({e.device}));
      EXPECT_EQ(alone.at(NameKey(kNvidia, e.device)).resource_name, e.resource_name)
          << std::hex << e.device << " with " << (db ? db->source() : "no pci.ids");
      EXPECT_THAT(alone.at(NameKey(kNvidia, e.device)).issue, IsEmpty());
    }
  }
}

class NewFixtureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<PciIdsDatabase>> db = LoadPciIds(testdata::kDir / "pci.ids.new");
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
  }
  std::map<uint32_t, ResolvedName> Resolve(std::initializer_list<uint16_t> devices,
                                           std::vector<NameOverride> overrides = {}) {
    auto resolved = NameResolver(db_.get(), "nvidia.com", std::move(overrides)).Resolve(Nvidia(devices));
    ExpectRegistrable(resolved);
    return resolved;
  }
  std::unique_ptr<PciIdsDatabase> db_;
};

TEST_F(NewFixtureTest, UnpinnedModelsUseThePciIdsSlug) {
  auto r = Resolve({0x2342, 0x25b6, 0x20b3, 0x2339, 0x2324, 0x1aef});
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2342)).name, "GH100_GH200_120GB___480GB");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x25b6)).name, "GA107GL_A2___A16");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x20b3)).name, "GA100_A100SXM64GB");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2339)).name, "GH100_H100_SXM5_94GB");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2324)).name, "GH100_H800");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x1aef)).name, "GA102_HIGH_DEFINITION_AUDIO_CONTROLLER");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2342)).source, NameSource::kPciIds);
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2342)).pci_ids_name, "GH100 [GH200 120GB / 480GB]");
  for (const auto& [key, name] : r) EXPECT_THAT(name.issue, IsEmpty()) << name.name;
}

TEST_F(NewFixtureTest, UnknownIdFallsBackToLowerCaseHexNotAnotherVendorsName) {
  // 233a is an Intel device and a subsystem line in the fixture, never an NVIDIA device.
  auto r = Resolve({0x233a, 0xbeef});
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x233a)).name, "233a");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x233a)).source, NameSource::kDeviceId);
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x233a)).pci_ids_name, "");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0xbeef)).resource_name, "nvidia.com/beef");
}

TEST_F(NewFixtureTest, TrailingUnderscoreIsTrimmedAndReported) {
  auto r = Resolve({0x24fa});
  const ResolvedName& n = r.at(NameKey(kNvidia, 0x24fa));
  EXPECT_EQ(n.name, "GA104_RTX_A4500_EMBEDDED_GPU");
  EXPECT_EQ(n.source, NameSource::kPciIds);
  EXPECT_THAT(n.issue, AllOf(HasSubstr("GA104_RTX_A4500_EMBEDDED_GPU_"), HasSubstr("10de:24fa"),
                             HasSubstr("start and end with")));
}

TEST_F(NewFixtureTest, OverlongNameIsCutTo63AndReported) {
  auto r = Resolve({0x05be});
  const ResolvedName& n = r.at(NameKey(kNvidia, 0x05be));
  EXPECT_EQ(n.name, "NF200_PCIE_2_0_SWITCH_FOR_QUADRO_PLEX_S4___TESLA_S870___TESLA_S");
  EXPECT_EQ(n.name.size(), 63u);
  EXPECT_THAT(n.issue, HasSubstr("81 characters"));
}

TEST_F(NewFixtureTest, SlugSharedWithAPinnedNameGetsTheDeviceSuffix) {
  // 20b1 and 20f1 are both "GA100 [A100 PCIe 40GB]"; Cozystack pins 20f1's name, so 20b1 moves.
  auto r = Resolve({0x20f1, 0x20b1, 0x1db1, 0x1df5});
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x20f1)).name, "GA100_A100_PCIE_40GB");
  EXPECT_THAT(r.at(NameKey(kNvidia, 0x20f1)).issue, IsEmpty());
  const ResolvedName& moved = r.at(NameKey(kNvidia, 0x20b1));
  EXPECT_EQ(moved.name, "GA100_A100_PCIE_40GB_20B1");
  EXPECT_THAT(moved.issue,
              AllOf(HasSubstr("10de:20b1"), HasSubstr("10de:20f1"), HasSubstr("GA100_A100_PCIE_40GB_20B1")));
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x1db1)).name, "GV100GL_TESLA_V100_SXM2_16GB");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x1df5)).name, "GV100GL_TESLA_V100_SXM2_16GB_1DF5");
}

// Cozystack's table is part of every node's names: a GPU whose slug is a pinned name moves even when the
// pinned model is absent, so hot-plugging that model later renames nothing.
TEST_F(NewFixtureTest, SlugOfAPinnedNameMovesEvenWithoutThePinnedModel) {
  const NameResolver resolver(db_.get(), "nvidia.com", {});
  auto r = resolver.Resolve(Nvidia({0x20b1}));
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x20b1)).name, "GA100_A100_PCIE_40GB_20B1");
  EXPECT_THAT(r.at(NameKey(kNvidia, 0x20b1)).issue, AllOf(HasSubstr("10de:20b1"), HasSubstr("10de:20f1 (pinned)")));
  auto later = resolver.Resolve(Nvidia({0x20b1, 0x20f1}));
  EXPECT_EQ(later.at(NameKey(kNvidia, 0x20b1)).name, "GA100_A100_PCIE_40GB_20B1");
  EXPECT_EQ(later.at(NameKey(kNvidia, 0x20f1)).name, "GA100_A100_PCIE_40GB");
}

TEST_F(NewFixtureTest, OverrideBeatsPinnedAndSlug) {
  auto r = Resolve({0x2335, 0x2342, 0x2236},
                   {{kNvidia, 0x2335, "H200"}, {kNvidia, 0x2342, "GH200"}, {0x1234, 0x2236, "WRONG_VENDOR"}});
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2335)).resource_name, "nvidia.com/H200");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2335)).source, NameSource::kOverride);
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2335)).pci_ids_name, "");  // not looked up: the override decides
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2342)).name, "GH200");
  // An override is per vendor:device.
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2236)).name, "GA102GL_A10");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2236)).source, NameSource::kPinned);
}

TEST_F(NewFixtureTest, LaterOverrideWins) {
  auto r = Resolve({0x2335}, {{kNvidia, 0x2335, "FROM_FILE"}, {kNvidia, 0x2335, "FROM_FLAG"}});
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2335)).name, "FROM_FLAG");
}

TEST_F(NewFixtureTest, InvalidOverrideIsRepairedAndReported) {
  auto r = Resolve({0x2335, 0x2236, 0x26b9},
                   {{kNvidia, 0x2335, "my gpu!"}, {kNvidia, 0x2236, "__A10__"}, {kNvidia, 0x26b9, "[]"}});
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2335)).name, "mygpu");
  EXPECT_THAT(r.at(NameKey(kNvidia, 0x2335)).issue, AllOf(HasSubstr("override"), HasSubstr("my gpu!")));
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2236)).name, "A10");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x26b9)).name, "26b9");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x26b9)).source, NameSource::kOverride);
}

TEST_F(NewFixtureTest, OverrideTakingAPinnedNameKeepsItAndThePinnedIdMoves) {
  auto r = Resolve({0x2236, 0x2237}, {{kNvidia, 0x2237, "GA102GL_A10"}});
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2237)).name, "GA102GL_A10");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2236)).name, "GA102GL_A10_2236");
  EXPECT_THAT(r.at(NameKey(kNvidia, 0x2236)).issue, AllOf(HasSubstr("10de:2236"), HasSubstr("10de:2237")));
}

TEST_F(NewFixtureTest, TwoOverridesWithOneNameBothMove) {
  auto r = Resolve({0x2335, 0x2330}, {{kNvidia, 0x2335, "HOPPER"}, {kNvidia, 0x2330, "HOPPER"}});
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2335)).name, "HOPPER_2335");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2330)).name, "HOPPER_2330");
}

TEST_F(NewFixtureTest, ResultDoesNotDependOnInputOrderOrRepeats) {
  const auto a = NameResolver(db_.get(), "nvidia.com", {}).Resolve(Nvidia({0x20b1, 0x20f1, 0x1df5, 0x1db1, 0x24fa}));
  const auto b = NameResolver(db_.get(), "nvidia.com", {})
                     .Resolve(Nvidia({0x24fa, 0x1db1, 0x24fa, 0x1df5, 0x20f1, 0x20b1, 0x20b1}));
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), a.size());
  for (const auto& [key, r] : a) {
    EXPECT_EQ(b.at(key).name, r.name);
    EXPECT_EQ(b.at(key).issue, r.issue);
  }
}

// Resource names are what the kubelet and running VMs know a GPU by: once given, a name never changes, and
// an id seen later (bound or hot-plugged after start) is the one that moves.
TEST(NameResolverTest, ANameOnceGivenNeverChanges) {
  FakePciIds db({{NameKey(kNvidia, 0xaaa1), "GX100 [Same]"}, {NameKey(kNvidia, 0xaaa2), "GX100 [Same]"}});
  const NameResolver resolver(&db, "nvidia.com", {});
  EXPECT_EQ(resolver.Resolve(Nvidia({0xaaa1})).at(NameKey(kNvidia, 0xaaa1)).name, "GX100_SAME");
  auto r = resolver.Resolve(Nvidia({0xaaa1, 0xaaa2}));
  ExpectRegistrable(r);
  EXPECT_EQ(r.at(NameKey(kNvidia, 0xaaa1)).name, "GX100_SAME");
  EXPECT_THAT(r.at(NameKey(kNvidia, 0xaaa1)).issue, IsEmpty());
  EXPECT_EQ(r.at(NameKey(kNvidia, 0xaaa2)).name, "GX100_SAME_AAA2");
  EXPECT_THAT(r.at(NameKey(kNvidia, 0xaaa2)).issue, AllOf(HasSubstr("10de:aaa1"), HasSubstr("10de:aaa2")));
  // A copy shares what was given.
  const NameResolver copy = resolver;
  EXPECT_EQ(copy.Resolve(Nvidia({0xaaa2})).at(NameKey(kNvidia, 0xaaa2)).name, "GX100_SAME_AAA2");
}

// An override reserves its name from the first resolution, whether or not its device is present yet.
TEST(NameResolverTest, AnOverrideForAnAbsentIdStillReservesItsName) {
  FakePciIds db({{NameKey(kNvidia, 0xaaa1), "GX100 [Same]"}});
  const NameResolver resolver(&db, "nvidia.com", {{kNvidia, 0xbbbb, "GX100_SAME"}});
  EXPECT_EQ(resolver.Resolve(Nvidia({0xaaa1})).at(NameKey(kNvidia, 0xaaa1)).name, "GX100_SAME_AAA1");
  EXPECT_EQ(resolver.Resolve(Nvidia({0xbbbb})).at(NameKey(kNvidia, 0xbbbb)).name, "GX100_SAME");
}

TEST(NameResolverTest, EqualSlugsOfTwoIdsBothGetTheirDeviceId) {
  FakePciIds db({{NameKey(kNvidia, 0xaaa1), "GX100 [Same]"}, {NameKey(kNvidia, 0xaaa2), "GX100 [Same]"}});
  auto r = NameResolver(&db, "nvidia.com", {}).Resolve(Nvidia({0xaaa1, 0xaaa2}));
  ExpectRegistrable(r);
  EXPECT_EQ(r.at(NameKey(kNvidia, 0xaaa1)).name, "GX100_SAME_AAA1");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0xaaa2)).name, "GX100_SAME_AAA2");
  EXPECT_THAT(r.at(NameKey(kNvidia, 0xaaa1)).issue, AllOf(HasSubstr("10de:aaa1"), HasSubstr("10de:aaa2")));
}

TEST(NameResolverTest, SameDeviceIdUnderTwoVendorsGetsTheVendorToo) {
  auto r = NameResolver(nullptr, "nvidia.com", {}).Resolve({{kNvidia, 0xabcd}, {0x1234, 0xabcd}});
  ExpectRegistrable(r);
  EXPECT_EQ(r.at(NameKey(kNvidia, 0xabcd)).name, "abcd_10DE_ABCD");
  EXPECT_EQ(r.at(NameKey(0x1234, 0xabcd)).name, "abcd_1234_ABCD");
}

TEST(NameResolverTest, SuffixOnALongNameStaysWithin63) {
  const std::string long_name(80, 'L');
  FakePciIds db({{NameKey(kNvidia, 0x0001), long_name}, {NameKey(kNvidia, 0x0002), long_name + " X"}});
  auto r = NameResolver(&db, "nvidia.com", {}).Resolve(Nvidia({0x0001, 0x0002}));
  ExpectRegistrable(r);
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x0001)).name, std::string(58, 'L') + "_0001");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x0002)).name, std::string(58, 'L') + "_0002");
  EXPECT_THAT(r.at(NameKey(kNvidia, 0x0001)).issue, AllOf(HasSubstr("80 characters"), HasSubstr("shared")));
}

TEST(NameResolverTest, SuffixThatHitsAnotherNameIsSeparatedAgain) {
  // 1111 and 2222 share FOO; 1111's first fix FOO_1111 is an operator's name for 3333.
  FakePciIds db({{NameKey(kNvidia, 0x1111), "FOO"}, {NameKey(kNvidia, 0x2222), "FOO"}});
  auto r = NameResolver(&db, "nvidia.com", {{kNvidia, 0x3333, "FOO_1111"}}).Resolve(Nvidia({0x1111, 0x2222, 0x3333}));
  ExpectRegistrable(r);
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x3333)).name, "FOO_1111");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2222)).name, "FOO_2222");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x1111)).name, "FOO_1111_10DE_1111");
}

TEST(NameResolverTest, HexFallbackWithoutDatabase) {
  auto r = NameResolver(nullptr, "nvidia.com", {}).Resolve(Nvidia({0x26b5, 0x2342}));
  ExpectRegistrable(r);
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x26b5)).name, "AD102GL_L40");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2342)).name, "2342");
  EXPECT_EQ(r.at(NameKey(kNvidia, 0x2342)).source, NameSource::kDeviceId);
}

TEST(NameResolverTest, PinnedTableIsNvidiaOnly) {
  FakePciIds db({{NameKey(0x1234, 0x2335), "Other [Thing]"}});
  auto r = NameResolver(&db, "nvidia.com", {}).Resolve({{0x1234, 0x2335}});
  EXPECT_EQ(r.at(NameKey(0x1234, 0x2335)).name, "OTHER_THING");
  EXPECT_EQ(r.at(NameKey(0x1234, 0x2335)).source, NameSource::kPciIds);
}

TEST(NameResolverTest, CustomDomainAndInvalidDomain) {
  auto ok = NameResolver(nullptr, "gpu.example.io", {}).Resolve(Nvidia({0x2236}));
  EXPECT_EQ(ok.at(NameKey(kNvidia, 0x2236)).resource_name, "gpu.example.io/GA102GL_A10");
  EXPECT_THAT(ok.at(NameKey(kNvidia, 0x2236)).issue, IsEmpty());
  auto bad = NameResolver(nullptr, "Bad_Domain", {}).Resolve(Nvidia({0x2236}));
  EXPECT_THAT(bad.at(NameKey(kNvidia, 0x2236)).issue, HasSubstr("Bad_Domain"));
}

}  // namespace
}  // namespace vfio_agent::names
