// What fp8_linear does around its GEMMs, on the CPU: the weight cache casts W once while W is
// unchanged and again after an in-place update (the optimizer's), giving the results of an uncached
// layer either way; queued delayed updates (Fp8UpdateGroup) leave the state untouched until the
// flush and then equal the immediate updates bit for bit; fp8_flush_on_backward flushes when the
// gradient reaches its input.
#include <gtest/gtest.h>

#include "kiln/autograd/functions.h"
#include "kiln/ops/copy.h"
#include "kiln/te/fp8_linear.h"
#include "kiln/te/fp8_update_group.h"
#include "kiln/te/fp8_weight_cache.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::te {
namespace fp8_linear_cache_test {

constexpr std::int64_t kT = 32, kIn = 160, kOut = 144;

Fp8Recipe recipe_of(Fp8ScalingRecipe r) {
  Fp8Recipe rec;
  rec.recipe = r;
  rec.format = Fp8Format::Hybrid;
  rec.amax_history_len = 3;
  rec.amax_compute_algo = ops::AmaxComputeAlgo::Max;
  return rec;
}

Fp8LinearState fresh_state() {
  return {Fp8ScalingState::fresh(3, Device::cpu()), Fp8ScalingState::fresh(3, Device::cpu()),
          Fp8ScalingState::fresh(3, Device::cpu()), nullptr, nullptr};
}

struct LayerResult {
  std::vector<float> y, dx, dw;
};

LayerResult run(const Tensor& x0, const Tensor& w, const Tensor& g, const Fp8Recipe& r, const Fp8LinearState& st) {
  Tensor x = x0.clone().requires_grad_(true);
  Tensor y = fp8_linear(x, w, Tensor(), r, &st);
  sum(mul(y, g)).backward();
  return {y.detach().to_vector<float>(), x.grad().to_vector<float>(), w.grad().to_vector<float>()};
}

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

class Fp8LinearCache : public ::testing::TestWithParam<Fp8ScalingRecipe> {};

// Tensorwise and blockwise: every call equals the uncached layer's. Delayed (history 1): the first
// micro-batch of each step does (both cast W with the scale of the previous step's W); later
// micro-batches reuse that cast, as TE's is_first_microbatch=False does, where the uncached layer
// casts again with the scale its last cast set.
TEST_P(Fp8LinearCache, WeightIsCastOnceUntilItChangesAndResultsMatchTheUncachedLayer) {
  Fp8Recipe r = recipe_of(GetParam());
  r.amax_history_len = 1;
  const ScalingLayout wl =
      GetParam() == Fp8ScalingRecipe::Blockwise ? ScalingLayout::Block128x128 : ScalingLayout::PerTensor;
  Tensor w = (Tensor::randn({kOut, kIn}, 2) * 0.05).requires_grad_(true);
  Tensor w_plain = w.detach().clone().requires_grad_(true);
  Fp8LinearState cached = fresh_state(), plain = fresh_state();
  for (auto* st : {&cached, &plain})
    for (auto member : {&Fp8LinearState::input, &Fp8LinearState::weight, &Fp8LinearState::grad_output})
      st->*member = Fp8ScalingState::fresh(1, Device::cpu());
  cached.weight_cache = std::make_shared<Fp8WeightCache>();
  for (int step = 0; step < 3; ++step) {
    std::shared_ptr<Storage> first_cast;
    for (int micro = 0; micro < 2; ++micro) {
      const auto seed = static_cast<std::uint64_t>(10 * step + micro);
      const Tensor x = Tensor::randn({kT, kIn}, 100 + seed) * (1.0 + micro), g = Tensor::randn({kT, kOut}, 200 + seed);
      const LayerResult a = run(x, w, g, r, cached), b = run(x, w_plain, g, r, plain);
      if (micro == 0 || GetParam() != Fp8ScalingRecipe::Delayed) {
        EXPECT_EQ(a.y, b.y) << "step " << step << " micro-batch " << micro;
        EXPECT_EQ(a.dx, b.dx) << "step " << step << " micro-batch " << micro;
        EXPECT_EQ(a.dw, b.dw) << "step " << step << " micro-batch " << micro;
      }
      const Fp8Casts* hit = cached.weight_cache->find(w.detach(), r.forward_dtype(), wl);
      ASSERT_NE(hit, nullptr) << "the cast made by this call is kept";
      if (micro == 0) first_cast = hit->rowwise.data.storage();
      EXPECT_EQ(hit->rowwise.data.storage(), first_cast) << "micro-batch " << micro << " reuses the first cast";
    }
    // The optimizer's in-place update bumps the version: the next call must cast again.
    const std::uint64_t before = w.storage()->version();
    {
      NoGradGuard no_grad;
      w.add_(w.grad(), -1e-2);
      w_plain.add_(w_plain.grad(), -1e-2);
    }
    ASSERT_GT(w.storage()->version(), before);
    EXPECT_EQ(cached.weight_cache->find(w.detach(), r.forward_dtype(), wl), nullptr);
    w.grad().zero_();
    w_plain.grad().zero_();
  }
}

INSTANTIATE_TEST_SUITE_P(AllRecipes, Fp8LinearCache,
                         ::testing::Values(Fp8ScalingRecipe::Delayed, Fp8ScalingRecipe::Tensorwise,
                                           Fp8ScalingRecipe::Blockwise));

TEST(Fp8UpdateGroup, QueuedUpdatesWaitForTheFlushThenEqualTheImmediateOnes) {
  Fp8Recipe r = recipe_of(Fp8ScalingRecipe::Delayed);
  r.amax_compute_algo = ops::AmaxComputeAlgo::MostRecent;
  const Tensor w = (Tensor::randn({kOut, kIn}, 3) * 0.05).requires_grad_(true);
  Fp8LinearState queued = fresh_state(), now = fresh_state();
  auto group = std::make_shared<Fp8UpdateGroup>(r.amax_compute_algo);
  queued.updates = group;
  for (int step = 0; step < 4; ++step) {
    const auto seed = static_cast<std::uint64_t>(step);
    const Tensor x = Tensor::randn({kT, kIn}, 300 + seed) * (4.0 - step), g = Tensor::randn({kT, kOut}, 400 + seed);
    Tensor xa = x.clone().requires_grad_(true);
    Tensor ya = fp8_linear(xa, w, Tensor(), r, &queued);
    EXPECT_EQ(group->pending(), 2u) << "input and weight queued";
    const std::vector<float> scale_before = values(queued.input.scale);
    group->flush();
    EXPECT_EQ(group->pending(), 0u);
    if (step > 0) {
      EXPECT_NE(values(queued.input.scale), scale_before) << "the flush advanced the scale";
    }
    sum(mul(ya, g)).backward();
    EXPECT_EQ(group->pending(), 1u) << "the gradient's cast queued";
    group->flush();
    const LayerResult b = run(x, w, g, r, now);
    EXPECT_EQ(values(ya.detach()), b.y) << "step " << step;
    for (auto member : {&Fp8LinearState::input, &Fp8LinearState::weight, &Fp8LinearState::grad_output}) {
      EXPECT_EQ(values((queued.*member).amax_history), values((now.*member).amax_history)) << "step " << step;
      EXPECT_EQ(values((queued.*member).scale), values((now.*member).scale)) << "step " << step;
      EXPECT_EQ(values((queued.*member).scale_inv), values((now.*member).scale_inv)) << "step " << step;
    }
  }
}

TEST(Fp8UpdateGroup, FlushOnBackwardRunsWhenTheGradientReachesTheInput) {
  const Fp8Recipe r = recipe_of(Fp8ScalingRecipe::Delayed);
  auto group = std::make_shared<Fp8UpdateGroup>(r.amax_compute_algo);
  Fp8LinearState st = fresh_state();
  st.updates = group;
  const Tensor w = (Tensor::randn({kOut, kIn}, 4) * 0.05).requires_grad_(true);
  Tensor x = Tensor::randn({kT, kIn}, 5).requires_grad_(true);
  const Tensor h = fp8_flush_on_backward(x, group);
  const Tensor y = fp8_linear(h, w, Tensor(), r, &st);
  group->flush();
  sum(y).backward();
  EXPECT_EQ(group->pending(), 0u) << "the gradient's update ran at the input";
  EXPECT_EQ(values(st.grad_output.amax_history)[0], 0.0f) << "entry 0 cleared by the update";
  EXPECT_NE(values(st.grad_output.scale)[0], 1.0f);
  EXPECT_TRUE(x.grad().defined());
  // Without a group (or without grad) the input is passed through untouched.
  EXPECT_EQ(fp8_flush_on_backward(x, nullptr).storage(), x.storage());
}

}  // namespace fp8_linear_cache_test
}  // namespace kiln::te
