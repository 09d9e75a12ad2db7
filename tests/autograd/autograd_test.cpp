#include <gtest/gtest.h>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/gradcheck.h"
#include "kiln/autograd/record.h"
#include "kiln/tensor/grad_mode.h"
#include "kiln/tensor/views.h"

namespace kiln {
namespace autograd_test {

using autograd::gradcheck;

Tensor rnd(Shape s, std::uint64_t seed) { return Tensor::randn(std::move(s), seed, DType::F64); }

TEST(Autograd, SimpleChainRule) {
  Tensor x = Tensor::from_vector<double>({1, 2, 3}).requires_grad_();
  Tensor y = sum(mul(x, x) * 3.0);
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{6, 12, 18}));
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = Tensor::from_vector<double>({1, 2}).requires_grad_();
  sum(x * 2.0).backward();
  sum(x * 2.0).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{4, 4}));
}

TEST(Autograd, SecondBackwardNeedsRetainGraph) {
  Tensor x = Tensor::from_vector<double>({1, 2}).requires_grad_();
  Tensor y = sum(x * x);
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{4, 8}));
  EXPECT_THROW(y.backward(), Error);
}

TEST(Autograd, NoGradScopeRecordsNothing) {
  Tensor x = Tensor::from_vector<double>({1, 2}).requires_grad_();
  NoGradGuard guard;
  Tensor y = x * 2.0;
  EXPECT_FALSE(y.requires_grad());
}

TEST(Autograd, InPlaceChangeOfSavedTensorIsDetected) {
  Tensor x = Tensor::from_vector<double>({1, 2}).requires_grad_();
  Tensor a = x * 1.0;
  Tensor y = sum(exp(a));
  {
    NoGradGuard g;
    a.mul_(2.0);
  }
  EXPECT_THROW(y.backward(), Error);
}

TEST(Autograd, RetainGradKeepsNonLeafGradients) {
  Tensor x = Tensor::from_vector<double>({1, 2}).requires_grad_();
  Tensor h = x * 3.0;
  h.retain_grad();
  sum(h * h).backward();
  EXPECT_EQ(h.grad().to_vector<double>(), (std::vector<double>{6, 12}));
}

TEST(Gradcheck, Elementwise) {
  auto unary = {+[](const Tensor& x) { return exp(x); },
                +[](const Tensor& x) { return tanh(x); },
                +[](const Tensor& x) { return sigmoid(x); },
                +[](const Tensor& x) { return gelu(x); },
                +[](const Tensor& x) { return gelu(x, true); },
                +[](const Tensor& x) { return silu(x); },
                +[](const Tensor& x) { return sin(x); },
                +[](const Tensor& x) { return square(x); },
                +[](const Tensor& x) { return leaky_relu(x, 0.1); },
                +[](const Tensor& x) { return clamp(x, -0.5, 0.5); }};
  int i = 0;
  for (auto fn : unary) {
    auto r = gradcheck([fn](const std::vector<Tensor>& in) { return fn(in[0]); }, {rnd({3, 4}, 10 + i)});
    EXPECT_TRUE(r.ok) << "unary #" << i << ": " << r.message;
    ++i;
  }
  Tensor pos = add(abs(rnd({3, 4}, 3)), 0.5);
  for (auto fn : {+[](const Tensor& x) { return log(x); }, +[](const Tensor& x) { return sqrt(x); },
                  +[](const Tensor& x) { return rsqrt(x); }, +[](const Tensor& x) { return pow(x, 2.5); }}) {
    auto r = gradcheck([fn](const std::vector<Tensor>& in) { return fn(in[0]); }, {pos.clone()});
    EXPECT_TRUE(r.ok) << r.message;
  }
}

TEST(Gradcheck, BroadcastingBinary) {
  for (auto fn : {+[](const Tensor&a, const Tensor&b) { return add(a, b); },
                  +[](const Tensor&a, const Tensor&b) { return sub(a, b); },
                  +[](const Tensor&a, const Tensor&b) { return mul(a, b); },
                  +[](const Tensor&a, const Tensor&b) { return div(a, add(abs(b), 1.0)); },
                  +[](const Tensor&a, const Tensor&b) { return maximum(a, b); }}) {
    auto r = gradcheck([fn](const std::vector<Tensor>& in) { return fn(in[0], in[1]); },
                       {rnd({2, 3, 4}, 1), rnd({3, 1}, 2)});
    EXPECT_TRUE(r.ok) << r.message;
  }
}

// Same shapes take add's and sub's no-broadcast path (a closure without captured shapes).
TEST(Gradcheck, SameShapeBinary) {
  for (auto fn : {+[](const Tensor&a, const Tensor&b) { return add(a, b); },
                  +[](const Tensor&a, const Tensor&b) { return sub(a, b); },
                  +[](const Tensor&a, const Tensor&b) { return mul(sub(a, b), add(a, a)); }}) {
    auto r = gradcheck([fn](const std::vector<Tensor>& in) { return fn(in[0], in[1]); },
                       {rnd({2, 3, 4}, 1), rnd({2, 3, 4}, 2)});
    EXPECT_TRUE(r.ok) << r.message;
  }
  Tensor a = Tensor::ones({3}, DType::F64).requires_grad_();
  Tensor b = Tensor::full({3}, 2.0, DType::F64).requires_grad_();
  sum(sub(add(a, b), b)).backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{0, 0, 0}));
}

TEST(Gradcheck, ReductionsAndViews) {
  auto check = [](auto fn, Tensor x) {
    auto r = gradcheck([fn](const std::vector<Tensor>& in) { return fn(in[0]); }, {x});
    EXPECT_TRUE(r.ok) << r.message;
  };
  check([](const Tensor& x) { return sum(x, {1}); }, rnd({3, 4, 2}, 5));
  check([](const Tensor& x) { return mean(x, {0, 2}, true); }, rnd({3, 4, 2}, 6));
  check([](const Tensor& x) { return amax(x, {1}); }, rnd({3, 4}, 7));
  check([](const Tensor& x) { return var(x, {1}); }, rnd({3, 4}, 8));
  check([](const Tensor& x) { return x.t().reshape({12}); }, rnd({3, 4}, 9));
  check([](const Tensor& x) { return x.slice(1, 1, 4, 2); }, rnd({3, 4}, 10));
  check([](const Tensor& x) { return x.select(0, 2); }, rnd({3, 4}, 11));
  check([](const Tensor& x) { return x.unsqueeze(1).expand({3, 5, 4}); }, rnd({3, 4}, 12));
  check([](const Tensor& x) { return x.permute({2, 0, 1}); }, rnd({2, 3, 4}, 13));
}

TEST(Gradcheck, MatmulAndLinear) {
  auto r =
      gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {rnd({3, 4}, 1), rnd({4, 5}, 2)});
  EXPECT_TRUE(r.ok) << r.message;
  r = gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
                {rnd({2, 3, 4}, 1), rnd({4, 5}, 2)});
  EXPECT_TRUE(r.ok) << r.message;
  r = gradcheck([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
                {rnd({2, 3, 4}, 3), rnd({5, 4}, 4), rnd({5}, 5)});
  EXPECT_TRUE(r.ok) << r.message;
}

// split_sizes is one node: every part's gradient lands in one buffer, a part that got none as zeros.
TEST(Gradcheck, SplitSizesWithAPartLeftUnused) {
  auto r = gradcheck(
      [](const std::vector<Tensor>& in) {
        std::vector<Tensor> p = split_sizes(in[0], {2, 1, 3}, 2);
        return add(sum(p[0], {2}) * 2.0, mul(sum(p[2], {2}), sum(p[2], {2})));
      },
      {rnd({2, 3, 6}, 21)});
  EXPECT_TRUE(r.ok) << r.message;
}

// When a kernel hands back the parts' gradients as views that tile one buffer (the attention
// backward writing dq, dk, dv into one packed dqkv), the whole's gradient is that buffer: no copy.
TEST(Autograd, SplitOfATiledGradientPassesTheBufferThrough) {
  Tensor leaf = rnd({2, 3, 6}, 22).requires_grad_();
  Tensor received;
  Tensor x = leaf * 1.0;
  {
    // An identity that keeps the gradient it receives (what split's backward hands up).
    Tensor y = x.detach();
    autograd::record("Keep", {x}, {&y}, [&received](const autograd::Grads& g) -> autograd::Grads {
      received = g[0];
      return {g[0]};
    });
    x = y;
  }
  std::vector<Tensor> parts = split_sizes(x, {2, 1, 3}, 2);
  Tensor packed = Tensor::randn({2, 3, 6}, 23, DType::F64);
  Tensor out = sum(parts[0].detach());
  autograd::record(
      "Packed", std::vector<Tensor>{parts[0], parts[1], parts[2]}, {&out},
      [packed](const autograd::Grads&) -> autograd::Grads {
        return {views::slice(packed, 2, 0, 2, 1), views::slice(packed, 2, 2, 3, 1), views::slice(packed, 2, 3, 6, 1)};
      });
  out.backward();
  ASSERT_TRUE(received.defined());
  EXPECT_EQ(received.storage(), packed.storage()) << "the packed buffer itself, not a copy";
  EXPECT_EQ(leaf.grad().to_vector<double>(), packed.to_vector<double>());
}

}  // namespace autograd_test
}  // namespace kiln
