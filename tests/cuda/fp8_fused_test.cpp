// The fused FP8 kernels on CUDA: the batched delayed update gives the CPU's bits; the norm / SwiGLU
// kernels with FP8 output give the bytes, amax and scale_inv of the CUDA cast of the CUDA plain op's
// output (same scale); the block transpose-cast gives both orientations' CPU bits on whole 128-tiles
// too (fp8_test.cpp covers partial tiles); a norm -> fp8_linear -> SwiGLU -> fp8_linear chain fed the
// producers' casts equals the unfused chain bit for bit on the GPU. Skips without a GPU.
#include <gtest/gtest.h>

#include <utility>

#include "../fp8/fp8_test_util.h"
#include "kiln/autograd/functions.h"
#include "kiln/ops/copy.h"
#include "kiln/te/fp8_linear.h"
#include "kiln/te/fused_norm.h"
#include "kiln/te/swiglu.h"
#include "test_util.h"

namespace kiln {
namespace fp8_fused_test {

using cudatest::gpu;
using fp8test::bytes;
using fp8test::floats;

// Any floating tensor's values as float32 on the host (bf16 included).
std::vector<float> f32s(const Tensor& t) { return t.to(Device::cpu()).to(DType::F32).to_vector<float>(); }

TEST(CudaFp8Fused, BatchedDelayedUpdateGivesTheCpuBits) {
  KILN_REQUIRE_CUDA();
  for (auto algo : {ops::AmaxComputeAlgo::Max, ops::AmaxComputeAlgo::MostRecent}) {
    std::vector<ops::Fp8DelayedScalingRef> cpu, cuda;
    for (int i = 0; i < 45; ++i) {  // two launches (32 a launch)
      const std::int64_t len = 1 + i % 4;
      const Tensor h = Tensor::rand({len}, 70 + static_cast<std::uint64_t>(i)) * (0.5 + i);
      const float sm = ops::fp8_scaled_max(i % 2 ? DType::F8E5M2 : DType::F8E4M3, i % 3);
      cpu.push_back({h.clone(), Tensor::full({1}, 2.0), Tensor::ones({1}), sm});
      cuda.push_back({h.to(gpu()), Tensor::full({1}, 2.0).to(gpu()), Tensor::ones({1}).to(gpu()), sm});
    }
    for (int step = 0; step < 3; ++step) {
      ops::fp8_delayed_scaling_update_many(cpu, algo);
      ops::fp8_delayed_scaling_update_many(cuda, algo);
    }
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_EQ(floats(cuda[i].amax_history), floats(cpu[i].amax_history)) << i;
      EXPECT_EQ(floats(cuda[i].scale), floats(cpu[i].scale)) << i;
      EXPECT_EQ(floats(cuda[i].scale_inv), floats(cpu[i].scale_inv)) << i;
    }
  }
}

TEST(CudaFp8Fused, BlockTransposeCastGivesTheCpuBitsOnWholeTiles) {
  KILN_REQUIRE_CUDA();
  const Tensor x = fp8test::spread_values(256, 384, 5, -8, 8);
  ops::Fp8CastOptions o;
  o.power_of_two_scales = true;
  for (DType in : {DType::F32, DType::BF16})
    for (auto layout : {ScalingLayout::Block1x128, ScalingLayout::Block128x128}) {
      const Tensor xin = x.to(in);
      Fp8Tensor cr = ops::fp8_empty(256, 384, DType::F8E4M3, layout, Device::cpu());
      Fp8Tensor cc = ops::fp8_empty(384, 256, DType::F8E4M3, layout, Device::cpu());
      Fp8Tensor gr = ops::fp8_empty(256, 384, DType::F8E4M3, layout, gpu());
      Fp8Tensor gc = ops::fp8_empty(384, 256, DType::F8E4M3, layout, gpu());
      ops::fp8_quantize_transpose_into(xin, cr, cc, o);
      ops::fp8_quantize_transpose_into(xin.to(gpu()), gr, gc, o);
      const std::string what = std::string(dtype_name(in)) + " " + std::string(scaling_layout_name(layout));
      EXPECT_EQ(bytes(gr.data), bytes(cr.data)) << what;
      EXPECT_EQ(bytes(gc.data), bytes(cc.data)) << what;
      for (auto member : {&Fp8Tensor::scale, &Fp8Tensor::scale_inv, &Fp8Tensor::amax}) {
        EXPECT_EQ(floats(gr.*member), floats(cr.*member)) << what;
        EXPECT_EQ(floats(gc.*member), floats(cc.*member)) << what;
      }
    }
}

// Per-tensor transpose-casts of 16-bit inputs on whole 64 x 64 tiles take the tiled kernel with
// 16-byte loads and 8-byte stores (and current scaling the vectorised amax): the CPU's bytes, scales
// and amax, for both formats, delayed and current scaling, one tile and many.
TEST(CudaFp8Fused, PerTensorTransposeCastOnWhole64TilesGivesTheCpuBits) {
  KILN_REQUIRE_CUDA();
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{64, 64}, {192, 320}, {512, 128}}) {
    const Tensor x = fp8test::spread_values(rows, cols, 11, -9, 9);
    for (DType in : {DType::BF16, DType::F16})
      for (DType t : {DType::F8E4M3, DType::F8E5M2})
        for (bool current : {false, true}) {
          ops::Fp8CastOptions o;
          o.current_scaling = current;
          const Tensor xin = x.to(in);
          Fp8Tensor cr = ops::fp8_empty(rows, cols, t, ScalingLayout::PerTensor, Device::cpu());
          Fp8Tensor cc = ops::fp8_empty(cols, rows, t, ScalingLayout::PerTensor, Device::cpu());
          Fp8Tensor gr = ops::fp8_empty(rows, cols, t, ScalingLayout::PerTensor, gpu());
          Fp8Tensor gc = ops::fp8_empty(cols, rows, t, ScalingLayout::PerTensor, gpu());
          if (!current)
            for (auto* q : {&cr, &cc, &gr, &gc}) ops::fill(q->scale, 0.37);
          ops::fp8_quantize_transpose_into(xin, cr, cc, o);
          ops::fp8_quantize_transpose_into(xin.to(gpu()), gr, gc, o);
          const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " " +
                                   std::string(dtype_name(in)) + " -> " + std::string(dtype_name(t)) +
                                   (current ? " current" : " delayed");
          EXPECT_EQ(bytes(gr.data), bytes(cr.data)) << what;
          EXPECT_EQ(bytes(gc.data), bytes(cc.data)) << what;
          for (auto member : {&Fp8Tensor::scale, &Fp8Tensor::scale_inv, &Fp8Tensor::amax}) {
            EXPECT_EQ(floats(gr.*member), floats(cr.*member)) << what;
            EXPECT_EQ(floats(gc.*member), floats(cc.*member)) << what;
          }
        }
  }
}

Fp8Tensor scaled(std::int64_t rows, std::int64_t cols, DType fp8, double scale) {
  Fp8Tensor q = ops::fp8_empty(rows, cols, fp8, ScalingLayout::PerTensor, gpu());
  ops::fill(q.scale, scale);
  return q;
}

void expect_same_cast(const Fp8Tensor& fused, const Fp8Tensor& plain, const std::string& what) {
  EXPECT_EQ(bytes(fused.data), bytes(plain.data)) << what;
  EXPECT_EQ(floats(fused.amax), floats(plain.amax)) << what;
  EXPECT_EQ(floats(fused.scale_inv), floats(plain.scale_inv)) << what;
}

TEST(CudaFp8Fused, NormAndSwigluFp8OutputsAreTheUnfusedCastsBytes) {
  KILN_REQUIRE_CUDA();
  const std::int64_t rows = 64;
  for (std::int64_t cols : {768, 9216})  // both register-tile widths of the norm kernel
    for (DType dt : {DType::F32, DType::BF16})
      for (bool rms : {false, true}) {
        const Tensor x = (Tensor::randn({rows, cols}, 1) * 3.0).to(dt).to(gpu());
        const Tensor res = Tensor::randn({rows, cols}, 2).to(dt).to(gpu());
        const Tensor w = (Tensor::randn({cols}, 3) * 0.5 + 1.0).to(dt).to(gpu());
        const Tensor b = (Tensor::randn({cols}, 4) * 0.1).to(dt).to(gpu());
        const auto [y, s] = rms ? te::add_rms_norm(x, res, w, 1e-5) : te::add_layer_norm(x, res, w, b, 1e-5);
        Fp8Tensor plain = scaled(rows, cols, DType::F8E4M3, 97.0), fused = scaled(rows, cols, DType::F8E4M3, 97.0);
        ops::fp8_quantize_into(y, plain);
        const auto s8 =
            (rms ? te::add_rms_norm_fp8(x, res, w, 1e-5, fused) : te::add_layer_norm_fp8(x, res, w, b, 1e-5, fused))
                .second;
        const std::string what = std::to_string(cols) + " " + std::string(dtype_name(dt)) + (rms ? " rms" : " layer");
        expect_same_cast(fused, plain, what);
        EXPECT_EQ(f32s(s8), f32s(s)) << what;
      }
  for (DType dt : {DType::F32, DType::BF16})
    for (DType fp8 : {DType::F8E4M3, DType::F8E5M2}) {
      const Tensor x = (Tensor::randn({96, 2 * 256}, 9) * 2.5).to(dt).to(gpu());
      Fp8Tensor plain = scaled(96, 256, fp8, 41.0), fused = scaled(96, 256, fp8, 41.0);
      ops::fp8_quantize_into(te::swiglu(x), plain);
      te::swiglu_fp8(x, fused);
      expect_same_cast(fused, plain, "swiglu " + std::string(dtype_name(dt)) + " " + std::string(dtype_name(fp8)));
    }
}

struct Chain {
  std::vector<float> y, dx, dnorm_w, dw1, dw2;
};

Chain run_chain(bool fused) {
  te::Fp8Recipe r;
  r.recipe = te::Fp8ScalingRecipe::Delayed;
  const std::int64_t rows = 128, h = 256, f = 384;
  auto fresh = [] {
    return te::Fp8LinearState{te::Fp8ScalingState::fresh(1, gpu()), te::Fp8ScalingState::fresh(1, gpu()),
                              te::Fp8ScalingState::fresh(1, gpu()), nullptr, nullptr};
  };
  te::Fp8LinearState s1 = fresh(), s2 = fresh();
  const Tensor nw = (Tensor::randn({h}, 11) * 0.2 + 1.0).to(DType::BF16).to(gpu()).requires_grad_(true);
  const Tensor w1 = (Tensor::randn({2 * f, h}, 12) * 0.05).to(DType::BF16).to(gpu()).requires_grad_(true);
  const Tensor w2 = (Tensor::randn({h, f}, 13) * 0.05).to(DType::BF16).to(gpu()).requires_grad_(true);
  Chain c;
  for (int step = 0; step < 3; ++step) {
    const auto seed = static_cast<std::uint64_t>(step);
    Tensor x = (Tensor::randn({rows, h}, 20 + seed) * 2.0).to(DType::BF16).to(gpu()).requires_grad_(true);
    Tensor y;
    if (fused) {
      const Fp8Tensor q1 = te::fp8_linear_input_cast(s1, r, rows, h, gpu());
      const Tensor fc1 =
          te::fp8_linear(te::add_layer_norm_fp8(x, Tensor(), nw, Tensor(), 1e-5, q1).first, w1, Tensor(), r, &s1, q1);
      const Fp8Tensor q2 = te::fp8_linear_input_cast(s2, r, rows, f, gpu());
      y = te::fp8_linear(te::swiglu_fp8(fc1, q2), w2, Tensor(), r, &s2, q2);
    } else {
      const Tensor fc1 =
          te::fp8_linear(te::add_layer_norm(x, Tensor(), nw, Tensor(), 1e-5).first, w1, Tensor(), r, &s1);
      y = te::fp8_linear(te::swiglu(fc1), w2, Tensor(), r, &s2);
    }
    sum(mul(y, Tensor::randn(y.shape(), 40 + seed).to(DType::BF16).to(gpu()))).backward();
    c.y = f32s(y.detach());
    c.dx = f32s(x.grad());
  }
  c.dnorm_w = f32s(nw.grad());
  c.dw1 = f32s(w1.grad());
  c.dw2 = f32s(w2.grad());
  return c;
}

TEST(CudaFp8Fused, FusedChainEqualsTheUnfusedChainBitForBit) {
  KILN_REQUIRE_CUDA();
  const Chain a = run_chain(true), b = run_chain(false);
  EXPECT_EQ(a.y, b.y);
  EXPECT_EQ(a.dx, b.dx);
  EXPECT_EQ(a.dnorm_w, b.dnorm_w);
  EXPECT_EQ(a.dw1, b.dw1);
  EXPECT_EQ(a.dw2, b.dw2);
}

}  // namespace fp8_fused_test
}  // namespace kiln
