#include "kiln/models/transformer_attention.h"

#include <tuple>

#include "kiln/autograd/checkpoint.h"
#include "kiln/autograd/functions.h"
#include "kiln/models/context_parallel_attention.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {

SelfAttention::SelfAttention(const SelfAttentionSpec& spec, std::int64_t layer_number, std::uint64_t dropout_seed,
                             const LayerContext& context)
    : Module("SelfAttention"), spec(spec), layer_number(layer_number), context_(context) {
  KILN_CHECK(spec.num_query_groups > 0 && spec.num_heads % spec.num_query_groups == 0,
             "SelfAttention: {} query groups do not divide {} heads", spec.num_query_groups, spec.num_heads);
  const std::int64_t qkv_rows = (spec.num_heads + 2 * spec.num_query_groups) * spec.head_dim;
  linear_qkv = register_module(
      "linear_qkv",
      std::make_shared<ParallelLinear>(ParallelLinearKind::Column, spec.hidden_size, qkv_rows, spec.bias, context));
  linear_proj = register_module(
      "linear_proj", std::make_shared<ParallelLinear>(ParallelLinearKind::Row, spec.num_heads * spec.head_dim,
                                                      spec.hidden_size, spec.bias, context));
  // Tensor parallelism: this rank's heads and query groups (whole ones; GptConfig refuses sizes
  // that do not divide), and dropout masks of its own (Megatron's model-parallel RNG: the ranks'
  // heads are different heads, so they do not share a mask).
  const int tp = context.tensor_parallel_size();
  KILN_CHECK(spec.num_heads % tp == 0 && spec.num_query_groups % tp == 0,
             "SelfAttention: {} heads and {} query groups do not split over --tensor-model-parallel-size {}",
             spec.num_heads, spec.num_query_groups, tp);
  local_heads_ = spec.num_heads / tp;
  local_groups_ = spec.num_query_groups / tp;
  const std::uint64_t seed =
      tp > 1 ? tensor_parallel_dropout_seed(dropout_seed, context.tensor_parallel_rank()) : dropout_seed;
  attention_dropout = register_module("attention_dropout", std::make_shared<nn::Dropout>(spec.attention_dropout, seed));
}

std::uint64_t tensor_parallel_dropout_seed(std::uint64_t seed, int tensor_parallel_rank) {
  // Megatron's model-parallel seed offset (2718 + tp rank), mixed in so each rank draws its own masks.
  return seed ^ ((2718ull + static_cast<std::uint64_t>(tensor_parallel_rank)) * 0x9e3779b97f4a7c15ull);
}

Tensor run_core_attention(const CoreOps& ops, const Tensor& q, const Tensor& k, const Tensor& v,
                          const std::shared_ptr<nn::Dropout>& dropout, bool recompute, double softmax_scale) {
  CoreAttentionOptions options;
  options.causal = true;
  options.softmax_scale = softmax_scale;
  if (dropout->is_training() && dropout->p > 0) {
    options.probs_dropout = [dropout](const Tensor& probs) { return dropout->forward(probs); };
    options.dropout_p = dropout->p;
    options.reserve_dropout = [dropout](std::int64_t count, Device device) { return dropout->reserve(count, device); };
  }
  if (recompute && grad_enabled()) {
    // Megatron's selective recompute: the [B, H, T, S] scores and probabilities are not kept.
    // The function outlives this call (the backward runs it again): it holds copies, not references.
    return autograd::checkpoint(
        [ops = &ops, options](const std::vector<Tensor>& in) { return ops->attention(in[0], in[1], in[2], options); },
        {q, k, v});
  }
  return ops.attention(q, k, v, options);
}

Tensor SelfAttention::forward(const Tensor& hidden, const PositionContext& positions, const Fp8Tensor* qkv_cast) {
  KILN_CHECK(hidden.dim() == 3 && hidden.size(2) == spec.hidden_size,
             "SelfAttention: expected hidden states [B, T, {}], got {}", spec.hidden_size, hidden.describe());
  const std::int64_t b = hidden.size(0), d = spec.head_dim;
  const std::int64_t groups = local_groups_, heads = local_heads_, per_group = heads / groups;

  // Megatron's grouped layout: per query group, its query heads, its key head, its value head.
  // Under sequence parallelism the hidden states are this rank's slice of the sequence; linear_qkv
  // all-gathers them, so attention sees every position.
  Tensor qkv = qkv_cast ? linear_qkv->forward(hidden, *qkv_cast) : linear_qkv->forward(hidden);
  const std::int64_t t = qkv.size(1);
  qkv = qkv.view({b, t, groups, (per_group + 2) * d});
  Tensor q, k, v;  // [B, T, heads, D], [B, T, groups, D], [B, T, groups, D]
  if (spec.rope) {
    KILN_CHECK(positions.rope != nullptr, "SelfAttention: RoPE layers need the rotary table");
    // The split, q's copy, the two rotations and v's copy: one kernel each way on the TE path.
    std::tie(q, k, v) = context_.ops->split_qkv_rope(qkv, d, *positions.rope, positions.position_offset);
  } else {
    std::tie(q, k, v) = split_grouped_qkv(qkv, d);
  }
  if (positions.cache != nullptr) std::tie(k, v) = positions.cache->update(layer_number, k, v);

  // Context parallelism: t is this rank's part of the sequence; attention spans the whole of it.
  const dist::Communicator* cp = context_.context_parallel_group();
  KILN_CHECK(cp == nullptr || positions.cache == nullptr,
             "SelfAttention: a KV cache (generation) does not run with context parallelism");
  Tensor attended = cp != nullptr ? context_parallel_attention(context_.cp_comm_type, *context_.ops, q, k, v, *cp,
                                                               attention_dropout, spec.recompute_core_attention)
                                  : run_core_attention(*context_.ops, q, k, v, attention_dropout,
                                                       spec.recompute_core_attention);  // [B, T, heads, D]
  return linear_proj->forward(attended.reshape({b, t, heads * d}));
}

}  // namespace kiln::models
