// --transformer-impl transformer_engine (te/'s fused kernels) against local (Kiln's plain ops, the
// reference checked against PyTorch in gpt_parity_test.cpp): the same weights give the same loss
// and gradients, for the GPT-2 and the Llama styles, on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kiln/models/gpt_model.h"
#include "kiln/models/transformer_core_ops.h"
#include "small_configs.h"

namespace kiln::models {
namespace {

// Dropout off: the two implementations draw no random numbers, so they must agree.
GptConfig without_dropout(GptConfig c) {
  c.attention_dropout = 0;
  c.hidden_dropout = 0;
  return c;
}

Tensor ids(std::int64_t b, std::int64_t t, std::int64_t vocab, std::int64_t salt) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(b * t));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int64_t>((i * 7 + 3 + salt * 13) % vocab);
  return Tensor::from_vector(v, {b, t});
}

struct Step {
  double loss = 0;
  std::vector<std::string> names;
  std::vector<std::vector<double>> grads;
};

Step training_step(GptConfig c, TransformerImpl impl) {
  c.transformer_impl = impl;
  GptModel m(c, 23);
  m.train();
  const Tensor tokens = ids(2, c.seq_length, c.vocab_size, 1), labels = ids(2, c.seq_length, c.vocab_size, 4);
  std::vector<float> mask(static_cast<std::size_t>(2 * c.seq_length), 1.0f);
  mask[3] = 0;  // a masked token: both paths must drop it from the mean
  Tensor loss = m.loss(tokens, labels, Tensor::from_vector(mask, {2, c.seq_length}));
  loss.backward();
  Step s;
  s.loss = loss.to_vector<double>()[0];
  for (const auto& [name, p] : m.named_parameters()) {
    s.names.push_back(name);
    s.grads.push_back(p.grad().to_vector<double>());
  }
  return s;
}

void expect_same(const GptConfig& c, const char* style) {
  ASSERT_EQ(std::string(core_ops_for(TransformerImpl::TransformerEngine).name), "transformer_engine");
  const Step local = training_step(c, TransformerImpl::Local);
  const Step te = training_step(c, TransformerImpl::TransformerEngine);
  EXPECT_NEAR(te.loss, local.loss, 1e-5 * std::abs(local.loss)) << style;
  ASSERT_EQ(te.names, local.names);
  for (std::size_t i = 0; i < te.grads.size(); ++i) {
    double scale = 0, worst = 0;
    for (std::size_t j = 0; j < te.grads[i].size(); ++j) {
      scale = std::max(scale, std::abs(local.grads[i][j]));
      worst = std::max(worst, std::abs(te.grads[i][j] - local.grads[i][j]));
    }
    EXPECT_LE(worst, 1e-5 * std::max(scale, 1e-3)) << style << ": gradient of " << te.names[i];
  }
}

TEST(GptTransformerEngineImpl, Gpt2StyleMatchesTheLocalOps) {
  expect_same(without_dropout(test_configs::small_gpt2()), "gpt-2 style");
}

TEST(GptTransformerEngineImpl, LlamaStyleMatchesTheLocalOps) {
  expect_same(without_dropout(test_configs::small_llama()), "llama style");
}

TEST(GptTransformerEngineImpl, AttentionDropoutRunsTheLocalAttention) {
  // te::attention has no dropout; with --attention-dropout the TE table must still train (through the
  // local attention) rather than drop the dropout silently: the two impls agree bit for bit.
  GptConfig c = without_dropout(test_configs::small_gpt2());
  c.attention_dropout = 0.3;
  const Step local = training_step(c, TransformerImpl::Local);
  const Step te = training_step(c, TransformerImpl::TransformerEngine);
  EXPECT_NEAR(te.loss, local.loss, 1e-5 * std::abs(local.loss));
}

}  // namespace
}  // namespace kiln::models
