// Gradient-accumulation fusion (autograd/grad_accumulation_fusion.h): with it on, a bf16 linear's
// weight gradient is added into the weight's fp32 .grad by the GEMM itself. The result is the
// fp32 product of the bf16 operands added to what .grad held (no 16-bit rounding of the product);
// the grad-ready hook fires once, with the gradient complete; a weight used twice sums both uses;
// the zero-bubble store's flush fuses too and equals the plain backward bit for bit;
// autograd::grad() and weights without an fp32 .grad take the plain way.
#include "kiln/autograd/grad_accumulation_fusion.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/functions.h"
#include "kiln/autograd/grad_ready_hook.h"
#include "kiln/autograd/weight_grad_store.h"
#include "kiln/ops/linalg.h"
#include "kiln/runtime/backend.h"
#include "kiln/te/gelu_mlp.h"

namespace kiln {
namespace grad_accumulation_fusion_test {

using autograd::GradientAccumulationFusionScope;

// dy [rows, out] and x [rows, in] in float64 from their (bf16) values: dy^T x [out, in].
std::vector<double> product_f64(const Tensor& dy, const Tensor& x) {
  const std::vector<double> a = dy.to(DType::F64).to_vector<double>(), b = x.to(DType::F64).to_vector<double>();
  const std::int64_t rows = dy.shape()[0], out = dy.shape()[1], in = x.shape()[1];
  std::vector<double> r(static_cast<std::size_t>(out * in), 0.0);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t o = 0; o < out; ++o)
      for (std::int64_t j = 0; j < in; ++j)
        r[static_cast<std::size_t>(o * in + j)] +=
            a[static_cast<std::size_t>(i * out + o)] * b[static_cast<std::size_t>(i * in + j)];
  return r;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

TEST(GemmInto, Bf16OperandsIntoAFloat32OutputAccumulateWithoutRounding) {
  const Tensor a = Tensor::randn({1, 37, 5}, 1).to(DType::BF16), b = Tensor::randn({1, 37, 7}, 2).to(DType::BF16);
  Tensor out = Tensor::randn({1, 5, 7}, 3);
  const std::vector<float> before = out.to_vector<float>();
  ops::gemm_into(a, b, out, /*trans_a=*/true, /*trans_b=*/false, 1.0, 1.0);
  std::vector<double> expected = product_f64(a.view({37, 5}), b.view({37, 7}));
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] += before[i];
  EXPECT_LT(max_abs_diff(out.to_vector<float>(), expected), 1e-5);
  // Another dtype for the output than the operands' or float32 is refused, naming the output.
  Tensor wrong = Tensor::zeros({1, 5, 7}, DType::F64);
  try {
    ops::gemm_into(a, b, wrong, true, false, 1.0, 0.0);
    FAIL() << "a float64 output for bf16 operands was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("float32 for bf16/f16 operands"), std::string::npos) << e.what();
  }
}

struct Bf16Linear {
  Tensor w = Tensor::randn({6, 9}, 11).to(DType::BF16).requires_grad_();
  Tensor x = Tensor::randn({4, 3, 9}, 12).to(DType::BF16);
  Tensor dy = Tensor::randn({4, 3, 6}, 13).to(DType::BF16);
  Tensor initial = Tensor::randn({6, 9}, 14);  // what the fp32 buffer held before this backward
  Bf16Linear() { w.set_grad(initial.clone()); }
  void backward() const { linear(x, w, Tensor()).backward(dy); }
  std::vector<double> exact() const {
    std::vector<double> e = product_f64(dy.view({12, 6}), x.view({12, 9}));
    const std::vector<float> init = initial.to_vector<float>();
    for (std::size_t i = 0; i < e.size(); ++i) e[i] += init[i];
    return e;
  }
};

TEST(GradientAccumulationFusion, TheWeightGradientReachesTheFp32GradUnrounded) {
  Bf16Linear fused, plain;
  {
    GradientAccumulationFusionScope on(true);
    fused.backward();
  }
  plain.backward();  // off by default
  const std::vector<double> exact = fused.exact();
  const double fused_error = max_abs_diff(fused.w.grad().to_vector<float>(), exact);
  const double plain_error = max_abs_diff(plain.w.grad().to_vector<float>(), exact);
  EXPECT_LT(fused_error, 1e-5);
  // The plain way rounds the product to bf16 before adding it: visibly further from the exact sum.
  EXPECT_GT(plain_error, 10 * fused_error);
  EXPECT_LT(plain_error, 0.1);
  EXPECT_FALSE(autograd::gradient_accumulation_fusion());  // the scope restored the setting
}

TEST(GradientAccumulationFusion, TheHookFiresOnceWithBothUsesOfAWeightSummed) {
  Bf16Linear t;
  int fired = 0;
  std::vector<float> seen;
  auto hook = autograd::register_grad_ready_hook(t.w, [&](const Tensor& w) {
    ++fired;
    seen = w.grad().to_vector<float>();
  });
  GradientAccumulationFusionScope on(true);
  // The weight used by two linears: both GEMMs add into .grad; the hook sees the sum.
  const Tensor y = linear(t.x, t.w, Tensor()) + linear(t.x, t.w, Tensor());
  y.backward(t.dy);
  EXPECT_EQ(fired, 1);
  std::vector<double> expected = product_f64(t.dy.view({12, 6}), t.x.view({12, 9}));
  const std::vector<float> init = t.initial.to_vector<float>();
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = init[i] + 2 * expected[i];
  EXPECT_LT(max_abs_diff(seen, expected), 2e-5);
  EXPECT_EQ(seen, t.w.grad().to_vector<float>());
}

TEST(GradientAccumulationFusion, TheZeroBubbleFlushFusesAndEqualsThePlainBackward) {
  Bf16Linear plain, split;
  int fired = 0;
  auto hook = autograd::register_grad_ready_hook(split.w, [&](const Tensor&) { ++fired; });
  GradientAccumulationFusionScope on(true);
  plain.backward();
  autograd::WeightGradStore store;
  {
    autograd::WeightGradStoreScope defer(&store);
    split.backward();
  }
  EXPECT_EQ(fired, 0);
  EXPECT_EQ(store.size(), 1u);
  store.flush();
  EXPECT_EQ(fired, 1);
  EXPECT_EQ(split.w.grad().to_vector<float>(), plain.w.grad().to_vector<float>());
  EXPECT_LT(max_abs_diff(split.w.grad().to_vector<float>(), split.exact()), 1e-5);
}

TEST(GradientAccumulationFusion, AutogradGradAndWeightsWithoutAnFp32GradTakeThePlainWay) {
  GradientAccumulationFusionScope on(true);
  // autograd::grad returns the gradient (bf16, the weight's dtype) and leaves .grad alone.
  Bf16Linear t;
  const std::vector<float> before = t.w.grad().to_vector<float>();
  const std::vector<Tensor> g = autograd::grad({linear(t.x, t.w, Tensor())}, {t.dy}, {t.w});
  ASSERT_TRUE(g[0].defined());
  EXPECT_EQ(g[0].dtype(), DType::BF16);
  EXPECT_EQ(t.w.grad().to_vector<float>(), before);
  // No .grad yet: the first backward creates it as before (the weight's dtype).
  Tensor w = Tensor::randn({6, 9}, 15).to(DType::BF16).requires_grad_();
  linear(t.x, w, Tensor()).backward(t.dy);
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::BF16);
  // An fp32 weight: nothing to fuse.
  Tensor w32 = Tensor::randn({6, 9}, 16).requires_grad_();
  w32.set_grad(Tensor::zeros({6, 9}, DType::F32));
  EXPECT_FALSE(autograd::fusable_main_grad(w32).defined());
}

TEST(GradientAccumulationFusion, TheGeluMlpsWeightsFuseToo) {
  Tensor w1 = Tensor::randn({8, 5}, 21).to(DType::BF16).requires_grad_();
  Tensor w2 = Tensor::randn({5, 8}, 22).to(DType::BF16).requires_grad_();
  const Tensor b1 = Tensor::randn({8}, 23).to(DType::BF16), x = Tensor::randn({7, 5}, 24).to(DType::BF16);
  const Tensor dy = Tensor::randn({7, 5}, 25).to(DType::BF16);
  auto run = [&](bool fusion) {
    w1.set_grad(Tensor::zeros({8, 5}, DType::F32));
    w2.set_grad(Tensor::zeros({5, 8}, DType::F32));
    GradientAccumulationFusionScope scope(fusion);
    te::linear_gelu_linear(x, w1, b1, w2, Tensor()).backward(dy);
    return std::pair(w1.grad().to_vector<float>(), w2.grad().to_vector<float>());
  };
  const auto [plain1, plain2] = run(false);
  const auto [fused1, fused2] = run(true);
  // The same gradients, to the plain way's bf16 rounding of the products.
  for (std::size_t i = 0; i < plain1.size(); ++i)
    EXPECT_NEAR(fused1[i], plain1[i], 1e-2 * (1 + std::abs(plain1[i]))) << i;
  for (std::size_t i = 0; i < plain2.size(); ++i)
    EXPECT_NEAR(fused2[i], plain2[i], 1e-2 * (1 + std::abs(plain2[i]))) << i;
  EXPECT_NE(fused1, plain1);  // and the fused ones are not the rounded ones
}

// The embedding's rows go into the fp32 table unrounded: exactly the fp32 sums of the bf16 rows
// (a row hit by several tokens sums them), on top of what the buffer held; the hook fires once.
void embedding_rows_into_fp32(Device dev, std::int64_t vocab) {
  Tensor table = Tensor::randn({vocab, 6}, 41).to(DType::BF16).to(dev).requires_grad_();
  const Tensor initial = Tensor::randn({vocab, 6}, 42);
  table.set_grad(initial.clone().to(dev));  // a copy: .to() of a CPU tensor to the CPU is the tensor
  int fired = 0;
  auto hook = autograd::register_grad_ready_hook(table, [&](const Tensor&) { ++fired; });
  const std::vector<std::int64_t> ids = {3, 0, 3, 7, 3, 1, 7, 2, 5, 3};
  const Tensor idx = Tensor::from_vector(ids, {2, 5}).to(dev);
  const Tensor dy = Tensor::randn({2, 5, 6}, 43).to(DType::BF16);
  {
    GradientAccumulationFusionScope on(true);
    embedding(table, idx).backward(dy.to(dev));
  }
  EXPECT_EQ(fired, 1);
  const std::vector<float> before = initial.to_vector<float>();
  std::vector<double> expected(before.begin(), before.end());
  const std::vector<double> rows = dy.to(DType::F64).to_vector<double>();
  for (std::size_t t = 0; t < ids.size(); ++t)
    for (std::size_t j = 0; j < 6; ++j) expected[static_cast<std::size_t>(ids[t]) * 6 + j] += rows[t * 6 + j];
  EXPECT_LT(max_abs_diff(table.grad().to(Device::cpu()).to_vector<float>(), expected), 1e-5) << dev.str();
}

TEST(GradientAccumulationFusion, TheEmbeddingsRowsGoIntoTheFp32Table) { embedding_rows_into_fp32(Device::cpu(), 9); }

// On a GPU: cuBLASLt with bf16 operands and an fp32 output, beta 1, into the weight's buffer.
TEST(GradientAccumulationFusionCuda, TheGemmAddsIntoTheFp32GradOnTheDevice) {
  if (device_count(DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA device";
  const Device dev = Device::cuda(0);
  const Tensor x = Tensor::randn({64, 3, 96}, 31).to(DType::BF16), dy = Tensor::randn({64, 3, 80}, 32).to(DType::BF16);
  const Tensor initial = Tensor::randn({80, 96}, 33);
  Tensor w = Tensor::randn({80, 96}, 34).to(DType::BF16).to(dev).requires_grad_();
  w.set_grad(initial.to(dev));
  int fired = 0;
  auto hook = autograd::register_grad_ready_hook(w, [&](const Tensor&) { ++fired; });
  {
    GradientAccumulationFusionScope on(true);
    linear(x.to(dev), w, Tensor()).backward(dy.to(dev));
  }
  EXPECT_EQ(fired, 1);
  std::vector<double> expected = product_f64(dy.view({192, 80}), x.view({192, 96}));
  const std::vector<float> init = initial.to_vector<float>();
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] += init[i];
  EXPECT_LT(max_abs_diff(w.grad().to(Device::cpu()).to_vector<float>(), expected), 1e-4);
  // The embedding: a small table (the one-hot GEMM into the fp32 buffer) and a large one (fp32
  // atomics: above the GEMM's 64 MiB one-hot bound at these 10 tokens).
  embedding_rows_into_fp32(dev, 9);
  embedding_rows_into_fp32(dev, 4'000'000);
}

}  // namespace grad_accumulation_fusion_test
}  // namespace kiln
