#pragma once
// The small MLA + MTP config the model tests use (mla_mtp_test.cpp, mla_mtp_parity_test.cpp,
// gpt_config_test.cpp): DeepSeek-V3 style in miniature. Query compression, qk head 8 + RoPE 4 (12)
// against value head 6 (so V is padded for the core attention), RMSNorm, SwiGLU, no biases, 2 MTP
// depths, no dropout.
#include "kiln/models/gpt_config.h"

namespace kiln::models::test_configs {

inline GptConfig small_mla_mtp() {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.ffn_hidden_size = 40;
  c.num_attention_heads = 4;
  c.seq_length = 10;
  c.max_position_embeddings = 16;
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 1;
  c.position_embedding_type = PositionEmbedding::Rope;
  c.normalization = Normalization::RMSNorm;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.attention_dropout = 0;
  c.hidden_dropout = 0;
  c.multi_latent_attention = true;
  c.q_lora_rank = 12;
  c.kv_lora_rank = 10;
  c.qk_head_dim = 8;
  c.qk_pos_emb_head_dim = 4;
  c.v_head_dim = 6;
  c.mtp_num_layers = 2;
  c.mtp_loss_scaling_factor = 0.3;
  return c;
}

}  // namespace kiln::models::test_configs
