// te::fp8_grouped_linear on the CPU (the reference backend), for every recipe and both formats: with
// experts of 0, 1, 17 and 64 rows (none a multiple of 16 but 0 and 64) and unused buffer rows after
// them, each expert's y, dx and dW equal float64 products of the dequantised casts the recipe
// prescribes (cast independently here with ops::fp8_quantize: per tensor over all experts' rows for
// activations and gradients, per expert for weights and for every block-scaled operand); the unused
// rows get zeros, an expert without rows a zero dW; the delayed recipe's states follow TE's update
// (one for the grouped input, one per expert weight, one for the grouped gradient); with
// gradient-accumulation fusion each expert's weight gradient goes into the fp32 .grad unrounded.
#include "kiln/te/fp8_grouped_linear.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/grad_accumulation_fusion.h"
#include "kiln/ops/copy.h"
#include "kiln/runtime/error.h"

namespace kiln::te {
namespace fp8_grouped_linear_test {

constexpr std::int64_t kIn = 160, kOut = 144;  // partial 128-blocks on both axes
const std::vector<std::int64_t> kRowsPerExpert = {0, 1, 17, 64};
constexpr std::int64_t kUnused = 3;  // buffer rows past offsets[E]

Fp8Recipe recipe_of(Fp8ScalingRecipe r, Fp8Format f) {
  Fp8Recipe rec;
  rec.recipe = r;
  rec.format = f;
  return rec;
}

std::vector<std::int64_t> offsets_of(const std::vector<std::int64_t>& rows) {
  std::vector<std::int64_t> off = {0};
  for (std::int64_t n : rows) off.push_back(off.back() + n);
  return off;
}

double max_rel(const Tensor& got, const Tensor& want) {
  const auto g = got.to(DType::F64).to_vector<double>(), w = want.to(DType::F64).to_vector<double>();
  double err = 0, scale = 1e-30;
  for (std::size_t i = 0; i < w.size(); ++i) {
    err = std::max(err, std::fabs(g[i] - w[i]));
    scale = std::max(scale, std::fabs(w[i]));
  }
  return err / scale;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to(DType::F64).to_vector<double>()) m = std::max(m, std::fabs(v));
  return m;
}

Fp8GroupedLinearState fresh_state(std::int64_t experts, std::int64_t len) {
  Fp8GroupedLinearState s{Fp8ScalingState::fresh(len, Device::cpu()), {}, Fp8ScalingState::fresh(len, Device::cpu())};
  for (std::int64_t e = 0; e < experts; ++e) s.weight.push_back(Fp8ScalingState::fresh(len, Device::cpu()));
  return s;
}

struct LayerRun {
  Tensor y, dx, dw;
};

LayerRun run_layer(const Tensor& x0, const Tensor& w0, const Tensor& g, const Tensor& offsets, const Fp8Recipe& r,
                   const Fp8GroupedLinearState* st) {
  Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  Tensor y = fp8_grouped_linear(x, w, offsets, r, st);
  sum(mul(y, g)).backward();
  return {y.detach(), x.grad(), w.grad()};
}

class Fp8GroupedLinearRecipes : public ::testing::TestWithParam<std::tuple<Fp8ScalingRecipe, Fp8Format>> {};

TEST_P(Fp8GroupedLinearRecipes, EachExpertsGemmsEqualFloat64ProductsOfTheQuantisedOperands) {
  const auto [rk, fmt] = GetParam();
  const Fp8Recipe r = recipe_of(rk, fmt);
  const std::vector<std::int64_t> off = offsets_of(kRowsPerExpert);
  const std::int64_t experts = static_cast<std::int64_t>(kRowsPerExpert.size()), used = off.back();
  const std::int64_t rows = used + kUnused;
  const Tensor x = Tensor::randn({rows, kIn}, 1) * 3.0, w = Tensor::randn({experts, kOut, kIn}, 2) * 0.05,
               g = Tensor::randn({rows, kOut}, 3) * 1e-3;
  const Tensor offsets = Tensor::from_vector(off, {experts + 1});
  const Fp8GroupedLinearState st = fresh_state(experts, 4);  // delayed: scale 1 for the first casts
  const LayerRun got = run_layer(x, w, g, offsets, r, &st);

  const bool block = rk == Fp8ScalingRecipe::Blockwise;
  const ScalingLayout act = block ? ScalingLayout::Block1x128 : ScalingLayout::PerTensor;
  const ScalingLayout wl = block ? ScalingLayout::Block128x128 : ScalingLayout::PerTensor;
  auto q = [&](const Tensor& t, DType d, ScalingLayout l) {
    Fp8Tensor unit = ops::fp8_empty(t.shape()[0], t.shape()[1], d, l, Device::cpu());  // scale 1
    ops::Fp8CastOptions o;
    o.current_scaling = rk == Fp8ScalingRecipe::Tensorwise;
    o.power_of_two_scales = block;
    ops::fp8_quantize_into(ops::contiguous(t), unit, o);
    return ops::fp8_dequantize(unit, DType::F64);
  };
  const DType e4 = DType::F8E4M3, gd = r.gradient_dtype();
  // Per tensor, activations and gradients are cast once over all experts' rows (the unused rows
  // are not among them); block scales are every expert's own.
  const Tensor qx_all = q(x.narrow(0, 0, used), e4, act), qg_all = q(g.narrow(0, 0, used), gd, act);
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t lo = off[static_cast<std::size_t>(e)], n = kRowsPerExpert[static_cast<std::size_t>(e)];
    const Tensor dw_got = got.dw.select(0, e);
    if (n == 0) {
      EXPECT_EQ(max_abs(dw_got), 0.0) << "expert " << e << " has no rows";
      continue;
    }
    const Tensor xe = x.narrow(0, lo, n), ge = g.narrow(0, lo, n), we = w.select(0, e);
    const Tensor qx = block ? q(xe, e4, act) : qx_all.narrow(0, lo, n);
    const Tensor qg = block ? q(ge, gd, act) : qg_all.narrow(0, lo, n);
    const Tensor qw = q(we, e4, wl);
    // Block recipes cast the backward's operands along the other axis (the contracted one).
    const Tensor w_dgrad = block ? q(we.t(), e4, wl).t() : qw;   // [out, in]
    const Tensor x_wgrad = block ? q(xe.t(), e4, act).t() : qx;  // [n, in]
    const Tensor g_wgrad = block ? q(ge.t(), gd, act).t() : qg;  // [n, out]
    EXPECT_LT(max_rel(got.y.narrow(0, lo, n), matmul(qx, qw.t())), 1e-6) << "expert " << e;
    EXPECT_LT(max_rel(got.dx.narrow(0, lo, n), matmul(qg, w_dgrad)), 1e-6) << "expert " << e;
    EXPECT_LT(max_rel(dw_got, matmul(g_wgrad.t(), x_wgrad)), 1e-6) << "expert " << e;
    EXPECT_GT(max_abs(dw_got), 0.0) << "expert " << e;
  }
  EXPECT_EQ(max_abs(got.y.narrow(0, used, kUnused)), 0.0) << "unused rows";
  EXPECT_EQ(max_abs(got.dx.narrow(0, used, kUnused)), 0.0) << "unused rows";
}

// Gradient-accumulation fusion (autograd/grad_accumulation_fusion.h): bf16 expert weights whose
// .grad is an fp32 main gradient get each expert's FP8 wgrad product added into its slice in f32 (an
// expert without rows keeps what it held), equal to what .grad held plus the float32 layer's exact
// products; the plain way rounds each product to bf16 first. dx is the same either way.
TEST_P(Fp8GroupedLinearRecipes, GradientAccumulationFusionAddsEachExpertsWgradIntoTheFp32Grad) {
  const auto [rk, fmt] = GetParam();
  const Fp8Recipe r = recipe_of(rk, fmt);
  const std::vector<std::int64_t> off = offsets_of(kRowsPerExpert);
  const std::int64_t experts = static_cast<std::int64_t>(kRowsPerExpert.size()), rows = off.back() + kUnused;
  const Tensor x = (Tensor::randn({rows, kIn}, 11) * 3.0).to(DType::BF16),
               w = (Tensor::randn({experts, kOut, kIn}, 12) * 0.05).to(DType::BF16),
               g = Tensor::randn({rows, kOut}, 13).to(DType::BF16);
  const Tensor offsets = Tensor::from_vector(off, {experts + 1});
  const Tensor initial = Tensor::randn({experts, kOut, kIn}, 14);
  auto backward = [&](bool fusion) {
    const Fp8GroupedLinearState st = fresh_state(experts, 4);
    Tensor xl = x.clone().requires_grad_(true), wl = w.clone().requires_grad_(true);
    wl.set_grad(initial.clone());
    autograd::GradientAccumulationFusionScope scope(fusion);
    fp8_grouped_linear(xl, wl, offsets, r, &st).backward(g);
    return std::pair{xl.grad(), wl.grad()};
  };
  const auto [dx_fused, grad_fused] = backward(true);
  const auto [dx_plain, grad_plain] = backward(false);
  ASSERT_EQ(grad_fused.dtype(), DType::F32);
  EXPECT_EQ(dx_fused.to_vector<float>(), dx_plain.to_vector<float>());
  // The same layer in float32 on the bf16 values: the same casts, products rounded only to f32.
  const Fp8GroupedLinearState st = fresh_state(experts, 4);
  const Tensor exact =
      run_layer(x.to(DType::F32), w.to(DType::F32), g.to(DType::F32), offsets, r, &st).dw.to(DType::F64) +
      initial.to(DType::F64);
  EXPECT_LT(max_rel(grad_fused, exact), 1e-6);
  EXPECT_GT(max_rel(grad_plain, exact), 10 * max_rel(grad_fused, exact));
  EXPECT_EQ(grad_fused.select(0, 0).to_vector<float>(), initial.select(0, 0).to_vector<float>())
      << "the expert without rows";
}

INSTANTIATE_TEST_SUITE_P(AllRecipes, Fp8GroupedLinearRecipes,
                         ::testing::Combine(::testing::Values(Fp8ScalingRecipe::Delayed, Fp8ScalingRecipe::Tensorwise,
                                                              Fp8ScalingRecipe::Blockwise),
                                            ::testing::Values(Fp8Format::E4M3, Fp8Format::Hybrid)));

float scale_of(const Fp8ScalingState& s) { return static_cast<const float*>(s.scale.data_ptr())[0]; }

TEST(Fp8GroupedLinear, DelayedStatesFollowTheAmaxOfEachGroupedCastAndEachExpertWeight) {
  Fp8Recipe r = recipe_of(Fp8ScalingRecipe::Delayed, Fp8Format::Hybrid);
  r.amax_history_len = 2;
  r.amax_compute_algo = ops::AmaxComputeAlgo::Max;
  const std::vector<std::int64_t> off = offsets_of(kRowsPerExpert);
  const std::int64_t experts = static_cast<std::int64_t>(kRowsPerExpert.size()), used = off.back();
  const Tensor offsets = Tensor::from_vector(off, {experts + 1});
  const Fp8GroupedLinearState st = fresh_state(experts, 2);
  const Tensor w = Tensor::randn({experts, kOut, kIn}, 5) * 0.05;
  float prev_x = 0, prev_g = 0;
  for (int step = 0; step < 3; ++step) {
    const auto seed = static_cast<std::uint64_t>(step);
    Tensor x = Tensor::randn({used + kUnused, kIn}, 10 + seed) * (4.0 - step);
    Tensor g = Tensor::randn({used + kUnused, kOut}, 20 + seed) * 1e-3;
    // Large values in the unused rows: they are not cast, so they must not reach the amaxes.
    x.narrow(0, used, kUnused).copy_(Tensor::full({kUnused, kIn}, 1e4));
    g.narrow(0, used, kUnused).copy_(Tensor::full({kUnused, kOut}, 1e4));
    run_layer(x, w, g, offsets, r, &st);
    const auto ax = static_cast<float>(max_abs(x.narrow(0, 0, used)));
    const auto ag = static_cast<float>(max_abs(g.narrow(0, 0, used)));
    EXPECT_EQ(scale_of(st.input), 448.0f / std::max(ax, prev_x)) << "step " << step;
    EXPECT_EQ(scale_of(st.grad_output), 57344.0f / std::max(ag, prev_g)) << "step " << step;
    for (std::int64_t e = 0; e < experts; ++e)
      EXPECT_EQ(scale_of(st.weight[static_cast<std::size_t>(e)]), 448.0f / static_cast<float>(max_abs(w.select(0, e))))
          << "expert " << e;
    prev_x = ax;
    prev_g = ag;
  }
}

TEST(Fp8GroupedLinear, RefusesShapesAndStatesThatDoNotFitByName) {
  const Tensor offsets = Tensor::from_vector(std::vector<std::int64_t>{0, 3, 5}, {3});
  auto refuse = [](auto&& call, const char* part) {
    try {
      call();
      ADD_FAILURE() << "accepted; expected '" << part << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  const Fp8Recipe tw = recipe_of(Fp8ScalingRecipe::Tensorwise, Fp8Format::Hybrid);
  refuse(
      [&] {
        fp8_grouped_linear(Tensor::randn({5, 24}, 1), Tensor::randn({2, 16, 24}, 2), offsets, tw, nullptr);
      },
      "--moe-ffn-hidden-size");
  const Fp8GroupedLinearState one_weight = fresh_state(1, 1);
  refuse(
      [&] {
        fp8_grouped_linear(Tensor::randn({5, 32}, 1), Tensor::randn({2, 16, 32}, 2), offsets,
                           recipe_of(Fp8ScalingRecipe::Delayed, Fp8Format::Hybrid), &one_weight);
      },
      "one weight state per expert");
  refuse(
      [&] {
        fp8_grouped_linear(Tensor::randn({5, 32}, 1), Tensor::randn({2, 16, 32}, 2), offsets,
                           recipe_of(Fp8ScalingRecipe::Mxfp8, Fp8Format::E4M3), nullptr);
      },
      "--fp8-recipe mxfp8");
}

}  // namespace fp8_grouped_linear_test
}  // namespace kiln::te
