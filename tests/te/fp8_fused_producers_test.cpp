// The FP8-output forms of the fused norms and SwiGLU (te::add_*_norm_fp8, te::swiglu_fp8) on the
// CPU: their bytes, amax and scale_inv equal fp8_quantize_into of the high-precision output the
// plain op returns (same scale), their sums equal the plain op's, and a norm -> fp8_linear chain fed
// the producer's cast gives bit for bit the outputs, gradients and delayed state of the unfused
// chain. (tests/cuda/fp8_fused_test.cpp checks the CUDA kernels the same way.)
#include <gtest/gtest.h>

#include "kiln/autograd/functions.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/fp8.h"
#include "kiln/te/fp8_linear.h"
#include "kiln/te/fused_norm.h"
#include "kiln/te/swiglu.h"

namespace kiln::te {
namespace fp8_fused_producers_test {

std::vector<std::uint8_t> bytes(const Tensor& t) {
  const Tensor c = t.to(Device::cpu());
  const auto* p = static_cast<const std::uint8_t*>(c.data_ptr());
  return {p, p + c.numel()};
}
std::vector<float> floats(const Tensor& t) { return t.to(Device::cpu()).to(DType::F32).to_vector<float>(); }

Fp8Tensor with_scale(std::int64_t rows, std::int64_t cols, DType fp8, float scale) {
  Fp8Tensor q = ops::fp8_empty(rows, cols, fp8, ScalingLayout::PerTensor, Device::cpu());
  ops::fill(q.scale, scale);
  return q;
}

void expect_same_cast(const Fp8Tensor& fused, const Fp8Tensor& plain, const std::string& what) {
  EXPECT_EQ(bytes(fused.data), bytes(plain.data)) << what;
  EXPECT_EQ(floats(fused.amax), floats(plain.amax)) << what;
  EXPECT_EQ(floats(fused.scale_inv), floats(plain.scale_inv)) << what;
}

TEST(Fp8FusedProducers, NormsWriteTheBytesOfTheUnfusedCast) {
  const std::int64_t rows = 24, cols = 96;
  for (DType dt : {DType::F32, DType::BF16})
    for (bool rms : {false, true})
      for (bool with_residual : {false, true})
        for (DType fp8 : {DType::F8E4M3, DType::F8E5M2}) {
          const Tensor x = (Tensor::randn({2, rows / 2, cols}, 1) * 3.0).to(dt);
          const Tensor res = with_residual ? Tensor::randn({2, rows / 2, cols}, 2).to(dt) : Tensor();
          const Tensor w = (Tensor::randn({cols}, 3) * 0.5 + 1.0).to(dt), b = (Tensor::randn({cols}, 4) * 0.1).to(dt);
          const auto [y, s] = rms ? add_rms_norm(x, res, w, 1e-5) : add_layer_norm(x, res, w, b, 1e-5);
          // A scale that pushes some values past fp8's range (saturation) and some into subnormals.
          const float scale = fp8 == DType::F8E4M3 ? 97.0f : 3000.0f;
          Fp8Tensor plain = with_scale(rows, cols, fp8, scale), fused = with_scale(rows, cols, fp8, scale);
          ops::fp8_quantize_into(y.reshape({rows, cols}), plain);
          const auto [placeholder, s8] =
              rms ? add_rms_norm_fp8(x, res, w, 1e-5, fused) : add_layer_norm_fp8(x, res, w, b, 1e-5, fused);
          const std::string what = std::string(dtype_name(dt)) + (rms ? " rms" : " layer") +
                                   (with_residual ? " +residual " : " ") + std::string(dtype_name(fp8));
          expect_same_cast(fused, plain, what);
          EXPECT_EQ(floats(s8), floats(s)) << what;
          EXPECT_EQ(placeholder.shape(), y.shape()) << what;
        }
}

TEST(Fp8FusedProducers, SwigluWritesTheBytesOfTheUnfusedCast) {
  for (DType dt : {DType::F32, DType::BF16})
    for (DType fp8 : {DType::F8E4M3, DType::F8E5M2}) {
      const Tensor x = (Tensor::randn({3, 16, 2 * 48}, 7) * 2.5).to(dt);
      const Tensor y = swiglu(x);
      Fp8Tensor plain = with_scale(48, 48, fp8, 41.0f), fused = with_scale(48, 48, fp8, 41.0f);
      ops::fp8_quantize_into(y.reshape({48, 48}), plain);
      const Tensor placeholder = swiglu_fp8(x, fused);
      expect_same_cast(fused, plain, std::string(dtype_name(dt)) + " " + std::string(dtype_name(fp8)));
      EXPECT_EQ(placeholder.shape(), y.shape());
    }
}

TEST(Fp8FusedProducers, RefuseAMisfitOutput) {
  const Tensor x = Tensor::randn({16, 32}, 1), w = Tensor::ones({32});
  Fp8Tensor wrong = with_scale(16, 16, DType::F8E4M3, 1.0f);
  EXPECT_THROW(add_rms_norm_fp8(x, Tensor(), w, 1e-5, wrong), Error);
  EXPECT_THROW(swiglu_fp8(x, with_scale(16, 8, DType::F8E4M3, 1.0f)), Error);
  Fp8Tensor blocks = ops::fp8_empty(16, 32, DType::F8E4M3, ScalingLayout::Block1x128, Device::cpu());
  EXPECT_THROW(add_layer_norm_fp8(x, Tensor(), w, Tensor(), 1e-5, blocks), Error);
}

struct ChainResult {
  std::vector<float> y, dx, dnorm_w, dw;
  Fp8LinearState st;
};

// norm -> fp8_linear (delayed), fused (the norm writes the linear's input cast) or not, then two more
// steps so the delayed scales the later steps use come from the earlier casts.
ChainResult chain(bool fused, bool rms, bool swiglu_too) {
  Fp8Recipe r;
  r.recipe = Fp8ScalingRecipe::Delayed;
  r.amax_history_len = 2;
  r.amax_compute_algo = ops::AmaxComputeAlgo::Max;
  const std::int64_t rows = 32, h = 64, f = 48;
  ChainResult out;
  out.st = {Fp8ScalingState::fresh(2, Device::cpu()), Fp8ScalingState::fresh(2, Device::cpu()),
            Fp8ScalingState::fresh(2, Device::cpu()), nullptr, nullptr};
  Fp8LinearState st2{Fp8ScalingState::fresh(2, Device::cpu()), Fp8ScalingState::fresh(2, Device::cpu()),
                     Fp8ScalingState::fresh(2, Device::cpu()), nullptr, nullptr};
  const Tensor norm_w = (Tensor::randn({h}, 11) * 0.2 + 1.0).requires_grad_(true);
  const Tensor w1 = (Tensor::randn({swiglu_too ? 2 * f : f, h}, 12) * 0.1).requires_grad_(true);
  const Tensor w2 = (Tensor::randn({h, f}, 13) * 0.1).requires_grad_(true);
  for (int step = 0; step < 3; ++step) {
    Tensor x = (Tensor::randn({rows, h}, 20 + static_cast<std::uint64_t>(step)) * (2.0 + step)).requires_grad_(true);
    Tensor y;
    if (fused) {
      const Fp8Tensor q = fp8_linear_input_cast(out.st, r, rows, h, Device::cpu());
      const Tensor p = rms ? add_rms_norm_fp8(x, Tensor(), norm_w, 1e-5, q).first
                           : add_layer_norm_fp8(x, Tensor(), norm_w, Tensor(), 1e-5, q).first;
      y = fp8_linear(p, w1, Tensor(), r, &out.st, q);
      if (swiglu_too) {
        const Fp8Tensor q2 = fp8_linear_input_cast(st2, r, rows, f, Device::cpu());
        y = fp8_linear(swiglu_fp8(y, q2), w2, Tensor(), r, &st2, q2);
      }
    } else {
      const Tensor n = rms ? add_rms_norm(x, Tensor(), norm_w, 1e-5).first
                           : add_layer_norm(x, Tensor(), norm_w, Tensor(), 1e-5).first;
      y = fp8_linear(n, w1, Tensor(), r, &out.st);
      if (swiglu_too) y = fp8_linear(swiglu(y), w2, Tensor(), r, &st2);
    }
    const Tensor g = Tensor::randn(y.shape(), 30 + static_cast<std::uint64_t>(step));
    sum(mul(y, g)).backward();
    out.y = floats(y.detach());
    out.dx = floats(x.grad());
  }
  out.dnorm_w = floats(norm_w.grad());
  out.dw = floats(w1.grad());
  return out;
}

TEST(Fp8FusedProducers, FusedChainEqualsTheUnfusedChainBitForBit) {
  for (bool rms : {false, true})
    for (bool swiglu_too : {false, true}) {
      const ChainResult a = chain(true, rms, swiglu_too), b = chain(false, rms, swiglu_too);
      const std::string what = std::string(rms ? "rms" : "layer") + (swiglu_too ? " + swiglu" : "");
      EXPECT_EQ(a.y, b.y) << what;
      EXPECT_EQ(a.dx, b.dx) << what;
      EXPECT_EQ(a.dnorm_w, b.dnorm_w) << what;
      EXPECT_EQ(a.dw, b.dw) << what;
      EXPECT_EQ(floats(a.st.input.amax_history), floats(b.st.input.amax_history)) << what;
      EXPECT_EQ(floats(a.st.input.scale), floats(b.st.input.scale)) << what;
    }
}

}  // namespace fp8_fused_producers_test
}  // namespace kiln::te
