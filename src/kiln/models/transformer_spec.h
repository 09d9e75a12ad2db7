#pragma once
// What a GPT decoder layer is made of, apart from how it computes (Megatron-core's ModuleSpec
// idea, kept small): sizes, which norm, whether attention rotates with RoPE, which MLP activation,
// biases, dropout rates and init scales. gpt_layer_spec() derives it from a validated GptConfig;
// the modules (transformer_layer.h) are built from a spec, and run with the CoreOps of
// transformer_core_ops.h.
#include <cstdint>
#include <memory>

#include "kiln/models/gpt_config.h"

namespace kiln::models {

struct MoeSpec;  // MoE: models/moe_spec.h

struct NormSpec {
  Normalization kind = Normalization::LayerNorm;  // LayerNorm has a bias, RMSNorm none
  std::int64_t size = 0;
  double eps = 1e-5;
};

// Megatron's init: N(0, std) for every weight, N(0, std / sqrt(2 * num_layers)) for the two output
// projections of a layer (linear_proj, linear_fc2), biases 0, norm weights 1 and biases 0.
struct InitSpec {
  double std = 0.02;
  double output_std = 0.02;
};

struct SelfAttentionSpec {
  std::int64_t hidden_size = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_query_groups = 0;
  std::int64_t head_dim = 0;
  bool rope = false;  // rotate q and k; otherwise positions come from the embedding (or nowhere)
  bool bias = true;   // linear_qkv and linear_proj
  double attention_dropout = 0;
  bool recompute_core_attention = false;  // --recompute-granularity selective
};

enum class MlpActivation { GeluTanh, SwiGLU };

struct MlpSpec {
  std::int64_t hidden_size = 0;
  std::int64_t ffn_hidden_size = 0;  // F: linear_fc1 has F rows, or 2F (gate | up) with SwiGLU
  MlpActivation activation = MlpActivation::GeluTanh;
  bool bias = true;
};

// MLA: multi-head latent attention's sizes (transformer_mla.h); enabled replaces the layer's
// SelfAttention by MlaSelfAttention (SelfAttentionSpec still gives hidden size, heads, linear_proj's
// bias, dropout and recompute; its query groups and head_dim are unused).
struct MlaSpec {
  bool enabled = false;
  std::int64_t q_lora_rank = 0;  // 0: linear_q_proj, no query compression
  std::int64_t kv_lora_rank = 0;
  std::int64_t qk_head_dim = 0, qk_pos_emb_head_dim = 0, v_head_dim = 0;
  NormSpec q_layernorm, kv_layernorm;
};

// input_layernorm -> self_attention -> dropout + residual -> pre_mlp_layernorm -> mlp -> dropout + residual
struct TransformerLayerSpec {
  NormSpec input_layernorm;
  SelfAttentionSpec self_attention;
  NormSpec pre_mlp_layernorm;
  MlpSpec mlp;
  MlaSpec mla;  // MLA
  double hidden_dropout = 0;
  InitSpec init;
  std::shared_ptr<const MoeSpec> moe;  // MoE: set on MoE layers (the mlp is a MoeLayer)
};

TransformerLayerSpec gpt_layer_spec(const GptConfig& config);
NormSpec final_norm_spec(const GptConfig& config);

}  // namespace kiln::models
