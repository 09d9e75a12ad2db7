// TransformerEngine's DelayedScaling update (ops::fp8_delayed_scaling_update) against a reference
// that states the recipe's documented meaning rather than its kernel's steps: after each cast the
// scale is fp8_max * 2^-margin divided by the largest of the last L recorded amaxes (max) or by the
// last one (most_recent), a zero or non-finite amax keeps the previous scale, and scale_inv is its
// reciprocal. Also: the cast records its amax into history[0] through a view, so cast + update
// run back to back with no host copies.
#include <gtest/gtest.h>

#include <cmath>
#include <deque>

#include "fp8_test_util.h"
#include "kiln/autograd/functions.h"

namespace kiln {
namespace fp8_delayed_scaling_test {

using ops::AmaxComputeAlgo;

float* f32(const Tensor& t) { return static_cast<float*>(t.data_ptr()); }

struct Reference {
  std::int64_t len;
  bool most_recent;
  float scaled_max;
  std::deque<float> window;  // the last `len` recorded amaxes, newest at the back
  float scale = 1.0f;

  void record(float amax) {
    window.push_back(amax);
    if (static_cast<std::int64_t>(window.size()) > len) window.pop_front();
    float a = 0.0f;
    if (most_recent)
      a = amax;
    else
      for (float w : window) a = std::fmax(a, w);
    if (std::isfinite(a) && a > 0.0f) scale = scaled_max / a;
  }
};

void check_steps(std::int64_t len, AmaxComputeAlgo algo, int margin, DType fp8) {
  Tensor history = Tensor::zeros({len});
  Tensor scale = Tensor::ones({1}), scale_inv = Tensor::ones({1});
  const float scaled_max = ops::fp8_scaled_max(fp8, margin);
  EXPECT_EQ(scaled_max, static_cast<float>(fp8_max(fp8) * std::ldexp(1.0, -margin)));
  Reference ref{len, algo == AmaxComputeAlgo::MostRecent, scaled_max, {}};
  // Rises, falls (so max and most_recent differ), a zero and an inf (scale kept), subnormal-ish.
  const float amaxes[] = {3.5f, 120.0f, 0.25f, 0.0f, 7.0f, INFINITY, 1e-30f, 2.0f, 0.5f, 0.5f, 900.0f, 1.0f};
  int step = 0;
  for (float a : amaxes) {
    f32(history)[0] = a;  // what the step's cast records
    ops::fp8_delayed_scaling_update(history, scale, scale_inv, algo, scaled_max);
    ref.record(a);
    const float s = f32(scale)[0];
    EXPECT_EQ(s, ref.scale) << "len " << len << " " << ops::amax_compute_algo_name(algo) << " margin " << margin
                            << " step " << step;
    EXPECT_EQ(f32(scale_inv)[0], 1.0f / s);
    EXPECT_EQ(f32(history)[0], 0.0f) << "entry 0 is cleared for the next cast";
    ++step;
  }
}

TEST(Fp8DelayedScaling, MatchesTheRecipeStepByStep) {
  for (std::int64_t len : {1, 2, 3, 5, 16})
    for (AmaxComputeAlgo algo : {AmaxComputeAlgo::Max, AmaxComputeAlgo::MostRecent})
      for (int margin : {0, 2})
        for (DType t : {DType::F8E4M3, DType::F8E5M2}) check_steps(len, algo, margin, t);
}

TEST(Fp8DelayedScaling, CastRecordsItsAmaxIntoTheHistoryAndUsesTheDelayedScale) {
  const std::int64_t len = 4;
  Tensor history = Tensor::zeros({len});
  Fp8Tensor q = ops::fp8_empty(2, 16, DType::F8E4M3, ScalingLayout::PerTensor, Device::cpu());
  q.amax = history.narrow(0, 0, 1);  // the cast writes amax straight into the window
  const float scaled_max = ops::fp8_scaled_max(DType::F8E4M3, 0);
  float expected_scale = 1.0f;
  for (int step = 0; step < 6; ++step) {
    const Tensor x = Tensor::randn({2, 16}, 100 + static_cast<std::uint64_t>(step)) * (1.0 + step * 3.0);
    ops::fp8_quantize_into(x, q);  // delayed: uses q.scale as it stands
    EXPECT_EQ(f32(q.scale)[0], expected_scale) << "step " << step;
    float amax = 0.0f;
    for (float v : x.to_vector<float>()) amax = std::fmax(amax, std::fabs(v));
    EXPECT_EQ(f32(history)[0], amax);
    ops::fp8_delayed_scaling_update(history, q.scale, q.scale_inv, AmaxComputeAlgo::Max, scaled_max);
    expected_scale = scaled_max / amax;  // amaxes rise every step here, so the window's max is the newest
  }
}

TEST(Fp8DelayedScaling, RejectsBadState) {
  Tensor s = Tensor::ones({1}), si = Tensor::ones({1});
  fp8test::expect_error(
      [&] {
        ops::fp8_delayed_scaling_update(Tensor::zeros({2, 2}), s, si, AmaxComputeAlgo::Max, 448.0f);
      },
      {"amax_history must be a contiguous float32 vector"});
  fp8test::expect_error(
      [&] { ops::fp8_delayed_scaling_update(Tensor::zeros({3}), Tensor::ones({2}), si, AmaxComputeAlgo::Max, 448.0f); },
      {"scale must be a float32 tensor of one element"});
}

TEST(Fp8DelayedScaling, BatchedUpdateEqualsTheSingleUpdates) {
  // More entries than one CUDA launch takes (32), histories of different lengths, both dtypes.
  for (AmaxComputeAlgo algo : {AmaxComputeAlgo::Max, AmaxComputeAlgo::MostRecent}) {
    std::vector<ops::Fp8DelayedScalingRef> batched, single;
    for (int i = 0; i < 40; ++i) {
      const std::int64_t len = 1 + i % 5;
      const float scaled_max = ops::fp8_scaled_max(i % 2 ? DType::F8E5M2 : DType::F8E4M3, i % 3);
      Tensor h = Tensor::rand({len}, 50 + static_cast<std::uint64_t>(i)) * (1.0 + i);
      if (i % 7 == 0) f32(h)[0] = 0.0f;  // a cast that saw only zeros keeps the scale
      batched.push_back({h, Tensor::full({1}, 0.5 + i), Tensor::ones({1}), scaled_max});
      single.push_back({h.clone(), Tensor::full({1}, 0.5 + i), Tensor::ones({1}), scaled_max});
    }
    ops::fp8_delayed_scaling_update_many(batched, algo);
    for (const auto& s : single)
      ops::fp8_delayed_scaling_update(s.amax_history, s.scale, s.scale_inv, algo, s.scaled_max);
    for (std::size_t i = 0; i < single.size(); ++i) {
      EXPECT_EQ(batched[i].amax_history.to_vector<float>(), single[i].amax_history.to_vector<float>()) << i;
      EXPECT_EQ(f32(batched[i].scale)[0], f32(single[i].scale)[0]) << i;
      EXPECT_EQ(f32(batched[i].scale_inv)[0], f32(single[i].scale_inv)[0]) << i;
    }
  }
  ops::fp8_delayed_scaling_update_many({}, AmaxComputeAlgo::Max);  // nothing queued: nothing to do
  try {
    ops::fp8_delayed_scaling_update_many({{Tensor::zeros({2}), Tensor::ones({2}), Tensor::ones({1}), 448.0f}},
                                         AmaxComputeAlgo::Max);
    ADD_FAILURE() << "a two-element scale was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("entry 0: scale"), std::string::npos) << e.what();
  }
}

}  // namespace fp8_delayed_scaling_test
}  // namespace kiln
