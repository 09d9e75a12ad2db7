// te::grouped_linear's weight gradient under gradient-accumulation fusion on a GPU. Experts of 1024
// rows or more (te/grouped_gemm_path.h: Auto runs the weight gradient as a loop of per-expert GEMMs):
// each expert's product is added into the fp32 .grad by its cuBLASLt GEMM (beta 1), as the CPU adds
// it. Smaller experts (Auto: one grouped launch in bf16): the plain path, the product rounded to bf16
// and accumulated, as the CPU's plain path does. An expert without rows keeps what it held either way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../te/te_test_util.h"
#include "kiln/autograd/grad_accumulation_fusion.h"
#include "kiln/te/moe.h"
#include "test_util.h"

namespace kiln {
namespace grouped_linear_fusion_cuda_test {

TEST(CudaGroupedLinearFusion, ExpertWgradsGoIntoTheFp32GradAsOnTheCpu) {
  KILN_REQUIRE_CUDA();
  const std::int64_t in = 64, out = 96;
  for (const std::vector<std::int64_t>& sizes : {std::vector<std::int64_t>{1024, 0, 1536},  // fused: a loop of GEMMs
                                                 std::vector<std::int64_t>{300, 0, 77}}) {  // small: the plain path
    std::vector<std::int64_t> off = {0};
    for (std::int64_t r : sizes) off.push_back(off.back() + r);
    const std::int64_t experts = static_cast<std::int64_t>(sizes.size()), rows = off.back() + 3;
    const Tensor x = (Tensor::randn({rows, in}, 1) * 2.0).to(DType::BF16);
    const Tensor w = (Tensor::randn({experts, out, in}, 2) * 0.05).to(DType::BF16);
    const Tensor g = Tensor::randn({rows, out}, 3).to(DType::BF16);
    const Tensor offsets = Tensor::from_vector(off, {experts + 1});
    const Tensor initial = Tensor::randn({experts, out, in}, 4);
    const bool fused = sizes[0] >= 1024;
    Tensor grads[2], dxs[2];
    int side = 0;
    for (Device d : {Device::cpu(), Device::cuda(0)}) {
      // Copies of their own on both sides (x.to(cpu) would be x itself, and the CPU's fused add
      // would move `initial`).
      Tensor xl = x.clone().to(d).requires_grad_(true), wl = w.clone().to(d).requires_grad_(true);
      wl.set_grad(initial.clone().to(d));
      // The CPU side fuses only where the GPU does, so both compute the same thing.
      const autograd::GradientAccumulationFusionScope scope(fused || d.is_cuda());
      te::grouped_linear(xl, wl, offsets.to(d)).backward(g.to(d));
      ASSERT_EQ(wl.grad().dtype(), DType::F32);
      grads[side] = wl.grad().to(Device::cpu());
      dxs[side++] = xl.grad().to(Device::cpu());
    }
    // fp32 sums in another order (fused), or products rounded to bf16 by both (plain): well within
    // bf16's resolution.
    EXPECT_LT(te_test::rel_error(grads[1].to(DType::F64), grads[0].to(DType::F64)), fused ? 1e-5 : 8e-3)
        << "experts of " << sizes[0] << " rows";
    EXPECT_LT(te_test::rel_error(dxs[1].to(DType::F64), dxs[0].to(DType::F64)), 1e-2);
    EXPECT_EQ(grads[1].select(0, 1).to_vector<float>(), initial.select(0, 1).to_vector<float>()) << "no rows";
  }
}

}  // namespace grouped_linear_fusion_cuda_test
}  // namespace kiln
