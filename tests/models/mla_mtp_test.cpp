// Multi-head latent attention and multi-token prediction apart from PyTorch parity
// (mla_mtp_parity_test.cpp): generation with MLA's compressed KV cache equals the full-sequence
// forward; parameter counts and FLOPs; MTP's loss value and per-depth losses. (The config's
// refusals: gpt_config_test.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kiln/autograd/functions.h"
#include "kiln/models/gpt_config_mla_mtp.h"
#include "kiln/models/gpt_model.h"
#include "kiln/nn/init.h"
#include "kiln/tensor/grad_mode.h"
#include "mla_configs.h"

namespace kiln::models {
namespace mla_mtp_test {

using test_configs::small_mla_mtp;

Tensor ids(std::initializer_list<std::int64_t> values) {
  return Tensor::from_vector(std::vector<std::int64_t>(values), {1, static_cast<std::int64_t>(values.size())});
}

// Prefill of 3 tokens, then one token at a time through the cache of latents: the logits equal the
// full-sequence forward's at every position (the cache holds kv_lora_rank + qk_pos_emb_head_dim
// values per token and layer).
void expect_cached_generation_matches_full_forward(GptConfig c) {
  GptModel model(c, 7);
  model.eval();
  {
    Generator gen(3);
    NoGradGuard no_grad;
    for (const auto& [name, p] : model.named_parameters())
      if (name.find("norm.") == std::string::npos) nn::init::normal_(p, 0.0, 0.2, &gen);
  }
  const Tensor tokens = ids({3, 14, 15, 9, 26, 5, 35, 8, 9});
  const std::int64_t t = tokens.size(1);
  NoGradGuard no_grad;
  const Tensor full = model.forward(tokens);  // [1, T, V]

  KvCache cache = model.make_kv_cache(1, c.max_positions());
  EXPECT_EQ(cache.keys(0).shape(), (Shape{1, c.max_positions(), 1, c.kv_lora_rank}));
  EXPECT_EQ(cache.values(0).shape(), (Shape{1, c.max_positions(), 1, c.qk_pos_emb_head_dim}));
  std::vector<Tensor> pieces{model.forward(tokens.narrow(1, 0, 3), cache)};
  for (std::int64_t i = 3; i < t; ++i) pieces.push_back(model.forward(tokens.narrow(1, i, 1), cache));
  EXPECT_EQ(cache.length(), t);
  const Tensor cached = cat(pieces, 1);
  const auto a = cached.to_vector<float>(), b = full.to_vector<float>();
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
  EXPECT_LT(worst, 1e-5) << "cached generation differs from the full forward";
}

TEST(Mla, CachedGenerationEqualsFullForward) { expect_cached_generation_matches_full_forward(small_mla_mtp()); }

TEST(Mla, CachedGenerationEqualsFullForwardOnTheFlashKernel) {
  GptConfig c = small_mla_mtp();
  c.transformer_impl = TransformerImpl::TransformerEngine;
  c.q_lora_rank = 0;
  expect_cached_generation_matches_full_forward(c);
}

TEST(Mla, ParameterCountMatchesTheModel) {
  GptConfig lite = small_mla_mtp();
  lite.q_lora_rank = 0;
  lite.mtp_num_layers = 0;
  lite.normalization = Normalization::LayerNorm;
  lite.add_bias_linear = true;
  lite.untie_embeddings_and_output_weights = true;
  for (const GptConfig& c : {small_mla_mtp(), lite}) {
    GptModel m(c, 1);
    EXPECT_EQ(m.num_parameters(), c.num_parameters());
  }
}

// Term by term for a DeepSeek-V3-sized attention (dense MLP, 3 layers, 1 MTP depth):
// 6 * (L * (q + kv + core + proj + mlp) + H * V + D * (layer + 2 H^2 + H * V)).
TEST(Mla, FlopsPerTokenCountsMlaAndMtp) {
  GptConfig c;
  c.num_layers = 3;
  c.hidden_size = 7168;
  c.ffn_hidden_size = 18432;
  c.num_attention_heads = 128;
  c.seq_length = 4096;
  c.vocab_size = 129280;
  c.make_vocab_size_divisible_by = 1;
  c.position_embedding_type = PositionEmbedding::Rope;
  c.normalization = Normalization::RMSNorm;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.multi_latent_attention = true;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_head_dim = 128;
  c.qk_pos_emb_head_dim = 64;
  c.v_head_dim = 128;
  c.mtp_num_layers = 1;
  c.validate();
  const double H = 7168, nh = 128, qr = 1536, kvr = 512, qk = 128, pe = 64, dv = 128, S = 4096, F = 18432, V = 129280;
  const double q = H * qr + qr * nh * (qk + pe), kv = H * (kvr + pe) + kvr * nh * (qk + dv);
  const double core = nh * (qk + pe) * S / 2 + nh * dv * S / 2, proj = nh * dv * H, mlp = 3 * H * F;
  const double layer = q + kv + core + proj + mlp;
  const double expected = 6 * (3 * layer + H * V + (layer + 2 * H * H + H * V));
  EXPECT_NEAR(c.flops_per_token(), expected, expected * 1e-12);
}

TEST(Mtp, ShiftLeftFillsZeros) {
  const Tensor x = Tensor::from_vector(std::vector<std::int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(shift_left(x).to_vector<std::int64_t>(), (std::vector<std::int64_t>{2, 3, 0, 5, 6, 0}));
}

// The loss's value is the main model's (as Megatron logs lm loss); the depths' losses are kept
// only when gradients are on (training), and the backward reaches MTP's parameters.
TEST(Mtp, LossValueIsTheMainLossAndDepthsAreKept) {
  GptConfig c = small_mla_mtp();
  GptConfig without = c;
  without.mtp_num_layers = 0;
  GptModel with_mtp(c, 11), plain(without, 11);
  const Tensor tokens = ids({1, 2, 3, 4, 5, 6, 7, 8}), labels = ids({2, 3, 4, 5, 6, 7, 8, 9});
  const Tensor l1 = with_mtp.loss(tokens, labels, Tensor());
  EXPECT_EQ(with_mtp.mtp_losses().size(), 2u);
  // The main model draws the same weights with or without MTP (MTP's are drawn after).
  EXPECT_FLOAT_EQ(l1.item(), plain.loss(tokens, labels, Tensor()).item());
  for (const Tensor& l : with_mtp.mtp_losses()) EXPECT_TRUE(std::isfinite(l.item()));
  {
    NoGradGuard no_grad;
    with_mtp.loss(tokens, labels, Tensor());
    EXPECT_TRUE(with_mtp.mtp_losses().empty());
  }
  l1.backward();
  for (const auto& [name, p] : with_mtp.mtp->named_parameters())
    EXPECT_TRUE(p.grad().defined()) << name << " has no gradient";
}

}  // namespace mla_mtp_test
}  // namespace kiln::models
