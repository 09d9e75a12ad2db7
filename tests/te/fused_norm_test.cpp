// add_rms_norm / add_layer_norm: float64 references, finite-difference gradients of both outputs,
// the CPU at f32/bf16, CUDA against the CPU, and refused inputs.
#include "kiln/te/fused_norm.h"

#include <gtest/gtest.h>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/gradcheck.h"
#include "kiln/ops/kernel_registry.h"
#include "kiln/te/fused_ops.h"
#include "te_reference.h"
#include "te_test_util.h"

namespace kiln {
namespace fused_norm_test {

using te_test::randn;
using te_test::rel_error;

struct NormCase {
  bool rms;
  bool residual;
  bool affine;
};

std::pair<Tensor, Tensor> run(const NormCase& c, const Tensor& x, const Tensor& r, const Tensor& w, const Tensor& b) {
  const Tensor res = c.residual ? r : Tensor();
  return c.rms ? te::add_rms_norm(x, res, c.affine ? w : Tensor(), 1e-5)
               : te::add_layer_norm(x, res, c.affine ? w : Tensor(), c.affine ? b : Tensor(), 1e-5);
}

class FusedNorm : public ::testing::TestWithParam<NormCase> {};

TEST_P(FusedNorm, MatchesFloat64Reference) {
  const NormCase c = GetParam();
  const Tensor x = randn({3, 7, 37}, 1, 2.0, 0.3), r = randn({3, 7, 37}, 2), w = randn({37}, 3, 0.2, 1.0),
               b = randn({37}, 4, 0.3);
  const auto [y, s] = run(c, x, r, w, b);
  const auto [ry, rs] = te_reference::add_norm(x, c.residual ? r : Tensor(), c.affine ? w : Tensor(),
                                               c.affine && !c.rms ? b : Tensor(), 1e-5, c.rms);
  EXPECT_LT(rel_error(y, ry), 1e-13);
  EXPECT_LT(rel_error(s, rs), 1e-15);
  // The CPU at float32 and bf16 (f32 accumulation).
  for (auto [t, tol] : {std::pair{DType::F32, 1e-5}, std::pair{DType::BF16, 3e-2}}) {
    const auto [yl, sl] = run(c, x.to(t), r.to(t), w.to(t), b.to(t));
    EXPECT_EQ(yl.dtype(), t);
    EXPECT_LT(rel_error(yl, ry), tol) << dtype_name(t);
    EXPECT_LT(rel_error(sl, rs), tol) << dtype_name(t);
  }
}

TEST_P(FusedNorm, GradientsOfBothOutputsByFiniteDifferences) {
  const NormCase c = GetParam();
  std::vector<Tensor> inputs = {randn({4, 9}, 11, 1.5, 0.2), randn({4, 9}, 12), randn({9}, 13, 0.3, 1.0),
                                randn({9}, 14, 0.2)};
  // The sum feeds a nonlinear consumer (as the next block does), so its gradient must join the
  // norm's correctly, not just pass through.
  auto f = [c](const std::vector<Tensor>& in) {
    auto [y, s] = run(c, in[0], in[1], in[2], in[3]);
    return add(y, mul(s, s));
  };
  const auto result = autograd::gradcheck(f, inputs);
  EXPECT_TRUE(result.ok) << result.message;
}

INSTANTIATE_TEST_SUITE_P(Variants, FusedNorm,
                         ::testing::Values(NormCase{true, true, true}, NormCase{true, false, true},
                                           NormCase{true, true, false}, NormCase{false, true, true},
                                           NormCase{false, false, true}, NormCase{false, true, false}),
                         [](const auto& info) {
                           return std::string(info.param.rms ? "rms" : "layer") +
                                  (info.param.residual ? "_residual" : "_no_residual") +
                                  (info.param.affine ? "_affine" : "_plain");
                         });

TEST(FusedNorm, OnlyTheSumReachingTheLossGivesItsGradientToBothInputs) {
  Tensor x = randn({2, 5}, 21).requires_grad_(true), r = randn({2, 5}, 22).requires_grad_(true);
  const Tensor w = randn({5}, 23, 0.1, 1.0).requires_grad_(true);
  auto [y, s] = te::add_rms_norm(x, r, w, 1e-6);
  sum(mul(s, 3.0)).backward();
  EXPECT_LT(rel_error(x.grad(), Tensor::full({2, 5}, 3.0, DType::F64)), 1e-15);
  EXPECT_LT(rel_error(r.grad(), Tensor::full({2, 5}, 3.0, DType::F64)), 1e-15);
  EXPECT_FALSE(w.grad().defined() && w.grad().to_vector<double>()[0] != 0);
}

TEST(FusedNorm, Float32WeightsWithBf16Activations) {
  const Tensor x = randn({4, 64}, 31), r = randn({4, 64}, 32), w = randn({64}, 33, 0.1, 1.0), b = randn({64}, 34, 0.1);
  Tensor xb = x.to(DType::BF16).requires_grad_(true), wf = w.to(DType::F32).requires_grad_(true),
         bf = b.to(DType::F32).requires_grad_(true);
  auto [y, s] = te::add_layer_norm(xb, r.to(DType::BF16), wf, bf, 1e-5);
  EXPECT_EQ(y.dtype(), DType::BF16);
  const auto [ry, rs] =
      te_reference::add_norm(x.to(DType::BF16), r.to(DType::BF16), w.to(DType::F32), b.to(DType::F32), 1e-5, false);
  EXPECT_LT(rel_error(y, ry), 2e-2);
  sum(y).backward();
  EXPECT_EQ(wf.grad().dtype(), DType::F32);
  EXPECT_EQ(bf.grad().dtype(), DType::F32);
  EXPECT_NEAR(bf.grad().to_vector<double>()[0], 4.0, 1e-6);  // d sum(y) / d b_j = rows
}

TEST(FusedNorm, RefusesBadInputs) {
  const Tensor x = randn({2, 8}, 41);
  te_test::expect_error([&] { te::add_rms_norm(x, randn({2, 7}, 42), Tensor(), 1e-5); }, {"add_rms_norm", "residual"});
  te_test::expect_error([&] { te::add_layer_norm(x, Tensor(), randn({7}, 43), Tensor(), 1e-5); },
                        {"add_layer_norm", "weight", "[8]"});
  te_test::expect_error([&] { te::add_layer_norm(x, Tensor(), Tensor(), randn({8}, 44).to(DType::F16), 1e-5); },
                        {"add_layer_norm", "bias", "float32"});
  te_test::expect_error([&] { te::add_rms_norm(x, Tensor(), Tensor(), 0); }, {"add_rms_norm", "eps"});
  te_test::expect_error(
      [&] {
        te::add_rms_norm(Tensor::zeros({2, 8}, DType::I64), Tensor(), Tensor(), 1e-5);
      },
      {"add_rms_norm", "x"});
}

// The family registers once in the process-wide registry (fused_ops() after an explicit
// registration, or the reverse, must not throw), and into a fresh registry with every op.
TEST(FusedOps, RegistrationIsIdempotentForTheProcessRegistry) {
  (void)te::fused_ops();
  EXPECT_THROW(te::register_fused_ops(ops::kernel_registry()), Error);  // the slots are taken
  EXPECT_NO_THROW((void)te::fused_ops());
  ops::KernelRegistry fresh;
  te::register_fused_ops(fresh);
  for (const char* op :
       {te::kAddRmsNormForwardOp, te::kAddRmsNormBackwardOp, te::kAddLayerNormForwardOp, te::kAddLayerNormBackwardOp,
        te::kApplyRopeOp, te::kSwigluForwardOp, te::kSwigluBackwardOp, te::kCrossEntropyChunkOp,
        te::kLinearBiasGeluForwardOp, te::kLinearBiasGeluBackwardOp, te::kDgeluBgradGemmOp})
    EXPECT_TRUE(fresh.has_kernel(op, DeviceKind::CPU, DType::BF16)) << op;
}

// The CUDA kernels against the CPU at bf16 and f32, forward and backward (both outputs' gradients
// in), at a narrow width, an odd width and the largest supported (16384), and at GPT-2's 768 and
// Llama's 2048 with thousands of rows: bf16 rows up to 1024 wide take the warp-per-row backward,
// whose blocks fold 8 rows at a time and stride over the rest (a last block with fewer rows).
TEST(FusedNormCuda, MatchesCpu) {
  KILN_TE_REQUIRE_CUDA(dev);
  for (auto [rows, h] : {std::pair<std::int64_t, std::int64_t>{6, 48},
                         {6, 1000},
                         {6, 4096},
                         {6, 16384},
                         {4099, 768},
                         {1029, 264},
                         {515, 2048}}) {
    for (bool rms : {true, false}) {
      for (auto [t, tol] : {std::pair{DType::F32, 1e-5}, std::pair{DType::BF16, 2e-2}}) {
        const Tensor x = randn({rows, h}, 51, 1.5, 0.2).to(t), r = randn({rows, h}, 52).to(t),
                     w = randn({h}, 53, 0.2, 1.0).to(t), b = randn({h}, 54, 0.2).to(t), gy = randn({rows, h}, 55).to(t),
                     gs = randn({rows, h}, 56).to(t);
        std::vector<Tensor> results[2];
        for (int side = 0; side < 2; ++side) {
          const Device d = side == 0 ? Device::cpu() : dev;
          Tensor xd = x.to(d).detach().requires_grad_(true), rd = r.to(d).detach().requires_grad_(true),
                 wd = w.to(d).detach().requires_grad_(true), bd = b.to(d).detach().requires_grad_(true);
          auto [y, s] = rms ? te::add_rms_norm(xd, rd, wd, 1e-5) : te::add_layer_norm(xd, rd, wd, bd, 1e-5);
          add(sum(mul(y, gy.to(d))), sum(mul(s, gs.to(d)))).backward();
          results[side] = {y, s, xd.grad(), rd.grad(), wd.grad()};
          if (!rms) results[side].push_back(bd.grad());
        }
        for (std::size_t k = 0; k < results[0].size(); ++k)
          EXPECT_LT(rel_error(results[1][k].to(Device::cpu()), results[0][k]), tol)
              << "H " << h << (rms ? " rms" : " layer") << " " << dtype_name(t) << " value " << k;
      }
    }
  }
}

}  // namespace fused_norm_test
}  // namespace kiln
