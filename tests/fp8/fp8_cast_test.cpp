// FP8 casts on the CPU (the reference backend): rounding against a brute-force nearest-even
// reference, saturation, amax, delayed / current / power-of-two scales, 1x128 and 128x128 block
// scales, the transpose-cast, dequantisation round trips, and the errors bad input gets.
#include <gtest/gtest.h>

#include <cmath>

#include "fp8_test_util.h"
#include "kiln/ops/copy.h"

namespace kiln {
namespace fp8_cast_test {

using namespace fp8test;
using ops::Fp8CastOptions;

constexpr DType kFp8[] = {DType::F8E4M3, DType::F8E5M2};

TEST(Fp8Cast, RoundsToNearestEvenAndSaturates) {
  for (DType t : kFp8) {
    // Random magnitudes over the whole range (and past it), plus every midpoint between codes.
    Tensor x = spread_values(64, 96, 7, -22, 18);
    std::vector<float> v = x.to_vector<float>();
    for (int c = 0; c < 127; ++c) {
      const double lo = decode(t, static_cast<std::uint8_t>(c)), hi = decode(t, static_cast<std::uint8_t>(c + 1));
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      const auto mid = static_cast<float>((lo + hi) / 2);  // exact: fp8 values have few bits
      for (float f :
           {mid, std::nextafterf(mid, static_cast<float>(hi)), std::nextafterf(mid, static_cast<float>(lo))}) {
        v.push_back(f);
        v.push_back(-f);
      }
    }
    const auto n = static_cast<std::int64_t>(v.size());
    Tensor xs = Tensor::from_vector(v, {1, n});
    Fp8Tensor q = ops::fp8_empty(1, n, t, ScalingLayout::PerTensor, Device::cpu());  // scale 1
    ops::fp8_quantize_into(xs, q);
    const auto b = bytes(q.data);
    int bad = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint8_t want = nearest_code(t, v[static_cast<std::size_t>(i)]);
      if (b[static_cast<std::size_t>(i)] != want && bad++ < 5)
        ADD_FAILURE() << dtype_name(t) << " " << v[static_cast<std::size_t>(i)] << ": got 0x" << std::hex
                      << int(b[static_cast<std::size_t>(i)]) << " want 0x" << int(want);
    }
    EXPECT_EQ(bad, 0) << dtype_name(t);
  }
}

TEST(Fp8Cast, SaturatesAtTheLargestFiniteValueAndReportsAmax) {
  Tensor x = Tensor::from_vector<float>({1.0e5f, -1.0e6f, 3.0f, 0.5f, INFINITY}, {1, 5});
  for (DType t : kFp8) {
    Fp8Tensor q = ops::fp8_empty(1, 5, t, ScalingLayout::PerTensor, Device::cpu());
    ops::fp8_quantize_into(x, q);
    const auto b = bytes(q.data);
    const std::uint8_t maxc = t == DType::F8E4M3 ? 0x7e : 0x7b;
    EXPECT_EQ(b[0], maxc) << dtype_name(t);
    EXPECT_EQ(b[1], maxc | 0x80) << dtype_name(t);
    EXPECT_EQ(b[4], maxc) << dtype_name(t) << ": +inf saturates too";
    EXPECT_EQ(decode(t, b[2]), 3.0);
    EXPECT_EQ(decode(t, b[3]), 0.5);
    EXPECT_EQ(floats(q.amax)[0], INFINITY);
    EXPECT_EQ(floats(q.scale_inv)[0], 1.0f);
  }
}

TEST(Fp8Cast, DelayedScalingMultipliesByTheGivenScale) {
  Tensor x = spread_values(8, 16, 3, -6, 6);
  Fp8Tensor q = ops::fp8_empty(8, 16, DType::F8E4M3, ScalingLayout::PerTensor, Device::cpu());
  ops::fill(q.scale, 3.0);
  ops::fp8_quantize_into(x, q);
  const auto v = x.to_vector<float>();
  const auto b = bytes(q.data);
  float amax = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(b[i], nearest_code(DType::F8E4M3, v[i] * 3.0f)) << v[i];
    amax = std::max(amax, std::fabs(v[i]));
  }
  EXPECT_EQ(floats(q.scale)[0], 3.0f);
  EXPECT_EQ(floats(q.scale_inv)[0], 1.0f / 3.0f);
  EXPECT_EQ(floats(q.amax)[0], amax);
}

TEST(Fp8Cast, CurrentScalingMapsAmaxOntoTheFormatMaximum) {
  Tensor x = spread_values(16, 32, 11, -9, 3);
  const auto v = x.to_vector<float>();
  float amax = 0;
  for (float f : v) amax = std::max(amax, std::fabs(f));
  for (DType t : kFp8) {
    for (bool pow2 : {false, true}) {
      Fp8CastOptions o;
      o.current_scaling = true;
      o.power_of_two_scales = pow2;
      Fp8Tensor q = ops::fp8_empty(16, 32, t, ScalingLayout::PerTensor, Device::cpu());
      ops::fp8_quantize_into(x, q, o);
      const float max = fp8_max(t);
      float want = max / amax;
      if (pow2) want = std::exp2(std::floor(std::log2(want)));
      EXPECT_EQ(floats(q.scale)[0], want) << dtype_name(t) << " pow2 " << pow2;
      EXPECT_EQ(floats(q.scale_inv)[0], 1.0f / want);
      EXPECT_EQ(floats(q.amax)[0], amax);
      const auto b = bytes(q.data);
      for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(b[i], nearest_code(t, v[i] * want)) << i;
      // The largest magnitude lands on (or, with a power-of-two scale, within a factor 2 of) the maximum.
      double top = 0;
      for (auto c : b) top = std::max(top, std::fabs(decode(t, c)));
      EXPECT_LE(top, max);
      EXPECT_GT(top, pow2 ? max / 2 : max * 0.93);
    }
  }
  // An all-zero input keeps scale 1; amax_epsilon floors the amax.
  Fp8CastOptions o;
  o.current_scaling = true;
  Fp8Tensor z = ops::fp8_quantize(Tensor::zeros({4, 16}), DType::F8E4M3, ScalingLayout::PerTensor, o);
  EXPECT_EQ(floats(z.scale)[0], 1.0f);
  o.amax_epsilon = 0.5f;
  Fp8Tensor e = ops::fp8_quantize(Tensor::full({4, 16}, 0.25), DType::F8E4M3, ScalingLayout::PerTensor, o);
  EXPECT_EQ(floats(e.scale)[0], 448.0f / 0.5f);
}

// Checks a block-scaled cast against the definition: every block's amax, scale = fp8_max / amax
// (optionally a power of two), scale_inv = 1 / scale, data = nearest(x * scale); padding untouched.
void check_blocks(const Tensor& x, const Fp8Tensor& q, bool pow2) {
  const std::int64_t R = x.shape()[0], C = x.shape()[1];
  Tensor xc = ops::contiguous(x.to(DType::F32));
  const auto v = xc.to_vector<float>();
  const auto b = bytes(q.data);
  const auto s = floats(q.scale), si = floats(q.scale_inv), am = floats(q.amax);
  const std::int64_t bh = q.layout == ScalingLayout::Block128x128 ? 128 : 1;
  std::vector<bool> used(s.size(), false);
  for (std::int64_t r0 = 0; r0 < R; r0 += bh)
    for (std::int64_t c0 = 0; c0 < C; c0 += 128) {
      float amax = 0;
      for (std::int64_t r = r0; r < std::min(R, r0 + bh); ++r)
        for (std::int64_t c = c0; c < std::min(C, c0 + 128); ++c)
          amax = std::max(amax, std::fabs(v[static_cast<std::size_t>(r * C + c)]));
      float want = amax == 0 ? 1.0f : fp8_max(q.dtype()) / amax;
      if (pow2) want = std::exp2(std::floor(std::log2(want)));
      const auto i = static_cast<std::size_t>(scale_at(q.layout, R, C, r0, c0));
      used[i] = true;
      ASSERT_EQ(am[i], amax) << "block " << r0 << "," << c0;
      ASSERT_EQ(s[i], want) << "block " << r0 << "," << c0;
      ASSERT_EQ(si[i], 1.0f / want);
      for (std::int64_t r = r0; r < std::min(R, r0 + bh); ++r)
        for (std::int64_t c = c0; c < std::min(C, c0 + 128); ++c)
          ASSERT_EQ(b[static_cast<std::size_t>(r * C + c)],
                    nearest_code(q.dtype(), v[static_cast<std::size_t>(r * C + c)] * want))
              << r << "," << c;
    }
  for (std::size_t i = 0; i < used.size(); ++i) {
    if (!used[i]) {
      EXPECT_TRUE(s[i] == 1.0f && si[i] == 1.0f && am[i] == 0.0f) << "padding entry " << i;
    }
  }
}

// Rows and 128-column groups of very different magnitudes, so a per-tensor scale would not do.
Tensor blocky(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  Tensor x = spread_values(rows, cols, seed, -4, 4);
  auto v = x.to_vector<float>();
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      v[static_cast<std::size_t>(r * cols + c)] *= std::exp2(static_cast<float>((r * 7 + (c / 128) * 5) % 23 - 11));
  return Tensor::from_vector(v, {rows, cols});
}

TEST(Fp8Cast, Block1x128ScalesEachRowsGroupOf128) {
  Tensor x = blocky(5, 300, 21);  // partial last block (44 columns), rows padded 5 -> 8
  for (DType t : kFp8)
    for (bool pow2 : {false, true}) {
      Fp8CastOptions o;
      o.power_of_two_scales = pow2;
      Fp8Tensor q = ops::fp8_quantize(x, t, ScalingLayout::Block1x128, o);
      EXPECT_EQ(q.scale.shape(), (Shape{3, 8}));
      check_blocks(x, q, pow2);
    }
}

TEST(Fp8Cast, Block128x128ScalesEachTile) {
  Tensor x = blocky(200, 260, 22);  // 2 x 3 tiles, partial on both edges; 3 -> 4 padded
  for (DType t : kFp8)
    for (bool pow2 : {false, true}) {
      Fp8CastOptions o;
      o.power_of_two_scales = pow2;
      Fp8Tensor q = ops::fp8_quantize(x, t, ScalingLayout::Block128x128, o);
      EXPECT_EQ(q.scale.shape(), (Shape{2, 4}));
      check_blocks(x, q, pow2);
    }
}

TEST(Fp8Cast, Bf16InputCastsLikeItsF32Value) {
  Tensor x = blocky(8, 256, 5).to(DType::BF16);
  for (auto layout : {ScalingLayout::PerTensor, ScalingLayout::Block1x128, ScalingLayout::Block128x128}) {
    Fp8Tensor a = ops::fp8_quantize(x, DType::F8E4M3, layout);
    Fp8Tensor b = ops::fp8_quantize(x.to(DType::F32), DType::F8E4M3, layout);
    EXPECT_EQ(bytes(a.data), bytes(b.data)) << scaling_layout_name(layout);
    EXPECT_EQ(floats(a.scale_inv), floats(b.scale_inv)) << scaling_layout_name(layout);
  }
}

TEST(Fp8Cast, TransposeCastEqualsCastingTheTranspose) {
  Tensor x = blocky(136, 272, 9);
  for (auto layout : {ScalingLayout::PerTensor, ScalingLayout::Block1x128, ScalingLayout::Block128x128}) {
    Fp8Tensor row = ops::fp8_empty(136, 272, DType::F8E4M3, layout, Device::cpu());
    Fp8Tensor col = ops::fp8_empty(272, 136, DType::F8E4M3, layout, Device::cpu());
    Fp8CastOptions o;
    o.current_scaling = true;
    ops::fp8_quantize_transpose_into(x, row, col, o);
    Fp8Tensor want_row = ops::fp8_quantize(x, DType::F8E4M3, layout, o);
    Fp8Tensor want_col = ops::fp8_quantize(ops::contiguous(x.t()), DType::F8E4M3, layout, o);
    EXPECT_EQ(bytes(row.data), bytes(want_row.data)) << scaling_layout_name(layout);
    EXPECT_EQ(bytes(col.data), bytes(want_col.data)) << scaling_layout_name(layout);
    EXPECT_EQ(floats(col.scale_inv), floats(want_col.scale_inv)) << scaling_layout_name(layout);
    EXPECT_EQ(floats(col.amax), floats(want_col.amax)) << scaling_layout_name(layout);
    if (layout == ScalingLayout::PerTensor) {  // the same scale: the bytes are the transpose
      const auto rb = bytes(row.data), cb = bytes(col.data);
      for (std::int64_t r = 0; r < 136; ++r)
        for (std::int64_t c = 0; c < 272; ++c)
          ASSERT_EQ(rb[static_cast<std::size_t>(r * 272 + c)], cb[static_cast<std::size_t>(c * 136 + r)]);
    }
  }
}

TEST(Fp8Cast, DequantizeRoundTripsWithinHalfAStep) {
  Tensor x = blocky(64, 384, 31);
  const auto v = x.to_vector<float>();
  for (DType t : kFp8)
    for (auto layout : {ScalingLayout::PerTensor, ScalingLayout::Block1x128, ScalingLayout::Block128x128}) {
      Fp8Tensor q = ops::fp8_quantize(x, t, layout);
      const auto back = ops::fp8_dequantize(q, DType::F64).to_vector<double>();
      const auto ex = exact(q);
      const auto si = floats(q.scale_inv);
      const double rel = t == DType::F8E4M3 ? 1.0 / 16 : 1.0 / 8;  // half a step of 3 / 2 mantissa bits
      for (std::int64_t r = 0; r < 64; ++r)
        for (std::int64_t c = 0; c < 384; ++c) {
          const auto i = static_cast<std::size_t>(r * 384 + c);
          ASSERT_EQ(back[i], static_cast<double>(static_cast<float>(ex[i])));  // one f32 product
          // Error: half a step relative, or half the smallest subnormal step (scaled) absolute.
          const double sub = (t == DType::F8E4M3 ? std::exp2(-10) : std::exp2(-17)) *
                             si[static_cast<std::size_t>(scale_at(layout, 64, 384, r, c))];
          // (plus two f32 roundings: x * scale before the cast, q * scale_inv after it)
          ASSERT_LE(std::fabs(back[i] - v[i]), std::max(rel * std::fabs(v[i]), sub) + 2.5e-7 * std::fabs(v[i]))
              << dtype_name(t) << " " << scaling_layout_name(layout) << " at " << r << "," << c;
        }
      // Values already on the fp8 grid come back exactly.
      Fp8Tensor q2 = ops::fp8_quantize(ops::fp8_dequantize(q, DType::F32), t, layout);
      EXPECT_EQ(bytes(q2.data), bytes(q.data)) << dtype_name(t) << " " << scaling_layout_name(layout);
    }
}

TEST(Fp8Cast, RefusesBadInput) {
  Tensor x = Tensor::randn({4, 32}, 1);
  Fp8Tensor q = ops::fp8_empty(4, 32, DType::F8E4M3, ScalingLayout::PerTensor, Device::cpu());
  expect_error([&] { ops::fp8_quantize_into(x.to(DType::I64), q); }, {"fp8_quantize", "x has dtype int64"});
  expect_error([&] { ops::fp8_quantize_into(Tensor::randn({4, 16}, 1), q); }, {"fp8_quantize", "[4, 16]", "[4, 32]"});
  expect_error([&] { ops::fp8_quantize_into(Tensor::randn({2, 4, 32}, 1), q); }, {"fp8_quantize", "2-D"});
  Fp8Tensor wrong = q;
  wrong.layout = ScalingLayout::Block1x128;  // per-tensor scales under a block layout
  expect_error([&] { ops::fp8_quantize_into(x, wrong); }, {"fp8_quantize", "dst.scale", "1x128", "[1, 4]"});
  Fp8Tensor no_amax = q;
  no_amax.amax = Tensor();
  expect_error([&] { ops::fp8_quantize_into(x, no_amax); }, {"fp8_quantize", "dst.amax is missing"});
  Fp8CastOptions o;
  o.power_of_two_scales = true;  // a delayed per-tensor scale is not computed
  expect_error([&] { ops::fp8_quantize_into(x, q, o); }, {"fp8_quantize", "power_of_two_scales"});
  expect_error([&] { (void)ops::fp8_empty(4, 4, DType::BF16, ScalingLayout::PerTensor, Device::cpu()); },
               {"fp8_empty", "bfloat16"});
  expect_error([&] { (void)parse_scaling_layout("2x64"); }, {"2x64", "1x128"});
}

}  // namespace fp8_cast_test
}  // namespace kiln
