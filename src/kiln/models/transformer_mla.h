#pragma once
// MlaSelfAttention: multi-head latent attention (DeepSeek-V2 section 2.1, DeepSeek-V3; Megatron-core's
// MLASelfAttention), with decoupled RoPE. Per token h [H], heads i = 1 .. nh:
//
//   queries:  c_q = q_layernorm(linear_q_down_proj(h)) [qr];  q = linear_q_up_proj(c_q)      (q_lora_rank > 0)
//             q = linear_q_proj(h)                                                          (q_lora_rank 0)
//             q viewed [nh, qk + pe] = (q_nope [nh, qk] | q_pe [nh, pe]),  q_pe = RoPE(q_pe)
//   keys and values: (c_kv [kvr] | k_pe [pe]) = linear_kv_down_proj(h);  k_pe = RoPE(k_pe), one per token
//             c_kv = kv_layernorm(c_kv);  linear_kv_up_proj(c_kv) viewed [nh, qk + v] = (k_nope | v)
//   attention per head: softmax((q_nope . k_nope + q_pe . k_pe) / sqrt(qk + pe)) v (causal)
//   out = linear_proj(heads concatenated [nh * v])
//
// RoPE is Kiln's rotate-half (the same table as the dense layers', of qk_pos_emb_head_dim channels,
// --rotary-base, optional Llama-3 scaling; not DeepSeek's YaRN). The down and up projections have
// no bias; linear_proj has one with --add-bias-linear (Megatron's).
//
// Generation (KvCache): a layer caches only the normalised latent c_kv [kvr] and the rotated k_pe
// [pe] per token (kv_lora_rank + qk_pos_emb_head_dim values instead of 2 * nh * head_dim), and
// up-projects the cached latents to keys and values at each step.
//
// Core attention runs on CoreOps::attention (te::attention with --transformer-impl
// transformer_engine), which takes keys and values of one head size: see forward() for how v's
// smaller head is padded.
#include <cstdint>
#include <memory>

#include "kiln/models/transformer_attention.h"
#include "kiln/models/transformer_norm.h"

namespace kiln::models {

class MlaSelfAttention : public nn::Module {
 public:
  MlaSelfAttention(const SelfAttentionSpec& attention, const MlaSpec& mla, std::int64_t layer_number,
                   std::uint64_t dropout_seed, const LayerContext& context);
  // hidden [B, T, H] -> [B, T, H]. positions.rope must be a table of qk_pos_emb_head_dim channels.
  Tensor forward(const Tensor& hidden, const PositionContext& positions);

  SelfAttentionSpec spec;
  MlaSpec mla;
  std::int64_t layer_number;  // index into the KvCache
  // Megatron-core's names; linear_q_proj without query compression, else the down/up pair and q_layernorm.
  std::shared_ptr<ParallelLinear> linear_q_proj, linear_q_down_proj, linear_q_up_proj;
  std::shared_ptr<ParallelLinear> linear_kv_down_proj, linear_kv_up_proj, linear_proj;
  std::shared_ptr<TransformerNorm> q_layernorm, kv_layernorm;
  std::shared_ptr<nn::Dropout> attention_dropout;

 private:
  LayerContext context_;
};

}  // namespace kiln::models
