// split_qkv_rope (the QKV split with RoPE on q and k in one kernel each way): equal bit for bit to
// the path it replaces (split_sizes, q's copy, apply_rope on q and on k, v's copy) forward and
// backward, at f32 and bf16, GQA shapes, partial rotary and position offsets; against a float64
// reference; its gradient by finite differences; CUDA against the CUDA unfused path and the CPU;
// bad input.
#include "kiln/te/qkv_rope.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/functions.h"
#include "kiln/autograd/gradcheck.h"
#include "te_reference.h"
#include "te_test_util.h"

namespace kiln {
namespace qkv_rope_test {

using te_test::randn;
using te_test::rel_error;

// The path split_qkv_rope replaces (SelfAttention's before it): split_sizes on the grouped layout,
// the copy that merges q's groups, apply_rope on q and on k; v a strided view (the attention then
// copies it).
te::SplitQkv unfused(const Tensor& qkv, std::int64_t d, const te::RopeTable& table, std::int64_t offset) {
  const std::int64_t b = qkv.shape()[0], t = qkv.shape()[1], groups = qkv.shape()[2];
  const std::int64_t per_group = qkv.shape()[3] / d - 2;
  std::vector<Tensor> parts = split_sizes(qkv, {per_group * d, d, d}, 3);
  const Tensor q = parts[0].reshape({b, t, groups * per_group, d});
  return {te::apply_rope(q, table, offset), te::apply_rope(parts[1], table, offset), parts[2]};
}

// The same bytes: equality of the values would let -0 pass for +0.
void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined() && want.defined()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const Tensor a = got.to(Device::cpu()).contiguous(), b = want.to(Device::cpu()).contiguous();
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0)
      << what << ": differs from the unfused path by up to " << rel_error(a, b) << " (relative)";
}

// Which outputs the loss reaches: the others get no gradient (the fused backward writes zeros).
struct Uses {
  bool q = true, k = true, v = true;
};

// Forward and backward through `path` from a leaf copy of qkv, the gradients of q, k, v seeded
// from fixed random tensors: (q, k, v, dqkv).
template <class Path>
std::tuple<Tensor, Tensor, Tensor, Tensor> run(Path path, const Tensor& qkv_data, Uses uses) {
  Tensor qkv = qkv_data.clone().requires_grad_(true);
  const te::SplitQkv out = path(qkv);
  std::vector<Tensor> roots, grads;
  const DType dt = qkv_data.dtype();
  const Device dev = qkv_data.device();
  if (uses.q) roots.push_back(out.q), grads.push_back(randn(out.q.shape(), 31).to(dt).to(dev));
  if (uses.k) roots.push_back(out.k), grads.push_back(randn(out.k.shape(), 32).to(dt).to(dev));
  if (uses.v) roots.push_back(out.v), grads.push_back(randn(out.v.shape(), 33).to(dt).to(dev));
  autograd::run_backward(roots, grads, false);
  return {out.q.detach(), out.k.detach(), out.v.detach(), qkv.grad()};
}

struct GqaCase {
  std::int64_t groups, per_group, head_dim, rope_dim, offset;
};

// per_group 1 (MQA-like pairs), 2 and 4 (Llama-3.2-1B's 32 heads over 8 groups); a table as wide
// as the head and one half as wide (partial rotary); offsets 0 and past the start (KV cache).
const std::vector<GqaCase> kCases = {
    {2, 1, 16, 16, 0}, {2, 2, 16, 16, 5}, {3, 4, 8, 8, 3}, {2, 2, 16, 8, 7}, {1, 4, 12, 4, 0}};

void expect_equal_to_unfused(const Tensor& qkv, const GqaCase& c, const te::RopeTable& table, Uses uses,
                             const std::string& what) {
  const auto fused =
      run([&](const Tensor& x) { return te::split_qkv_rope(x, c.head_dim, table, c.offset); }, qkv, uses);
  const auto reference = run([&](const Tensor& x) { return unfused(x, c.head_dim, table, c.offset); }, qkv, uses);
  expect_same_bits(std::get<0>(fused), std::get<0>(reference), what + " q");
  expect_same_bits(std::get<1>(fused), std::get<1>(reference), what + " k");
  expect_same_bits(std::get<2>(fused), std::get<2>(reference), what + " v");
  expect_same_bits(std::get<3>(fused), std::get<3>(reference), what + " dqkv");
}

std::string name(const GqaCase& c, DType t) {
  return std::string(dtype_name(t)) + " groups " + std::to_string(c.groups) + " per_group " +
         std::to_string(c.per_group) + " D " + std::to_string(c.head_dim) + " rope " + std::to_string(c.rope_dim) +
         " offset " + std::to_string(c.offset);
}

TEST(SplitQkvRope, EqualsSplitThenApplyRopeBitForBit) {
  for (const GqaCase& c : kCases) {
    const te::RopeTable table = te::make_rope_table(c.rope_dim, 32, 500000, true, 8, Device::cpu());
    for (DType t : {DType::F32, DType::BF16, DType::F16}) {
      const Tensor qkv = randn({2, 5, c.groups, (c.per_group + 2) * c.head_dim}, 11).to(t);
      expect_equal_to_unfused(qkv, c, table, Uses{}, name(c, t));
    }
  }
}

TEST(SplitQkvRope, OutputsWithoutGradientContributeZeros) {
  const GqaCase c{2, 2, 16, 8, 3};
  const te::RopeTable table = te::make_rope_table(c.rope_dim, 32, 10000, false, 1, Device::cpu());
  const Tensor qkv = randn({2, 4, c.groups, (c.per_group + 2) * c.head_dim}, 12).to(DType::BF16);
  for (const Uses uses :
       {Uses{true, false, false}, Uses{false, true, false}, Uses{false, false, true}, Uses{true, false, true}})
    expect_equal_to_unfused(
        qkv, c, table, uses,
        "uses q " + std::to_string(uses.q) + " k " + std::to_string(uses.k) + " v " + std::to_string(uses.v));
  // Only q used: the k and v parts of dqkv are exactly zero.
  const auto [q, k, v, dqkv] = run([&](const Tensor& x) { return te::split_qkv_rope(x, c.head_dim, table, c.offset); },
                                   qkv, Uses{true, false, false});
  const Tensor kv_grad = dqkv.view({2, 4, c.groups, c.per_group + 2, c.head_dim}).narrow(3, c.per_group, 2);
  for (double g : kv_grad.to_vector<double>()) ASSERT_EQ(g, 0.0);
}

TEST(SplitQkvRope, ReadsAnyStridesAsContiguous) {
  const GqaCase c{2, 2, 8, 8, 1};
  const te::RopeTable table = te::make_rope_table(8, 16, 10000, false, 1, Device::cpu());
  // qkv as a transposed [B, G, T, .] tensor: made contiguous before the kernel.
  const Tensor strided = randn({2, c.groups, 3, (c.per_group + 2) * c.head_dim}, 13).transpose(1, 2);
  ASSERT_FALSE(strided.is_contiguous());
  const te::SplitQkv got = te::split_qkv_rope(strided, c.head_dim, table, c.offset);
  const te::SplitQkv want = unfused(strided.contiguous(), c.head_dim, table, c.offset);
  expect_same_bits(got.q, want.q, "q");
  expect_same_bits(got.k, want.k, "k");
  expect_same_bits(got.v, want.v.contiguous(), "v");
  EXPECT_TRUE(got.q.is_contiguous() && got.k.is_contiguous() && got.v.is_contiguous());
}

TEST(SplitQkvRope, MatchesTheFloat64Reference) {
  for (const GqaCase& c : kCases) {
    const te::RopeTable table = te::make_rope_table(c.rope_dim, 32, 10000, false, 1, Device::cpu());
    const Tensor qkv = randn({2, 5, c.groups, (c.per_group + 2) * c.head_dim}, 14);
    const te_reference::SplitQkv want = te_reference::split_qkv_rope(qkv, c.head_dim, table.cos, table.sin, c.offset);
    for (DType t : {DType::F64, DType::F32, DType::BF16}) {
      const double tol = t == DType::F64 ? 1e-15 : t == DType::F32 ? 1e-6 : 1e-2;
      const te::SplitQkv got = te::split_qkv_rope(qkv.to(t), c.head_dim, table, c.offset);
      EXPECT_LT(rel_error(got.q, want.q), tol) << name(c, t);
      EXPECT_LT(rel_error(got.k, want.k), tol) << name(c, t);
      EXPECT_LT(rel_error(got.v, want.v), tol) << name(c, t);
    }
  }
}

TEST(SplitQkvRope, GradientsByFiniteDifferences) {
  for (const GqaCase& c : {GqaCase{2, 2, 8, 8, 4}, GqaCase{1, 1, 8, 4, 0}}) {
    const te::RopeTable table = te::make_rope_table(c.rope_dim, 16, 500000, true, 8, Device::cpu());
    const Tensor qkv = randn({2, 3, c.groups, (c.per_group + 2) * c.head_dim}, 15);
    // Each output alone, so the other two arrive as undefined gradients.
    for (int output = 0; output < 3; ++output) {
      const auto result = autograd::gradcheck(
          [&](const std::vector<Tensor>& in) {
            const te::SplitQkv out = te::split_qkv_rope(in[0], c.head_dim, table, c.offset);
            return output == 0 ? out.q : output == 1 ? out.k : out.v;
          },
          {qkv.clone()});  // a leaf of its own: gradients accumulate
      EXPECT_TRUE(result.ok) << "output " << output << ": " << result.message;
    }
  }
}

TEST(SplitQkvRope, RefusesBadInput) {
  const te::RopeTable table = te::make_rope_table(8, 16, 10000, false, 1, Device::cpu());
  te_test::expect_error(
      [&] {
        te::split_qkv_rope(randn({2, 3, 32}, 1), 8, table, 0);
      },
      {"split_qkv_rope", "qkv", "[B, T, groups, (per_group + 2) * head_dim]"});
  // 30 is no multiple of head_dim 8, and 16 leaves no query head (per_group 0).
  te_test::expect_error(
      [&] {
        te::split_qkv_rope(randn({1, 2, 2, 30}, 1), 8, table, 0);
      },
      {"split_qkv_rope", "qkv's last dimension 30", "head_dim 8"});
  te_test::expect_error(
      [&] {
        te::split_qkv_rope(randn({1, 2, 2, 16}, 1), 8, table, 0);
      },
      {"split_qkv_rope", "qkv's last dimension 16", "per_group >= 1"});
  const te::RopeTable f64_table{table.cos.to(DType::F64), table.sin};
  te_test::expect_error(
      [&] {
        te::split_qkv_rope(randn({1, 2, 2, 24}, 1), 8, f64_table, 0);
      },
      {"split_qkv_rope", "table.cos", "float32", "float64"});
  const te::RopeTable f64_sin{table.cos, table.sin.to(DType::F64)};
  te_test::expect_error(
      [&] {
        te::split_qkv_rope(randn({1, 2, 2, 24}, 1), 8, f64_sin, 0);
      },
      {"split_qkv_rope", "table.sin", "float32"});
  te_test::expect_error(
      [&] {
        te::split_qkv_rope(randn({1, 2, 2, 18}, 1), 6, table, 0);
      },
      {"split_qkv_rope", "rotates 8 channels", "head_dim is 6"});
  te_test::expect_error(
      [&] {
        te::split_qkv_rope(randn({1, 10, 2, 24}, 1), 8, table, 7);
      },
      {"split_qkv_rope", "positions 7..16", "16 positions"});
}

TEST(SplitQkvRopeCuda, EqualsUnfusedBitForBitAndMatchesCpu) {
  KILN_TE_REQUIRE_CUDA(dev);
  // Llama-3.2-1B's attention shape (16-byte vectors), a partial table (vectors), and head_dim 12
  // with a 4-channel table (element by element: 12 and 2 are no whole 16-byte vectors).
  for (const GqaCase& c : {GqaCase{8, 4, 64, 64, 0}, GqaCase{2, 2, 128, 64, 9}, GqaCase{3, 2, 12, 4, 5}}) {
    const te::RopeTable cpu_table = te::make_rope_table(c.rope_dim, 200, 500000, true, 32, Device::cpu());
    const te::RopeTable gpu_table = te::make_rope_table(c.rope_dim, 200, 500000, true, 32, dev);
    for (auto [t, tol] : {std::pair{DType::F32, 1e-6}, std::pair{DType::BF16, 1e-2}, std::pair{DType::F16, 2e-3}}) {
      const Tensor qkv = randn({2, 67, c.groups, (c.per_group + 2) * c.head_dim}, 16).to(t);
      expect_equal_to_unfused(qkv.to(dev), c, gpu_table, Uses{}, "cuda " + name(c, t));
      expect_equal_to_unfused(qkv.to(dev), c, gpu_table, Uses{false, true, false}, "cuda k only " + name(c, t));
      const auto on_gpu = run([&](const Tensor& x) { return te::split_qkv_rope(x, c.head_dim, gpu_table, c.offset); },
                              qkv.to(dev), Uses{});
      const auto on_cpu =
          run([&](const Tensor& x) { return te::split_qkv_rope(x, c.head_dim, cpu_table, c.offset); }, qkv, Uses{});
      EXPECT_LT(rel_error(std::get<0>(on_gpu).to(Device::cpu()), std::get<0>(on_cpu)), tol) << name(c, t);
      EXPECT_LT(rel_error(std::get<1>(on_gpu).to(Device::cpu()), std::get<1>(on_cpu)), tol) << name(c, t);
      expect_same_bits(std::get<2>(on_gpu), std::get<2>(on_cpu), "cuda v " + name(c, t));
      EXPECT_LT(rel_error(std::get<3>(on_gpu).to(Device::cpu()), std::get<3>(on_cpu)), tol) << name(c, t);
    }
  }
}

TEST(SplitQkvRopeCuda, MisalignedTensorsTakeTheElementPath) {
  KILN_TE_REQUIRE_CUDA(dev);
  const GqaCase c{2, 2, 64, 64, 0};
  const te::RopeTable table = te::make_rope_table(c.rope_dim, 16, 10000, false, 1, dev);
  // Contiguous views one bf16 element into their storage (not 16-byte aligned): qkv, and the
  // gradients of q, k, v (the backward reads them in place).
  auto misaligned = [&](const Shape& shape, std::uint64_t seed) {
    const Tensor storage = randn({numel_of(shape) + 1}, seed).to(DType::BF16).to(dev);
    Tensor view = storage.narrow(0, 1, numel_of(shape)).view(shape);
    EXPECT_TRUE(view.is_contiguous());
    return view;
  };
  const Shape shape{1, 3, c.groups, (c.per_group + 2) * c.head_dim};
  const Tensor qkv = misaligned(shape, 17);
  Tensor fused_leaf = qkv.clone().requires_grad_(true), unfused_leaf = qkv.clone().requires_grad_(true);
  // The leaves are aligned; narrow + view of a one-element-larger copy gives the kernel a misaligned qkv.
  auto shifted = [&](const Tensor& leaf) {
    return cat({Tensor::zeros({1}, DType::BF16, dev), leaf.reshape({numel_of(shape)})}, 0)
        .narrow(0, 1, numel_of(shape))
        .view(shape);
  };
  const te::SplitQkv got = te::split_qkv_rope(shifted(fused_leaf), c.head_dim, table, c.offset);
  const te::SplitQkv want = unfused(shifted(unfused_leaf), c.head_dim, table, c.offset);
  const Tensor gq = misaligned(got.q.shape(), 18), gk = misaligned(got.k.shape(), 19),
               gv = misaligned(got.v.shape(), 20);
  autograd::run_backward({got.q, got.k, got.v}, {gq, gk, gv}, false);
  autograd::run_backward({want.q, want.k, want.v}, {gq, gk, gv}, false);
  expect_same_bits(got.q, want.q, "misaligned q");
  expect_same_bits(got.k, want.k, "misaligned k");
  expect_same_bits(got.v, want.v, "misaligned v");
  expect_same_bits(fused_leaf.grad(), unfused_leaf.grad(), "misaligned dqkv");
}

}  // namespace qkv_rope_test
}  // namespace kiln
