// linear_cross_entropy: the float64 reference (mask, ignore_index), chunking that does not change
// the result, finite-difference gradients, the backward scaling by the incoming gradient, no
// gradient work without grad, CUDA vs CPU, and refused inputs.
#include "kiln/te/linear_cross_entropy.h"

#include <gtest/gtest.h>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/gradcheck.h"
#include "kiln/tensor/grad_mode.h"
#include "te_reference.h"
#include "te_test_util.h"

namespace kiln {
namespace linear_cross_entropy_test {

using te_test::randn;
using te_test::rel_error;

struct Problem {
  Tensor hidden, weight, labels, mask;
};

Problem problem(std::int64_t n, std::int64_t h, std::int64_t v, std::uint64_t seed, bool with_mask) {
  Problem p{randn({n, h}, seed), randn({v, h}, seed + 1, 0.5), Tensor(), Tensor()};
  std::vector<std::int64_t> labels(static_cast<std::size_t>(n));
  std::vector<double> mask(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    labels[static_cast<std::size_t>(i)] = (i * 7 + 3) % v;
    mask[static_cast<std::size_t>(i)] = i % 4 == 1 ? 0.0 : (i % 3 == 0 ? 0.5 : 1.0);
  }
  labels[2] = -100;  // PyTorch's ignore_index: masked whatever the mask says
  p.labels = Tensor::from_vector(labels, {n});
  if (with_mask) p.mask = Tensor::from_vector(mask, {n});
  return p;
}

TEST(LinearCrossEntropy, MatchesFloat64ReferenceWithAndWithoutMask) {
  for (bool with_mask : {false, true}) {
    const Problem p = problem(13, 6, 17, 1, with_mask);
    const Tensor loss = te::linear_cross_entropy(p.hidden, p.weight, p.labels, p.mask);
    EXPECT_EQ(loss.dim(), 0);
    EXPECT_EQ(loss.dtype(), DType::F64);
    const double want = te_reference::linear_cross_entropy(p.hidden, p.weight, p.labels, p.mask).item();
    EXPECT_NEAR(loss.item(), want, 1e-13 * std::abs(want));
    for (auto [t, tol] : {std::pair{DType::F32, 1e-5}, std::pair{DType::BF16, 2e-2}}) {
      const Tensor l = te::linear_cross_entropy(p.hidden.to(t), p.weight.to(t), p.labels, p.mask);
      EXPECT_EQ(l.dtype(), DType::F32);
      EXPECT_NEAR(l.item(), want, tol * std::abs(want)) << dtype_name(t);
    }
  }
}

TEST(LinearCrossEntropy, ChunkSizeDoesNotChangeLossOrGradients) {
  const Problem p = problem(10, 5, 9, 2, true);
  std::vector<std::vector<double>> seen;
  for (std::int64_t rows_per_chunk : {1, 3, 4, 10}) {
    te::LinearCrossEntropyOptions o;
    o.max_chunk_bytes = rows_per_chunk * 9 * 8;
    Tensor h = p.hidden.clone().requires_grad_(true), w = p.weight.clone().requires_grad_(true);
    Tensor loss = te::linear_cross_entropy(h, w, p.labels, p.mask, o);
    loss.backward();
    std::vector<double> all = {loss.item()};
    for (const Tensor& g : {h.grad(), w.grad()})
      for (double v : g.to_vector<double>()) all.push_back(v);
    seen.push_back(all);
  }
  for (std::size_t k = 1; k < seen.size(); ++k)
    for (std::size_t i = 0; i < seen[0].size(); ++i) EXPECT_NEAR(seen[k][i], seen[0][i], 1e-14) << k << " " << i;
}

TEST(LinearCrossEntropy, GradientsByFiniteDifferences) {
  const Problem p = problem(7, 4, 6, 3, true);
  te::LinearCrossEntropyOptions o;
  o.max_chunk_bytes = 2 * 6 * 8;  // chunks of two rows
  const auto result = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return te::linear_cross_entropy(in[0], in[1], p.labels, p.mask, o); },
      {p.hidden, p.weight});
  EXPECT_TRUE(result.ok) << result.message;
}

TEST(LinearCrossEntropy, BackwardScalesByTheIncomingGradient) {
  const Problem p = problem(5, 4, 6, 4, false);
  Tensor h1 = p.hidden.clone().requires_grad_(true), h2 = p.hidden.clone().requires_grad_(true);
  te::linear_cross_entropy(h1, p.weight, p.labels, Tensor()).backward();
  mul(te::linear_cross_entropy(h2, p.weight, p.labels, Tensor()), -2.5).backward();
  EXPECT_LT(rel_error(h2.grad(), mul(h1.grad(), -2.5)), 1e-15);
}

TEST(LinearCrossEntropy, WithoutGradNoGraph) {
  const Problem p = problem(5, 4, 6, 5, false);
  Tensor h = p.hidden.clone().requires_grad_(true);
  Tensor loss;
  {
    NoGradGuard no_grad;
    loss = te::linear_cross_entropy(h, p.weight, p.labels, Tensor());
  }
  EXPECT_FALSE(loss.requires_grad());
  EXPECT_NEAR(loss.item(), te_reference::linear_cross_entropy(p.hidden, p.weight, p.labels, Tensor()).item(), 1e-13);
}

TEST(LinearCrossEntropy, RefusesBadInput) {
  const Problem p = problem(4, 3, 5, 6, false);
  te_test::expect_error(
      [&] {
        te::linear_cross_entropy(p.hidden, p.weight, Tensor::from_vector(std::vector<std::int64_t>{0, 1, 5, 2}, {4}),
                                 Tensor());
      },
      {"linear_cross_entropy", "labels[2] is 5", "[0, 5)"});
  // A label out of range under a zero mask is not used, so it is not an error.
  EXPECT_NO_THROW(te::linear_cross_entropy(p.hidden, p.weight,
                                           Tensor::from_vector(std::vector<std::int64_t>{0, 1, 9, 2}, {4}),
                                           Tensor::from_vector(std::vector<double>{1, 1, 0, 1}, {4})));
  te_test::expect_error(
      [&] {
        te::linear_cross_entropy(p.hidden, p.weight, p.labels,
                                 Tensor::from_vector(std::vector<double>{0, 0, 0, 0}, {4}));
      },
      {"linear_cross_entropy", "selects no token"});
  te_test::expect_error(
      [&] {
        te::linear_cross_entropy(p.hidden, randn({5, 4}, 1), p.labels, Tensor());
      },
      {"linear_cross_entropy", "weight", "H = 3"});
  te_test::expect_error([&] { te::linear_cross_entropy(p.hidden, p.weight, p.labels.to(DType::F32), Tensor()); },
                        {"linear_cross_entropy", "labels", "int64"});
  te_test::expect_error(
      [&] {
        te::linear_cross_entropy(p.hidden, p.weight, p.labels,
                                 Tensor::from_vector(std::vector<double>{1, -1, 1, 1}, {4}));
      },
      {"linear_cross_entropy", "loss_mask[1]"});
}

// CUDA against the CPU with a realistic vocabulary, several chunks, bf16 and f32.
TEST(LinearCrossEntropyCuda, MatchesCpu) {
  KILN_TE_REQUIRE_CUDA(dev);
  const Problem p = problem(300, 64, 5000, 7, true);
  for (auto [t, tol] : {std::pair{DType::F32, te_test::f32_gemm_tolerance()}, std::pair{DType::BF16, 3e-2}}) {
    te::LinearCrossEntropyOptions o;
    o.max_chunk_bytes = 128 * 5000 * static_cast<std::int64_t>(dtype_size(t));  // three chunks
    std::vector<Tensor> got[2];
    for (int side = 0; side < 2; ++side) {
      const Device d = side == 0 ? Device::cpu() : dev;
      Tensor h = p.hidden.to(d, t).requires_grad_(true), w = p.weight.to(d, t).requires_grad_(true);
      Tensor loss = te::linear_cross_entropy(h, w, p.labels.to(d), p.mask.to(d), o);
      loss.backward();
      got[side] = {loss.to(Device::cpu()), h.grad().to(Device::cpu()), w.grad().to(Device::cpu())};
    }
    for (std::size_t k = 0; k < 3; ++k) EXPECT_LT(rel_error(got[1][k], got[0][k]), tol) << dtype_name(t) << " " << k;
  }
}

}  // namespace linear_cross_entropy_test
}  // namespace kiln
