// Memory formats: channels-last detection and conversion, elementwise ops keeping a dense layout
// (through flat views), and a conv-BN-ReLU-residual block giving the same values and gradients
// from a channels-last input as from a contiguous one.
#include "kiln/ops/memory_format.h"

#include <gtest/gtest.h>

#include "kiln/autograd/functions.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"
#include "test_util.h"

namespace kiln {
namespace memory_format_test {

using testing::expect_close;
using testing::host;

TEST(MemoryFormat, DetectsDenseAndChannelsLastLayouts) {
  Tensor x = Tensor::randn({2, 3, 4, 5}, 1);
  EXPECT_TRUE(ops::is_non_overlapping_dense(x));
  EXPECT_FALSE(ops::is_channels_last(x));
  Tensor cl = ops::to_channels_last(x);
  EXPECT_TRUE(ops::is_channels_last(cl));
  EXPECT_FALSE(cl.is_contiguous());
  EXPECT_TRUE(ops::is_non_overlapping_dense(cl));
  EXPECT_EQ(cl.strides(), (Strides{60, 1, 15, 3}));
  EXPECT_TRUE(ops::to_channels_last(cl).is_same(cl));  // no second copy
  EXPECT_EQ(host(cl), host(x));
  // A transpose is dense; a slice with gaps and a broadcast are not.
  EXPECT_TRUE(ops::is_non_overlapping_dense(x.transpose(1, 3)));
  EXPECT_FALSE(ops::is_non_overlapping_dense(x.slice(3, 0, 5, 2)));
  EXPECT_FALSE(ops::is_non_overlapping_dense(Tensor::ones({3, 1}).expand({3, 4})));
  EXPECT_FALSE(ops::same_dense_layout(x, x));  // contiguous operands take the ordinary path
  EXPECT_TRUE(ops::same_dense_layout(cl, ops::to_channels_last(Tensor::randn({2, 3, 4, 5}, 2))));
  // Size-1 dimensions do not matter for the layout.
  EXPECT_TRUE(ops::is_channels_last(ops::to_channels_last(Tensor::randn({1, 3, 1, 1}, 3))));
  EXPECT_THROW(ops::to_channels_last(Tensor::randn({3, 4}, 4)), Error);
}

TEST(MemoryFormat, ElementwiseOpsKeepTheDenseLayoutOfTheirInputs) {
  for (DType t : {DType::F64, DType::F32, DType::BF16}) {
    Tensor a = testing::randn({2, 5, 3, 4}, 5, t), b = testing::randn({2, 5, 3, 4}, 6, t);
    Tensor acl = ops::to_channels_last(a), bcl = ops::to_channels_last(b);
    auto keeps = [&](const Tensor& got, const Tensor& want, const char* what) {
      EXPECT_TRUE(ops::is_channels_last(got)) << what;
      EXPECT_EQ(host(got), host(want)) << what;
    };
    keeps(ops::unary(ops::UnaryOp::Relu, acl), ops::unary(ops::UnaryOp::Relu, a), "relu");
    keeps(ops::binary(ops::BinaryOp::Add, acl, bcl), ops::binary(ops::BinaryOp::Add, a, b), "add");
    keeps(ops::binary(ops::BinaryOp::Mul, acl, 0.5), ops::binary(ops::BinaryOp::Mul, a, 0.5), "mul scalar");
    keeps(ops::clamp(acl, -0.5, 0.5), ops::clamp(a, -0.5, 0.5), "clamp");
    Tensor relu_a = ops::unary(ops::UnaryOp::Relu, a);
    keeps(ops::unary_backward(ops::UnaryOp::Relu, bcl, acl, ops::to_channels_last(relu_a)),
          ops::unary_backward(ops::UnaryOp::Relu, b, a, relu_a), "relu backward");
    const DType other = t == DType::F32 ? DType::F64 : DType::F32;
    keeps(ops::to(acl, acl.device(), other), ops::to(a, a.device(), other), "dtype conversion");
    // Mixed layouts still compute the right values (into a contiguous result).
    EXPECT_EQ(host(ops::binary(ops::BinaryOp::Sub, acl, b)), host(ops::binary(ops::BinaryOp::Sub, a, b)));
    // In place on a channels-last tensor.
    Tensor c = ops::to_channels_last(a);
    ops::binary_(ops::BinaryOp::Add, c, bcl);
    EXPECT_TRUE(ops::is_channels_last(c));
    EXPECT_EQ(host(c), host(ops::binary(ops::BinaryOp::Add, a, b)));
  }
}

// conv -> BN -> ReLU -> conv -> BN, plus the input (a ResNet basic block): values and every
// gradient agree whether the input is contiguous or channels-last.
TEST(MemoryFormat, ResidualBlockAgreesAcrossLayouts) {
  for (DType t : {DType::F64, DType::F32}) {
    auto run = [t](bool channels_last) {
      Tensor x = testing::randn({2, 4, 6, 6}, 10, t).requires_grad_();
      Tensor w1 = testing::randn({4, 4, 3, 3}, 11, t).requires_grad_();
      Tensor w2 = testing::randn({4, 4, 3, 3}, 12, t).requires_grad_();
      Tensor g = Tensor::ones({4}, t).requires_grad_(), b = Tensor::zeros({4}, t).requires_grad_();
      ops::Conv2dParams p;
      p.pad_h = p.pad_w = 1;
      Tensor in = channels_last ? to_channels_last(x) : x;
      Tensor h = relu(kiln::batch_norm(kiln::conv2d(in, w1, Tensor(), p), g, b, Tensor(), Tensor(), true));
      Tensor y = relu(add(kiln::batch_norm(kiln::conv2d(h, w2, Tensor(), p), g, b, Tensor(), Tensor(), true), in));
      Tensor loss = sum(mul(y, y));
      loss.backward();
      return std::vector<Tensor>{y, x.grad(), w1.grad(), w2.grad(), g.grad(), b.grad()};
    };
    std::vector<Tensor> nchw = run(false), nhwc = run(true);
    const char* names[] = {"output", "grad x", "grad w1", "grad w2", "grad gamma", "grad beta"};
    for (std::size_t i = 0; i < nchw.size(); ++i) {
      ASSERT_TRUE(nhwc[i].defined()) << names[i];
      expect_close(nhwc[i], host(nchw[i]), testing::tol(t) * 10, names[i]);
    }
    EXPECT_TRUE(nhwc[1].shape() == nchw[1].shape());
  }
}

}  // namespace memory_format_test
}  // namespace kiln
