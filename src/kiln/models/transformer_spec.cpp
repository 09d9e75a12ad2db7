#include "kiln/models/transformer_spec.h"

#include <cmath>

namespace kiln::models {

NormSpec final_norm_spec(const GptConfig& config) {
  return {config.normalization, config.hidden_size, config.norm_epsilon};
}

TransformerLayerSpec gpt_layer_spec(const GptConfig& config) {
  TransformerLayerSpec spec;
  spec.input_layernorm = final_norm_spec(config);
  spec.pre_mlp_layernorm = final_norm_spec(config);

  SelfAttentionSpec& attention = spec.self_attention;
  attention.hidden_size = config.hidden_size;
  attention.num_heads = config.num_attention_heads;
  attention.num_query_groups = config.query_groups();
  attention.head_dim = config.head_dim();
  attention.rope = config.position_embedding_type == PositionEmbedding::Rope;
  attention.bias = config.add_bias_linear;
  attention.attention_dropout = config.attention_dropout;
  attention.recompute_core_attention = config.recompute_granularity == RecomputeGranularity::Selective;

  spec.mlp.hidden_size = config.hidden_size;
  spec.mlp.ffn_hidden_size = config.ffn_hidden();
  spec.mlp.activation = config.swiglu ? MlpActivation::SwiGLU : MlpActivation::GeluTanh;
  spec.mlp.bias = config.add_bias_linear;

  // MLA
  spec.mla.enabled = config.multi_latent_attention;
  if (spec.mla.enabled) {
    spec.mla.q_lora_rank = config.q_lora_rank;
    spec.mla.kv_lora_rank = config.kv_lora_rank;
    spec.mla.qk_head_dim = config.qk_head_dim;
    spec.mla.qk_pos_emb_head_dim = config.qk_pos_emb_head_dim;
    spec.mla.v_head_dim = config.v_head_dim;
    spec.mla.q_layernorm = {config.normalization, config.q_lora_rank, config.norm_epsilon};
    spec.mla.kv_layernorm = {config.normalization, config.kv_lora_rank, config.norm_epsilon};
  }

  spec.hidden_dropout = config.hidden_dropout;
  spec.init.std = config.init_method_std;
  spec.init.output_std = config.init_method_std / std::sqrt(2.0 * static_cast<double>(config.num_layers));
  return spec;
}

}  // namespace kiln::models
