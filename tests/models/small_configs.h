#pragma once
// The small GPT-2 and Llama style configs the model tests compare implementations on (Kiln against
// PyTorch, transformer_engine against local): every feature of each style in a few thousand
// parameters.
#include "kiln/models/gpt_config.h"

namespace kiln::models::test_configs {

// GPT-2 style: learned positions, LayerNorm, GELU(tanh), biases, tied output layer, padded vocabulary.
inline GptConfig small_gpt2() {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 48;
  c.num_attention_heads = 4;
  c.seq_length = 12;
  c.max_position_embeddings = 16;
  c.vocab_size = 100;  // padded to 128: the padded rows take part in the softmax, as in Megatron
  return c;
}

// Llama style: RoPE (base 5e5, Llama 3 scaling: with head size 16 the frequencies fall in all three
// bands), RMSNorm, SwiGLU, GQA (8 heads, 2 groups), --kv-channels 16 (heads * 16 != hidden), no
// biases, untied output layer.
inline GptConfig small_llama() {
  GptConfig c = GptConfig::llama3_8b(100);
  c.num_layers = 2;
  c.hidden_size = 64;
  c.ffn_hidden_size = 96;
  c.num_attention_heads = 8;
  c.num_query_groups = 2;
  c.kv_channels = 16;
  c.seq_length = 12;
  c.max_position_embeddings = 64;
  c.rope_llama3_scaling = true;
  c.rope_scaling_factor = 8;
  c.make_vocab_size_divisible_by = 1;
  return c;
}

}  // namespace kiln::models::test_configs
