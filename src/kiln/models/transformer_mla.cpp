#include "kiln/models/transformer_mla.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "kiln/autograd/functions.h"
#include "kiln/models/context_parallel_attention.h"
#include "kiln/models/tensor_parallel_mappings.h"
#include "kiln/runtime/error.h"

namespace kiln::models {

namespace {

// FP8 (a recipe in the context) for the projections whose in and out sizes are multiples of 16 (FP8
// GEMMs' rule); the others, e.g. a small LoRA rank plus the RoPE channels, stay in the model's dtype
// rather than refusing the run (docs/llm.md, FP8).
LayerContext fp8_if_aligned(const LayerContext& context, std::int64_t in, std::int64_t out) {
  LayerContext c = context;
  if (in % 16 != 0 || out % 16 != 0) c.fp8 = nullptr;
  return c;
}

}  // namespace

MlaSelfAttention::MlaSelfAttention(const SelfAttentionSpec& attention, const MlaSpec& mla, std::int64_t layer_number,
                                   std::uint64_t dropout_seed, const LayerContext& context)
    : Module("MLASelfAttention"), spec(attention), mla(mla), layer_number(layer_number), context_(context) {
  KILN_CHECK(mla.enabled && mla.kv_lora_rank > 0 && mla.qk_head_dim > 0 && mla.v_head_dim > 0 &&
                 mla.qk_pos_emb_head_dim > 0 && mla.q_lora_rank >= 0,
             "MlaSelfAttention: invalid sizes (kv_lora_rank {}, q_lora_rank {}, qk {}, pe {}, v {})", mla.kv_lora_rank,
             mla.q_lora_rank, mla.qk_head_dim, mla.qk_pos_emb_head_dim, mla.v_head_dim);
  const std::int64_t h = spec.hidden_size, nh = spec.num_heads;
  const std::int64_t q_width = nh * (mla.qk_head_dim + mla.qk_pos_emb_head_dim);
  auto column = [&](std::int64_t in, std::int64_t out) {
    return std::make_shared<ParallelLinear>(ParallelLinearKind::Column, in, out, /*bias=*/false,
                                            fp8_if_aligned(context, in, out));
  };
  // The down projections are whole on every tensor-parallel rank (Megatron's "duplicated" linears):
  // plain linears of this rank's tokens, built without the groups (tensor_parallel_layout() marks them).
  LayerContext whole_context = context;
  whole_context.groups = nullptr;
  whole_context.sequence_parallel = false;
  auto replicated = [&](std::int64_t in, std::int64_t out) {
    return std::make_shared<ParallelLinear>(ParallelLinearKind::Column, in, out, /*bias=*/false,
                                            fp8_if_aligned(whole_context, in, out));
  };
  if (mla.q_lora_rank == 0) {
    linear_q_proj = register_module("linear_q_proj", column(h, q_width));
  } else {
    linear_q_down_proj = register_module("linear_q_down_proj", replicated(h, mla.q_lora_rank));
    q_layernorm = register_module("q_layernorm", std::make_shared<TransformerNorm>(mla.q_layernorm, context));
    linear_q_up_proj = register_module("linear_q_up_proj", column(mla.q_lora_rank, q_width));
  }
  linear_kv_down_proj =
      register_module("linear_kv_down_proj", replicated(h, mla.kv_lora_rank + mla.qk_pos_emb_head_dim));
  kv_layernorm = register_module("kv_layernorm", std::make_shared<TransformerNorm>(mla.kv_layernorm, context));
  linear_kv_up_proj =
      register_module("linear_kv_up_proj", column(mla.kv_lora_rank, nh * (mla.qk_head_dim + mla.v_head_dim)));
  linear_proj = register_module(
      "linear_proj", std::make_shared<ParallelLinear>(ParallelLinearKind::Row, nh * mla.v_head_dim, h, spec.bias,
                                                      fp8_if_aligned(context, nh * mla.v_head_dim, h)));
  attention_dropout =
      register_module("attention_dropout", std::make_shared<nn::Dropout>(spec.attention_dropout, dropout_seed));
}

Tensor MlaSelfAttention::forward(const Tensor& hidden, const PositionContext& positions) {
  KILN_CHECK(hidden.dim() == 3 && hidden.size(2) == spec.hidden_size,
             "MlaSelfAttention: expected hidden states [B, T, {}], got {}", spec.hidden_size, hidden.describe());
  KILN_CHECK(positions.rope != nullptr, "MlaSelfAttention: the decoupled RoPE needs the rotary table");
  // Tensor parallelism: this rank's nh / tp heads. The down projections and their norms run on this
  // rank's tokens (under sequence parallelism its slice of the sequence: [B, T/tp, ...]); the
  // column-parallel up projections take them to the whole sequence (copy_to or the sequence gather).
  const dist::Communicator* tp = context_.tensor_parallel_group();
  const std::int64_t b = hidden.size(0), local_t = hidden.size(1),
                     nh = spec.num_heads / context_.tensor_parallel_size();
  const std::int64_t qk = mla.qk_head_dim, pe = mla.qk_pos_emb_head_dim, dv = mla.v_head_dim;
  const std::int64_t kvr = mla.kv_lora_rank;
  const CoreOps& ops = *context_.ops;

  Tensor q = mla.q_lora_rank == 0
                 ? linear_q_proj->forward(hidden)
                 : linear_q_up_proj->forward(q_layernorm->forward(linear_q_down_proj->forward(hidden)).first);
  const std::int64_t t = q.size(1);  // the whole sequence
  q = q.view({b, t, nh, qk + pe});
  Tensor q_nope = q.narrow(3, 0, qk);
  Tensor q_pe = ops.apply_rope(q.narrow(3, qk, pe), *positions.rope, positions.position_offset);

  Tensor kv_down = linear_kv_down_proj->forward(hidden);  // [B, T (T/tp), kvr + pe]
  Tensor latent = kv_layernorm->forward(kv_down.narrow(2, 0, kvr)).first.reshape({b, local_t, 1, kvr});
  // The shared key part k_pe meets every rank's heads: the sequence gathered under sequence
  // parallelism, and in the backward the heads' gradients summed over the group (the gather's
  // reduce-scatter, or copy_to's all-reduce).
  Tensor k_pe = kv_down.narrow(2, kvr, pe);
  if (tp != nullptr)
    k_pe = context_.sequence_parallel ? gather_from_sequence_parallel_region(k_pe.contiguous(), *tp)
                                      : copy_to_tensor_parallel_region(k_pe, *tp);
  k_pe = ops.apply_rope(k_pe.reshape({b, t, 1, pe}), *positions.rope,
                        positions.position_offset);  // one rotated key part per token, shared by the heads
  // Generation: the cache holds the latents and rotated k_pe of every position so far.
  if (positions.cache != nullptr) std::tie(latent, k_pe) = positions.cache->update(layer_number, latent, k_pe);
  const std::int64_t s = k_pe.size(1);

  Tensor kv = linear_kv_up_proj->forward(latent.reshape({b, latent.size(1), kvr})).view({b, s, nh, qk + dv});
  Tensor k_nope = kv.narrow(3, 0, qk), v = kv.narrow(3, qk, dv);
  Tensor query = cat({q_nope, q_pe}, 3);                       // [B, T, nh, qk + pe]
  Tensor key = cat({k_nope, k_pe.expand({b, s, nh, pe})}, 3);  // [B, S, nh, qk + pe]

  // The core attention takes v's head size (dv) apart from q's and k's (qk + pe: 192 against 128 in
  // DeepSeek-V3): cuDNN's kernels as they are, Kiln's on zero-padded operands (te::attention), the
  // local path with plain matmuls. The scale is set from qk + pe explicitly.
  const double scale = 1.0 / std::sqrt(static_cast<double>(qk + pe));
  // Context parallelism: t is this rank's part of the sequence (its RoPE rows are its positions',
  // GptModel's table); the ring or all-to-all attention spans the whole of it, v's head size its own.
  const dist::Communicator* cp = context_.context_parallel_group();
  KILN_CHECK(cp == nullptr || positions.cache == nullptr,
             "MlaSelfAttention: a KV cache (generation) does not run with context parallelism");
  const Tensor attended = cp != nullptr
                              ? context_parallel_attention(context_.cp_comm_type, ops, query, key, v, *cp,
                                                           attention_dropout, spec.recompute_core_attention, scale)
                              : run_core_attention(ops, query, key, v, attention_dropout, spec.recompute_core_attention,
                                                   scale);  // [B, T, nh, dv]
  return linear_proj->forward(attended.reshape({b, t, nh * dv}));
}

}  // namespace kiln::models
