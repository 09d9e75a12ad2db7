#pragma once
// The MLA and MTP parts of GptConfig (gpt_config.h): their validation and their terms in
// num_parameters() and flops_per_token(), kept apart from the dense decoder's.
//
// MLA (multi-head latent attention, DeepSeek-V2/V3, Megatron-core's MLASelfAttention): see
// transformer_mla.h for the computation. MTP (DeepSeek-V3's multi-token prediction): see
// multi_token_prediction.h.
#include <cstdint>

#include "kiln/models/gpt_config.h"

namespace kiln::models {

// Throws kiln::Error naming the flags of the first inconsistency of the MLA and MTP fields.
void validate_mla_mtp(const GptConfig& c);

// One layer's attention parameters with MLA (no input norm):
//   q:  q_lora_rank > 0: H * qr + norm(qr) + qr * nh * (qk + pe)   (linear_q_down_proj, q_layernorm, linear_q_up_proj)
//       else             H * nh * (qk + pe)                        (linear_q_proj)
//   kv: H * (kvr + pe) + norm(kvr) + kvr * nh * (qk + v)           (linear_kv_down_proj, kv_layernorm,
//   linear_kv_up_proj) out: (nh * v + bias) * H                                        (linear_proj)
// with norm(n) = n (RMSNorm) or 2n (LayerNorm); only linear_proj has a bias (Megatron's).
std::int64_t mla_attention_parameters(const GptConfig& c);

// One layer's attention multiply-adds per token in the forward with MLA (GEMMs only):
//   q GEMMs (as above, without norms) + H * (kvr + pe) + kvr * nh * (qk + v)
//   + nh * (qk + pe) * S / 2 + nh * v * S / 2      (QK^T and PV, causal half)
//   + nh * v * H                                   (linear_proj)
// Megatron's num_floating_point_operations has the same GEMM terms (and counts norms as + 1s).
double mla_attention_multiply_adds(const GptConfig& c);

// MTP's parameters: per depth enorm + hnorm + final_layernorm (norms), eh_proj (2H -> H, no bias)
// and one transformer layer of `layer_parameters`; the embedding and output head are shared.
std::int64_t mtp_parameters(const GptConfig& c, std::int64_t layer_parameters);

// MTP's forward multiply-adds per token: per depth one transformer layer of `layer_multiply_adds`,
// eh_proj (2H * H) and the shared output head (H * Vpad), as Megatron's MTP term.
double mtp_multiply_adds(const GptConfig& c, double layer_multiply_adds);

}  // namespace kiln::models
