// FaultyStorage (model/faulty_storage.h): each fault kind at a named write, on a sequence of
// writes in the order of Megatron's save protocol (reports/research/save-protocol-2026-12-04.md:
// the ranks' .distcp files, the coordinator's .metadata, metadata.json, then the tracker). The
// expected files are written out by hand from that order and the fault's definition.
#include "model/faulty_storage.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using namespace ckptsim::model;

const std::vector<std::string> kProtocol = {
    "iter_0000003/__0_0.distcp", "iter_0000003/__1_0.distcp", "iter_0000003/.metadata",
    "iter_0000003/metadata.json", "latest_checkpointed_iteration.txt"};

// Writes every file of kProtocol (ten bytes each), as a save does; the statuses, in order.
std::vector<bool> save(Storage& s) {
  std::vector<bool> ok;
  const std::string ten = "0123456789";
  for (const auto& p : kProtocol) ok.push_back(s.write_file(p, {ten.data(), ten.size()}).is_ok());
  return ok;
}

std::vector<std::string> files(const Storage& s) {
  std::vector<std::string> out;
  for (const auto& p : kProtocol) {
    auto b = s.read_file(p);
    if (b.is_ok()) out.push_back(p + ":" + std::to_string(b.value().size()));
  }
  return out;
}

TEST(FaultyStorage, CrashBeforeTheMetadataLeavesTheDataFilesAndNothingAfter) {
  MemoryStorage base;
  FaultyStorage s(base, {{StorageFaultKind::kCrashBefore, ".metadata", 0}});
  EXPECT_EQ(save(s), (std::vector<bool>{true, true, false, false, false}));
  EXPECT_EQ(files(base), (std::vector<std::string>{"iter_0000003/__0_0.distcp:10",
                                                   "iter_0000003/__1_0.distcp:10"}));
  EXPECT_TRUE(s.crashed());
  ASSERT_EQ(s.fired().size(), 1u);
  EXPECT_EQ(s.fired()[0], "crash_before at write 0 of '*.metadata': iter_0000003/.metadata");
}

TEST(FaultyStorage, CrashAfterTheSecondDataFileKeepsItAndStopsThere) {
  MemoryStorage base;
  FaultyStorage s(base, {{StorageFaultKind::kCrashAfter, ".distcp", 1}});
  EXPECT_EQ(save(s), (std::vector<bool>{true, false, false, false, false}));
  EXPECT_EQ(files(base), (std::vector<std::string>{"iter_0000003/__0_0.distcp:10",
                                                   "iter_0000003/__1_0.distcp:10"}));
}

TEST(FaultyStorage, ATornFileHoldsItsFirstHalfAndTheProcessStops) {
  MemoryStorage base;
  FaultyStorage s(base, {{StorageFaultKind::kTorn, "", 2}});
  EXPECT_EQ(save(s), (std::vector<bool>{true, true, false, false, false}));
  EXPECT_EQ(files(base),
            (std::vector<std::string>{"iter_0000003/__0_0.distcp:10",
                                      "iter_0000003/__1_0.distcp:10", "iter_0000003/.metadata:5"}));
  EXPECT_EQ(s.landed().back(), "iter_0000003/.metadata (torn: 5 of 10 bytes)");
}

// With pages: half of 10000 bytes at 4096 a page lands 4096; a file under two pages lands empty.
// Mutation caught: the page rounding left out (5000 and 5 bytes land).
TEST(FaultyStorage, WithPagesATornOrShortWriteLandsWholePagesOnly) {
  MemoryStorage base;
  FaultyStorage s(
      base, {{StorageFaultKind::kShort, "big", 0}, {StorageFaultKind::kTorn, "small", 0}}, 4096);
  const std::vector<char> big(10000, 'x');
  const std::vector<char> small(10, 'y');
  EXPECT_TRUE(s.write_file("big", big).is_ok());
  EXPECT_FALSE(s.landed_whole("big"));
  EXPECT_FALSE(s.write_file("small", small).is_ok());
  EXPECT_EQ(base.read_file("big").value().size(), 4096u);
  EXPECT_EQ(base.read_file("small").value().size(), 0u);
  EXPECT_TRUE(s.crashed());
}

TEST(FaultyStorage, AShortWriteReportsSuccessAndTheSaveGoesOn) {
  MemoryStorage base;
  FaultyStorage s(base, {{StorageFaultKind::kShort, ".distcp", 0}});
  EXPECT_EQ(save(s), (std::vector<bool>{true, true, true, true, true}));
  EXPECT_EQ(files(base).front(), "iter_0000003/__0_0.distcp:5");
  EXPECT_FALSE(s.crashed());
}

TEST(FaultyStorage, DiskFullFailsOneWriteAndLaterWritesGoOn) {
  MemoryStorage base;
  FaultyStorage s(base, {{StorageFaultKind::kDiskFull, "metadata.json", 0}});
  EXPECT_EQ(save(s), (std::vector<bool>{true, true, true, false, true}));
  auto w = s.write_file("x", {});
  EXPECT_TRUE(w.is_ok());
  EXPECT_FALSE(base.exists("iter_0000003/metadata.json"));
  EXPECT_TRUE(base.exists("latest_checkpointed_iteration.txt"));
  // The message names the file and the errno's text.
  FaultyStorage again(base, {{StorageFaultKind::kDiskFull, "", 0}});
  const ckptsim::Status st = again.write_file("iter_0000003/.metadata", {});
  EXPECT_NE(st.message().find("iter_0000003/.metadata: No space left on device"), std::string::npos)
      << st.message();
}

TEST(FaultyStorage, EachFaultFiresOnceAndTheFirstToFireDecides) {
  MemoryStorage base;
  FaultyStorage s(base, {{StorageFaultKind::kShort, ".distcp", 0},
                         {StorageFaultKind::kDiskFull, "", 0},
                         {StorageFaultKind::kCrashBefore, "", 3}});
  // Write 0: both the short and the disk-full fault count it; the short one, first, decides.
  // Write 3 (metadata.json) crashes.
  EXPECT_EQ(save(s), (std::vector<bool>{true, true, true, false, false}));
  ASSERT_EQ(s.fired().size(), 2u);
  EXPECT_EQ(s.fired()[0], "short at write 0 of '*.distcp': iter_0000003/__0_0.distcp");
  EXPECT_EQ(s.fired()[1], "crash_before at write 3 of any file: iter_0000003/metadata.json");
}

TEST(FaultyStorage, KindNamesRoundTrip) {
  for (auto k : {StorageFaultKind::kCrashBefore, StorageFaultKind::kCrashAfter,
                 StorageFaultKind::kTorn, StorageFaultKind::kShort, StorageFaultKind::kDiskFull}) {
    EXPECT_EQ(parse_storage_fault_kind(storage_fault_kind_name(k)), k);
  }
  EXPECT_EQ(parse_storage_fault_kind("buggify"), std::nullopt);
}

}  // namespace
