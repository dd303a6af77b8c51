// Tests of model/py/host_tensor.h: each fast path against the torch expression it stands for,
// bit for bit, on edge values, and the views against torch's views.
//
// Which deliberately broken variant (mutation) each test catches:
//   FloatsOfEveryBf16PatternAreTorchs      bf16 -> float through float arithmetic or a shift of
//                                          15 (NaN payloads, subnormals); reading a
//                                          non-contiguous tensor's memory in storage order
//   FloatToBf16RoundsAsTorchCopyDoes       truncating instead of rounding; ties away from zero
//                                          or up; a carry into the exponent lost (FLT_MAX ->
//                                          inf); a NaN mapped to 0x7FC0 instead of torch's own
//   CopyOfSameDtypeIsTorchs                a partial overlap copied instead of raising; a
//                                          broadcast source taken as a flat one
//   ItemIsTorchsItem                       bf16 or int read as float; the storage offset of a
//                                          one-element view ignored
//   ZerosCloneAndEmptyAreTorchs            clone() sharing its source's storage; zeros() of
//                                          a dtype left with garbage
//   NarrowAndViewAreRealViews              a copy instead of a view (writes lost); the base's
//                                          own storage offset or strides ignored; torch's
//                                          error for an out-of-range narrow not raised
//   CopyBytesConvertsAsTorch               bytes of a bf16 piece copied into a float tensor as
//                                          they are
#include "model/py/host_tensor.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace ckptsim::model {
namespace {

std::vector<uint8_t> bytes_of(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return {p, p + c.numel() * c.element_size()};
}

at::Tensor floats_tensor(const std::vector<uint32_t>& bits) {
  at::Tensor t = at::empty({static_cast<int64_t>(bits.size())}, at::kFloat);
  std::memcpy(t.data_ptr(), bits.data(), bits.size() * sizeof(uint32_t));
  return t;
}

// Float bit patterns at the edges of float -> bfloat16 rounding.
std::vector<uint32_t> rounding_edges() {
  std::vector<uint32_t> bits = {
      0x00000000, 0x80000000,                                      // +-0
      0x00000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x807FFFFF,  // subnormals, ties among them
      0x3F808000,                                                  // tie, even below: rounds down
      0x3F818000,                                                  // tie, odd below: rounds up
      0x3F808001, 0x3F807FFF, 0xBF808000, 0xBF818000,
      0x7F7FFFFF,                                      // FLT_MAX: rounds up into inf
      0x7F7F7FFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,  // +-inf
      0x3F800000, 0x40490FDB, 0x33800000,
  };
  uint64_t x = 0x9E3779B97F4A7C15ULL;  // and arbitrary finite patterns
  while (bits.size() < 200) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const auto b = static_cast<uint32_t>(x >> 32);
    if ((b & 0x7F800000U) != 0x7F800000U) bits.push_back(b);
  }
  return bits;
}

TEST(HostTensor, FloatsOfEveryBf16PatternAreTorchs) {
  at::Tensor t = at::empty({65536}, at::kBFloat16);
  auto* p = static_cast<uint16_t*>(t.data_ptr());
  for (uint32_t i = 0; i < 65536; ++i) p[i] = static_cast<uint16_t>(i);
  const std::vector<float> got = host::floats(t);
  ASSERT_EQ(got.size(), 65536U);
  const at::Tensor want = t.to(at::kFloat);
  EXPECT_EQ(std::memcmp(got.data(), want.data_ptr(), got.size() * sizeof(float)), 0);

  // Float as it is, and a non-contiguous tensor in its logical order (torch's path).
  const at::Tensor f = at::arange(12, at::kFloat).reshape({3, 4});
  EXPECT_EQ(host::floats(f), std::vector<float>(f.data_ptr<float>(), f.data_ptr<float>() + 12));
  const at::Tensor ft = f.t();
  const at::Tensor ftc = ft.contiguous();
  EXPECT_EQ(host::floats(ft),
            std::vector<float>(ftc.data_ptr<float>(), ftc.data_ptr<float>() + 12));
  EXPECT_TRUE(host::floats(at::empty({0}, at::kBFloat16)).empty());
}

TEST(HostTensor, FloatToBf16RoundsAsTorchCopyDoes) {
  const std::vector<uint32_t> edges = rounding_edges();
  // Every length up to past two AVX-512 vectors, so that torch's vector and tail paths both run.
  for (size_t n = 1; n <= 40; ++n) {
    std::vector<uint32_t> bits(edges.begin(), edges.begin() + static_cast<std::ptrdiff_t>(n));
    for (size_t start = 0; start + n <= edges.size(); start += 37) {
      std::copy_n(edges.begin() + static_cast<std::ptrdiff_t>(start), n, bits.begin());
      const at::Tensor src = floats_tensor(bits);
      at::Tensor want = at::empty({static_cast<int64_t>(n)}, at::kBFloat16);
      want.copy_(src);
      const at::Tensor got = at::empty({static_cast<int64_t>(n)}, at::kBFloat16);
      host::copy_(got, src);
      ASSERT_EQ(bytes_of(got), bytes_of(want)) << "n " << n << " from " << start;
    }
  }
  // NaNs, quiet and signalling, with payloads and signs, in both paths: torch's own bits.
  const std::vector<uint32_t> nans = {0x7FC00000, 0xFFC00000, 0x7F800001,
                                      0x7FBFFFFF, 0xFF812345, 0x7FC0FFFF};
  for (size_t n : {1, 6, 17, 33}) {
    std::vector<uint32_t> bits(n);
    for (size_t i = 0; i < n; ++i) bits[i] = i % 3 == 0 ? nans[i % nans.size()] : 0x3F818000;
    const at::Tensor src = floats_tensor(bits);
    at::Tensor want = at::empty({static_cast<int64_t>(n)}, at::kBFloat16);
    want.copy_(src);
    const at::Tensor got = at::zeros({static_cast<int64_t>(n)}, at::kBFloat16);
    host::copy_(got, src);
    EXPECT_EQ(bytes_of(got), bytes_of(want)) << "n " << n;
  }
  // The inline helper itself, on the documented edges.
  EXPECT_EQ(host::float_to_bf16(std::bit_cast<float>(0x3F808000U)), 0x3F80);
  EXPECT_EQ(host::float_to_bf16(std::bit_cast<float>(0x3F818000U)), 0x3F82);
  EXPECT_EQ(host::float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(host::float_to_bf16(std::numeric_limits<float>::quiet_NaN()), std::nullopt);
}

TEST(HostTensor, CopyOfSameDtypeIsTorchs) {
  const at::Tensor src = at::arange(10, at::kFloat);
  const at::Tensor dst = at::zeros({10}, at::kFloat);
  host::copy_(dst, src);
  EXPECT_EQ(bytes_of(dst), bytes_of(src));
  // bf16 -> float through the copy, exactly.
  const at::Tensor b = src.to(at::kBFloat16);
  const at::Tensor f = at::empty({10}, at::kFloat);
  host::copy_(f, b);
  EXPECT_EQ(bytes_of(f), bytes_of(b.to(at::kFloat)));
  // A partial overlap: torch raises, and so must the fast path.
  const at::Tensor buf = at::arange(10, at::kFloat);
  auto partial = [&] { host::copy_(buf.narrow(0, 0, 6), buf.narrow(0, 2, 6)); };
  EXPECT_THROW(partial(), c10::Error);
  // The same elements: nothing changes.
  host::copy_(buf.narrow(0, 1, 4), buf.narrow(0, 1, 4));
  EXPECT_EQ(bytes_of(buf), bytes_of(at::arange(10, at::kFloat)));
  // A broadcast source fills every row.
  const at::Tensor rows = at::zeros({3, 4}, at::kFloat);
  host::copy_(rows, at::arange(4, at::kFloat));
  EXPECT_EQ(bytes_of(rows), bytes_of(at::arange(4, at::kFloat).repeat({3})));
}

TEST(HostTensor, ItemIsTorchsItem) {
  auto same = [](const at::Tensor& t) {
    const double got = host::item(t);
    const double want = t.item<double>();
    EXPECT_EQ(std::bit_cast<uint64_t>(got), std::bit_cast<uint64_t>(want)) << t;
  };
  for (const at::ScalarType dtype :
       {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kInt}) {
    same(at::scalar_tensor(5.0, at::TensorOptions().dtype(dtype)));
    same(at::scalar_tensor(-3.0, at::TensorOptions().dtype(dtype)));
  }
  same(at::scalar_tensor(1.0 / 3.0, at::TensorOptions().dtype(at::kBFloat16)));
  same(at::scalar_tensor(-0.0, at::TensorOptions().dtype(at::kFloat)));
  same(floats_tensor({0x7FC01234}));  // a NaN's payload
  same(floats_tensor({0x00000001}));  // the smallest subnormal
  same(at::scalar_tensor(static_cast<double>(int64_t{1} << 62), at::kLong));
  // One element of a larger tensor, at an offset.
  const at::Tensor big = at::arange(8, at::kBFloat16);
  same(big.narrow(0, 5, 1));
  same(big.reshape({2, 4}).narrow(1, 3, 1).narrow(0, 1, 1));
}

TEST(HostTensor, ZerosCloneAndEmptyAreTorchs) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kDouble, at::kLong}) {
    const at::Tensor z = host::zeros({3, 5}, dtype);
    const at::Tensor want = at::zeros({3, 5}, at::TensorOptions().dtype(dtype));
    EXPECT_EQ(z.scalar_type(), dtype);
    EXPECT_EQ(z.sizes(), want.sizes());
    EXPECT_EQ(z.strides(), want.strides());
    EXPECT_EQ(bytes_of(z), bytes_of(want));
    const at::Tensor e = host::empty({4, 1, 2}, dtype);
    EXPECT_EQ(e.strides(), at::empty({4, 1, 2}, at::TensorOptions().dtype(dtype)).strides());
  }
  const at::Tensor src = at::arange(6, at::kFloat).reshape({2, 3});
  const at::Tensor c = host::clone(src);
  EXPECT_EQ(bytes_of(c), bytes_of(src));
  EXPECT_EQ(c.strides(), src.strides());
  EXPECT_NE(c.data_ptr(), src.data_ptr());
  src.fill_(7.0);
  EXPECT_EQ(c.flatten()[5].item<float>(), 5.0F);  // its own storage
  const at::Tensor ct = host::clone(src.t());     // torch's: contiguous
  EXPECT_TRUE(ct.is_contiguous());
  EXPECT_EQ(bytes_of(ct), bytes_of(src.t()));
  const at::Tensor g = at::arange(8, at::kFloat);
  host::zero_(g.narrow(0, 2, 3));
  EXPECT_EQ(bytes_of(g), bytes_of(at::tensor({0.F, 1.F, 0.F, 0.F, 0.F, 5.F, 6.F, 7.F})));
}

TEST(HostTensor, NarrowAndViewAreRealViews) {
  const at::Tensor base = at::arange(24, at::kFloat);
  const at::Tensor inner = host::narrow(base, 4, 12);
  const at::Tensor want_inner = base.narrow(0, 4, 12);
  EXPECT_EQ(inner.storage_offset(), want_inner.storage_offset());
  // A narrow of a narrow, then a 2-D view, then a narrow of the 2-D view's rows.
  const at::Tensor nested = host::narrow(inner, 2, 6);
  EXPECT_EQ(nested.storage_offset(), base.narrow(0, 6, 6).storage_offset());
  const at::Tensor grid = host::view(nested, {2, 3});
  const at::Tensor want_grid = want_inner.narrow(0, 2, 6).view({2, 3});
  EXPECT_EQ(grid.sizes(), want_grid.sizes());
  EXPECT_EQ(grid.strides(), want_grid.strides());
  EXPECT_EQ(grid.storage_offset(), want_grid.storage_offset());
  const at::Tensor row = host::narrow(grid, 1, 1);
  EXPECT_EQ(row.storage_offset(), want_grid.narrow(0, 1, 1).storage_offset());
  EXPECT_EQ(row.strides(), want_grid.narrow(0, 1, 1).strides());
  // Writes through every level reach the base.
  host::copy_(row, at::full({1, 3}, -1.0, at::kFloat));
  EXPECT_EQ(base[9].item<float>(), -1.0F);
  EXPECT_EQ(base[11].item<float>(), -1.0F);
  EXPECT_EQ(base[12].item<float>(), 12.0F);
  host::zero_(grid);
  EXPECT_EQ(base[6].item<float>(), 0.0F);
  EXPECT_EQ(base[5].item<float>(), 5.0F);
  // A new object per call (identity-keyed dicts see two keys), sharing one storage.
  const at::Tensor again = host::narrow(base, 4, 12);
  EXPECT_NE(again.unsafeGetTensorImpl(), inner.unsafeGetTensorImpl());
  EXPECT_TRUE(again.is_alias_of(inner));
  // Torch's errors, word for word.
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([&] { host::narrow(base, 20, 5); }), message([&] { base.narrow(0, 20, 5); }));
  EXPECT_EQ(message([&] { host::view(base, {5, 5}); }), message([&] { base.view({5, 5}); }));
  EXPECT_NE(message([&] { host::view(base.reshape({4, 6}).t(), {24}); }), "no error");
}

TEST(HostTensor, CopyBytesConvertsAsTorch) {
  const at::Tensor b = at::arange(5, at::kFloat).div(3.0).to(at::kBFloat16);
  const std::vector<uint8_t> raw = bytes_of(b);
  const at::Tensor f = at::empty({5}, at::kFloat);
  host::copy_bytes(f, at::kBFloat16, std::as_bytes(std::span(raw.data(), raw.size())));
  EXPECT_EQ(bytes_of(f), bytes_of(b.to(at::kFloat)));
  const at::Tensor same = at::empty({5}, at::kBFloat16);
  host::copy_bytes(same, at::kBFloat16, std::as_bytes(std::span(raw.data(), raw.size())));
  EXPECT_EQ(bytes_of(same), raw);
}

}  // namespace
}  // namespace ckptsim::model
