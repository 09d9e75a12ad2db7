// The memory estimate pretrain-gpt refuses oversized runs with: Korthikanti et al.'s activations
// (34 s b h bytes per layer for the GPT-2 shape at 16 bits, without the attention-score term),
// fp32 gradients, Adam's moments and fp32 masters, the logits.
#include <gtest/gtest.h>

#include "kiln/train/gpt_pretrain.h"

namespace kiln::train {
namespace gpt_memory_estimate_test {

TEST(GptMemoryEstimate, Gpt2SmallInBf16) {
  const auto config = models::GptConfig::gpt2_124m(50257);
  const auto e = estimate_gpt_training_memory(config, 16, true);
  const std::size_t n = static_cast<std::size_t>(config.num_parameters());
  EXPECT_EQ(e.parameters, 2 * n);
  EXPECT_EQ(e.gradients, 4 * n);
  EXPECT_EQ(e.optimizer, 12 * n) << "two fp32 moments and the fp32 masters";
  const double sbh = 1024.0 * 16 * 768;
  const double logits = 1024.0 * 16 * 50304 * 4;  // f32, vocabulary padded to a multiple of 128
  EXPECT_EQ(e.activations, static_cast<std::size_t>(12 * 34 * sbh + logits));
  EXPECT_EQ(e.total(), e.parameters + e.gradients + e.optimizer + e.activations);
}

TEST(GptMemoryEstimate, Fp32DoublesActivationsAndNeedsNoMasters) {
  const auto config = models::GptConfig::gpt2_124m(50257);
  const auto bf16 = estimate_gpt_training_memory(config, 4, true);
  const auto fp32 = estimate_gpt_training_memory(config, 4, false);
  const std::size_t n = static_cast<std::size_t>(config.num_parameters());
  EXPECT_EQ(fp32.parameters, 4 * n);
  EXPECT_EQ(fp32.optimizer, 8 * n);
  const double logits = 1024.0 * 4 * 50304 * 4;
  EXPECT_NEAR(static_cast<double>(fp32.activations) - logits, 2 * (static_cast<double>(bf16.activations) - logits), 1);
}

TEST(GptMemoryEstimate, FullRecomputeKeepsLayerInputs) {
  auto config = models::GptConfig::gpt2_124m(50257);
  config.recompute_granularity = models::RecomputeGranularity::Full;
  config.recompute_num_layers = 1;
  const double sbh = 1024.0 * 8 * 768, logits = 1024.0 * 8 * 50304 * 4;
  const auto uniform = estimate_gpt_training_memory(config, 8, true);
  EXPECT_EQ(uniform.activations, static_cast<std::size_t>(12 * 2 * sbh + 34 * sbh + logits))
      << "every layer's input, and one layer rebuilt at a time";
  config.recompute_method = models::RecomputeMethod::Block;
  config.recompute_num_layers = 4;
  const auto block = estimate_gpt_training_memory(config, 8, true);
  EXPECT_EQ(block.activations, static_cast<std::size_t>(4 * 2 * sbh + 8 * 34 * sbh + 34 * sbh + logits));
  EXPECT_LT(uniform.activations, block.activations);
}

TEST(GptMemoryEstimate, LlamaShapeCountsGqaAndSwiglu) {
  const auto config = models::GptConfig::llama3_2_1b(128256);
  const auto e = estimate_gpt_training_memory(config, 1, true);
  const double s = static_cast<double>(config.seq_length), h = 2048, f = static_cast<double>(config.ffn_hidden());
  const double q = 2048, kv = 8 * 64;
  const double per_layer = s * (4 * h + (2 * h + 2 * (q + 2 * kv) + 2 * q + h) + (2 * h + 2 * 2 * f + 2 * f + h));
  const double logits = s * static_cast<double>(config.padded_vocab_size()) * 4;
  EXPECT_EQ(e.activations, static_cast<std::size_t>(16 * per_layer + logits));
}

}  // namespace gpt_memory_estimate_test
}  // namespace kiln::train
