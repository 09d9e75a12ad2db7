#pragma once
// The split of a fused QKV projection with RoPE on q and k, in one kernel each way (TransformerEngine's
// fused QKV RoPE): Megatron's grouped layout [B, T, G, (P + 2) D] (per query group: its P query
// heads, its key head, its value head) to contiguous q, k, v, in place of split_sizes, the copy of
// q that merges the groups' heads, apply_rope on q and on k, and the copy of v the attention makes.
#include <cstdint>

#include "kiln/te/rope.h"
#include "kiln/tensor/tensor.h"

namespace kiln::te {

struct SplitQkv {
  Tensor q;  // [B, T, G P, D], rotated
  Tensor k;  // [B, T, G, D], rotated
  Tensor v;  // [B, T, G, D]
};

// qkv [B, T, G, (P + 2) head_dim] (floating; bf16/f16/f32 on CUDA; any strides, read contiguous),
// P >= 1; token t at position position_offset + t. q and k equal apply_rope(q or k split from qkv,
// table, position_offset) bit for bit (the same per-element math; the table's 2R <= head_dim
// channels rotate, the rest pass through), v the value heads; all three contiguous. Differentiable
// in qkv: the backward writes dqkv in one kernel (dq and dk rotated by -theta, dv copied; an
// output without a gradient contributes zeros).
SplitQkv split_qkv_rope(const Tensor& qkv, std::int64_t head_dim, const RopeTable& table, std::int64_t position_offset);

}  // namespace kiln::te
