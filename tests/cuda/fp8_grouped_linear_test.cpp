// te::fp8_grouped_linear on CUDA (per-expert cuBLASLt FP8 GEMMs after one read-back of the offsets)
// against the CPU reference (float64 accumulation there, f32 on the GPU): for every recipe, with
// experts of 0, 1, 17, 64 and 30 rows and unused rows after them, two steps (the delayed recipe's
// second casts with scales from the first) give the CPU's y, dx and dW, and the same delayed-scaling
// states afterwards; a small FP8 MoE GptModel trains to the CPU's losses. Skips without a GPU.
#include "kiln/te/fp8_grouped_linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "../fp8/fp8_test_util.h"
#include "kiln/autograd/functions.h"
#include "kiln/models/gpt_model.h"
#include "kiln/optim/optimizer.h"
#include "test_util.h"

namespace kiln {
namespace fp8_grouped_linear_test {

using cudatest::gpu;
using fp8test::floats;

double rel(const Tensor& got, const Tensor& want) {
  if (!got.defined() || !want.defined()) return std::numeric_limits<double>::infinity();  // a missing gradient fails
  const auto g = got.to(Device::cpu()).to(DType::F64).to_vector<double>();
  const auto w = want.to(Device::cpu()).to(DType::F64).to_vector<double>();
  double err = 0, scale = 1e-30;
  for (std::size_t i = 0; i < w.size(); ++i) {
    err = std::max(err, std::fabs(g[i] - w[i]));
    scale = std::max(scale, std::fabs(w[i]));
  }
  return err / scale;
}

// One test per recipe (a failure or a crash names its recipe).
class CudaFp8GroupedLinearRecipe : public ::testing::TestWithParam<te::Fp8ScalingRecipe> {};

TEST_P(CudaFp8GroupedLinearRecipe, MatchesTheCpu) {
  KILN_REQUIRE_CUDA();
  const std::vector<std::int64_t> offsets = {0, 0, 1, 18, 82, 112};  // 0, 1, 17, 64, 30 rows
  const std::int64_t experts = 5, rows = 115, in = 384, out = 272;
  const Tensor x = Tensor::randn({rows, in}, 1) * 2.0, w = Tensor::randn({experts, out, in}, 2) * 0.05,
               g = Tensor::randn({rows, out}, 3) * 1e-3;
  {
    const te::Fp8ScalingRecipe recipe = GetParam();
    te::Fp8Recipe r;
    r.recipe = recipe;
    r.amax_history_len = 4;
    r.amax_compute_algo = ops::AmaxComputeAlgo::Max;
    struct Side {
      Device d;
      te::Fp8GroupedLinearState st;
      Tensor y, dx, dw;
    };
    Side sides[2] = {{Device::cpu(), {}, {}, {}, {}}, {gpu(), {}, {}, {}, {}}};
    for (Side& s : sides) {
      s.st.input = te::Fp8ScalingState::fresh(4, s.d);
      s.st.grad_output = te::Fp8ScalingState::fresh(4, s.d);
      for (std::int64_t e = 0; e < experts; ++e) s.st.weight.push_back(te::Fp8ScalingState::fresh(4, s.d));
      const Tensor off = Tensor::from_vector(offsets, {experts + 1}).to(s.d);
      for (int step = 0; step < 2; ++step) {
        // Detached first: on the CPU .to() returns the tensor itself, which must not become a leaf
        // (the GPU side would then get a non-leaf copy without .grad).
        Tensor xv = x.detach().to(s.d).requires_grad_(true), wv = w.detach().to(s.d).requires_grad_(true);
        s.y = te::fp8_grouped_linear(xv, wv, off, r, &s.st);
        sum(mul(s.y, g.to(s.d))).backward();
        s.dx = xv.grad();
        s.dw = wv.grad();
      }
    }
    const std::string name(te::to_string(recipe));
    // The casts are bit-equal; the products are not: the CPU sums in float64, Hopper's FP8 tensor
    // cores keep about 14 mantissa bits between promotions (as CudaFp8Training's linear test).
    // Measured on the H200 2026-12-03: y off by 2.5e-4 of its largest element at K = 384.
    constexpr double kTol = 2e-3;
    EXPECT_LT(rel(sides[1].y, sides[0].y), kTol) << name;
    EXPECT_LT(rel(sides[1].dx, sides[0].dx), kTol) << name;
    EXPECT_LT(rel(sides[1].dw, sides[0].dw), kTol) << name;
    if (recipe == te::Fp8ScalingRecipe::Delayed) {
      for (auto member : {&te::Fp8GroupedLinearState::input, &te::Fp8GroupedLinearState::grad_output}) {
        EXPECT_EQ(floats((sides[1].st.*member).amax_history), floats((sides[0].st.*member).amax_history));
        EXPECT_EQ(floats((sides[1].st.*member).scale), floats((sides[0].st.*member).scale));
      }
      for (std::size_t e = 0; e < sides[0].st.weight.size(); ++e)
        EXPECT_EQ(floats(sides[1].st.weight[e].scale), floats(sides[0].st.weight[e].scale)) << "expert " << e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CudaFp8, CudaFp8GroupedLinearRecipe,
                         ::testing::Values(te::Fp8ScalingRecipe::Delayed, te::Fp8ScalingRecipe::Tensorwise,
                                           te::Fp8ScalingRecipe::Blockwise),
                         [](const auto& info) { return std::string(te::to_string(info.param)); });

TEST(CudaFp8GroupedLinear, SmallMoeGptTrainsToTheCpuLosses) {
  KILN_REQUIRE_CUDA();
  models::GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.seq_length = 32;
  c.vocab_size = 128;
  c.attention_dropout = 0;
  c.hidden_dropout = 0;
  c.add_bias_linear = false;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 64;
  c.fp8 = true;
  std::vector<std::int64_t> s(4 * 32 + 1);
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<std::int64_t>((i * 37 + 11) % 97);
  const Tensor tokens = Tensor::from_vector(std::vector<std::int64_t>(s.begin(), s.end() - 1), {4, 32});
  const Tensor labels = Tensor::from_vector(std::vector<std::int64_t>(s.begin() + 1, s.end()), {4, 32});
  for (auto recipe :
       {te::Fp8ScalingRecipe::Delayed, te::Fp8ScalingRecipe::Tensorwise, te::Fp8ScalingRecipe::Blockwise}) {
    c.fp8_recipe.recipe = recipe;
    std::vector<double> losses[2];
    int side = 0;
    for (Device d : {Device::cpu(), gpu()}) {
      models::GptModel m(c, 3);
      m.to(d);
      optim::AdamOptions o = optim::AdamW::defaults();
      o.lr = 3e-3;
      optim::AdamW opt(m.parameters(), o);
      for (int i = 0; i < 8; ++i) {
        opt.zero_grad();
        Tensor loss = m.loss(tokens.to(d), labels.to(d), Tensor());
        loss.backward();
        opt.step();
        losses[side].push_back(loss.item());
      }
      ++side;
    }
    for (std::size_t i = 0; i < losses[0].size(); ++i)
      EXPECT_NEAR(losses[1][i], losses[0][i], 2e-3 * losses[0][i]) << te::to_string(recipe) << " step " << i;
  }
}

}  // namespace fp8_grouped_linear_test
}  // namespace kiln
