// CUDA vs CPU: conv2d, pooling, batch/layer/RMS norm, softmax, cross-entropy, indexing, topk;
// fused optimizers against a host reference; CUDA graph capture and replay.
#include <gtest/gtest-spi.h>

#include <algorithm>
#include <cmath>

#if KILN_WITH_CUDA
#include "kiln/runtime/cuda/cuda_graph.h"
#endif
#include "test_util.h"

namespace kiln::cudatest {
namespace nn_kernels_test {

constexpr std::array<DType, 3> kTypes = {DType::F32, DType::F64, DType::BF16};

// f64 kernels are held to 4e-9 (x4 for weight and bias gradients): tight enough that a kernel
// computing in f32 fails (F64ToleranceCatchesAnF32Kernel), loose enough for another summation order.
double tol_scale(DType t) { return t == DType::F32 ? 50.0 : (t == DType::BF16 ? 2.0 : 4.0); }

// The f64 tolerance must reject an f32 computation of the same reduction (a 3x3x64 convolution's
// dot products, the shortest in these tests), or an f64 kernel silently running in f32 would pass.
TEST(CudaTolerances, F64ToleranceCatchesAnF32Kernel) {
  const std::int64_t n = 256, k = 3 * 3 * 64;
  Tensor x = Tensor::randn({n, k}, 11, DType::F64), w = Tensor::randn({k}, 12, DType::F64);
  auto xv = x.to_vector<double>(), wv = w.to_vector<double>();
  std::vector<double> exact(n), in_f32(n);
  for (std::int64_t i = 0; i < n; ++i) {
    double acc = 0;
    float acc32 = 0;
    for (std::int64_t j = 0; j < k; ++j) {
      acc += xv[i * k + j] * wv[j];
      acc32 += static_cast<float>(xv[i * k + j]) * static_cast<float>(wv[j]);
    }
    exact[i] = acc;
    in_f32[i] = acc32;
  }
  Tensor want = Tensor::from_vector(exact, {n}), got = Tensor::from_vector(in_f32, {n});
  testing::TestPartResultArray failures;
  {
    testing::ScopedFakeTestPartResultReporter intercept(
        testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    expect_close(got, want, "f32 reduction", tol_scale(DType::F64) * 4);
  }
  ASSERT_EQ(failures.size(), 1) << "the f64 tolerance accepted an f32 reduction";
  EXPECT_NE(std::string(failures.GetTestPartResult(0).message()).find("elements differ"), std::string::npos);
  expect_close(want, want, "exact", tol_scale(DType::F64));
}

// ---- conv2d -------------------------------------------------------------------------------------

struct ConvCase {
  std::int64_t n, c, h, w, k, r;
  ops::Conv2dParams p;
};

TEST(CudaConv, ForwardBackwardMatchCpu) {
  KILN_REQUIRE_CUDA();
  KILN_REQUIRE_CPU_REF(conv2d_forward);
  std::vector<ConvCase> cases = {
      {2, 3, 9, 11, 4, 3, {1, 1, 1, 1, 1, 1, 1}},
      {2, 8, 10, 10, 6, 3, {2, 2, 1, 1, 1, 1, 1}},
      {1, 4, 7, 7, 4, 1, {1, 1, 0, 0, 1, 1, 1}},
      {2, 4, 9, 9, 6, 3, {1, 1, 2, 2, 2, 2, 2}},  // dilation + groups
  };
  for (DType t : kTypes) {
    for (const auto& c : cases) {
      const std::int64_t oh = (c.h + 2 * c.p.pad_h - c.p.dilation_h * (c.r - 1) - 1) / c.p.stride_h + 1;
      const std::int64_t ow = (c.w + 2 * c.p.pad_w - c.p.dilation_w * (c.r - 1) - 1) / c.p.stride_w + 1;
      Tensor x = randn({c.n, c.c, c.h, c.w}, 1, t), w = randn({c.k, c.c / c.p.groups, c.r, c.r}, 2, t, 0.3);
      Tensor b = randn({c.k}, 3, t);
      Tensor yw = poisoned({c.n, c.k, oh, ow}, t, Device::cpu()), yg = poisoned({c.n, c.k, oh, ow}, t, gpu());
      cpu_kernel(ops::op::conv2d_forward)(x, w, b, yw, c.p);
      cuda_kernel(ops::op::conv2d_forward)(on(x, gpu()), on(w, gpu()), on(b, gpu()), yg, c.p);
      expect_close(yg, yw, "conv2d fwd " + name(t), tol_scale(t));
      if (!has_cpu_kernel(ops::op::conv2d_backward)) continue;
      Tensor gy = randn(yw.shape(), 4, t);
      Tensor gxw = poisoned(x.shape(), t, Device::cpu()), gww = poisoned(w.shape(), t, Device::cpu()),
             gbw = poisoned(b.shape(), t, Device::cpu());
      Tensor gxg = poisoned(x.shape(), t, gpu()), gwg = poisoned(w.shape(), t, gpu()),
             gbg = poisoned(b.shape(), t, gpu());
      cpu_kernel(ops::op::conv2d_backward)(gy, x, w, gxw, gww, gbw, c.p);
      cuda_kernel(ops::op::conv2d_backward)(on(gy, gpu()), on(x, gpu()), on(w, gpu()), gxg, gwg, gbg, c.p);
      expect_close(gxg, gxw, "conv2d grad_x " + name(t), tol_scale(t));
      expect_close(gwg, gww, "conv2d grad_w " + name(t), tol_scale(t) * 4);
      expect_close(gbg, gbw, "conv2d grad_b " + name(t), tol_scale(t) * 4);
    }
  }
}

// ---- pooling ------------------------------------------------------------------------------------

TEST(CudaPool, MaxAvgAdaptiveMatchCpu) {
  KILN_REQUIRE_CUDA();
  std::vector<ops::Pool2dParams> params = {
      {2, 2, 2, 2, 0, 0, true}, {3, 3, 2, 2, 1, 1, true}, {3, 3, 2, 2, 1, 1, false}, {3, 2, 1, 2, 1, 0, true}};
  for (DType t : kTypes) {
    Tensor x = randn({2, 3, 11, 10}, 5, t);
    for (const auto& p : params) {
      const std::int64_t oh = (11 + 2 * p.pad_h - p.kernel_h) / p.stride_h + 1;
      const std::int64_t ow = (10 + 2 * p.pad_w - p.kernel_w) / p.stride_w + 1;
      Shape ys{2, 3, oh, ow};
      Tensor gy = randn(ys, 6, t);
      if (has_cpu_kernel(ops::op::max_pool2d_forward)) {
        Tensor yw = poisoned(ys, t, Device::cpu()), yg = poisoned(ys, t, gpu());
        Tensor iw = poisoned(ys, DType::I64, Device::cpu()), ig = poisoned(ys, DType::I64, gpu());
        cpu_kernel(ops::op::max_pool2d_forward)(x, yw, iw, p);
        cuda_kernel(ops::op::max_pool2d_forward)(on(x, gpu()), yg, ig, p);
        expect_close(yg, yw, 0, 0, "max_pool fwd " + name(t));
        expect_close(ig, iw, 0, 0, "max_pool indices " + name(t));
        Tensor gw = poisoned(x.shape(), t, Device::cpu()), gg = poisoned(x.shape(), t, gpu());
        cpu_kernel(ops::op::max_pool2d_backward)(gy, iw, gw, p);
        cuda_kernel(ops::op::max_pool2d_backward)(on(gy, gpu()), ig, gg, p);
        expect_close(gg, gw, "max_pool bwd " + name(t), 4.0);
      }
      if (has_cpu_kernel(ops::op::avg_pool2d_forward)) {
        Tensor yw = poisoned(ys, t, Device::cpu()), yg = poisoned(ys, t, gpu());
        cpu_kernel(ops::op::avg_pool2d_forward)(x, yw, p);
        cuda_kernel(ops::op::avg_pool2d_forward)(on(x, gpu()), yg, p);
        expect_close(yg, yw, "avg_pool fwd " + name(t), 4.0);
        Tensor gw = poisoned(x.shape(), t, Device::cpu()), gg = poisoned(x.shape(), t, gpu());
        cpu_kernel(ops::op::avg_pool2d_backward)(gy, gw, p);
        cuda_kernel(ops::op::avg_pool2d_backward)(on(gy, gpu()), gg, p);
        expect_close(gg, gw, "avg_pool bwd " + name(t), 4.0);
      }
    }
    if (has_cpu_kernel(ops::op::adaptive_avg_pool2d_forward)) {
      for (Shape ys : {Shape{2, 3, 1, 1}, Shape{2, 3, 4, 3}, Shape{2, 3, 11, 10}}) {
        Tensor yw = poisoned(ys, t, Device::cpu()), yg = poisoned(ys, t, gpu());
        cpu_kernel(ops::op::adaptive_avg_pool2d_forward)(x, yw);
        cuda_kernel(ops::op::adaptive_avg_pool2d_forward)(on(x, gpu()), yg);
        expect_close(yg, yw, "adaptive fwd " + name(t), 4.0);
        Tensor gy = randn(ys, 7, t);
        Tensor gw = poisoned(x.shape(), t, Device::cpu()), gg = poisoned(x.shape(), t, gpu());
        cpu_kernel(ops::op::adaptive_avg_pool2d_backward)(gy, gw);
        cuda_kernel(ops::op::adaptive_avg_pool2d_backward)(on(gy, gpu()), gg);
        expect_close(gg, gw, "adaptive bwd " + name(t), 4.0);
      }
    }
  }
}

// Global average pooling checked without a CPU kernel: mean over each plane.
TEST(CudaPool, GlobalAveragePoolIsPlaneMean) {
  KILN_REQUIRE_CUDA();
  Tensor x = randn({4, 8, 7, 5}, 8, DType::F32);
  Tensor y = poisoned({4, 8, 1, 1}, DType::F32, gpu());
  cuda_kernel(ops::op::adaptive_avg_pool2d_forward)(on(x, gpu()), y);
  Tensor want = poisoned({4, 8, 1, 1}, DType::F32, Device::cpu());
  int dims[2] = {2, 3};
  cpu_kernel(ops::op::reduce)(ops::ReduceOp::Mean, x, std::span<const int>(dims), want);
  expect_close(y, want, "global avg pool", 4.0);
}

// ---- batch norm ---------------------------------------------------------------------------------

TEST(CudaBatchNorm, TrainingEvalBackwardMatchCpu) {
  KILN_REQUIRE_CUDA();
  KILN_REQUIRE_CPU_REF(batch_norm_forward);
  for (DType t : {DType::F32, DType::F64}) {
    for (Shape xs : {Shape{8, 5, 6, 7}, Shape{64, 3}, Shape{3, 4, 33, 33}}) {
      const std::int64_t c = xs[1];
      Tensor x = randn(xs, 10, t, 2.0, 1.0), w = randn({c}, 11, t), b = randn({c}, 12, t);
      for (bool training : {true, false}) {
        Tensor rm_c = randn({c}, 13, t), rv_c = randn({c}, 14, t, 0.1, 1.0);
        Tensor rm_g = on(rm_c, gpu()), rv_g = on(rv_c, gpu());
        Tensor yw = poisoned(xs, t, Device::cpu()), yg = poisoned(xs, t, gpu());
        Tensor smw = poisoned({c}, t, Device::cpu()), sig = poisoned({c}, t, gpu());
        Tensor siw = poisoned({c}, t, Device::cpu()), smg = poisoned({c}, t, gpu());
        cpu_kernel(ops::op::batch_norm_forward)(x, w, b, rm_c, rv_c, training, 0.1, 1e-5, Tensor(), false, yw, smw,
                                                siw);
        cuda_kernel(ops::op::batch_norm_forward)(on(x, gpu()), on(w, gpu()), on(b, gpu()), rm_g, rv_g, training, 0.1,
                                                 1e-5, Tensor(), false, yg, smg, sig);
        std::string what = "batch_norm " + name(t) + " " + shape_str(xs) + (training ? " train" : " eval");
        expect_close(yg, yw, what + " y", tol_scale(t));
        expect_close(rm_g, rm_c, what + " running_mean", tol_scale(t));
        expect_close(rv_g, rv_c, what + " running_var", tol_scale(t));
        if (!training || !has_cpu_kernel(ops::op::batch_norm_backward)) continue;
        expect_close(smg, smw, what + " save_mean", tol_scale(t));
        expect_close(sig, siw, what + " save_invstd", tol_scale(t));
        Tensor gy = randn(xs, 15, t);
        Tensor gxw = poisoned(xs, t, Device::cpu()), gww = poisoned({c}, t, Device::cpu()),
               gbw = poisoned({c}, t, Device::cpu());
        Tensor gxg = poisoned(xs, t, gpu()), gwg = poisoned({c}, t, gpu()), gbg = poisoned({c}, t, gpu());
        cpu_kernel(ops::op::batch_norm_backward)(gy, x, Tensor(), false, w, smw, siw, gxw, gww, gbw, Tensor());
        cuda_kernel(ops::op::batch_norm_backward)(on(gy, gpu()), on(x, gpu()), Tensor(), false, on(w, gpu()), smg, sig,
                                                  gxg, gwg, gbg, Tensor());
        expect_close(gxg, gxw, what + " grad_x", tol_scale(t) * 4);
        expect_close(gwg, gww, what + " grad_w", tol_scale(t) * 4);
        expect_close(gbg, gbw, what + " grad_b", tol_scale(t) * 4);
      }
    }
  }
}

// Without a CPU kernel: training output has zero mean / unit variance per channel.
TEST(CudaBatchNorm, TrainingNormalisesPerChannel) {
  KILN_REQUIRE_CUDA();
  Tensor x = on(randn({16, 4, 9, 9}, 16, DType::F32, 3.0, 2.0), gpu());
  Tensor y = poisoned(x.shape(), DType::F32, gpu());
  Tensor sm = poisoned({4}, DType::F32, gpu()), si = poisoned({4}, DType::F32, gpu());
  Tensor rm = Tensor::zeros({4}, DType::F32, gpu()), rv = Tensor::ones({4}, DType::F32, gpu());
  cuda_kernel(ops::op::batch_norm_forward)(x, Tensor(), Tensor(), rm, rv, true, 0.1, 1e-5, Tensor(), false, y, sm, si);
  int dims[3] = {0, 2, 3};
  Tensor mean = poisoned({1, 4, 1, 1}, DType::F32, gpu()), var = poisoned({1, 4, 1, 1}, DType::F32, gpu());
  cuda_kernel(ops::op::reduce)(ops::ReduceOp::Mean, y, std::span<const int>(dims), mean);
  cuda_kernel(ops::op::variance)(y, std::span<const int>(dims), 0, var);
  expect_close(mean, Tensor::zeros({1, 4, 1, 1}), 0, 1e-5, "bn mean");
  expect_close(var, Tensor::ones({1, 4, 1, 1}), 1e-3, 1e-3, "bn var");
  Tensor xm = poisoned({1, 4, 1, 1}, DType::F32, gpu());
  cuda_kernel(ops::op::reduce)(ops::ReduceOp::Mean, x, std::span<const int>(dims), xm);
  Tensor rm_want = poisoned({1, 4, 1, 1}, DType::F32, gpu());
  cuda_kernel(ops::op::binary_scalar)(ops::BinaryOp::Mul, xm, 0.1, rm_want);
  expect_close(rm.reshape({1, 4, 1, 1}), rm_want, 1e-5, 1e-6, "bn running mean");
}

// ---- layer / RMS norm ---------------------------------------------------------------------------

TEST(CudaRowNorm, LayerAndRmsNormMatchCpu) {
  KILN_REQUIRE_CUDA();
  for (DType t : kTypes) {
    const DType stats = t == DType::F64 ? DType::F64 : DType::F32;  // ops::layer_norm's statistics
    for (Shape xs : {Shape{37, 96}, Shape{5, 3, 2000}}) {
      const std::int64_t d = xs.back(), rows = numel_of(xs) / d;
      Tensor x = randn(xs, 20, t, 2.0, 0.5), w = randn({d}, 21, t), b = randn({d}, 22, t), gy = randn(xs, 23, t);
      if (has_cpu_kernel(ops::op::layer_norm_forward)) {
        Tensor yw = poisoned(xs, t, Device::cpu()), yg = poisoned(xs, t, gpu());
        Tensor mw = poisoned({rows}, stats, Device::cpu()), mg = poisoned({rows}, stats, gpu());
        Tensor rw = poisoned({rows}, stats, Device::cpu()), rg = poisoned({rows}, stats, gpu());
        cpu_kernel(ops::op::layer_norm_forward)(x, w, b, 1e-5, yw, mw, rw);
        cuda_kernel(ops::op::layer_norm_forward)(on(x, gpu()), on(w, gpu()), on(b, gpu()), 1e-5, yg, mg, rg);
        expect_close(yg, yw, "layer_norm " + name(t), tol_scale(t));
        Tensor gxw = poisoned(xs, t, Device::cpu()), gww = poisoned({d}, t, Device::cpu()),
               gbw = poisoned({d}, t, Device::cpu());
        Tensor gxg = poisoned(xs, t, gpu()), gwg = poisoned({d}, t, gpu()), gbg = poisoned({d}, t, gpu());
        cpu_kernel(ops::op::layer_norm_backward)(gy, x, w, mw, rw, gxw, gww, gbw);
        cuda_kernel(ops::op::layer_norm_backward)(on(gy, gpu()), on(x, gpu()), on(w, gpu()), mg, rg, gxg, gwg, gbg);
        expect_close(gxg, gxw, "layer_norm grad_x " + name(t), tol_scale(t) * 4);
        expect_close(gwg, gww, "layer_norm grad_w " + name(t), tol_scale(t) * 10);
        expect_close(gbg, gbw, "layer_norm grad_b " + name(t), tol_scale(t) * 10);
      }
      if (has_cpu_kernel(ops::op::rms_norm_forward)) {
        Tensor yw = poisoned(xs, t, Device::cpu()), yg = poisoned(xs, t, gpu());
        Tensor rw = poisoned({rows}, stats, Device::cpu()), rg = poisoned({rows}, stats, gpu());
        cpu_kernel(ops::op::rms_norm_forward)(x, w, 1e-6, yw, rw);
        cuda_kernel(ops::op::rms_norm_forward)(on(x, gpu()), on(w, gpu()), 1e-6, yg, rg);
        expect_close(yg, yw, "rms_norm " + name(t), tol_scale(t));
        Tensor gxw = poisoned(xs, t, Device::cpu()), gww = poisoned({d}, t, Device::cpu());
        Tensor gxg = poisoned(xs, t, gpu()), gwg = poisoned({d}, t, gpu());
        cpu_kernel(ops::op::rms_norm_backward)(gy, x, w, rw, gxw, gww);
        cuda_kernel(ops::op::rms_norm_backward)(on(gy, gpu()), on(x, gpu()), on(w, gpu()), rg, gxg, gwg);
        expect_close(gxg, gxw, "rms_norm grad_x " + name(t), tol_scale(t) * 4);
        expect_close(gwg, gww, "rms_norm grad_w " + name(t), tol_scale(t) * 10);
      }
    }
  }
}

// ---- softmax / cross-entropy --------------------------------------------------------------------

TEST(CudaSoftmax, ForwardBackwardMatchCpu) {
  KILN_REQUIRE_CUDA();
  KILN_REQUIRE_CPU_REF(softmax_forward);
  for (DType t : kTypes) {
    for (Shape xs : {Shape{33, 10}, Shape{7, 1000}, Shape{3, 5000}}) {
      for (bool log : {false, true}) {
        Tensor x = randn(xs, 30, t, 3.0), gy = randn(xs, 31, t);
        Tensor yw = poisoned(xs, t, Device::cpu()), yg = poisoned(xs, t, gpu());
        cpu_kernel(ops::op::softmax_forward)(x, log, yw);
        cuda_kernel(ops::op::softmax_forward)(on(x, gpu()), log, yg);
        expect_close(yg, yw, "softmax " + name(t), tol_scale(t));
        Tensor gw = poisoned(xs, t, Device::cpu()), gg = poisoned(xs, t, gpu());
        cpu_kernel(ops::op::softmax_backward)(gy, yw, log, gw);
        cuda_kernel(ops::op::softmax_backward)(on(gy, gpu()), on(yw, gpu()), log, gg);
        expect_close(gg, gw, "softmax bwd " + name(t), tol_scale(t) * 4);
      }
    }
  }
}

TEST(CudaSoftmax, RowsSumToOne) {
  KILN_REQUIRE_CUDA();
  for (std::int64_t d : {10, 1000, 3000}) {
    Tensor x = on(randn({17, d}, 32, DType::F32, 5.0), gpu());
    Tensor y = poisoned(x.shape(), DType::F32, gpu());
    cuda_kernel(ops::op::softmax_forward)(x, false, y);
    int dims[1] = {1};
    Tensor s = poisoned({17, 1}, DType::F32, gpu());
    cuda_kernel(ops::op::reduce)(ops::ReduceOp::Sum, y, std::span<const int>(dims), s);
    expect_close(s, Tensor::ones({17, 1}), 1e-5, 1e-5, "softmax row sums");
  }
}

TEST(CudaCrossEntropy, ForwardBackwardMatchCpu) {
  KILN_REQUIRE_CUDA();
  KILN_REQUIRE_CPU_REF(cross_entropy_forward);
  for (DType t : kTypes) {
    for (std::int64_t c : {10, 2000}) {
      for (double smoothing : {0.0, 0.1}) {
        const std::int64_t n = 37;
        Tensor logits = randn({n, c}, 40, t, 3.0);
        Tensor target = rand_int({n}, 41, 0, c);
        std::vector<std::int64_t> tv = target.to_vector<std::int64_t>();
        tv[3] = -100;  // ignored row
        target = Tensor::from_vector(tv);
        Tensor lw = poisoned({n}, t, Device::cpu()), lg = poisoned({n}, t, gpu());
        Tensor ew = poisoned({n}, DType::F32, Device::cpu()), eg = poisoned({n}, DType::F32, gpu());
        cpu_kernel(ops::op::cross_entropy_forward)(logits, target, -100, smoothing, lw, ew);
        cuda_kernel(ops::op::cross_entropy_forward)(on(logits, gpu()), on(target, gpu()), -100, smoothing, lg, eg);
        std::string what = "cross_entropy " + name(t) + " C=" + std::to_string(c);
        expect_close(lg, lw, what, tol_scale(t));
        Tensor gl = randn({n}, 42, t);
        Tensor gw = poisoned({n, c}, t, Device::cpu()), gg = poisoned({n, c}, t, gpu());
        cpu_kernel(ops::op::cross_entropy_backward)(gl, logits, target, ew, -100, smoothing, gw);
        cuda_kernel(ops::op::cross_entropy_backward)(on(gl, gpu()), on(logits, gpu()), on(target, gpu()), eg, -100,
                                                     smoothing, gg);
        expect_close(gg, gw, what + " grad", tol_scale(t) * 4);
      }
    }
  }
}

// ---- indexing / topk ----------------------------------------------------------------------------

TEST(CudaIndexing, SelectAddGatherScatterMatchCpu) {
  KILN_REQUIRE_CUDA();
  for (DType t : {DType::F32, DType::F64}) {
    Tensor x = randn({6, 7, 8}, 50, t);
    for (int dim = 0; dim < 3; ++dim) {
      Tensor idx = rand_int({11}, 51 + dim, 0, x.shape()[dim]);
      Shape os = x.shape();
      os[dim] = 11;
      if (has_cpu_kernel(ops::op::index_select)) {
        Tensor w = poisoned(os, t, Device::cpu()), g = poisoned(os, t, gpu());
        cpu_kernel(ops::op::index_select)(x, dim, idx, w);
        cuda_kernel(ops::op::index_select)(on(x, gpu()), dim, on(idx, gpu()), g);
        expect_close(g, w, 0, 0, "index_select dim " + std::to_string(dim));
      }
      if (has_cpu_kernel(ops::op::index_add)) {
        Tensor src = randn(os, 52, t);
        Tensor w = x.clone(), g = on(x, gpu());
        cpu_kernel(ops::op::index_add)(w, dim, idx, src);
        cuda_kernel(ops::op::index_add)(g, dim, on(idx, gpu()), on(src, gpu()));
        expect_close(g, w, "index_add dim " + std::to_string(dim), 10.0);
      }
      Shape gs = x.shape();
      gs[dim] = 5;
      Tensor gidx = rand_int(gs, 53 + dim, 0, x.shape()[dim]);
      if (has_cpu_kernel(ops::op::gather)) {
        Tensor w = poisoned(gs, t, Device::cpu()), g = poisoned(gs, t, gpu());
        cpu_kernel(ops::op::gather)(x, dim, gidx, w);
        cuda_kernel(ops::op::gather)(on(x, gpu()), dim, on(gidx, gpu()), g);
        expect_close(g, w, 0, 0, "gather dim " + std::to_string(dim));
      }
      if (has_cpu_kernel(ops::op::scatter_add)) {
        Tensor src = randn(gs, 54, t);
        Tensor w = x.clone(), g = on(x, gpu());
        cpu_kernel(ops::op::scatter_add)(w, dim, gidx, src);
        cuda_kernel(ops::op::scatter_add)(g, dim, on(gidx, gpu()), on(src, gpu()));
        expect_close(g, w, "scatter_add dim " + std::to_string(dim), 10.0);
      }
    }
  }
}

// topk checked against a host sort (no ties in random data).
TEST(CudaTopk, MatchesHostSort) {
  KILN_REQUIRE_CUDA();
  for (std::int64_t d : {7, 100, 3000, 20000}) {
    for (bool largest : {true, false}) {
      const std::int64_t rows = 5, k = std::min<std::int64_t>(d, 17);
      Tensor x = randn({rows, d}, 60, DType::F32);
      Tensor v = poisoned({rows, k}, DType::F32, gpu()), i = poisoned({rows, k}, DType::I64, gpu());
      cuda_kernel(ops::op::topk)(on(x, gpu()), k, largest, v, i);
      auto xv = x.to_vector<float>();
      auto vv = v.to_vector<float>();
      auto iv = i.to_vector<std::int64_t>();
      for (std::int64_t r = 0; r < rows; ++r) {
        std::vector<std::int64_t> order(d);
        for (std::int64_t j = 0; j < d; ++j) order[j] = j;
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](std::int64_t a, std::int64_t b) {
          return largest ? xv[r * d + a] > xv[r * d + b] : xv[r * d + a] < xv[r * d + b];
        });
        for (std::int64_t j = 0; j < k; ++j) {
          ASSERT_EQ(iv[r * k + j], order[j]) << "topk d=" << d << " row " << r << " rank " << j;
          ASSERT_EQ(vv[r * k + j], xv[r * d + order[j]]);
        }
      }
    }
  }
}

// ---- optimizers ---------------------------------------------------------------------------------

std::vector<Tensor> make_params(std::uint64_t seed, const std::vector<std::int64_t>& sizes, Device d) {
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < sizes.size(); ++i) out.push_back(on(randn({sizes[i]}, seed + i, DType::F32), d));
  return out;
}

TEST(CudaOptim, AdamMatchesHostReference) {
  KILN_REQUIRE_CUDA();
  const std::vector<std::int64_t> sizes = {1, 3, 4097, 70001, 16384, 5};
  for (bool decoupled : {false, true}) {
    auto p = make_params(100, sizes, gpu()), g = make_params(200, sizes, gpu()), m = make_params(300, sizes, gpu());
    auto v = make_params(400, sizes, gpu());
    for (auto& t : v) t = on(ops::to(t, Device::cpu(), DType::F32), gpu());
    for (auto& t : v) cuda_kernel(ops::op::unary)(ops::UnaryOp::Square, t, t, 0);  // v >= 0
    std::vector<std::vector<float>> hp, hg, hm, hv;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      hp.push_back(p[i].to_vector<float>());
      hg.push_back(g[i].to_vector<float>());
      hm.push_back(m[i].to_vector<float>());
      hv.push_back(v[i].to_vector<float>());
    }
    ops::AdamParams ap;
    ap.lr = 1e-2;
    ap.weight_decay = 0.05;
    ap.decoupled_weight_decay = decoupled;
    for (std::int64_t step = 1; step <= 3; ++step) {
      ap.step = step;
      cuda_kernel(ops::op::adam_step)(p, g, m, v, {}, ap);
      const double bc1 = 1 - std::pow(ap.beta1, step), bc2 = 1 - std::pow(ap.beta2, step);
      for (std::size_t i = 0; i < sizes.size(); ++i)
        for (std::size_t j = 0; j < hp[i].size(); ++j) {
          double pp = hp[i][j], gg = hg[i][j];
          if (decoupled)
            pp *= 1 - ap.lr * ap.weight_decay;
          else
            gg += ap.weight_decay * pp;
          hm[i][j] = static_cast<float>(ap.beta1 * hm[i][j] + (1 - ap.beta1) * gg);
          hv[i][j] = static_cast<float>(ap.beta2 * hv[i][j] + (1 - ap.beta2) * gg * gg);
          pp -= ap.lr / bc1 * hm[i][j] / (std::sqrt(hv[i][j]) / std::sqrt(bc2) + ap.eps);
          hp[i][j] = static_cast<float>(pp);
        }
    }
    for (std::size_t i = 0; i < sizes.size(); ++i)
      expect_close(p[i], Tensor::from_vector(hp[i], p[i].shape()), 1e-5, 1e-6, "adam param " + std::to_string(i));
  }
}

TEST(CudaOptim, SgdMomentumAndSumOfSquares) {
  KILN_REQUIRE_CUDA();
  const std::vector<std::int64_t> sizes = {10, 20000, 3};
  auto p = make_params(500, sizes, gpu()), g = make_params(600, sizes, gpu());
  std::vector<Tensor> buf;
  for (auto s : sizes) buf.push_back(Tensor::zeros({s}, DType::F32, gpu()));
  std::vector<std::vector<float>> hp, hg, hb;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    hp.push_back(p[i].to_vector<float>());
    hg.push_back(g[i].to_vector<float>());
    hb.push_back(std::vector<float>(hp[i].size(), 0.f));
  }
  ops::SgdParams sp;
  sp.lr = 0.1;
  sp.momentum = 0.9;
  sp.weight_decay = 1e-3;
  sp.nesterov = true;
  for (int step = 0; step < 3; ++step) {
    sp.first_step = step == 0;
    cuda_kernel(ops::op::sgd_step)(p, g, buf, {}, sp);
    for (std::size_t i = 0; i < sizes.size(); ++i)
      for (std::size_t j = 0; j < hp[i].size(); ++j) {
        float d = hg[i][j] + static_cast<float>(sp.weight_decay) * hp[i][j];
        float b = sp.first_step ? d : 0.9f * hb[i][j] + d;
        hb[i][j] = b;
        d = d + 0.9f * b;
        hp[i][j] -= 0.1f * d;
      }
  }
  double ss = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    expect_close(p[i], Tensor::from_vector(hp[i], p[i].shape()), 1e-5, 1e-6, "sgd param " + std::to_string(i));
    for (float x : hp[i]) ss += static_cast<double>(x) * x;
  }
  Tensor out = poisoned({}, DType::F32, gpu());
  cuda_kernel(ops::op::sum_of_squares)(p, out);
  EXPECT_NEAR(out.item(), ss, 1e-4 * ss);
}

#if KILN_WITH_CUDA
// ---- CUDA graphs --------------------------------------------------------------------------------

TEST(CudaGraphTest, CaptureAndReplayElementwiseReduceAdam) {
  KILN_REQUIRE_CUDA();
  Tensor x = on(randn({4096}, 70, DType::F32), gpu());
  Tensor y = poisoned({4096}, DType::F32, gpu()), s = poisoned({1}, DType::F32, gpu());
  std::vector<Tensor> p = {on(randn({1000}, 71, DType::F32), gpu())}, g = {on(randn({1000}, 72, DType::F32), gpu())};
  std::vector<Tensor> m = {Tensor::zeros({1000}, DType::F32, gpu())}, v = {Tensor::zeros({1000}, DType::F32, gpu())};
  int dims[1] = {0};
  auto step = [&] {
    cuda_kernel(ops::op::unary)(ops::UnaryOp::Relu, x, y, 0);
    cuda_kernel(ops::op::binary_scalar)(ops::BinaryOp::Mul, y, 2.0, y);
    cuda_kernel(ops::op::reduce)(ops::ReduceOp::Sum, y, std::span<const int>(dims), s);
    cuda_kernel(ops::op::adam_step)(p, g, m, v, {}, ops::AdamParams{});
  };
  step();  // warm-up: allocator cache, optimizer table
  synchronize(gpu());
  Tensor p_before = p[0].clone();
  CudaGraph graph;
  graph.capture_begin(gpu());
  step();
  graph.capture_end();
  cuda_kernel(ops::op::fill)(s, 0.0);
  graph.replay();
  graph.replay();
  synchronize(gpu());
  auto xv = x.to_vector<float>();
  double want = 0;
  for (float e : xv) want += e > 0 ? 2.0 * e : 0.0;
  EXPECT_NEAR(s.item(), want, 1e-3 * std::fabs(want) + 1e-3);
  // Two replays moved the parameters twice more.
  auto a = p_before.to_vector<float>(), b = p[0].to_vector<float>();
  double moved = 0;
  for (std::size_t i = 0; i < a.size(); ++i) moved += std::fabs(a[i] - b[i]);
  EXPECT_GT(moved, 0.0);
}

#endif  // KILN_WITH_CUDA

}  // namespace nn_kernels_test
}  // namespace kiln::cudatest
