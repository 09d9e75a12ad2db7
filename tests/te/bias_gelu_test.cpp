// linear_bias_gelu: float64 reference, finite-difference gradients (with and without bias), the
// CPU at f32/bf16, CUDA (the cuBLASLt epilogue and its fallback) vs CPU, bad input.
#include "kiln/te/bias_gelu.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/gradcheck.h"
#include "kiln/autograd/weight_grad_store.h"
#include "kiln/te/gelu_mlp.h"
#include "te_reference.h"
#include "te_test_util.h"

namespace kiln {
namespace bias_gelu_test {

using te_test::randn;
using te_test::rel_error;

TEST(LinearBiasGelu, MatchesFloat64Reference) {
  const Tensor x = randn({2, 3, 10}, 1), w = randn({12, 10}, 2, 0.5), b = randn({12}, 3, 0.5);
  const Tensor y = te::linear_bias_gelu(x, w, b);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 12}));
  EXPECT_LT(rel_error(y, te_reference::linear_bias_gelu(x, w, b)), 1e-14);
  EXPECT_LT(rel_error(te::linear_bias_gelu(x, w, Tensor()), te_reference::linear_bias_gelu(x, w, Tensor())), 1e-14);
  for (auto [t, tol] : {std::pair{DType::F32, 1e-5}, std::pair{DType::BF16, 3e-2}})
    EXPECT_LT(rel_error(te::linear_bias_gelu(x.to(t), w.to(t), b.to(t)),
                        te_reference::linear_bias_gelu(x.to(t), w.to(t), b.to(t))),
              tol)
        << dtype_name(t);
}

TEST(LinearBiasGelu, GradientsByFiniteDifferences) {
  auto with_bias =
      autograd::gradcheck([](const std::vector<Tensor>& in) { return te::linear_bias_gelu(in[0], in[1], in[2]); },
                          {randn({5, 4}, 4), randn({6, 4}, 5, 0.7), randn({6}, 6, 0.5)});
  EXPECT_TRUE(with_bias.ok) << with_bias.message;
  auto without =
      autograd::gradcheck([](const std::vector<Tensor>& in) { return te::linear_bias_gelu(in[0], in[1], Tensor()); },
                          {randn({3, 2, 4}, 7), randn({5, 4}, 8, 0.7)});
  EXPECT_TRUE(without.ok) << without.message;
}

TEST(LinearBiasGelu, RefusesBadInput) {
  te_test::expect_error(
      [] {
        te::linear_bias_gelu(randn({2, 4}, 1), randn({3, 5}, 2), Tensor());
      },
      {"linear_bias_gelu", "w", "K = 4"});
  te_test::expect_error(
      [] {
        te::linear_bias_gelu(randn({2, 4}, 1), randn({3, 4}, 2), randn({4}, 3));
      },
      {"linear_bias_gelu", "b", "[3]"});
  te_test::expect_error(
      [] {
        te::linear_bias_gelu(randn({2, 4}, 1), randn({3, 4}, 2).to(DType::F32), Tensor());
      },
      {"linear_bias_gelu", "dtype"});
}

// Width 64: the cuBLASLt GELU_AUX_BIAS epilogue; width 30: the fallback (aux ld not a multiple of 8).
TEST(LinearBiasGeluCuda, MatchesCpu) {
  KILN_TE_REQUIRE_CUDA(dev);
  for (std::int64_t o : {64, 30}) {
    for (bool bias : {true, false}) {
      for (auto [t, tol] : {std::pair{DType::F32, te_test::f32_gemm_tolerance()}, std::pair{DType::BF16, 3e-2}}) {
        const Tensor x = randn({100, 48}, 9).to(t), w = randn({o, 48}, 10, 0.2).to(t), b = randn({o}, 11, 0.5).to(t),
                     g = randn({100, o}, 12).to(t);
        std::vector<Tensor> got[2];
        for (int side = 0; side < 2; ++side) {
          const Device d = side == 0 ? Device::cpu() : dev;
          // detach(): on the CPU side to() hands back x itself, and requires_grad_ on it would make the
          // CUDA side's copy a non-leaf (whose .grad() stays empty).
          Tensor xd = x.to(d).detach().requires_grad_(true), wd = w.to(d).detach().requires_grad_(true),
                 bd = b.to(d).detach().requires_grad_(true);
          Tensor y = te::linear_bias_gelu(xd, wd, bias ? bd : Tensor());
          sum(mul(y, g.to(d))).backward();
          const std::string where = fmt::format("on {}: O {} bias {} {}", d.str(), o, bias, dtype_name(t));
          ASSERT_TRUE(y.requires_grad()) << "y is not part of the graph " << where;
          ASSERT_TRUE(xd.grad().defined()) << "x's gradient is missing " << where;
          ASSERT_TRUE(wd.grad().defined()) << "w's gradient is missing " << where;
          ASSERT_TRUE(!bias || bd.grad().defined()) << "b's gradient is missing " << where;
          got[side] = {y.to(Device::cpu()), xd.grad().to(Device::cpu()), wd.grad().to(Device::cpu())};
          if (bias) got[side].push_back(bd.grad().to(Device::cpu()));
        }
        for (std::size_t k = 0; k < got[0].size(); ++k)
          EXPECT_LT(rel_error(got[1][k], got[0][k]), tol)
              << "O " << o << " bias " << bias << " " << dtype_name(t) << " value " << k;
      }
    }
  }
}

TEST(LinearGeluLinear, MatchesFloat64ReferenceAndFiniteDifferences) {
  const Tensor x = randn({2, 3, 6}, 20), w1 = randn({8, 6}, 21, 0.5), b1 = randn({8}, 22, 0.5),
               w2 = randn({5, 8}, 23, 0.5), b2 = randn({5}, 24, 0.5);
  EXPECT_LT(rel_error(te::linear_gelu_linear(x, w1, b1, w2, b2), te_reference::linear_gelu_linear(x, w1, b1, w2, b2)),
            1e-14);
  EXPECT_LT(rel_error(te::linear_gelu_linear(x, w1, Tensor(), w2, Tensor()),
                      te_reference::linear_gelu_linear(x, w1, Tensor(), w2, Tensor())),
            1e-14);
  for (auto [t, tol] : {std::pair{DType::F32, 1e-5}, std::pair{DType::BF16, 3e-2}})
    EXPECT_LT(rel_error(te::linear_gelu_linear(x.to(t), w1.to(t), b1.to(t), w2.to(t), b2.to(t)),
                        te_reference::linear_gelu_linear(x.to(t), w1.to(t), b1.to(t), w2.to(t), b2.to(t))),
              tol)
        << dtype_name(t);
  const auto result = autograd::gradcheck(
      [](const std::vector<Tensor>& in) { return te::linear_gelu_linear(in[0], in[1], in[2], in[3], in[4]); },
      {randn({4, 3}, 25), randn({6, 3}, 26, 0.7), randn({6}, 27, 0.5), randn({2, 6}, 28, 0.7), randn({2}, 29, 0.5)});
  EXPECT_TRUE(result.ok) << result.message;
}

// Zero-bubble pipelines' weight-gradient store (autograd/weight_grad_store.h): with a store active,
// the input and fc1-bias gradients come at once, fc1's and fc2's weight and fc2's bias gradients at
// the flush, bit for bit those of the plain backward.
TEST(LinearGeluLinear, WeightGradientsDeferIntoAStoreBitForBit) {
  auto make = [](std::uint64_t seed) {
    return std::vector<Tensor>{randn({8, 6}, seed, 0.5).requires_grad_(), randn({8}, seed + 1, 0.5).requires_grad_(),
                               randn({5, 8}, seed + 2, 0.5).requires_grad_(),
                               randn({5}, seed + 3, 0.5).requires_grad_()};
  };
  const std::vector<Tensor> plain = make(30), split = make(30);
  const Tensor x0 = randn({2, 3, 6}, 34), weights = randn({2, 3, 5}, 35);
  Tensor xp = x0.detach().requires_grad_(), xs = x0.detach().requires_grad_();
  sum(te::linear_gelu_linear(xp, plain[0], plain[1], plain[2], plain[3]) * weights).backward();
  autograd::WeightGradStore store;
  {
    autograd::WeightGradStoreScope defer(&store);
    sum(te::linear_gelu_linear(xs, split[0], split[1], split[2], split[3]) * weights).backward();
  }
  EXPECT_EQ(store.size(), 1u);
  EXPECT_EQ(xs.grad().to_vector<double>(), xp.grad().to_vector<double>());
  EXPECT_EQ(split[1].grad().to_vector<double>(), plain[1].grad().to_vector<double>()) << "b1: in the backward";
  for (std::size_t i : {0u, 2u, 3u}) EXPECT_FALSE(split[i].grad().defined()) << i;
  store.flush();
  for (std::size_t i = 0; i < 4; ++i)
    EXPECT_EQ(split[i].grad().to_vector<double>(), plain[i].grad().to_vector<double>()) << i;
}

TEST(LinearGeluLinear, RefusesBadInput) {
  te_test::expect_error(
      [] {
        te::linear_gelu_linear(randn({2, 4}, 1), randn({6, 4}, 2), Tensor(), randn({3, 5}, 3), Tensor());
      },
      {"linear_gelu_linear", "w2", "[out, 6]"});
  te_test::expect_error(
      [] {
        te::linear_gelu_linear(randn({2, 4}, 1), randn({6, 4}, 2), randn({5}, 3), randn({3, 6}, 4), Tensor());
      },
      {"linear_gelu_linear", "b1", "[6]"});
}

// F = 64: the GELU_AUX_BIAS and DGELU_BGRAD epilogues; F = 30: their fallbacks.
TEST(LinearGeluLinearCuda, MatchesCpu) {
  KILN_TE_REQUIRE_CUDA(dev);
  for (std::int64_t f : {64, 30}) {
    for (bool bias : {true, false}) {
      for (auto [t, tol] : {std::pair{DType::F32, te_test::f32_gemm_tolerance()}, std::pair{DType::BF16, 3e-2}}) {
        const std::vector<Tensor> host = {randn({100, 48}, 30).to(t), randn({f, 48}, 31, 0.2).to(t),
                                          randn({f}, 32, 0.5).to(t), randn({24, f}, 33, 0.2).to(t),
                                          randn({24}, 34, 0.5).to(t)};
        const Tensor g = randn({100, 24}, 35).to(t);
        std::vector<Tensor> got[2];
        for (int side = 0; side < 2; ++side) {
          const Device d = side == 0 ? Device::cpu() : dev;
          std::vector<Tensor> in;
          for (const Tensor& v : host) in.push_back(v.to(d).detach().requires_grad_(true));
          Tensor y = te::linear_gelu_linear(in[0], in[1], bias ? in[2] : Tensor(), in[3], bias ? in[4] : Tensor());
          sum(mul(y, g.to(d))).backward();
          got[side] = {y.to(Device::cpu())};
          for (int i : {0, 1, 3}) got[side].push_back(in[static_cast<std::size_t>(i)].grad().to(Device::cpu()));
          if (bias)
            for (int i : {2, 4}) got[side].push_back(in[static_cast<std::size_t>(i)].grad().to(Device::cpu()));
        }
        for (std::size_t k = 0; k < got[0].size(); ++k)
          EXPECT_LT(rel_error(got[1][k], got[0][k]), tol)
              << "F " << f << " bias " << bias << " " << dtype_name(t) << " value " << k;
      }
    }
  }
}

}  // namespace bias_gelu_test
}  // namespace kiln
