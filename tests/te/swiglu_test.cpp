// swiglu: float64 reference, finite-difference gradient, the CPU at f32/bf16, CUDA vs CPU.
#include "kiln/te/swiglu.h"

#include <gtest/gtest.h>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/gradcheck.h"
#include "te_reference.h"
#include "te_test_util.h"

namespace kiln {
namespace swiglu_test {

using te_test::randn;
using te_test::rel_error;

TEST(Swiglu, MatchesFloat64Reference) {
  const Tensor x = randn({3, 4, 22}, 1, 3.0);
  const Tensor y = te::swiglu(x);
  EXPECT_EQ(y.shape(), (Shape{3, 4, 11}));
  EXPECT_LT(rel_error(y, te_reference::swiglu(x)), 1e-15);
  EXPECT_LT(rel_error(te::swiglu(x.to(DType::F32)), te_reference::swiglu(x.to(DType::F32))), 1e-6);
  EXPECT_LT(rel_error(te::swiglu(x.to(DType::BF16)), te_reference::swiglu(x.to(DType::BF16))), 1e-2);
  // A strided input (a transposed view) is made contiguous first.
  const Tensor xt = randn({22, 5}, 2).t();
  EXPECT_LT(rel_error(te::swiglu(xt), te_reference::swiglu(xt.contiguous())), 1e-15);
}

TEST(Swiglu, GradientByFiniteDifferences) {
  const auto result =
      autograd::gradcheck([](const std::vector<Tensor>& in) { return te::swiglu(in[0]); }, {randn({4, 10}, 3, 2.0)});
  EXPECT_TRUE(result.ok) << result.message;
}

TEST(Swiglu, RefusesAnOddLastDimension) {
  te_test::expect_error([] { te::swiglu(randn({2, 7}, 4)); }, {"swiglu", "[..., 2F]", "[2, 7]"});
}

TEST(SwigluCuda, MatchesCpu) {
  KILN_TE_REQUIRE_CUDA(dev);
  for (auto [t, tol] : {std::pair{DType::F32, 1e-6}, std::pair{DType::BF16, 1e-2}}) {
    const Tensor x = randn({64, 2 * 1000}, 5, 3.0).to(t), g = randn({64, 1000}, 6).to(t);
    Tensor xc = x.clone().requires_grad_(true), xg = x.to(dev).requires_grad_(true);
    Tensor yc = te::swiglu(xc), yg = te::swiglu(xg);
    sum(mul(yc, g)).backward();
    sum(mul(yg, g.to(dev))).backward();
    EXPECT_LT(rel_error(yg.to(Device::cpu()), yc), tol) << dtype_name(t);
    EXPECT_LT(rel_error(xg.grad().to(Device::cpu()), xc.grad()), tol) << dtype_name(t);
  }
}

// The kernels take 16 bytes of each half per thread where the width and the pointers allow, one
// element per thread elsewhere: both forms give the same bits, and widths that are no multiple of
// a pack still match the CPU.
TEST(SwigluCuda, PackedAndElementwiseKernelsAgreeBitForBit) {
  KILN_TE_REQUIRE_CUDA(dev);
  for (DType t : {DType::BF16, DType::F32}) {
    const std::int64_t rows = 33, f = 1024;
    const Tensor x = randn({rows, 2 * f}, 7, 3.0).to(t).to(dev), g = randn({rows, f}, 8).to(t).to(dev);
    // The same values one element into a larger buffer: contiguous but not 16-byte aligned.
    Tensor storage = Tensor::zeros({rows * 2 * f + 1}, t, dev);
    Tensor shifted = make_view(storage, {rows, 2 * f}, {2 * f, 1}, 1);
    shifted.copy_(x);
    Tensor xa = x.clone().requires_grad_(true), xs = shifted.detach().requires_grad_(true);
    const Tensor ya = te::swiglu(xa), ys = te::swiglu(xs);
    sum(mul(ya, g)).backward();
    sum(mul(ys, g)).backward();
    EXPECT_EQ(ya.to(DType::F32).to(Device::cpu()).to_vector<float>(),
              ys.to(DType::F32).to(Device::cpu()).to_vector<float>())
        << dtype_name(t);
    EXPECT_EQ(xa.grad().to(DType::F32).to(Device::cpu()).to_vector<float>(),
              xs.grad().to(DType::F32).to(Device::cpu()).to_vector<float>())
        << dtype_name(t);
  }
  // A width that is no multiple of 8: the element-wise form, against the CPU.
  const Tensor x = randn({5, 2 * 1003}, 9, 3.0).to(DType::BF16);
  EXPECT_LT(rel_error(te::swiglu(x.to(dev)).to(Device::cpu()), te::swiglu(x)), 1e-2);
}

}  // namespace swiglu_test
}  // namespace kiln
