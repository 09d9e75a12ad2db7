// te::grouped_linear (the bf16 MoE experts) under gradient-accumulation fusion: each expert's weight
// gradient is added by its GEMM into the weight's fp32 main gradient (.grad) in f32, an expert
// without rows keeps what it held, and nothing flows to .grad the plain way; dx is unchanged. The
// plain path rounds each expert's product to bf16 before the accumulation adds it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/autograd/grad_accumulation_fusion.h"
#include "kiln/te/moe.h"
#include "te_test_util.h"

namespace kiln::te {
namespace grouped_linear_fusion_test {

TEST(GroupedLinearFusion, EachExpertsWgradGoesIntoTheFp32GradInFloat32) {
  // Experts 0 and 2 without rows; 5 unused rows past offsets[E] (the padding of a dispatch).
  const std::vector<std::int64_t> rows_per_expert = {0, 37, 0, 64};
  std::vector<std::int64_t> off = {0};
  for (std::int64_t r : rows_per_expert) off.push_back(off.back() + r);
  const std::int64_t experts = static_cast<std::int64_t>(rows_per_expert.size()), in = 48, out = 40;
  const std::int64_t rows = off.back() + 5;
  const Tensor x = (Tensor::randn({rows, in}, 1) * 3.0).to(DType::BF16);
  const Tensor w = (Tensor::randn({experts, out, in}, 2) * 0.05).to(DType::BF16);
  const Tensor g = Tensor::randn({rows, out}, 3).to(DType::BF16);
  const Tensor offsets = Tensor::from_vector(off, {experts + 1});
  const Tensor initial = Tensor::randn({experts, out, in}, 4);
  auto backward = [&](bool fusion) {
    Tensor xl = x.clone().requires_grad_(true), wl = w.clone().requires_grad_(true);
    wl.set_grad(initial.clone());
    autograd::GradientAccumulationFusionScope scope(fusion);
    grouped_linear(xl, wl, offsets).backward(g);
    return std::pair{xl.grad(), wl.grad()};
  };
  const auto [dx_fused, grad_fused] = backward(true);
  const auto [dx_plain, grad_plain] = backward(false);
  ASSERT_EQ(grad_fused.dtype(), DType::F32);
  EXPECT_EQ(dx_fused.to(DType::F32).to_vector<float>(), dx_plain.to(DType::F32).to_vector<float>());
  // float64: initial + dy_e^T x_e over each expert's rows, from the bf16 values.
  const std::vector<double> xs = x.to(DType::F64).to_vector<double>(), gs = g.to(DType::F64).to_vector<double>();
  std::vector<double> exact = initial.to(DType::F64).to_vector<double>();
  for (std::int64_t e = 0; e < experts; ++e)
    for (std::int64_t r = off[static_cast<std::size_t>(e)]; r < off[static_cast<std::size_t>(e) + 1]; ++r)
      for (std::int64_t o = 0; o < out; ++o)
        for (std::int64_t i = 0; i < in; ++i)
          exact[static_cast<std::size_t>((e * out + o) * in + i)] +=
              gs[static_cast<std::size_t>(r * out + o)] * xs[static_cast<std::size_t>(r * in + i)];
  const Tensor want = Tensor::from_vector(exact, {experts, out, in});
  const double fused_error = te_test::rel_error(grad_fused.to(DType::F64), want);
  EXPECT_LT(fused_error, 1e-6);
  EXPECT_GT(te_test::rel_error(grad_plain.to(DType::F64), want), 10 * fused_error);
  for (std::int64_t e : {0, 2})
    EXPECT_EQ(grad_fused.select(0, e).to_vector<float>(), initial.select(0, e).to_vector<float>())
        << "expert " << e << " has no rows";
}

}  // namespace grouped_linear_fusion_test
}  // namespace kiln::te
