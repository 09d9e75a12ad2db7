// conv2d / pooling forward and backward against plain-loop float64 references.
#include "kiln/ops/conv_pool.h"

#include <gtest/gtest.h>

#include "kiln/autograd/functions.h"
#include "test_util.h"

namespace kiln {
namespace conv_pool_test {

using namespace kiln::testing;

struct ConvCase {
  std::int64_t n, c, h, w, oc, kh, kw;
  ops::Conv2dParams p;
  bool bias;
};

struct ConvRef {
  std::vector<double> y, gx, gw, gb;
  std::int64_t oh, ow;
};

// Direct convolution and its gradients for grad_y = gy (all float64).
ConvRef reference_conv(const ConvCase& k, const std::vector<double>& x, const std::vector<double>& w,
                       const std::vector<double>& b, const std::vector<double>* gy) {
  const auto& p = k.p;
  ConvRef r;
  r.oh = (k.h + 2 * p.pad_h - p.dilation_h * (k.kh - 1) - 1) / p.stride_h + 1;
  r.ow = (k.w + 2 * p.pad_w - p.dilation_w * (k.kw - 1) - 1) / p.stride_w + 1;
  const std::int64_t cg = k.c / p.groups, ocg = k.oc / p.groups;
  r.y.assign(k.n * k.oc * r.oh * r.ow, 0.0);
  r.gx.assign(x.size(), 0.0);
  r.gw.assign(w.size(), 0.0);
  r.gb.assign(k.oc, 0.0);
  for (std::int64_t n = 0; n < k.n; ++n)
    for (std::int64_t o = 0; o < k.oc; ++o)
      for (std::int64_t oy = 0; oy < r.oh; ++oy)
        for (std::int64_t ox = 0; ox < r.ow; ++ox) {
          const std::int64_t yi = ((n * k.oc + o) * r.oh + oy) * r.ow + ox;
          double acc = k.bias ? b[o] : 0.0;
          const double g = gy ? (*gy)[yi] : 0.0;
          r.gb[o] += g;
          const std::int64_t grp = o / ocg;
          for (std::int64_t ci = 0; ci < cg; ++ci)
            for (std::int64_t i = 0; i < k.kh; ++i)
              for (std::int64_t j = 0; j < k.kw; ++j) {
                const std::int64_t iy = oy * p.stride_h - p.pad_h + i * p.dilation_h;
                const std::int64_t ix = ox * p.stride_w - p.pad_w + j * p.dilation_w;
                if (iy < 0 || iy >= k.h || ix < 0 || ix >= k.w) continue;
                const std::int64_t c = grp * cg + ci;
                const std::int64_t xi = ((n * k.c + c) * k.h + iy) * k.w + ix;
                const std::int64_t wi = ((o * cg + ci) * k.kh + i) * k.kw + j;
                acc += x[xi] * w[wi];
                r.gx[xi] += g * w[wi];
                r.gw[wi] += g * x[xi];
              }
          r.y[yi] = acc;
        }
  return r;
}

std::vector<ConvCase> conv_cases() {
  std::vector<ConvCase> cases;
  cases.push_back({2, 3, 7, 6, 4, 3, 3, {}, true});
  ops::Conv2dParams strided;
  strided.stride_h = 2;
  strided.stride_w = 3;
  strided.pad_h = 1;
  strided.pad_w = 2;
  cases.push_back({2, 3, 9, 8, 5, 3, 2, strided, true});
  ops::Conv2dParams dilated;
  dilated.dilation_h = 2;
  dilated.dilation_w = 3;
  dilated.pad_h = 2;
  dilated.pad_w = 1;
  cases.push_back({1, 2, 8, 9, 3, 3, 3, dilated, false});
  ops::Conv2dParams grouped;
  grouped.groups = 2;
  grouped.pad_h = grouped.pad_w = 1;
  cases.push_back({3, 4, 5, 5, 6, 3, 3, grouped, true});
  ops::Conv2dParams depthwise;
  depthwise.groups = 4;
  depthwise.stride_h = depthwise.stride_w = 2;
  cases.push_back({2, 4, 6, 6, 4, 1, 1, depthwise, true});
  return cases;
}

TEST(Conv2d, ForwardAndBackwardMatchReference) {
  int idx = 0;
  for (const auto& k : conv_cases()) {
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(fmt::format("case {} dtype {}", idx, dtype_name(dt)));
      Tensor x = randn({k.n, k.c, k.h, k.w}, 1 + idx, dt);
      Tensor w = randn({k.oc, k.c / k.p.groups, k.kh, k.kw}, 2 + idx, dt);
      Tensor b = k.bias ? randn({k.oc}, 3 + idx, dt) : Tensor();
      Tensor y = ops::conv2d(x, w, b, k.p);
      Tensor gy = randn(y.shape(), 4 + idx, dt);
      auto gyv = host(gy);
      ConvRef r = reference_conv(k, host(x), host(w), k.bias ? host(b) : std::vector<double>{}, &gyv);
      ASSERT_EQ(y.shape(), (Shape{k.n, k.oc, r.oh, r.ow}));
      const double t = dt == DType::BF16 ? 3e-2 : tol(dt) * 10;
      expect_close(y, r.y, t, "y");
      auto g = ops::conv2d_backward(gy, x, w, k.p, true, true, k.bias);
      expect_close(g.x, r.gx, t, "grad_x");
      expect_close(g.w, r.gw, dt == DType::BF16 ? 5e-2 : t, "grad_w");
      if (k.bias) expect_close(g.b, r.gb, t, "grad_b");
    }
    ++idx;
  }
}

TEST(Conv2d, LargeBatchIsProcessedInChunks) {
  // 8 channels x 3x3 x 32x32 = 73728 column elements per sample: 130 samples need two chunks.
  ConvCase k{130, 8, 32, 32, 2, 3, 3, {}, true};
  k.p.pad_h = k.p.pad_w = 1;
  Tensor x = randn({k.n, k.c, k.h, k.w}, 11, DType::F64);
  Tensor w = randn({k.oc, k.c, k.kh, k.kw}, 12, DType::F64);
  Tensor b = randn({k.oc}, 13, DType::F64);
  Tensor y = ops::conv2d(x, w, b, k.p);
  Tensor gy = randn(y.shape(), 14, DType::F64);
  auto gyv = host(gy);
  ConvRef r = reference_conv(k, host(x), host(w), host(b), &gyv);
  expect_close(y, r.y, 1e-10, "y");
  auto g = ops::conv2d_backward(gy, x, w, k.p, true, true, true);
  expect_close(g.x, r.gx, 1e-10, "grad_x");
  expect_close(g.w, r.gw, 1e-10, "grad_w");
  expect_close(g.b, r.gb, 1e-10, "grad_b");
}

TEST(Conv2d, NonContiguousInputAndErrors) {
  Tensor x = randn({2, 5, 5, 3}, 1, DType::F64).permute({0, 3, 1, 2});  // NHWC storage viewed as NCHW
  Tensor w = randn({2, 3, 3, 3}, 2, DType::F64);
  ConvCase k{2, 3, 5, 5, 2, 3, 3, {}, false};
  expect_close(ops::conv2d(x, w, Tensor(), k.p), reference_conv(k, host(x), host(w), {}, nullptr).y, 1e-10, "y");
  Tensor bad = randn({2, 4, 3, 3}, 3, DType::F64);
  try {
    (void)ops::conv2d(x, bad, Tensor(), k.p);
    FAIL() << "expected a channel mismatch error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv2d"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 4, 3, 3]"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)ops::conv2d(x, w.to(DType::F32), Tensor(), k.p), Error);
  ops::Conv2dParams big;
  EXPECT_THROW((void)ops::conv2d(randn({1, 3, 2, 2}, 4, DType::F64), w, Tensor(), big), Error);
}

// ---- pooling

struct PoolRef {
  std::vector<double> y, gx;
  std::vector<std::int64_t> idx;
};

PoolRef reference_max_pool(const std::vector<double>& x, std::int64_t planes, std::int64_t h, std::int64_t w, int k,
                           int s, int pad, const std::vector<double>& gy) {
  const std::int64_t oh = (h + 2 * pad - k) / s + 1, ow = (w + 2 * pad - k) / s + 1;
  PoolRef r;
  r.gx.assign(x.size(), 0.0);
  for (std::int64_t pl = 0; pl < planes; ++pl)
    for (std::int64_t oy = 0; oy < oh; ++oy)
      for (std::int64_t ox = 0; ox < ow; ++ox) {
        double best = -INFINITY;
        std::int64_t bi = -1;
        for (int i = 0; i < k; ++i)
          for (int j = 0; j < k; ++j) {
            const std::int64_t iy = oy * s - pad + i, ix = ox * s - pad + j;
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
            const double v = x[(pl * h + iy) * w + ix];
            if (v > best) {
              best = v;
              bi = iy * w + ix;
            }
          }
        r.y.push_back(best);
        r.idx.push_back(bi);
        r.gx[pl * h * w + bi] += gy[(pl * oh + oy) * ow + ox];
      }
  return r;
}

TEST(Pool, MaxPoolForwardBackward) {
  for (DType dt : float_dtypes()) {
    for (auto [k, s, pad] : {std::tuple{2, 2, 0}, std::tuple{3, 2, 1}, std::tuple{3, 1, 1}}) {
      SCOPED_TRACE(fmt::format("{} k{} s{} p{}", dtype_name(dt), k, s, pad));
      Tensor x = randn({2, 3, 7, 6}, 5, dt);
      ops::Pool2dParams p;
      p.kernel_h = p.kernel_w = k;
      p.stride_h = p.stride_w = s;
      p.pad_h = p.pad_w = pad;
      auto [y, idx] = ops::max_pool2d(x, p);
      Tensor gy = randn(y.shape(), 6, dt);
      PoolRef r = reference_max_pool(host(x), 6, 7, 6, k, s, pad, host(gy));
      expect_close(y, r.y, 0, "y");
      EXPECT_EQ(idx.to_vector<std::int64_t>(), r.idx);
      Tensor gx = ops::max_pool2d_backward(gy, idx, x.shape(), dt, p);
      expect_close(gx, r.gx, tol(dt), "grad_x");
    }
  }
}

TEST(Pool, AvgPoolBothPaddingModes) {
  for (DType dt : float_dtypes()) {
    for (bool include : {true, false}) {
      const std::int64_t h = 7, w = 5;
      Tensor x = randn({2, 2, h, w}, 7, dt);
      ops::Pool2dParams p;
      p.kernel_h = p.kernel_w = 3;
      p.stride_h = p.stride_w = 2;
      p.pad_h = p.pad_w = 1;
      p.count_include_pad = include;
      Tensor y = ops::avg_pool2d(x, p);
      const std::int64_t oh = (h + 2 - 3) / 2 + 1, ow = (w + 2 - 3) / 2 + 1;
      ASSERT_EQ(y.shape(), (Shape{2, 2, oh, ow}));
      Tensor gy = randn(y.shape(), 8, dt);
      auto xv = host(x), gyv = host(gy);
      std::vector<double> ref, gref(xv.size(), 0.0);
      for (std::int64_t pl = 0; pl < 4; ++pl)
        for (std::int64_t oy = 0; oy < oh; ++oy)
          for (std::int64_t ox = 0; ox < ow; ++ox) {
            double s = 0;
            int cnt = 0;
            for (int i = 0; i < 3; ++i)
              for (int j = 0; j < 3; ++j) {
                const std::int64_t iy = oy * 2 - 1 + i, ix = ox * 2 - 1 + j;
                if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                s += xv[(pl * h + iy) * w + ix];
                ++cnt;
              }
            const double div = include ? 9.0 : cnt;
            ref.push_back(s / div);
            for (int i = 0; i < 3; ++i)
              for (int j = 0; j < 3; ++j) {
                const std::int64_t iy = oy * 2 - 1 + i, ix = ox * 2 - 1 + j;
                if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                gref[(pl * h + iy) * w + ix] += gyv[(pl * oh + oy) * ow + ox] / div;
              }
          }
      expect_close(y, ref, tol(dt), "y");
      expect_close(ops::avg_pool2d_backward(gy, x.shape(), p), gref, tol(dt), "grad_x");
    }
  }
}

TEST(Pool, AdaptiveAvgPoolUsesPyTorchWindows) {
  for (DType dt : float_dtypes()) {
    const std::int64_t h = 7, w = 5, oh = 3, ow = 2;
    Tensor x = randn({2, 3, h, w}, 9, dt);
    Tensor y = ops::adaptive_avg_pool2d(x, oh, ow);
    Tensor gy = randn(y.shape(), 10, dt);
    auto xv = host(x), gyv = host(gy);
    std::vector<double> ref, gref(xv.size(), 0.0);
    for (std::int64_t pl = 0; pl < 6; ++pl)
      for (std::int64_t oy = 0; oy < oh; ++oy)
        for (std::int64_t ox = 0; ox < ow; ++ox) {
          const std::int64_t ys = oy * h / oh, ye = ((oy + 1) * h + oh - 1) / oh;
          const std::int64_t xs = ox * w / ow, xe = ((ox + 1) * w + ow - 1) / ow;
          double s = 0;
          for (std::int64_t iy = ys; iy < ye; ++iy)
            for (std::int64_t ix = xs; ix < xe; ++ix) s += xv[(pl * h + iy) * w + ix];
          const double cnt = static_cast<double>((ye - ys) * (xe - xs));
          ref.push_back(s / cnt);
          for (std::int64_t iy = ys; iy < ye; ++iy)
            for (std::int64_t ix = xs; ix < xe; ++ix)
              gref[(pl * h + iy) * w + ix] += gyv[(pl * oh + oy) * ow + ox] / cnt;
        }
    expect_close(y, ref, tol(dt), "y");
    expect_close(ops::adaptive_avg_pool2d_backward(gy, x.shape()), gref, tol(dt), "grad_x");
  }
  // Global pooling is the plane mean.
  Tensor x = randn({2, 3, 4, 4}, 11, DType::F64);
  expect_close(adaptive_avg_pool2d(x, 1, 1).reshape({6}), host(mean(x, {2, 3})), 1e-12, "global");
}

}  // namespace conv_pool_test
}  // namespace kiln
