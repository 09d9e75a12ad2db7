// Channels-last on CUDA: convolutions (cuDNN NHWC), batch norm (column-reduction kernels) and a
// whole residual block with gradients give the results of the NCHW path and of the CPU.
#include <string>

#include "kiln/autograd/functions.h"
#include "kiln/ops/conv_pool.h"
#include "kiln/ops/memory_format.h"
#include "kiln/ops/norm.h"
#include "test_util.h"

namespace kiln {
namespace channels_last_test {

using namespace cudatest;

TEST(CudaChannelsLast, ConvolutionMatchesNchwAndCpu) {
  KILN_REQUIRE_CUDA();
  struct Case {
    std::int64_t n, c, h, k, r;
    int stride, pad;
    bool bias;
  };
  const Case cases[] = {{4, 16, 12, 32, 3, 1, 1, false},
                        {4, 16, 12, 32, 3, 2, 1, true},
                        {2, 8, 9, 16, 1, 2, 0, false},
                        {2, 3, 10, 8, 3, 1, 1, true}};
  for (DType t : {DType::F32, DType::BF16}) {
    for (const Case& c : cases) {
      ops::Conv2dParams p;
      p.stride_h = p.stride_w = c.stride;
      p.pad_h = p.pad_w = c.pad;
      Tensor x = randn({c.n, c.c, c.h, c.h}, 1, t), w = randn({c.k, c.c, c.r, c.r}, 2, t, 0.2);
      Tensor b = c.bias ? randn({c.k}, 3, t) : Tensor();
      Tensor y_cpu = ops::conv2d(x, w, b, p);
      Tensor xg = on(x, gpu()), wg = on(w, gpu()), bg = on(b, gpu());
      Tensor y_nchw = ops::conv2d(xg, wg, bg, p);
      Tensor y_cl = ops::conv2d(ops::to_channels_last(xg), wg, bg, p);
      EXPECT_TRUE(ops::is_channels_last(y_cl)) << name(t);
      expect_close(y_cl, y_nchw, "conv fwd channels-last vs NCHW " + name(t), 2);
      expect_close(on(y_cl, Device::cpu()), y_cpu, "conv fwd channels-last vs CPU " + name(t), 2);

      Tensor gy = randn(y_cpu.shape(), 4, t);
      ops::Conv2dGrads g_cpu = ops::conv2d_backward(gy, x, w, p, true, true, c.bias);
      Tensor gyg = on(gy, gpu());
      ops::Conv2dGrads g_cl =
          ops::conv2d_backward(ops::to_channels_last(gyg), ops::to_channels_last(xg), wg, p, true, true, c.bias);
      EXPECT_TRUE(ops::is_channels_last(g_cl.x)) << name(t);
      EXPECT_TRUE(g_cl.w.is_contiguous()) << "the weight gradient has the parameter's layout";
      expect_close(on(g_cl.x, Device::cpu()), g_cpu.x, "conv grad_x channels-last vs CPU " + name(t), 2);
      expect_close(on(g_cl.w, Device::cpu()), g_cpu.w, "conv grad_w channels-last vs CPU " + name(t), 8);
      if (c.bias) expect_close(on(g_cl.b, Device::cpu()), g_cpu.b, "conv grad_b channels-last vs CPU " + name(t), 8);
      // A contiguous grad_y with a channels-last input is converted, not misread.
      ops::Conv2dGrads g_mixed = ops::conv2d_backward(gyg, ops::to_channels_last(xg), wg, p, true, true, c.bias);
      expect_close(on(g_mixed.x, Device::cpu()), g_cpu.x, "conv grad_x, grad_y contiguous " + name(t), 2);
    }
  }
}

TEST(CudaChannelsLast, BatchNormMatchesNchw) {
  KILN_REQUIRE_CUDA();
  for (DType t : {DType::F32, DType::BF16}) {
    for (std::int64_t c : {3, 64, 80}) {
      Tensor x = randn({8, c, 7, 9}, 5, t, 2.0, 0.5), gamma = randn({c}, 6, DType::F32),
             beta = randn({c}, 7, DType::F32);
      Tensor xg = on(x, gpu()), gg = on(gamma, gpu()), bg = on(beta, gpu());
      Tensor rm1 = Tensor::zeros({c}, DType::F32, gpu()), rv1 = Tensor::ones({c}, DType::F32, gpu());
      Tensor rm2 = Tensor::zeros({c}, DType::F32, gpu()), rv2 = Tensor::ones({c}, DType::F32, gpu());
      ops::BatchNormResult nchw = ops::batch_norm(xg, gg, bg, rm1, rv1, true, 0.1, 1e-5);
      ops::BatchNormResult cl = ops::batch_norm(ops::to_channels_last(xg), gg, bg, rm2, rv2, true, 0.1, 1e-5);
      EXPECT_TRUE(ops::is_channels_last(cl.y)) << name(t);
      expect_close(cl.y, nchw.y, "bn y " + name(t), 2);
      expect_close(cl.save_mean, nchw.save_mean, "bn mean " + name(t));
      expect_close(cl.save_invstd, nchw.save_invstd, "bn invstd " + name(t), 10);
      expect_close(rm2, rm1, "bn running mean " + name(t));
      expect_close(rv2, rv1, "bn running var " + name(t), 10);
      Tensor gy = on(randn(x.shape(), 8, t), gpu());
      ops::NormGrads g1 = ops::batch_norm_backward(gy, xg, gg, nchw.save_mean, nchw.save_invstd, true, true, true);
      ops::NormGrads g2 = ops::batch_norm_backward(ops::to_channels_last(gy), ops::to_channels_last(xg), gg,
                                                   cl.save_mean, cl.save_invstd, true, true, true);
      EXPECT_TRUE(ops::is_channels_last(g2.x)) << name(t);
      expect_close(g2.x, g1.x, "bn grad_x " + name(t), 4);
      expect_close(g2.w, g1.w, "bn grad_w " + name(t), 10);
      expect_close(g2.b, g1.b, "bn grad_b " + name(t), 10);
      // Evaluation with the running statistics.
      ops::BatchNormResult e1 = ops::batch_norm(xg, gg, bg, rm1, rv1, false, 0.1, 1e-5);
      ops::BatchNormResult e2 = ops::batch_norm(ops::to_channels_last(xg), gg, bg, rm1, rv1, false, 0.1, 1e-5);
      expect_close(e2.y, e1.y, "bn eval " + name(t), 2);
    }
  }
}

// The fused epilogue (ReLU, shortcut add) on channels-last input: the CUDA kernels (16-byte packs when
// C allows: 24, 64 and 256 in bf16, also 20 in f32; element-wise otherwise) against the CPU kernels.
// The backward is fed the CPU's output as y, so both sides mask the same elements.
TEST(CudaChannelsLast, BatchNormEpilogueMatchesCpu) {
  KILN_REQUIRE_CUDA();
  for (DType t : {DType::F32, DType::BF16}) {
    for (std::int64_t c : {20, 24, 64, 256}) {
      for (bool residual : {false, true}) {
        for (bool relu : {false, true}) {
          const std::string what =
              name(t) + " C=" + std::to_string(c) + (residual ? " residual" : "") + (relu ? " relu" : "");
          Tensor x = randn({6, c, 5, 7}, 30, t, 1.0, 0.5), r = randn({6, c, 5, 7}, 31, t);
          Tensor gamma = randn({c}, 32, DType::F32), beta = randn({c}, 33, DType::F32);
          Tensor rm_c = Tensor::zeros({c}, DType::F32), rv_c = Tensor::ones({c}, DType::F32);
          Tensor rm_g = on(rm_c, gpu()), rv_g = on(rv_c, gpu());
          const ops::BatchNormEpilogue epi_c{residual ? r : Tensor(), relu};
          const ops::BatchNormEpilogue epi_g{residual ? ops::to_channels_last(on(r, gpu())) : Tensor(), relu};
          ops::BatchNormResult want = ops::batch_norm(x, gamma, beta, rm_c, rv_c, true, 0.1, 1e-5, epi_c);
          Tensor xg = ops::to_channels_last(on(x, gpu())), gg = on(gamma, gpu()), bg = on(beta, gpu());
          ops::BatchNormResult got = ops::batch_norm(xg, gg, bg, rm_g, rv_g, true, 0.1, 1e-5, epi_g);
          EXPECT_TRUE(ops::is_channels_last(got.y)) << what;
          expect_close(on(got.y, Device::cpu()), want.y, "bn epilogue y " + what, 2);
          expect_close(on(got.save_mean, Device::cpu()), want.save_mean, "bn epilogue mean " + what);
          expect_close(on(got.save_invstd, Device::cpu()), want.save_invstd, "bn epilogue invstd " + what, 10);
          expect_close(on(rv_g, Device::cpu()), rv_c, "bn epilogue running var " + what, 10);
          Tensor gy = randn(x.shape(), 34, t);
          ops::BatchNormEpilogueGrads gw = ops::batch_norm_epilogue_backward(
              gy, x, want.y, relu, gamma, want.save_mean, want.save_invstd, true, true, true, residual);
          ops::BatchNormEpilogueGrads gg2 = ops::batch_norm_epilogue_backward(
              ops::to_channels_last(on(gy, gpu())), xg, ops::to_channels_last(on(want.y, gpu())), relu, gg,
              got.save_mean, got.save_invstd, true, true, true, residual);
          EXPECT_TRUE(ops::is_channels_last(gg2.x)) << what;
          expect_close(on(gg2.x, Device::cpu()), gw.x, "bn epilogue grad_x " + what, 4);
          expect_close(on(gg2.w, Device::cpu()), gw.w, "bn epilogue grad_w " + what, 10);
          expect_close(on(gg2.b, Device::cpu()), gw.b, "bn epilogue grad_b " + what, 10);
          if (residual) expect_close(on(gg2.residual, Device::cpu()), gw.residual, "bn epilogue grad_res " + what);
        }
      }
    }
  }
}

// Layer norm has no channels-last kernel: a channels-last input is made contiguous, and its
// gradient must be allocated contiguous too (the kernel writes it as such).
TEST(CudaChannelsLast, LayerNormOfChannelsLastInputMatchesContiguous) {
  KILN_REQUIRE_CUDA();
  Tensor x = on(randn({2, 4, 3, 8}, 20, DType::F32), gpu()), w = on(randn({8}, 21, DType::F32), gpu());
  Tensor b = on(randn({8}, 22, DType::F32), gpu()), gy = on(randn({2, 4, 3, 8}, 23, DType::F32), gpu());
  ops::LayerNormResult r1 = ops::layer_norm(x, w, b, 1e-5);
  ops::LayerNormResult r2 = ops::layer_norm(ops::to_channels_last(x), w, b, 1e-5);
  expect_close(r2.y, r1.y, "layer norm y");
  ops::NormGrads g1 = ops::layer_norm_backward(gy, x, w, r1.mean, r1.rstd, true, true, true);
  ops::NormGrads g2 = ops::layer_norm_backward(ops::to_channels_last(gy), ops::to_channels_last(x), w, r2.mean, r2.rstd,
                                               true, true, true);
  expect_close(g2.x, g1.x, "layer norm grad_x", 4);
  expect_close(g2.w, g1.w, "layer norm grad_w", 4);
}

TEST(CudaChannelsLast, ResidualBlockGradientsMatchNchw) {
  KILN_REQUIRE_CUDA();
  for (DType t : {DType::F32, DType::BF16}) {
    auto run = [t](bool channels_last) {
      Tensor x = on(randn({8, 16, 8, 8}, 10, t), gpu()).requires_grad_();
      Tensor w1 = on(randn({16, 16, 3, 3}, 11, t, 0.2), gpu()).requires_grad_();
      Tensor w2 = on(randn({32, 16, 3, 3}, 12, t, 0.2), gpu()).requires_grad_();
      Tensor ws = on(randn({32, 16, 1, 1}, 13, t, 0.2), gpu()).requires_grad_();
      Tensor g1 = Tensor::ones({16}, DType::F32, gpu()).requires_grad_(),
             b1 = Tensor::zeros({16}, DType::F32, gpu()).requires_grad_();
      Tensor g2 = Tensor::ones({32}, DType::F32, gpu()).requires_grad_(),
             b2 = Tensor::zeros({32}, DType::F32, gpu()).requires_grad_();
      ops::Conv2dParams p3, p1, p3s;
      p3.pad_h = p3.pad_w = 1;
      p3s = p3;
      p3s.stride_h = p3s.stride_w = 2;
      p1.stride_h = p1.stride_w = 2;
      Tensor in = channels_last ? to_channels_last(x) : x;
      Tensor h = relu(kiln::batch_norm(kiln::conv2d(in, w1, Tensor(), p3), g1, b1, Tensor(), Tensor(), true));
      Tensor main = kiln::batch_norm(kiln::conv2d(h, w2, Tensor(), p3s), g2, b2, Tensor(), Tensor(), true);
      Tensor y = relu(add(main, kiln::conv2d(in, ws, Tensor(), p1)));
      Tensor pooled = adaptive_avg_pool2d(y, 1, 1);
      Tensor loss = sum(mul(pooled, pooled).to(DType::F32));
      loss.backward();
      return std::vector<Tensor>{y, x.grad(), w1.grad(), w2.grad(), ws.grad(), g1.grad(), b2.grad()};
    };
    std::vector<Tensor> a = run(false), b = run(true);
    EXPECT_TRUE(ops::is_channels_last(b[0])) << "the block's output stays channels-last";
    const char* names[] = {"output", "grad x", "grad w1", "grad w2", "grad shortcut", "grad gamma1", "grad beta2"};
    for (std::size_t i = 0; i < a.size(); ++i)
      expect_close(on(b[i], Device::cpu()), on(a[i], Device::cpu()), std::string(names[i]) + " " + name(t), 10);
  }
}

}  // namespace channels_last_test
}  // namespace kiln
