// te::fp8_linear on the CPU (the reference backend), for every recipe and both formats: the forward
// and both backward GEMMs equal float64 products of the dequantised casts the recipe prescribes
// (cast independently here with ops::fp8_quantize), the gradients stay close to the exact float64
// gradients of the unquantised layer, the delayed recipe's state follows TE's update, and recipes
// the device cannot run are refused by name.
#include "kiln/te/fp8_linear.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/grad_accumulation_fusion.h"
#include "kiln/ops/copy.h"
#include "kiln/runtime/error.h"

namespace kiln::te {
namespace fp8_linear_test {

constexpr std::int64_t kT = 48, kIn = 160, kOut = 144;  // partial 128-blocks on every axis

Fp8Recipe recipe_of(Fp8ScalingRecipe r, Fp8Format f) {
  Fp8Recipe rec;
  rec.recipe = r;
  rec.format = f;
  return rec;
}

// The cast of a high-precision matrix as the recipe prescribes it, dequantised exactly to float64.
Tensor cast_f64(const Tensor& x, DType dtype, ScalingLayout layout, const Fp8Recipe& r) {
  ops::Fp8CastOptions o;
  o.current_scaling = true;
  o.power_of_two_scales = r.recipe == Fp8ScalingRecipe::Blockwise;
  return ops::fp8_dequantize(ops::fp8_quantize(ops::contiguous(x), dtype, layout, o), DType::F64);
}

Tensor matmul64(const Tensor& a, const Tensor& b) { return matmul(a, b); }  // float64 in, float64 out

double max_rel(const Tensor& got, const Tensor& want) {
  const auto g = got.to(DType::F64).to_vector<double>(), w = want.to_vector<double>();
  double err = 0, scale = 1e-30;
  for (std::size_t i = 0; i < w.size(); ++i) {
    err = std::max(err, std::fabs(g[i] - w[i]));
    scale = std::max(scale, std::fabs(w[i]));
  }
  return err / scale;
}

struct LayerRun {
  Tensor y, dx, dw;
};

LayerRun run_layer(const Tensor& x0, const Tensor& w0, const Tensor& g, const Fp8Recipe& r, const Fp8LinearState* st) {
  Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  Tensor y = fp8_linear(x, w, Tensor(), r, st);
  sum(mul(y, g)).backward();
  return {y.detach(), x.grad(), w.grad()};
}

// The float64 products of the dequantised casts the recipe prescribes: y = x W^T, dx = g W,
// dW = g^T x (the delayed recipe with a fresh state casts with scale 1: so do these).
struct ReferenceGemms {
  Tensor y, dx, dw;
};
ReferenceGemms reference_gemms(const Tensor& x, const Tensor& w, const Tensor& g, const Fp8Recipe& r) {
  const bool block = r.recipe == Fp8ScalingRecipe::Blockwise;
  const ScalingLayout act = block ? ScalingLayout::Block1x128 : ScalingLayout::PerTensor;
  const ScalingLayout wl = block ? ScalingLayout::Block128x128 : ScalingLayout::PerTensor;
  auto q = [&](const Tensor& t, DType d, ScalingLayout l) {
    if (r.recipe != Fp8ScalingRecipe::Delayed) return cast_f64(t, d, l, r);
    Fp8Tensor unit = ops::fp8_empty(t.shape()[0], t.shape()[1], d, l, Device::cpu());  // scale 1
    ops::fp8_quantize_into(ops::contiguous(t), unit);
    return ops::fp8_dequantize(unit, DType::F64);
  };
  const DType e4 = DType::F8E4M3, gd = r.gradient_dtype();
  const Tensor qx = q(x, e4, act), qw = q(w, e4, wl), qg = q(g, gd, act);
  // Block recipes cast the backward's operands along the other axis (the contracted one).
  const Tensor w_dgrad = block ? q(w.t(), e4, wl).t() : qw;   // [out, in]
  const Tensor x_wgrad = block ? q(x.t(), e4, act).t() : qx;  // [T, in]
  const Tensor g_wgrad = block ? q(g.t(), gd, act).t() : qg;  // [T, out]
  return {matmul64(qx, qw.t()), matmul64(qg, w_dgrad), matmul64(g_wgrad.t(), x_wgrad)};
}

class Fp8LinearRecipes : public ::testing::TestWithParam<std::tuple<Fp8ScalingRecipe, Fp8Format>> {};

TEST_P(Fp8LinearRecipes, GemmsEqualFloat64ProductsOfTheQuantisedOperands) {
  const auto [rk, fmt] = GetParam();
  const Fp8Recipe r = recipe_of(rk, fmt);
  const Tensor x = Tensor::randn({kT, kIn}, 1) * 3.0, w = Tensor::randn({kOut, kIn}, 2) * 0.05,
               g = Tensor::randn({kT, kOut}, 3) * 1e-3;
  // Delayed with a fresh state casts with scale 1 (nothing recorded yet): the reference does too.
  const Fp8LinearState st{Fp8ScalingState::fresh(4, Device::cpu()), Fp8ScalingState::fresh(4, Device::cpu()),
                          Fp8ScalingState::fresh(4, Device::cpu())};
  const LayerRun got = run_layer(x, w, g, r, &st);
  const auto [y_ref, dx_ref, dw_ref] = reference_gemms(x, w, g, r);
  // f32 outputs of float64 accumulations: only the final rounding differs.
  EXPECT_LT(max_rel(got.y, y_ref), 1e-6);
  EXPECT_LT(max_rel(got.dx, dx_ref), 1e-6);
  EXPECT_LT(max_rel(got.dw, dw_ref), 1e-6);

  // And the fp8 layer's values and gradients stay near the exact (unquantised) ones: e4m3 keeps 3
  // mantissa bits, e5m2 2. Delayed scaling's first step casts at scale 1 (flushing most of these
  // small gradients): its second step, with scales from the first step's amaxes, is the one compared.
  const LayerRun near = rk == Fp8ScalingRecipe::Delayed ? run_layer(x, w, g, r, &st) : got;
  const Tensor x64 = x.to(DType::F64), w64 = w.to(DType::F64), g64 = g.to(DType::F64);
  const double tol = fmt == Fp8Format::Hybrid ? 0.15 : 0.08;
  EXPECT_LT(max_rel(near.y, matmul64(x64, w64.t())), 0.08);
  EXPECT_LT(max_rel(near.dx, matmul64(g64, w64)), tol);
  EXPECT_LT(max_rel(near.dw, matmul64(g64.t(), x64)), tol);
}

// Gradient-accumulation fusion (autograd/grad_accumulation_fusion.h): a bf16 weight whose .grad is
// an fp32 main gradient gets the FP8 weight-gradient GEMM's product added into that .grad in f32
// (ops::Fp8GemmOptions::accumulate), not rounded to bf16 first; dx is the same either way.
TEST_P(Fp8LinearRecipes, GradientAccumulationFusionAddsTheWgradIntoTheFp32Grad) {
  const auto [rk, fmt] = GetParam();
  const Fp8Recipe r = recipe_of(rk, fmt);
  const Tensor x = (Tensor::randn({kT, kIn}, 4) * 3.0).to(DType::BF16),
               w = (Tensor::randn({kOut, kIn}, 5) * 0.05).to(DType::BF16),
               g = Tensor::randn({kT, kOut}, 6).to(DType::BF16);
  const Tensor initial = Tensor::randn({kOut, kIn}, 7);  // what the fp32 buffer held before
  auto backward = [&](bool fusion) {
    const Fp8LinearState st{Fp8ScalingState::fresh(4, Device::cpu()), Fp8ScalingState::fresh(4, Device::cpu()),
                            Fp8ScalingState::fresh(4, Device::cpu())};
    Tensor xl = x.clone().requires_grad_(true), wl = w.clone().requires_grad_(true);
    wl.set_grad(initial.clone());
    autograd::GradientAccumulationFusionScope scope(fusion);
    fp8_linear(xl, wl, Tensor(), r, &st).backward(g);
    return std::pair{xl.grad(), wl.grad()};
  };
  const auto [dx_fused, grad_fused] = backward(true);
  const auto [dx_plain, grad_plain] = backward(false);
  ASSERT_EQ(grad_fused.dtype(), DType::F32);
  EXPECT_EQ(dx_fused.to_vector<float>(), dx_plain.to_vector<float>());
  const Tensor exact =
      reference_gemms(x.to(DType::F32), w.to(DType::F32), g.to(DType::F32), r).dw + initial.to(DType::F64);
  const double fused_error = max_rel(grad_fused, exact), plain_error = max_rel(grad_plain, exact);
  EXPECT_LT(fused_error, 1e-6);              // the f32 sum of the exact product and what .grad held
  EXPECT_GT(plain_error, 10 * fused_error);  // the plain way rounds the product to bf16 first
  EXPECT_LT(plain_error, 1.0 / 128);
}

INSTANTIATE_TEST_SUITE_P(AllRecipes, Fp8LinearRecipes,
                         ::testing::Combine(::testing::Values(Fp8ScalingRecipe::Delayed, Fp8ScalingRecipe::Tensorwise,
                                                              Fp8ScalingRecipe::Blockwise),
                                            ::testing::Values(Fp8Format::E4M3, Fp8Format::Hybrid)));

TEST(Fp8Linear, DelayedStateFollowsTheAmaxOfEachCast) {
  Fp8Recipe r = recipe_of(Fp8ScalingRecipe::Delayed, Fp8Format::Hybrid);
  r.amax_history_len = 2;
  r.amax_compute_algo = ops::AmaxComputeAlgo::Max;
  const Fp8LinearState st{Fp8ScalingState::fresh(2, Device::cpu()), Fp8ScalingState::fresh(2, Device::cpu()),
                          Fp8ScalingState::fresh(2, Device::cpu())};
  auto amax = [](const Tensor& t) {
    double m = 0;
    for (double v : t.to(DType::F64).to_vector<double>()) m = std::max(m, std::fabs(v));
    return static_cast<float>(m);
  };
  const Tensor w = Tensor::randn({kOut, kIn}, 5) * 0.05;
  float prev_x = 0, prev_g = 0;
  for (int step = 0; step < 3; ++step) {
    const Tensor x = Tensor::randn({kT, kIn}, 10 + static_cast<std::uint64_t>(step)) * (4.0 - step);
    const Tensor g = Tensor::randn({kT, kOut}, 20 + static_cast<std::uint64_t>(step)) * 1e-3;
    run_layer(x, w, g, r, &st);
    const float ax = std::max(amax(x), prev_x), ag = std::max(amax(g), prev_g);  // window of 2, max
    EXPECT_EQ(static_cast<const float*>(st.input.scale.data_ptr())[0], 448.0f / ax) << "step " << step;
    EXPECT_EQ(static_cast<const float*>(st.weight.scale.data_ptr())[0], 448.0f / amax(w));
    EXPECT_EQ(static_cast<const float*>(st.grad_output.scale.data_ptr())[0], 57344.0f / ag) << "step " << step;
    prev_x = amax(x);
    prev_g = amax(g);
  }
}

TEST(Fp8Linear, BiasAndLeadingDimensions) {
  const Fp8Recipe r = recipe_of(Fp8ScalingRecipe::Tensorwise, Fp8Format::Hybrid);
  const Tensor x = Tensor::randn({2, 8, 32}, 7), w = Tensor::randn({16, 32}, 8) * 0.1, b = Tensor::randn({16}, 9);
  const Tensor y = fp8_linear(x, w, b, r, nullptr);
  ASSERT_EQ(y.shape(), (Shape{2, 8, 16}));
  const Tensor y0 = fp8_linear(x.reshape({16, 32}), w, Tensor(), r, nullptr);
  EXPECT_LT(max_rel(y.reshape({16, 16}) - b, y0.to(DType::F64)), 1e-6);
}

TEST(Fp8Linear, RefusesMxfp8AndBadShapesByName) {
  const Tensor x = Tensor::randn({16, 32}, 1), w = Tensor::randn({16, 32}, 2);
  try {
    fp8_linear(x, w, Tensor(), recipe_of(Fp8ScalingRecipe::Mxfp8, Fp8Format::E4M3), nullptr);
    ADD_FAILURE() << "mxfp8 ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--fp8-recipe mxfp8"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("the CPU"), std::string::npos) << e.what();
  }
  try {
    fp8_linear(Tensor::randn({10, 32}, 1), w, Tensor(), recipe_of(Fp8ScalingRecipe::Tensorwise, Fp8Format::E4M3),
               nullptr);
    ADD_FAILURE() << "10 tokens ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 16"), std::string::npos) << e.what();
  }
}

}  // namespace fp8_linear_test
}  // namespace kiln::te
