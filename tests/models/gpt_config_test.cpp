// GptConfig: validation messages name Megatron's flags; vocabulary padding; parameter counts against
// the published ones; Megatron's FLOP formula.
#include "kiln/models/gpt_config.h"

#include <gtest/gtest.h>

#include <string>

#include "kiln/runtime/error.h"
#include "mla_configs.h"

namespace kiln::models {
namespace gpt_config_test {

GptConfig tiny() {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.seq_length = 16;
  c.vocab_size = 100;
  return c;
}

// The message validate() throws, or "" when it accepts the config.
std::string validation_error(const GptConfig& c) {
  try {
    c.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_refused(const GptConfig& c, std::initializer_list<const char*> words) {
  const std::string message = validation_error(c);
  ASSERT_FALSE(message.empty()) << "the config was accepted";
  for (const char* w : words) EXPECT_NE(message.find(w), std::string::npos) << "'" << w << "' not in: " << message;
}

TEST(GptConfig, TinyAndPresetsAreValid) {
  EXPECT_EQ(validation_error(tiny()), "");
  EXPECT_EQ(validation_error(GptConfig::gpt2_124m(50257)), "");
  EXPECT_EQ(validation_error(GptConfig::gpt2_350m(50257)), "");
  EXPECT_EQ(validation_error(GptConfig::llama3_2_1b(128256)), "");
  EXPECT_EQ(validation_error(GptConfig::llama3_8b(128256)), "");
}

TEST(GptConfig, HeadsNotDividingHiddenNeedKvChannels) {
  GptConfig c = tiny();
  c.num_attention_heads = 6;  // 64 / 6
  expect_refused(c, {"--hidden-size (64)", "--num-attention-heads (6)", "--kv-channels"});
  c.kv_channels = 16;  // an explicit head size makes it valid
  EXPECT_EQ(validation_error(c), "");
  EXPECT_EQ(c.head_dim(), 16);
}

TEST(GptConfig, QueryGroupsMustDivideHeads) {
  GptConfig c = tiny();
  c.num_query_groups = 3;
  expect_refused(c, {"--num-attention-heads (4)", "--num-query-groups (3)"});
  c.num_query_groups = 8;  // more groups than heads
  expect_refused(c, {"--num-query-groups (8)"});
  c.num_query_groups = 2;
  EXPECT_EQ(validation_error(c), "");
}

TEST(GptConfig, SeqLengthBeyondMaxPositions) {
  GptConfig c = tiny();
  c.max_position_embeddings = 8;
  expect_refused(c, {"--seq-length (16)", "--max-position-embeddings (8)"});
  c.max_position_embeddings = 0;  // defaults to seq_length
  EXPECT_EQ(c.max_positions(), 16);
  EXPECT_EQ(validation_error(c), "");
}

TEST(GptConfig, SwigluFfnDefaultAndTooSmallHidden) {
  GptConfig c = tiny();
  c.swiglu = true;
  EXPECT_EQ(c.ffn_hidden(), 128);  // Megatron: int(4 * 64 * 2 / 3 / 64) * 64
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  expect_refused(c, {"--swiglu", "--ffn-hidden-size"});
  c.ffn_hidden_size = 40;
  EXPECT_EQ(validation_error(c), "");
  GptConfig plain = tiny();
  EXPECT_EQ(plain.ffn_hidden(), 256);  // 4 * hidden
}

TEST(GptConfig, OtherFlagsAreNamed) {
  GptConfig c = tiny();
  c.num_layers = 0;
  expect_refused(c, {"--num-layers"});
  c = tiny();
  c.attention_dropout = 1.0;
  expect_refused(c, {"--attention-dropout"});
  c = tiny();
  c.hidden_dropout = -0.1;
  expect_refused(c, {"--hidden-dropout"});
  c = tiny();
  c.init_method_std = 0;
  expect_refused(c, {"--init-method-std"});
  c = tiny();
  c.norm_epsilon = 0;
  expect_refused(c, {"--norm-epsilon"});
  c = tiny();
  c.make_vocab_size_divisible_by = 0;
  expect_refused(c, {"--make-vocab-size-divisible-by"});
  c = tiny();
  c.vocab_size = 0;
  expect_refused(c, {"tokenizer"});
  c = tiny();
  c.position_embedding_type = PositionEmbedding::Rope;
  c.kv_channels = 7;
  expect_refused(c, {"--position-embedding-type rope", "even"});
  c = tiny();
  c.rope_llama3_scaling = true;  // learned positions
  expect_refused(c, {"--position-embedding-type", "learned_absolute"});
  c = tiny();
  c.recompute_granularity = RecomputeGranularity::Full;
  c.recompute_num_layers = 3;
  expect_refused(c, {"--recompute-num-layers (3)", "--num-layers (2)"});
}

TEST(GptConfig, ParseNamesMegatronsSpellings) {
  EXPECT_EQ(parse_position_embedding("rope"), PositionEmbedding::Rope);
  EXPECT_EQ(parse_normalization("RMSNorm"), Normalization::RMSNorm);
  EXPECT_EQ(parse_transformer_impl("transformer_engine"), TransformerImpl::TransformerEngine);
  EXPECT_EQ(parse_recompute_granularity("selective"), RecomputeGranularity::Selective);
  EXPECT_EQ(parse_recompute_method("block"), RecomputeMethod::Block);
  for (auto v : {PositionEmbedding::LearnedAbsolute, PositionEmbedding::Rope, PositionEmbedding::None})
    EXPECT_EQ(parse_position_embedding(to_string(v)), v);
  try {
    parse_normalization("layernorm");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--normalization: 'layernorm' is not one of LayerNorm, RMSNorm"),
              std::string::npos)
        << e.what();
  }
}

TEST(GptConfig, PaddedVocabRoundsUpToTheMultiple) {
  GptConfig c = GptConfig::gpt2_124m(50257);
  EXPECT_EQ(c.padded_vocab_size(), 50304);
  c.make_vocab_size_divisible_by = 1;
  EXPECT_EQ(c.padded_vocab_size(), 50257);
  c.vocab_size = 50304;
  c.make_vocab_size_divisible_by = 128;
  EXPECT_EQ(c.padded_vocab_size(), 50304);
}

// The published counts: Hugging Face's GPT-2 (124,439,808 with its unpadded vocabulary of 50257 and
// 1024 learned positions, tied), Llama-3.2-1B (1,235,814,400, tied) and Llama-3-8B (8,030,261,248).
TEST(GptConfig, ParameterCountsMatchThePublishedModels) {
  GptConfig gpt2 = GptConfig::gpt2_124m(50257);
  gpt2.make_vocab_size_divisible_by = 1;
  EXPECT_EQ(gpt2.num_parameters(), 124439808);
  gpt2.make_vocab_size_divisible_by = 128;  // Megatron pads to 50304: 47 more rows of 768
  EXPECT_EQ(gpt2.num_parameters(), 124439808 + 47 * 768);
  EXPECT_EQ(GptConfig::llama3_2_1b(128256).num_parameters(), 1235814400);
  EXPECT_EQ(GptConfig::llama3_8b(128256).num_parameters(), 8030261248);
}

// Megatron's formula for a GPT-2 shape (MHA, no SwiGLU) reduces to the closed form of Narayanan et
// al. with the causal half of attention: 72 L H^2 (1 + S / (12 H) + V / (12 L H)) per token.
TEST(GptConfig, FlopsPerTokenIsMegatronsFormula) {
  const GptConfig gpt2 = GptConfig::gpt2_124m(50257);
  const double l = 12, h = 768, s = 1024, v = 50304;
  const double closed_form = 72 * l * h * h * (1 + s / (12 * h) + v / (12 * l * h));
  EXPECT_NEAR(gpt2.flops_per_token(), closed_form, closed_form * 1e-12);

  // Llama-3-8B (GQA, SwiGLU), term by term: 6 * (L * (qkv + attention + proj + mlp) + H * V).
  const GptConfig llama = GptConfig::llama3_8b(128256);
  const double H = 4096, F = 14336, q = 32 * 128, k = 8 * 128, S = 8192, V = 128256;
  const double per_layer = H * (q + 2 * k) + q * S + q * H + 3 * H * F;
  const double expected = 6 * (32 * per_layer + H * V);
  EXPECT_NEAR(llama.flops_per_token(), expected, expected * 1e-12);
}

// MLA, MTP: the refusals name the flags.
TEST(GptConfig, MlaRefusalsNameTheFlags) {
  GptConfig c = test_configs::small_mla_mtp();
  c.kv_lora_rank = 4 * (8 + 6);  // as wide as the keys and values it would compress
  expect_refused(c, {"--kv-lora-rank", "--qk-head-dim", "--v-head-dim"});
  c = test_configs::small_mla_mtp();
  c.q_lora_rank = 4 * (8 + 4);
  expect_refused(c, {"--q-lora-rank", "--qk-pos-emb-head-dim"});
  c = test_configs::small_mla_mtp();
  c.num_query_groups = 2;
  expect_refused(c, {"--multi-latent-attention", "--num-query-groups"});
  c = test_configs::small_mla_mtp();
  c.kv_channels = 8;
  expect_refused(c, {"--kv-channels", "--multi-latent-attention"});
  c = test_configs::small_mla_mtp();
  c.qk_pos_emb_head_dim = 3;
  expect_refused(c, {"--qk-pos-emb-head-dim"});
  c = test_configs::small_mla_mtp();
  c.position_embedding_type = PositionEmbedding::None;
  expect_refused(c, {"--multi-latent-attention", "--position-embedding-type rope"});
}

TEST(GptConfig, MtpRefusalsNameTheFlags) {
  GptConfig c = test_configs::small_mla_mtp();
  c.mtp_num_layers = -1;
  expect_refused(c, {"--mtp-num-layers"});
  c = test_configs::small_mla_mtp();
  c.mtp_num_layers = c.seq_length;
  expect_refused(c, {"--mtp-num-layers", "--seq-length"});
  c = test_configs::small_mla_mtp();
  c.mtp_loss_scaling_factor = -0.5;
  expect_refused(c, {"--mtp-loss-scaling-factor"});
  c = test_configs::small_mla_mtp();
  c.multi_latent_attention = false;
  c.position_embedding_type = PositionEmbedding::LearnedAbsolute;
  expect_refused(c, {"--mtp-num-layers", "learned_absolute"});
}

}  // namespace gpt_config_test
}  // namespace kiln::models
