#pragma once
// SelfAttention (Megatron-core's): linear_qkv -> split into q, k, v per query group -> RoPE on q and
// k (or none) -> core attention (causal, GQA) -> linear_proj.
//
// linear_qkv's rows are grouped per query group g (Megatron's layout): its heads / groups query
// heads, then its key head, then its value head, each head_dim rows. So the output, viewed as
// [B, T, groups, (heads / groups + 2) * head_dim], splits along the last dimension into q, k, v.
//
// With tensor parallelism each rank holds heads / tp query heads and groups / tp query groups: a
// contiguous range of whole query groups, which in the grouped layout is a contiguous range of
// linear_qkv's rows (so the column-parallel split is the plain row split) and of linear_proj's columns.
//
// With a KvCache the new keys and values are stored in it and the queries attend to every cached
// position (no gradients flow into the cache).
#include <cstdint>
#include <memory>

#include "kiln/models/gpt_kv_cache.h"
#include "kiln/models/transformer_linear.h"
#include "kiln/models/transformer_spec.h"
#include "kiln/nn/layers.h"

namespace kiln::models {

// Where the tokens of a forward sit: positions start at position_offset (cache->length() when
// generating), RoPE's table when the layers rotate, and the cache to append to.
struct PositionContext {
  // Context parallelism: the table's row p holds the rotation of this rank's p-th token (its true
  // position; GptModel gathers it), so position_offset stays 0.
  const RopeTable* rope = nullptr;
  std::int64_t position_offset = 0;
  KvCache* cache = nullptr;
};

// Causal core attention through ops.attention, with dropout on the probabilities in training and
// Megatron's selective recompute (the [B, H, T, S] scores are not kept) when `recompute` and
// gradients are on. softmax_scale 0: 1 / sqrt(D). Shared by SelfAttention and MlaSelfAttention.
Tensor run_core_attention(const CoreOps& ops, const Tensor& q, const Tensor& k, const Tensor& v,
                          const std::shared_ptr<nn::Dropout>& dropout, bool recompute, double softmax_scale = 0);

// The dropout seed of tensor-parallel rank `rank` for dropout inside the tensor-parallel region or on
// the sequence slices: a different stream per rank (Megatron's model-parallel RNG tracker).
std::uint64_t tensor_parallel_dropout_seed(std::uint64_t seed, int tensor_parallel_rank);

class SelfAttention : public nn::Module {
 public:
  SelfAttention(const SelfAttentionSpec& spec, std::int64_t layer_number, std::uint64_t dropout_seed,
                const LayerContext& context);
  // hidden [B, T, H] -> [B, T, H] (linear_proj's output, bias included).
  // qkv_cast: hidden's FP8 cast made by the fused input norm (hidden is then its placeholder).
  Tensor forward(const Tensor& hidden, const PositionContext& positions, const Fp8Tensor* qkv_cast = nullptr);

  SelfAttentionSpec spec;
  std::int64_t layer_number;  // index into the KvCache
  std::shared_ptr<ParallelLinear> linear_qkv, linear_proj;
  std::shared_ptr<nn::Dropout> attention_dropout;  // on the attention probabilities

 private:
  LayerContext context_;
  std::int64_t local_heads_ = 0, local_groups_ = 0;  // this rank's (all of them without tensor parallelism)
};

}  // namespace kiln::models
