// RoPE: the inverse frequencies against Hugging Face's formulas re-derived in float64 (default and
// Llama-3.1 scaling), the table, rotation against a float64 reference (offsets, partial rotary),
// the backward (rotation by -theta) by finite differences, CUDA against the CPU, bad input.
#include "kiln/te/rope.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/gradcheck.h"
#include "te_reference.h"
#include "te_test_util.h"

namespace kiln {
namespace rope_test {

using te_test::randn;
using te_test::rel_error;

TEST(Rope, InverseFrequenciesMatchHuggingFace) {
  struct Config {
    std::int64_t dim;
    double base;
    bool llama3;
    double factor;
  };
  // Llama-2 (10000), Llama-3.1-8B (500000, factor 8, D 128), Llama-3.2-1B (D 64, factor 32).
  for (const Config c : {Config{128, 10000, false, 1}, Config{128, 500000, true, 8}, Config{64, 500000, true, 32},
                         Config{8, 500000, true, 8}}) {
    const auto got = te::rope_inv_freq(c.dim, c.base, c.llama3, c.factor);
    const auto want = te_reference::hf_inv_freq(c.dim, c.base, c.llama3, c.factor);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-15 * want[i]) << "dim " << c.dim << " i " << i;
  }
  // The three bands of the Llama-3.1 scaling at D 128, base 500000, factor 8: the highest
  // frequency is kept, the lowest divided by 8, and one in between blended.
  const auto plain = te::rope_inv_freq(128, 500000, false, 1), scaled = te::rope_inv_freq(128, 500000, true, 8);
  EXPECT_DOUBLE_EQ(scaled.front(), plain.front());
  EXPECT_DOUBLE_EQ(scaled.back(), plain.back() / 8);
  int blended = 0;
  for (std::size_t i = 0; i < plain.size(); ++i)
    if (scaled[i] < plain[i] && scaled[i] > plain[i] / 8) ++blended;
  EXPECT_GT(blended, 0);
}

TEST(Rope, TableHoldsCosAndSinOfPositionTimesFrequency) {
  const te::RopeTable t = te::make_rope_table(16, 40, 10000, false, 1, Device::cpu());
  ASSERT_EQ(t.cos.shape(), (Shape{40, 8}));
  EXPECT_EQ(t.cos.dtype(), DType::F32);
  const auto inv = te_reference::hf_inv_freq(16, 10000, false, 1);
  const auto c = t.cos.to_vector<double>(), s = t.sin.to_vector<double>();
  for (std::int64_t p = 0; p < 40; ++p)
    for (std::int64_t i = 0; i < 8; ++i) {
      EXPECT_NEAR(c[static_cast<std::size_t>(p * 8 + i)], std::cos(p * inv[static_cast<std::size_t>(i)]), 1e-7);
      EXPECT_NEAR(s[static_cast<std::size_t>(p * 8 + i)], std::sin(p * inv[static_cast<std::size_t>(i)]), 1e-7);
    }
}

TEST(Rope, RotatesAsTheReferenceWithOffsetAndPartialRotary) {
  const te::RopeTable full = te::make_rope_table(16, 32, 10000, false, 1, Device::cpu());
  const te::RopeTable partial = te::make_rope_table(8, 32, 10000, false, 1, Device::cpu());  // 8 of 16 channels
  const Tensor x = randn({2, 5, 3, 16}, 1);
  for (const auto* table : {&full, &partial})
    for (std::int64_t offset : {0, 7}) {
      const Tensor y = te::apply_rope(x, *table, offset);
      EXPECT_LT(rel_error(y, te_reference::rope(x, table->cos, table->sin, offset)), 1e-15);
      for (DType t : {DType::F32, DType::BF16})
        EXPECT_LT(rel_error(te::apply_rope(x.to(t), *table, offset),
                            te_reference::rope(x.to(t), table->cos, table->sin, offset)),
                  t == DType::F32 ? 1e-6 : 1e-2);
    }
  // Position 0 is the identity; a rotation keeps each pair's norm.
  const Tensor y0 = te::apply_rope(x.narrow(1, 0, 1).contiguous(), full, 0);
  EXPECT_LT(rel_error(y0, x.narrow(1, 0, 1).contiguous()), 1e-15);
}

TEST(Rope, ReadsStridedViewsInPlace) {
  const te::RopeTable table = te::make_rope_table(8, 16, 10000, false, 1, Device::cpu());
  // q as a slice of a fused projection [B, T, H, 3D], and as a transposed [B, H, T, D] tensor.
  const Tensor fused = randn({2, 5, 3, 24}, 4);
  const Tensor q = fused.narrow(3, 8, 8), kt = randn({2, 3, 5, 8}, 5).transpose(1, 2);
  for (const Tensor& x : {q, kt}) {
    ASSERT_FALSE(x.is_contiguous());
    EXPECT_LT(rel_error(te::apply_rope(x, table, 2), te_reference::rope(x.contiguous(), table.cos, table.sin, 2)),
              1e-15);
  }
  const auto result = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return te::apply_rope(in[0].narrow(3, 8, 8), table, 1); },
      {randn({1, 3, 2, 24}, 6)});
  EXPECT_TRUE(result.ok) << result.message;
}

TEST(Rope, BackwardIsTheInverseRotationByFiniteDifferences) {
  const te::RopeTable table = te::make_rope_table(8, 16, 500000, true, 8, Device::cpu());
  const auto result = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return te::apply_rope(in[0], table, 4); }, {randn({2, 3, 2, 8}, 2)});
  EXPECT_TRUE(result.ok) << result.message;
  // Forward then the backward's rotation gives x back.
  Tensor x = randn({1, 4, 2, 8}, 3).requires_grad_(true);
  Tensor y = te::apply_rope(x, table, 2);
  y.backward(y.detach());
  EXPECT_LT(rel_error(x.grad(), x.detach()), 1e-6);  // the table is float32
}

TEST(Rope, RefusesBadInput) {
  const te::RopeTable table = te::make_rope_table(8, 16, 10000, false, 1, Device::cpu());
  te_test::expect_error([&] { te::apply_rope(randn({2, 3, 8}, 1), table, 0); }, {"apply_rope", "[B, T, H, D]"});
  te_test::expect_error(
      [&] {
        te::apply_rope(randn({1, 10, 2, 8}, 1), table, 7);
      },
      {"apply_rope", "positions 7..16", "16 positions"});
  te_test::expect_error([&] { te::apply_rope(randn({1, 2, 2, 6}, 1), table, 0); }, {"apply_rope", "8 channels"});
  te_test::expect_error([&] { te::make_rope_table(7, 16, 10000, false, 1, Device::cpu()); },
                        {"make_rope_table", "head_dim"});
  te_test::expect_error([&] { te::make_rope_table(8, 16, 10000, true, 0.5, Device::cpu()); },
                        {"make_rope_table", "scaling factor"});
}

TEST(RopeCuda, MatchesCpu) {
  KILN_TE_REQUIRE_CUDA(dev);
  for (std::int64_t d : {64, 128}) {
    const te::RopeTable cpu_table = te::make_rope_table(d, 300, 500000, true, 8, Device::cpu());
    const te::RopeTable gpu_table = te::make_rope_table(d, 300, 500000, true, 8, dev);
    for (auto [t, tol] : {std::pair{DType::F32, 1e-6}, std::pair{DType::BF16, 1e-2}}) {
      // x as the middle third of a fused [B, T, H, 3D] projection on each device: the strided path.
      const Tensor fused = randn({2, 100, 4, 3 * d}, 5).to(t), g = randn({2, 100, 4, d}, 6).to(t);
      Tensor fc = fused.clone().requires_grad_(true), fg = fused.to(dev).requires_grad_(true);
      Tensor yc = te::apply_rope(fc.narrow(3, d, d), cpu_table, 150);
      Tensor yg = te::apply_rope(fg.narrow(3, d, d), gpu_table, 150);
      sum(mul(yc, g)).backward();
      sum(mul(yg, g.to(dev))).backward();
      Tensor xc = fc, xg = fg;
      EXPECT_LT(rel_error(yg.to(Device::cpu()), yc), tol) << d << " " << dtype_name(t);
      EXPECT_LT(rel_error(xg.grad().to(Device::cpu()), xc.grad()), tol) << d << " " << dtype_name(t);
    }
  }
}

}  // namespace rope_test
}  // namespace kiln
