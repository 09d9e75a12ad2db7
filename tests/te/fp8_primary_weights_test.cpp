// --fp8-param-gather's pieces on the CPU (the FP8 reference): the master -> FP8 cast of each recipe
// gives the bytes and scales of ops::fp8_quantize of the fp32 master; a master cut into shards
// anywhere (inside 128x128 blocks) casts, piece by piece, to the whole master's bytes, and the
// pieces' amaxes max-reduced are the whole matrix's; the fp8 transpose of a weight's cast is the cast
// of W^T; an FP8 primary weight's state_dict value round-trips through a load; fp8_linear on a
// primary weight runs on its bytes.
#include "kiln/te/fp8_primary_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/ops/fp8.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::te {
namespace fp8_primary_weights_test {

// Not multiples of 128: partial blocks at both edges.
constexpr std::int64_t kOut = 208, kIn = 272;

Fp8Recipe recipe_of(Fp8ScalingRecipe r) {
  Fp8Recipe rec;
  rec.recipe = r;
  rec.amax_history_len = 2;
  rec.amax_compute_algo = ops::AmaxComputeAlgo::Max;
  return rec;
}

ScalingLayout layout_of(Fp8ScalingRecipe r) {
  return r == Fp8ScalingRecipe::Blockwise ? ScalingLayout::Block128x128 : ScalingLayout::PerTensor;
}

Fp8LinearState fresh_state() {
  Fp8LinearState s;
  s.input = Fp8ScalingState::fresh(2, Device::cpu());
  s.weight = Fp8ScalingState::fresh(2, Device::cpu());
  s.grad_output = Fp8ScalingState::fresh(2, Device::cpu());
  return s;
}

std::vector<std::uint8_t> bytes(const Tensor& fp8) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(fp8.numel()));
  const Tensor c = fp8.detach().contiguous();
  std::memcpy(out.data(), c.data_ptr(), out.size());
  return out;
}

std::vector<float> floats(const Tensor& t) { return t.detach().contiguous().to_vector<float>(); }

// The reference: ops::fp8_quantize of the whole fp32 master with the recipe's scaling (delayed: the
// scale the weight's state holds after the cast recorded the master's amax and updated).
Fp8Tensor reference_cast(const Tensor& master, const Fp8Recipe& r, const Fp8ScalingState& delayed) {
  Fp8Tensor q =
      ops::fp8_empty(master.shape()[0], master.shape()[1], r.forward_dtype(), layout_of(r.recipe), Device::cpu());
  ops::Fp8CastOptions o;
  if (r.recipe == Fp8ScalingRecipe::Delayed)
    q.scale = delayed.scale.clone();
  else
    o.current_scaling = r.recipe == Fp8ScalingRecipe::Tensorwise;
  o.power_of_two_scales = r.recipe == Fp8ScalingRecipe::Blockwise;
  ops::fp8_quantize_into(master, q, o);
  return q;
}

class Fp8PrimaryWeights : public ::testing::TestWithParam<Fp8ScalingRecipe> {};

TEST_P(Fp8PrimaryWeights, ConversionAndMasterCastEqualTheQuantisationOfTheMaster) {
  const Fp8Recipe r = recipe_of(GetParam());
  NoGradGuard no_grad;
  const Tensor w0 = Tensor::randn({kOut, kIn}, 7) * 0.03;
  Tensor w = w0.clone().requires_grad_(true);
  Fp8LinearState st = fresh_state();
  te::Fp8PrimaryWeights weights({{w, &st}}, r);
  ASSERT_EQ(w.dtype(), DType::F8E4M3);
  ASSERT_TRUE(st.primary_weight != nullptr);
  EXPECT_TRUE(w.requires_grad());
  const std::vector<Tensor> init = weights.take_initial_values();
  ASSERT_EQ(init.size(), 1u);
  EXPECT_EQ(floats(init[0]), floats(w0));
  EXPECT_THROW(weights.take_initial_values(), Error);

  // The conversion cast the value as a master; then a step's master casts again.
  Fp8Tensor ref = reference_cast(w0, r, st.weight);
  EXPECT_EQ(bytes(w), bytes(ref.data));
  EXPECT_EQ(floats(st.primary_weight->cast.scale_inv), floats(ref.scale_inv));
  const Tensor master = Tensor::randn({kOut, kIn}, 8) * 0.5;
  weights.cast_masters({{w, {0, w.numel()}, master.reshape({w.numel()})}}, nullptr, true);
  ref = reference_cast(master, r, st.weight);
  EXPECT_EQ(bytes(w), bytes(ref.data));
  EXPECT_EQ(floats(st.primary_weight->cast.scale_inv), floats(ref.scale_inv));
  if (r.recipe == Fp8ScalingRecipe::Delayed) {
    // The master's amax went through the history: with history 2 and max, the larger of the two.
    const float amax0 = floats(kiln::amax(kiln::abs(w0)))[0], amax1 = floats(kiln::amax(kiln::abs(master)))[0];
    EXPECT_EQ(floats(st.weight.scale)[0], ops::fp8_scaled_max(DType::F8E4M3, 0) / std::max(amax0, amax1));
  }
  // A recast without recording leaves the scaling as it is and gives the same bytes.
  const std::vector<float> history = floats(st.weight.amax_history);
  weights.cast_masters({{w, {0, w.numel()}, master.reshape({w.numel()})}}, nullptr, false);
  EXPECT_EQ(bytes(w), bytes(ref.data));
  EXPECT_EQ(floats(st.weight.amax_history), history);
}

// The distributed optimizer's shards cut the weight anywhere: three pieces (a cut inside a row and
// inside a 128x128 block) cast to the whole master's bytes, and each piece's amaxes, max-reduced
// as the data-parallel all-reduce does, are the whole matrix's per-tensor or per-block amaxes.
TEST_P(Fp8PrimaryWeights, ShardedCastEqualsTheWholeCast) {
  const Fp8Recipe r = recipe_of(GetParam());
  NoGradGuard no_grad;
  Tensor w = (Tensor::randn({kOut, kIn}, 3) * 0.03).requires_grad_(true);
  Tensor v = w.detach().clone().requires_grad_(true);
  Fp8LinearState sw = fresh_state(), sv = fresh_state();
  te::Fp8PrimaryWeights whole({{w, &sw}}, r), sharded({{v, &sv}}, r);
  const Tensor master = (Tensor::randn({kOut, kIn}, 4) * 2.0).reshape({kOut * kIn});
  whole.cast_masters({{w, {0, w.numel()}, master}}, nullptr, true);
  const std::int64_t cuts[] = {0, 130 * kIn + 77, 131 * kIn + 200, kOut * kIn};
  std::vector<optim::FlatOptimizer::MasterPiece> pieces;
  for (int k = 0; k < 3; ++k)
    pieces.push_back({v, {cuts[k], cuts[k + 1]}, master.narrow(0, cuts[k], cuts[k + 1] - cuts[k]).contiguous()});
  sharded.cast_masters(pieces, nullptr, true);
  EXPECT_EQ(bytes(v), bytes(w));
  EXPECT_EQ(floats(sv.primary_weight->cast.scale_inv), floats(sw.primary_weight->cast.scale_inv));
  EXPECT_EQ(floats(sv.weight.scale), floats(sw.weight.scale));

  // The ops themselves: per-piece amaxes max-reduced = the whole cast's amaxes.
  const ScalingLayout layout = layout_of(r.recipe);
  const Shape grid = fp8_scale_shape(layout, kOut, kIn);
  Tensor reduced = Tensor::zeros(grid);
  for (int k = 0; k < 3; ++k) {
    Tensor mine = Tensor::zeros(grid);
    ops::fp8_piece_amax_(pieces[static_cast<std::size_t>(k)].master, {kOut, kIn, cuts[k], layout}, mine);
    reduced = kiln::maximum(reduced, mine);
  }
  ops::Fp8CastOptions o;
  o.current_scaling = true;
  const Fp8Tensor q = ops::fp8_quantize(master.reshape({kOut, kIn}), DType::F8E4M3, layout, o);
  EXPECT_EQ(floats(reduced), floats(q.amax));  // padding entries: 0 in both
}

// The fp8 transpose of a weight's cast (dgrad's operand under --fp8-param-gather) is the cast of W^T.
TEST(Fp8PrimaryWeightTranspose, TransposeOfTheCastIsTheCastOfTheTranspose) {
  for (const ScalingLayout layout : {ScalingLayout::PerTensor, ScalingLayout::Block128x128}) {
    SCOPED_TRACE(std::string(scaling_layout_name(layout)));
    ops::Fp8CastOptions o;
    o.current_scaling = true;
    o.power_of_two_scales = layout != ScalingLayout::PerTensor;
    const Tensor x = Tensor::randn({kOut, kIn}, 5) * 3.0;
    const Fp8Tensor q = ops::fp8_quantize(x, DType::F8E4M3, layout, o);
    const Fp8Tensor t = fp8_transposed(q);
    const Fp8Tensor qt = ops::fp8_quantize(x.t().contiguous(), DType::F8E4M3, layout, o);
    t.check("test", "transposed");
    EXPECT_EQ(bytes(t.data), bytes(qt.data));
    EXPECT_EQ(floats(t.scale_inv), floats(qt.scale_inv));
    EXPECT_THROW(fp8_transposed(ops::fp8_quantize(x, DType::F8E4M3, ScalingLayout::Block1x128)), Error);
  }
}

// fp8_linear on a primary weight: its bytes as fprop's operand, the transpose as dgrad's; the result
// equals fp8_linear on a high-precision weight holding the same values under current scaling (the
// recast of an fp8-exact weight is the same bytes) and the weight's gradient arrives in x's dtype.
// (Delayed is left out: its weight scale comes from the state, not from the weight's own amax.)
TEST(Fp8PrimaryWeightLinear, LinearOnTheBytesEqualsLinearOnTheirValues) {
  for (const Fp8ScalingRecipe recipe : {Fp8ScalingRecipe::Tensorwise, Fp8ScalingRecipe::Blockwise}) {
    SCOPED_TRACE(std::string(to_string(recipe)));
    const Fp8Recipe r = recipe_of(recipe);
    Tensor w = (Tensor::randn({kOut, kIn - 16}, 11) * 0.03).requires_grad_(true);
    Fp8LinearState st = fresh_state(), plain_state = fresh_state();
    te::Fp8PrimaryWeights weights({{w, &st}}, r);
    Tensor plain = fp8_primary_weight_value(*st.primary_weight).requires_grad_(true);
    const Tensor x0 = Tensor::randn({32, kIn - 16}, 12);
    Tensor x1 = x0.clone().requires_grad_(true), x2 = x0.clone().requires_grad_(true);
    const Tensor y1 = fp8_linear(x1, w, Tensor(), r, &st);
    const Tensor y2 = fp8_linear(x2, plain, Tensor(), r, &plain_state);
    // Blockwise scales are powers of two: the recast is exact. A tensorwise recast may move the scale
    // by an ulp (448 / (448 * scale_inv)), so the results agree to float rounding.
    auto expect_close = [&](const std::vector<float>& a, const std::vector<float>& b) {
      ASSERT_EQ(a.size(), b.size());
      const float tol = r.recipe == Fp8ScalingRecipe::Blockwise ? 0.0f : 1e-5f;
      for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol * (1.0f + std::fabs(b[i]))) << i;
    };
    expect_close(floats(y1), floats(y2));
    const Tensor g = Tensor::randn(y1.shape(), 13);
    kiln::sum(kiln::mul(y1, g)).backward();
    kiln::sum(kiln::mul(y2, g)).backward();
    expect_close(floats(x1.grad()), floats(x2.grad()));
    ASSERT_EQ(w.grad().dtype(), DType::F32);
    EXPECT_EQ(floats(w.grad()), floats(plain.grad()));
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8PrimaryWeights,
                         ::testing::Values(Fp8ScalingRecipe::Delayed, Fp8ScalingRecipe::Tensorwise,
                                           Fp8ScalingRecipe::Blockwise),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace fp8_primary_weights_test
}  // namespace kiln::te
