// batch_norm / layer_norm / rms_norm against plain-loop references.
#include "kiln/ops/norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kiln/autograd/functions.h"
#include "test_util.h"

namespace kiln {
namespace norm_test {

using namespace kiln::testing;

TEST(BatchNorm, TrainingUsesBatchStatsAndUpdatesRunningStats) {
  const std::int64_t n = 4, c = 3, hw = 5;
  for (DType dt : float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = randn({n, c, 1, hw}, 50, dt);
    Tensor w = randn({c}, 51, dt), b = randn({c}, 52, dt);
    Tensor rm = Tensor::from_vector<float>({0.5f, -1.0f, 0.0f}), rv = Tensor::from_vector<float>({1.0f, 2.0f, 0.5f});
    auto rm0 = host(rm), rv0 = host(rv);
    Tensor y = batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5);
    auto xv = host(x), wv = host(w), bv = host(b);
    std::vector<double> ref(xv.size());
    for (std::int64_t ch = 0; ch < c; ++ch) {
      double s = 0, sq = 0;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < hw; ++j) s += xv[(i * c + ch) * hw + j];
      const double m = s / (n * hw);
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < hw; ++j) sq += std::pow(xv[(i * c + ch) * hw + j] - m, 2);
      const double var = sq / (n * hw);
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < hw; ++j) {
          const std::int64_t k = (i * c + ch) * hw + j;
          ref[k] = (xv[k] - m) / std::sqrt(var + 1e-5) * wv[ch] + bv[ch];
        }
      EXPECT_NEAR(host(rm)[ch], 0.9 * rm0[ch] + 0.1 * m, 1e-5);
      EXPECT_NEAR(host(rv)[ch], 0.9 * rv0[ch] + 0.1 * var * (n * hw) / (n * hw - 1), 1e-5);
    }
    expect_close(y, ref, dt == DType::BF16 ? 3e-2 : tol(dt) * 10, "y");
  }
}

// An f64 normalisation keeps its statistics in f64 (they were f32, which made f64 layer norm and
// its gradients agree with an f64 reference only to about 1e-7).
TEST(Norms, F64StatisticsAreF64) {
  Tensor x = randn({6, 40}, 71, DType::F64);
  auto ln = ops::layer_norm(x, Tensor(), Tensor(), 1e-5);
  auto rms = ops::rms_norm(x, Tensor(), 1e-5);
  auto bn = ops::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5);
  for (const Tensor* t : {&ln.mean, &ln.rstd, &rms.rstd, &bn.save_mean, &bn.save_invstd})
    EXPECT_EQ(t->dtype(), DType::F64) << t->describe();
  auto xv = x.to_vector<double>();
  auto rstd = ln.rstd.to_vector<double>();
  for (int r = 0; r < 6; ++r) {
    double m = 0, q = 0;
    for (int i = 0; i < 40; ++i) m += xv[r * 40 + i] / 40;
    for (int i = 0; i < 40; ++i) q += (xv[r * 40 + i] - m) * (xv[r * 40 + i] - m) / 40;
    EXPECT_NEAR(rstd[r], 1 / std::sqrt(q + 1e-5), 1e-13) << "row " << r;
  }
  EXPECT_EQ(ops::layer_norm(randn({2, 8}, 72, DType::F32), Tensor(), Tensor(), 1e-5).rstd.dtype(), DType::F32);
}

TEST(BatchNorm, EvalUsesRunningStats2D) {
  Tensor x = randn({5, 3}, 53, DType::F64);
  Tensor rm = Tensor::from_vector<double>({0.5, -1.0, 0.0}), rv = Tensor::from_vector<double>({1.0, 2.0, 0.5});
  Tensor y = batch_norm(x, Tensor(), Tensor(), rm, rv, false, 0.1, 1e-5);
  auto xv = host(x);
  std::vector<double> ref(xv.size());
  const double m[3] = {0.5, -1.0, 0.0}, v[3] = {1.0, 2.0, 0.5};
  for (int i = 0; i < 5; ++i)
    for (int ch = 0; ch < 3; ++ch) ref[i * 3 + ch] = (xv[i * 3 + ch] - m[ch]) / std::sqrt(v[ch] + 1e-5);
  expect_close(y, ref, 1e-12, "y");
  EXPECT_EQ(host(rm), (std::vector<double>{0.5, -1.0, 0.0}));  // untouched in eval
  EXPECT_THROW((void)batch_norm(randn({1, 3}, 1, DType::F64), Tensor(), Tensor(), rm, rv, true), Error);
}

// Mixed precision (autocast): bf16 activations with f32 weight, bias and running statistics. The
// result is bf16, the parameter gradients f32, and everything matches the all-f32 computation on
// the same (bf16-representable) values.
TEST(BatchNorm, Bf16InputWithF32ParametersMatchesF32) {
  const std::int64_t n = 4, c = 3, hw = 6;
  for (bool training : {true, false}) {
    SCOPED_TRACE(training ? "training" : "eval");
    Tensor x16 = randn({n, c, 2, hw / 2}, 60, DType::BF16), gy16 = randn({n, c, 2, hw / 2}, 61, DType::BF16);
    Tensor x32 = x16.to(DType::F32), gy32 = gy16.to(DType::F32);
    Tensor w0 = randn({c}, 62, DType::F32), b0 = randn({c}, 63, DType::F32);
    Tensor rm16 = Tensor::from_vector<float>({0.5f, -1.0f, 0.0f}),
           rv16 = Tensor::from_vector<float>({1.0f, 2.0f, 0.5f});
    Tensor rm32 = rm16.clone(), rv32 = rv16.clone();
    Tensor w16 = w0.clone().requires_grad_(), b16 = b0.clone().requires_grad_();
    Tensor w32 = w0.clone().requires_grad_(), b32 = b0.clone().requires_grad_();
    x16.requires_grad_();
    x32.requires_grad_();
    Tensor y16 = batch_norm(x16, w16, b16, rm16, rv16, training, 0.1, 1e-5);
    Tensor y32 = batch_norm(x32, w32, b32, rm32, rv32, training, 0.1, 1e-5);
    EXPECT_EQ(y16.dtype(), DType::BF16);
    expect_close(y16, host(y32), 2e-2, "y");
    expect_close(rm16, host(rm32), 1e-5, "running_mean");
    expect_close(rv16, host(rv32), 1e-5, "running_var");
    sum(y16 * gy16).backward();
    sum(y32 * gy32).backward();
    ASSERT_TRUE(w16.grad().defined() && b16.grad().defined() && x16.grad().defined());
    EXPECT_EQ(w16.grad().dtype(), DType::F32);
    EXPECT_EQ(b16.grad().dtype(), DType::F32);
    EXPECT_EQ(x16.grad().dtype(), DType::BF16);
    expect_close(w16.grad(), host(w32.grad()), 2e-2, "grad_w");
    expect_close(b16.grad(), host(b32.grad()), 2e-2, "grad_b");
    expect_close(x16.grad(), host(x32.grad()), 3e-2, "grad_x");
  }
  // Other mixes stay errors: an f64 weight with a bf16 input, an f32 weight with an f64 input.
  EXPECT_THROW(
      (void)batch_norm(randn({2, 3}, 1, DType::BF16), randn({3}, 2, DType::F64), Tensor(), Tensor(), Tensor(), true),
      Error);
  EXPECT_THROW(
      (void)batch_norm(randn({2, 3}, 1, DType::F64), randn({3}, 2, DType::F32), Tensor(), Tensor(), Tensor(), true),
      Error);
}

// batch_norm_act fuses the shortcut's add and the ReLU into the normalisation: at float64 it is the
// composed ops to rounding, forward and backward (running statistics, input, parameter and residual
// gradients), with and without each part; bf16 stays within a bf16 rounding of the f32 result.
TEST(BatchNormAct, MatchesTheComposedOpsForwardAndBackward) {
  const Shape shape{4, 3, 5, 2};
  for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
    for (bool residual : {false, true}) {
      for (bool relu : {false, true}) {
        if (!residual && !relu) continue;
        SCOPED_TRACE(std::string(dtype_name(dt)) + (residual ? " residual" : "") + (relu ? " relu" : ""));
        const DType ref_dt = dt == DType::F64 ? DType::F64 : DType::F32;
        Tensor x0 = randn(shape, 70, DType::F64), r0 = randn(shape, 71, DType::F64), gy0 = randn(shape, 72, DType::F64);
        Tensor w0 = randn({3}, 73, ref_dt), b0 = randn({3}, 74, ref_dt);
        auto leaf = [](const Tensor& t, DType d) { return t.to(d).requires_grad_(); };
        // Fused, at dt.
        Tensor xf = leaf(x0, dt), rf = leaf(r0, dt), wf = leaf(w0, ref_dt), bf = leaf(b0, ref_dt);
        Tensor rmf = Tensor::zeros({3}, DType::F32), rvf = Tensor::ones({3}, DType::F32);
        Tensor yf = batch_norm_act(xf, wf, bf, rmf, rvf, true, 0.1, 1e-5, residual ? rf : Tensor(), relu);
        // Composed, at the reference precision (f64 for f64, f32 otherwise).
        Tensor xc = leaf(x0.to(dt), ref_dt), rc = leaf(r0.to(dt), ref_dt), wc = leaf(w0, ref_dt), bc = leaf(b0, ref_dt);
        Tensor rmc = Tensor::zeros({3}, DType::F32), rvc = Tensor::ones({3}, DType::F32);
        Tensor yc = batch_norm(xc, wc, bc, rmc, rvc, true, 0.1, 1e-5);
        if (residual) yc = add(yc, rc);
        if (relu) yc = kiln::relu(yc);
        EXPECT_EQ(yf.dtype(), dt);
        const double tol = dt == DType::F64 ? 1e-12 : dt == DType::F32 ? 1e-5 : 2e-2;
        expect_close(yf, host(yc), tol, "y");
        expect_close(rmf, host(rmc), 1e-6, "running_mean");
        expect_close(rvf, host(rvc), 1e-6, "running_var");
        sum(yf * gy0.to(dt)).backward();
        sum(yc * gy0.to(dt).to(ref_dt)).backward();
        expect_close(xf.grad(), host(xc.grad()), dt == DType::BF16 ? 5e-2 : tol * 10, "grad_x");
        expect_close(wf.grad(), host(wc.grad()), dt == DType::BF16 ? 5e-2 : tol * 10, "grad_w");
        expect_close(bf.grad(), host(bc.grad()), dt == DType::BF16 ? 5e-2 : tol * 10, "grad_b");
        if (residual) expect_close(rf.grad(), host(rc.grad()), dt == DType::BF16 ? 1e-2 : tol, "grad_residual");
        if (!residual) {
          EXPECT_FALSE(rf.grad().defined());
        }
      }
    }
  }
}

// The fused ReLU keeps NaN (a diverged run must not turn into finite activations), and the
// backward's mask is the output's sign: no gradient where the ReLU clipped.
TEST(BatchNormAct, ReluKeepsNanAndMasksTheGradient) {
  Tensor x = Tensor::from_vector<double>({1, 2, 3, 4, -1, -2, 0.5, 7}, {4, 2});
  Tensor rm = Tensor::zeros({2}, DType::F64), rv = Tensor::ones({2}, DType::F64);
  Tensor residual = Tensor::from_vector<double>({0, 0, std::nan(""), 0, 0, 0, 0, 0}, {4, 2});
  Tensor y = batch_norm_act(x, Tensor(), Tensor(), rm, rv, true, 0.1, 1e-5, residual, true);
  auto yv = host(y);
  EXPECT_TRUE(std::isnan(yv[2])) << "NaN in the residual must reach the output";
  for (std::size_t i = 0; i < yv.size(); ++i)
    if (i != 2) {
      EXPECT_GE(yv[i], 0.0) << i;
    }
  Tensor xg = x.clone().requires_grad_(), rg = Tensor::zeros({4, 2}, DType::F64).requires_grad_();
  Tensor y2 = batch_norm_act(xg, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5, rg, true);
  sum(y2).backward();
  auto y2v = host(y2), grv = host(rg.grad());
  for (std::size_t i = 0; i < y2v.size(); ++i) EXPECT_EQ(grv[i], y2v[i] > 0 ? 1.0 : 0.0) << i;
}

// Bad input names what is wrong.
TEST(BatchNormAct, RejectsAResidualOfAnotherShapeOrDtype) {
  Tensor x = randn({4, 3, 2, 2}, 80, DType::F32);
  EXPECT_THROW((void)batch_norm_act(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5,
                                    randn({4, 3, 2, 1}, 81, DType::F32), true),
               Error);
  EXPECT_THROW((void)batch_norm_act(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5,
                                    randn({4, 3, 2, 2}, 81, DType::F64), false),
               Error);
}

TEST(LayerNorm, NormalisesLastDimension) {
  const std::int64_t rows = 6, d = 7;
  for (DType dt : float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = randn({2, 3, d}, 54, dt), w = randn({d}, 55, dt), b = randn({d}, 56, dt);
    auto xv = host(x), wv = host(w), bv = host(b);
    std::vector<double> ln(xv.size()), rms(xv.size());
    for (std::int64_t r = 0; r < rows; ++r) {
      double s = 0, sq = 0, ss = 0;
      for (std::int64_t i = 0; i < d; ++i) s += xv[r * d + i];
      const double m = s / d;
      for (std::int64_t i = 0; i < d; ++i) {
        sq += std::pow(xv[r * d + i] - m, 2);
        ss += xv[r * d + i] * xv[r * d + i];
      }
      for (std::int64_t i = 0; i < d; ++i) {
        ln[r * d + i] = (xv[r * d + i] - m) / std::sqrt(sq / d + 1e-5) * wv[i] + bv[i];
        rms[r * d + i] = xv[r * d + i] / std::sqrt(ss / d + 1e-6) * wv[i];
      }
    }
    const double t = dt == DType::BF16 ? 3e-2 : tol(dt) * 10;
    expect_close(layer_norm(x, w, b), ln, t, "layer_norm");
    expect_close(rms_norm(x, w), rms, t, "rms_norm");
  }
  EXPECT_THROW((void)layer_norm(randn({2, 3}, 1, DType::F32), randn({4}, 2, DType::F32), Tensor()), Error);
}

}  // namespace norm_test
}  // namespace kiln
