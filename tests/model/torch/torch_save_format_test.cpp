// load_torch_save on damaged copies of a real torch.save blob (the common.pt of a fixture in
// tests/fixtures/real-checkpoints): every damage is a one-line Status (invariant 1).
#include "model/torch/torch_save_format.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace ckptsim::model {
namespace {

// miles-main keeps the raw per-param step tensors in common.pt: one FloatStorage, key '0'.
const std::string kCommonPt =
    std::string(CKPTSIM_SOURCE_DIR) +
    "/tests/fixtures/real-checkpoints/rx-2e64d788b6__hybrid-offload1-dp1-raw-step-in-common/"
    "iter_0000003/common.pt";

std::string common_pt() {
  std::ifstream in(kCommonPt, std::ios::binary);
  EXPECT_TRUE(in) << kCommonPt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `blob` with its one occurrence of `from` replaced by `to` (same length).
std::string damaged(std::string blob, const std::string& from, const std::string& to) {
  const size_t at = blob.find(from);
  EXPECT_NE(at, std::string::npos) << "no " << from;
  EXPECT_EQ(blob.find(from, at + 1), std::string::npos) << from << " twice";
  EXPECT_EQ(from.size(), to.size());
  return at == std::string::npos ? blob : blob.replace(at, from.size(), to);
}

std::string error(const std::string& blob) {
  Result<Value> v = load_torch_save({blob.data(), blob.size()});
  EXPECT_FALSE(v.is_ok()) << "a damaged blob loaded";
  if (v.is_ok()) return "";
  const std::string& m = v.status().message();
  EXPECT_EQ(m.find_first_of("\n\r"), std::string::npos) << m;
  return m;
}

TEST(TorchSave, TheUndamagedBlobLoads) {
  const std::string blob = common_pt();
  Result<Value> v = load_torch_save({blob.data(), blob.size()});
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_TRUE(v.value().is_dict());
}

// The storage key was quoted verbatim in its error, so a newline split the message.
TEST(TorchSave, ControlCharacterInAStorageKeyStaysOnOneLine) {
  // BINUNICODE '0' (the storage key of the persistent id) -> '\n'.
  const std::string m = error(damaged(common_pt(),
                                      std::string("X\x01\0\0\0"
                                                  "0q",
                                                  7),
                                      std::string("X\x01\0\0\0"
                                                  "\nq",
                                                  7)));
  EXPECT_NE(m.find("a storage key '\\n'"), std::string::npos) << m;
}

// A zip record whose central directory declares 4 GiB (0xffffffff, no zip64 field) in a 2.4 KB
// blob: libtorch's reader allocated the declared size before reading (torch_save_fuzzer, GPU
// machine, 2026-12-04). Now an error naming the record, before libtorch sees the bytes.
// Mutation caught: the size check taken out (libtorch's own message, after the allocation).
// The second (GPU machine, later the same day): the same forged size behind a zip64 locator that
// points at no zip64 record, which libtorch's reader passes over; the check gave up there.
// Mutation caught: giving up on a broken zip64 locator (the second input's libtorch message).
TEST(TorchSave, ARecordSizeLargerThanTheArchiveIsAnErrorNotAnAllocation) {
  for (const char* name : {"record-size-forged-4gib", "record-size-forged-4gib-broken-zip64"}) {
    std::ifstream in(std::string(CKPTSIM_SOURCE_DIR) +
                         "/tests/fixtures/fuzz-regressions/torch_save_fuzzer/" + name,
                     std::ios::binary);
    ASSERT_TRUE(in) << name;
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string m = error(ss.str());
    EXPECT_NE(m.find("declares 4294967295 bytes, more than the whole archive"), std::string::npos)
        << name << ": " << m;
  }
}

}  // namespace
}  // namespace ckptsim::model
