// softmax / log_softmax, cross_entropy, mse_loss and dropout against plain-loop references.
#include "kiln/ops/softmax_loss.h"

#include <gtest/gtest.h>

#include "kiln/autograd/functions.h"
#include "test_util.h"

namespace kiln {
namespace softmax_loss_test {

using namespace kiln::testing;

// Softmax of x [a, b, c] along dim, computed with explicit index arithmetic.
std::vector<double> reference_softmax(const std::vector<double>& x, const Shape& s, int dim, bool log) {
  std::vector<double> y(x.size());
  const Strides st = contiguous_strides(s);
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::int64_t rem = static_cast<std::int64_t>(i), base = 0;
    for (int d = 0; d < 3; ++d) {
      const std::int64_t c = rem / st[d];
      rem %= st[d];
      if (d != dim) base += c * st[d];
    }
    double mx = -INFINITY, sum = 0;
    for (std::int64_t k = 0; k < s[dim]; ++k) mx = std::max(mx, x[base + k * st[dim]]);
    for (std::int64_t k = 0; k < s[dim]; ++k) sum += std::exp(x[base + k * st[dim]] - mx);
    y[i] = log ? x[i] - mx - std::log(sum) : std::exp(x[i] - mx) / sum;
  }
  return y;
}

TEST(Softmax, AnyDimMatchesReference) {
  const Shape s{3, 4, 5};
  for (DType dt : float_dtypes())
    for (int dim = 0; dim < 3; ++dim)
      for (bool log : {false, true}) {
        SCOPED_TRACE(fmt::format("{} dim {} log {}", dtype_name(dt), dim, log));
        Tensor x = randn(s, 20 + dim, dt);
        Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
        ASSERT_EQ(y.shape(), s);
        expect_close(y, reference_softmax(host(x), s, dim, log), tol(dt), "y");
      }
  // Large logits do not overflow.
  Tensor big = Tensor::from_vector<float>({1000.f, 1001.f, 1002.f});
  expect_close(softmax(big), reference_softmax({1000, 1001, 1002}, {1, 1, 3}, 2, false), 1e-6, "big");
}

struct CeRef {
  double loss;
  std::vector<double> grad;
};

CeRef reference_ce(const std::vector<double>& x, const std::vector<std::int64_t>& t, std::int64_t n, std::int64_t c,
                   std::int64_t ignore, double eps) {
  CeRef r{0, std::vector<double>(x.size(), 0.0)};
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < n; ++i) count += t[i] != ignore;
  for (std::int64_t i = 0; i < n; ++i) {
    if (t[i] == ignore) continue;
    double mx = -INFINITY, sum = 0;
    for (std::int64_t j = 0; j < c; ++j) mx = std::max(mx, x[i * c + j]);
    for (std::int64_t j = 0; j < c; ++j) sum += std::exp(x[i * c + j] - mx);
    const double lse = mx + std::log(sum);
    for (std::int64_t j = 0; j < c; ++j) {
      const double q = (j == t[i] ? 1.0 - eps : 0.0) + eps / c;
      r.loss += q * (lse - x[i * c + j]) / count;
      r.grad[i * c + j] = (std::exp(x[i * c + j] - lse) - q) / count;
    }
  }
  return r;
}

TEST(CrossEntropy, SmoothingAndIgnoreIndex) {
  const std::int64_t n = 6, c = 5;
  std::vector<std::int64_t> t{0, 4, -100, 2, 2, 1};
  for (DType dt : float_dtypes())
    for (double eps : {0.0, 0.1}) {
      SCOPED_TRACE(fmt::format("{} smoothing {}", dtype_name(dt), eps));
      Tensor x = randn({n, c}, 30, dt).requires_grad_();
      Tensor loss = cross_entropy(x, Tensor::from_vector(t), -100, eps);
      EXPECT_EQ(loss.dim(), 0);
      EXPECT_EQ(loss.dtype(), dt);
      CeRef r = reference_ce(host(x), t, n, c, -100, eps);
      expect_close(loss, {r.loss}, tol(dt), "loss");
      loss.backward();
      // The saved log-sum-exp is f32 (the kernel contract), which bounds f64 gradients to ~1e-7.
      expect_close(x.grad(), r.grad, std::max(tol(dt), 1e-6), "grad");
    }
}

TEST(CrossEntropy, SpatialInputAndCustomIgnore) {
  // [N, C, L] logits: the class dimension is 1.
  Tensor x = randn({2, 3, 4}, 31, DType::F64);
  std::vector<std::int64_t> t{0, 1, 2, 7, 2, 2, 1, 0};
  Tensor loss = cross_entropy(x, Tensor::from_vector(t, {2, 4}), 7, 0.0);
  auto xv = host(x.permute({0, 2, 1}).contiguous());
  expect_close(loss, {reference_ce(xv, t, 8, 3, 7, 0.0).loss}, 1e-12, "loss");
  EXPECT_THROW((void)cross_entropy(randn({2, 3}, 1, DType::F32), Tensor::from_vector<std::int64_t>({0, 3})), Error);
  EXPECT_THROW((void)cross_entropy(randn({2, 3}, 1, DType::F32), Tensor::from_vector<float>({0, 1})), Error);
}

TEST(MseLoss, MeanSquaredError) {
  Tensor a = randn({3, 4}, 40, DType::F64), b = randn({3, 4}, 41, DType::F64);
  auto av = host(a), bv = host(b);
  double s = 0;
  for (std::size_t i = 0; i < av.size(); ++i) s += (av[i] - bv[i]) * (av[i] - bv[i]);
  expect_close(mse_loss(a, b), {s / 12}, 1e-12, "mse");
  EXPECT_THROW((void)mse_loss(a, randn({4, 3}, 1, DType::F64)), Error);
}

TEST(Dropout, MaskIsDeterministicAndScaled) {
  Tensor x = Tensor::ones({10000}, DType::F32);
  const double p = 0.3;
  Tensor y = dropout(x, p, true, 1234, 0);
  auto v = y.to_vector<float>();
  std::int64_t kept = 0;
  for (float e : v) {
    ASSERT_TRUE(e == 0.0f || std::abs(e - 1.0f / 0.7f) < 1e-6f) << e;
    kept += e != 0.0f;
  }
  EXPECT_NEAR(static_cast<double>(kept) / 10000.0, 0.7, 0.03);
  EXPECT_EQ(dropout(x, p, true, 1234, 0).to_vector<float>(), v);      // same seed and offset: same mask
  EXPECT_NE(dropout(x, p, true, 1234, 10000).to_vector<float>(), v);  // another offset: another mask
  EXPECT_TRUE(dropout(x, p, false, 1234).is_same(x));                 // eval: identity
  EXPECT_TRUE(dropout(x, 0.0, true, 1234).is_same(x));
  EXPECT_EQ(sum(dropout(x, 1.0, true, 1)).item(), 0.0);
  // The gradient uses the same mask.
  Tensor xg = Tensor::ones({100}, DType::F64).requires_grad_();
  Tensor yg = dropout(xg, 0.5, true, 7);
  sum(yg).backward();
  EXPECT_EQ(xg.grad().to_vector<double>(), yg.to_vector<double>());
}

}  // namespace softmax_loss_test
}  // namespace kiln
