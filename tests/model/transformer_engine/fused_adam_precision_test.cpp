// TE FusedAdam's precision-aware states (issue 26): remainders, bf16 and fp16 moments, master
// weights, and what state_dict/load_state_dict do to them, each expected value worked out here
// from TE's rules (fused_adam.py, adam.cu), not by the code under test.
// Mutations caught: the bf16 param rounded from the master by round-to-nearest-even instead of
// adam.cu's ties away from zero (RemainderSplitRoundsTiesAwayFromZero); split_master without the
// "round up" (RemainderSplit*); _apply_scale dividing by the scale instead of multiplying by its
// reciprocal, or a range of 65504 (Fp16MomentIsScaledByAmaxOver32752); fp32 params' master
// updated by the step (Fp32ParamKeepsItsInitialMasterParam); load_state_dict casting a remainder
// master to fp32 (LoadStateDictKeepsDtypesAndBits); set_scaled_state without its dtype assert
// (SetScaledStateOfARemainderMasterAssertsInt16).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "model/errors.h"
#include "model/transformer_engine/fused_adam.h"

using namespace ckptsim::model;

namespace {

DictPtr group_of(std::vector<at::Tensor> params) {
  return Dict::make({{"params", params_list(params)},
                     {"lr", Value(0.01)},
                     {"weight_decay", Value(0.1)},
                     {"betas", Value::tuple({Value(0.9), Value(0.95)})},
                     {"eps", Value(1e-8)}});
}

FusedAdamOptions precision_aware(StateDType m, StateDType v, bool remainders) {
  FusedAdamOptions o;
  o.master_weights = true;
  o.use_decoupled_grad = true;
  o.exp_avg_dtype = m;
  o.exp_avg_sq_dtype = v;
  o.store_param_remainders = remainders;
  return o;
}

uint16_t bf16_bits(const at::Tensor& t, int64_t i) {
  uint16_t b = 0;
  std::memcpy(&b, static_cast<const char*>(t.data_ptr()) + 2 * i, 2);
  return b;
}

// Round to nearest even on the 16 dropped bits (what torch's float -> bfloat16 does).
uint16_t rne_bf16(float x) {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

at::Tensor floats(std::initializer_list<float> v) {
  return at::tensor(std::vector<float>(v), at::TensorOptions().dtype(at::kFloat));
}

}  // namespace

TEST(FusedAdamPrecision, RemainderSplitRoundsTiesAwayFromZero) {
  // (fp32 bits) -> (bf16 bits, remainder): the high half, plus one where bit 15 is set.
  const uint32_t in[] = {0x3F808000u, 0xBF807FFFu, 0xBF80C000u, 0x3F800000u};
  const uint16_t want_bf16[] = {0x3F81, 0xBF80, 0xBF81, 0x3F80};
  const int16_t want_rem[] = {-32768, 32767, -16384, 0};
  at::Tensor master = at::empty({4}, at::kFloat);
  for (int i = 0; i < 4; ++i) master[i] = std::bit_cast<float>(in[i]);
  at::Tensor p = at::zeros({4}, at::kBFloat16);
  at::Tensor r = at::zeros({4}, at::kShort);
  split_master(master, p, r);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(bf16_bits(p, i), want_bf16[i]) << i;
    EXPECT_EQ(r[i].item<int16_t>(), want_rem[i]) << i;
  }
  // A tie rounds away from zero: RNE would keep 0x3F80 for 0x3F808000.
  EXPECT_NE(rne_bf16(std::bit_cast<float>(in[0])), want_bf16[0]);
  const at::Tensor back = master_from_remainder(p, r);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(back[i].item<float>()), in[i]) << i;
}

TEST(FusedAdamPrecision, Bf16MomentsAreStoredRoundedToNearestEven) {
  Runtime rt(1, 0, 0);
  at::Tensor p = floats({0.5F, -0.25F, 1.0F}).to(at::kBFloat16);
  FusedAdam opt(rt, {group_of({p})}, nullptr,
                precision_aware(StateDType::kBFloat16, StateDType::kBFloat16, true));
  const at::Tensor g = floats({0.3F, -1e-3F, 7.0F});
  rt.set_decoupled_grad(p, g);
  opt.step();
  const at::Tensor m = opt.state.find(p)->get()->at("exp_avg").tensor();
  const at::Tensor v = opt.state.find(p)->get()->at("exp_avg_sq").tensor();
  ASSERT_EQ(m.scalar_type(), at::kBFloat16);
  ASSERT_EQ(v.scalar_type(), at::kBFloat16);
  ASSERT_EQ(opt.state.find(p)->get()->at("master_param").tensor().scalar_type(), at::kShort);
  const float omb1 = 1.0F - 0.9F;
  const float omb2 = 1.0F - 0.95F;
  for (int i = 0; i < 3; ++i) {
    const float gi = g[i].item<float>();
    EXPECT_EQ(bf16_bits(m, i), rne_bf16(0.9F * 0.0F + omb1 * gi)) << i;
    EXPECT_EQ(bf16_bits(v, i), rne_bf16(0.95F * 0.0F + (omb2 * gi) * gi)) << i;
  }
  EXPECT_EQ(*opt.stored_dtype(p, "exp_avg"), "bf16");
  EXPECT_EQ(*opt.stored_dtype(p, "master_param"), "int16");
}

TEST(FusedAdamPrecision, Fp16MomentIsScaledByAmaxOver32752) {
  Runtime rt(1, 0, 0);
  constexpr int kN = 64;
  std::vector<float> grads;
  for (int i = 0; i < kN; ++i) grads.push_back((i % 2 ? -1.0F : 1.0F) * 0.0137F * float(i + 1));
  at::Tensor p = at::ones({kN}, at::kBFloat16);
  FusedAdam opt(rt, {group_of({p})}, nullptr,
                precision_aware(StateDType::kFloat16, StateDType::kFloat32, false));
  rt.set_decoupled_grad(p, at::tensor(grads, at::TensorOptions().dtype(at::kFloat)));
  opt.step();
  const at::Tensor m32 = opt.unscaled_copy(p, "exp_avg");
  const at::Tensor codes = opt.state.find(p)->get()->at("exp_avg").tensor();
  ASSERT_EQ(codes.scalar_type(), at::kHalf);
  // m = (1 - 0.9) * g; scale = amax / 32752 (fp32); code = fp16(m * (1 / scale)).
  const float omb1 = 1.0F - 0.9F;
  float amax = 0.0F;
  for (float g : grads) amax = std::max(amax, std::abs(omb1 * g));
  const float scale = amax / 32752.0F;
  for (int i = 0; i < kN; ++i) {
    const float want = static_cast<float>(c10::Half(omb1 * grads[i] * (1.0F / scale)));
    EXPECT_EQ(codes[i].item<float>(), want) << i;
    EXPECT_EQ(m32[i].item<float>(), want * scale) << i;
  }
  // _apply_scale multiplies the caller's fp32 tensor IN PLACE by the reciprocal of the new
  // scale (not a division: the two differ in fp32 on some element here).
  at::Tensor x = at::tensor(grads, at::TensorOptions().dtype(at::kFloat));
  opt.set_scaled_state(p, "exp_avg", x);
  float xmax = 0.0F;
  for (float g : grads) xmax = std::max(xmax, std::abs(g));
  const float s2 = xmax / 32752.0F;
  int quotient_differs = 0;
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(x[i].item<float>(), grads[i] * (1.0F / s2)) << i;
    quotient_differs += grads[i] / s2 != grads[i] * (1.0F / s2);
  }
  EXPECT_GT(quotient_differs, 0);
  // The fp32 moment is not scaled.
  EXPECT_EQ(*opt.stored_dtype(p, "exp_avg_sq"), "fp32");
}

TEST(FusedAdamPrecision, Bf16ParamWithAWholeMasterIsItsRoundedMaster) {
  Runtime rt(1, 0, 0);
  at::Tensor p = floats({0.5F, -0.25F, 1.0F}).to(at::kBFloat16);
  FusedAdam opt(rt, {group_of({p})}, nullptr,
                precision_aware(StateDType::kFloat32, StateDType::kFloat32, false));
  for (int s = 0; s < 3; ++s) {
    rt.set_decoupled_grad(p, floats({0.3F, -1e-3F, 7.0F}));
    opt.step();
  }
  const at::Tensor master = opt.state.find(p)->get()->at("master_param").tensor();
  ASSERT_EQ(master.scalar_type(), at::kFloat);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NE(master[i].item<float>(), floats({0.5F, -0.25F, 1.0F})[i].item<float>()) << i;
    EXPECT_EQ(bf16_bits(p, i), rne_bf16(master[i].item<float>())) << i;
  }
}

TEST(FusedAdamPrecision, Fp32ParamKeepsItsInitialMasterParam) {
  // TE creates master_param for every param, but updates an fp32 param itself (p_f32_model).
  Runtime rt(1, 0, 0);
  at::Tensor p = floats({0.5F, -0.25F});
  FusedAdam opt(rt, {group_of({p})}, nullptr,
                precision_aware(StateDType::kBFloat16, StateDType::kBFloat16, true));
  for (int s = 0; s < 2; ++s) {
    rt.set_decoupled_grad(p, floats({0.3F, -1e-3F}));
    opt.step();
  }
  const at::Tensor master = opt.state.find(p)->get()->at("master_param").tensor();
  ASSERT_EQ(master.scalar_type(), at::kFloat);  // no remainders for an fp32 param
  EXPECT_EQ(master[0].item<float>(), 0.5F);
  EXPECT_EQ(master[1].item<float>(), -0.25F);
  EXPECT_NE(p[0].item<float>(), 0.5F);
  EXPECT_TRUE(opt.master_value(p).equal(p));
}

TEST(FusedAdamPrecision, LoadStateDictKeepsDtypesAndBits) {
  Runtime rt(1, 0, 0);
  at::Tensor p = floats({0.5F, -0.25F, 1.0F}).to(at::kBFloat16);
  const auto options = precision_aware(StateDType::kBFloat16, StateDType::kBFloat16, true);
  FusedAdam opt(rt, {group_of({p})}, nullptr, options);
  for (int s = 0; s < 2; ++s) {
    rt.set_decoupled_grad(p, floats({0.3F, -1e-3F, 7.0F}));
    opt.step();
  }
  const Value sd = opt.state_dict();
  const Dict& saved = *sd.dict()->at("state").dict()->at(int64_t{0}).dict();
  EXPECT_EQ(saved.at("exp_avg").tensor().scalar_type(), at::kFloat);  // unscaled for the dict
  EXPECT_EQ(saved.at("master_param").tensor().scalar_type(), at::kShort);
  at::Tensor q = p.clone();
  FusedAdam other(rt, {group_of({q})}, nullptr, options);
  other.load_state_dict(sd);
  for (const char* name : {"exp_avg", "exp_avg_sq", "master_param"}) {
    const at::Tensor a = opt.state.find(p)->get()->at(name).tensor();
    const at::Tensor b = other.state.find(q)->get()->at(name).tensor();
    EXPECT_EQ(a.scalar_type(), b.scalar_type()) << name;
    EXPECT_TRUE(a.equal(b)) << name;
  }
  EXPECT_EQ(sd.dict()->at("param_groups").list()->at(0).dict()->at("step").as_int(), 2);
}

TEST(FusedAdamPrecision, SetScaledStateOfARemainderMasterAssertsInt16) {
  Runtime rt(1, 0, 0);
  at::Tensor p = floats({0.5F}).to(at::kBFloat16);
  FusedAdam opt(rt, {group_of({p})}, nullptr,
                precision_aware(StateDType::kFloat32, StateDType::kFloat32, true));
  EXPECT_THROW(opt.set_scaled_state(p, "master_param", floats({0.5F})), PyAssertionError);
  EXPECT_NO_THROW(opt.set_scaled_state(p, "master_param", at::zeros({1}, at::kShort)));
  EXPECT_THROW(opt.set_scaled_state(p, "exp_avg", at::zeros({1}, at::kShort)), PyAssertionError);
}
