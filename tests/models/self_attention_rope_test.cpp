// SelfAttention's QKV split + RoPE through CoreOps::split_qkv_rope: on the transformer_engine table
// (te::split_qkv_rope, one kernel each way) the layer's output and every gradient equal, bit for
// bit, those of the path it replaced there (split_sizes, q's copy, te::apply_rope on q and on k, v
// a strided view), for GQA shapes, at f32 and bf16, at a position offset.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/models/transformer_attention.h"
#include "kiln/models/transformer_core_ops.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {
namespace self_attention_rope_test {

// The transformer_engine table with the split and the rotations unfused, as SelfAttention ran them
// before split_qkv_rope.
CoreOps te_ops_with_unfused_split() {
  CoreOps ops = te_core_ops();
  ops.name = "transformer_engine, unfused split + RoPE";
  ops.split_qkv_rope = [](const Tensor& qkv, std::int64_t head_dim, const RopeTable& table, std::int64_t offset) {
    auto [q, k, v] = split_grouped_qkv(qkv, head_dim);
    const CoreOps& te = te_core_ops();
    return std::tuple<Tensor, Tensor, Tensor>{te.apply_rope(q, table, offset), te.apply_rope(k, table, offset), v};
  };
  return ops;
}

struct Pass {
  Tensor out, dhidden;
  std::vector<std::string> names;
  std::vector<Tensor> grads;
};

// One forward and backward of a layer with fixed weights, input and output gradient.
Pass run(const CoreOps& ops, std::int64_t heads, std::int64_t groups, DType dtype, std::int64_t offset) {
  SelfAttentionSpec spec;
  spec.hidden_size = 32;
  spec.num_heads = heads;
  spec.num_query_groups = groups;
  spec.head_dim = 8;
  spec.rope = true;
  LayerContext context;
  context.ops = &ops;
  SelfAttention layer(spec, 0, 7, context);
  {
    NoGradGuard no_grad;
    std::uint64_t seed = 40;
    for (const auto& [name, p] : layer.named_parameters()) {
      Tensor param = p;  // the same storage, not const
      param.copy_(Tensor::randn(p.shape(), seed++, p.dtype()).mul_(0.3));
    }
  }
  layer.to(dtype);
  const RopeTable table = ops.make_rope_table(spec.head_dim, 32, 500000, true, 8, Device::cpu());
  PositionContext positions;
  positions.rope = &table;
  positions.position_offset = offset;
  Tensor hidden = Tensor::randn({2, 6, spec.hidden_size}, 3).to(dtype).requires_grad_(true);
  Pass pass;
  pass.out = layer.forward(hidden, positions);
  pass.out.backward(Tensor::randn(pass.out.shape(), 4).to(dtype));
  pass.dhidden = hidden.grad();
  for (const auto& [name, p] : layer.named_parameters()) {
    pass.names.push_back(name);
    pass.grads.push_back(p.grad());
  }
  return pass;
}

void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined() && want.defined()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const Tensor a = got.contiguous(), b = want.contiguous();
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << what;
}

TEST(SelfAttentionRope, FusedSplitEqualsTheUnfusedPathBitForBit) {
  const CoreOps unfused = te_ops_with_unfused_split();
  struct Heads {
    std::int64_t heads, groups;
  };
  for (const Heads s : {Heads{4, 4}, Heads{4, 2}, Heads{8, 2}})
    for (DType dtype : {DType::F32, DType::BF16}) {
      const std::string what =
          std::string(dtype_name(dtype)) + " heads " + std::to_string(s.heads) + " groups " + std::to_string(s.groups);
      const Pass fused = run(te_core_ops(), s.heads, s.groups, dtype, 5);
      const Pass reference = run(unfused, s.heads, s.groups, dtype, 5);
      expect_same_bits(fused.out, reference.out, what + " output");
      expect_same_bits(fused.dhidden, reference.dhidden, what + " input gradient");
      ASSERT_EQ(fused.names, reference.names);
      for (std::size_t i = 0; i < fused.grads.size(); ++i)
        expect_same_bits(fused.grads[i], reference.grads[i], what + " gradient of " + fused.names[i]);
    }
}

}  // namespace self_attention_rope_test
}  // namespace kiln::models
