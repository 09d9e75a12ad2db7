// --transformer-impl transformer_engine (te/'s fused kernels) against local (Kiln's plain ops, the
// reference checked against PyTorch in gpt_parity_test.cpp): the same weights give the same loss
// and gradients, for the GPT-2 and the Llama styles, on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kiln/models/gpt_model.h"
#include "kiln/models/transformer_core_ops.h"
#include "kiln/nn/graph_safe_random.h"
#include "kiln/nn/layers.h"
#include "small_configs.h"

namespace kiln::models {
namespace gpt_te_impl_test {

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

// `passes` forward/backward passes (gradients accumulate; the dropout offsets advance between them):
// the last loss and the accumulated gradients.
Step training_step(GptConfig c, TransformerImpl impl, bool graph_safe_random = false, int passes = 1) {
  c.transformer_impl = impl;
  GptModel m(c, 23);
  m.train();
  // Graph-safe dropout (CUDA graphs): offsets in counters on the device (the CPU here).
  if (graph_safe_random) nn::set_graph_safe_random(m);
  const Tensor tokens = ids(2, c.seq_length, c.vocab_size, 1), labels = ids(2, c.seq_length, c.vocab_size, 4);
  std::vector<float> mask(static_cast<std::size_t>(2 * c.seq_length), 1.0f);
  mask[3] = 0;  // a masked token: both paths must drop it from the mean
  Tensor loss;
  for (int pass = 0; pass < passes; ++pass) {
    loss = m.loss(tokens, labels, Tensor::from_vector(mask, {2, c.seq_length}));
    loss.backward();
  }
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

TEST(GptTransformerEngineImpl, FusedAttentionDropoutMatchesTheLocalOps) {
  // te::attention applies the attention dropout in its kernels with the mask nn::Dropout draws on
  // the local path's [B, H, T, S] probabilities (same seed, offset and Philox stream): the two impls
  // drop the same probabilities, so loss and gradients agree as without dropout; the offsets of the
  // layers' dropout modules advance alike.
  GptConfig c = without_dropout(test_configs::small_gpt2());
  c.attention_dropout = 0.3;
  expect_same(c, "gpt-2 style, attention dropout 0.3");
  GptConfig llama = without_dropout(test_configs::small_llama());
  llama.attention_dropout = 0.2;
  expect_same(llama, "llama style (GQA), attention dropout 0.2");
}

TEST(GptTransformerEngineImpl, FusedAttentionDropoutUnderRecompute) {
  // A recompute of the attention (selective: core attention only; full: the whole layer) replays
  // the first run's draw (nn::Dropout::reserve under the random tape): the same loss and gradients
  // as no recompute, and as the local ops under the same recompute.
  GptConfig c = without_dropout(test_configs::small_gpt2());
  c.attention_dropout = 0.3;
  const Step plain = training_step(c, TransformerImpl::TransformerEngine);
  for (RecomputeGranularity g : {RecomputeGranularity::Selective, RecomputeGranularity::Full}) {
    GptConfig r = c;
    r.recompute_granularity = g;
    if (g == RecomputeGranularity::Full) r.recompute_num_layers = 1;
    const Step recomputed = training_step(r, TransformerImpl::TransformerEngine);
    // The same ops on the same values (the order of some gradient sums may differ).
    EXPECT_NEAR(recomputed.loss, plain.loss, 1e-6 * std::abs(plain.loss)) << to_string(g);
    ASSERT_EQ(recomputed.grads.size(), plain.grads.size());
    for (std::size_t i = 0; i < plain.grads.size(); ++i) {
      double scale = 0, worst = 0;
      for (std::size_t j = 0; j < plain.grads[i].size(); ++j) {
        scale = std::max(scale, std::abs(plain.grads[i][j]));
        worst = std::max(worst, std::abs(recomputed.grads[i][j] - plain.grads[i][j]));
      }
      EXPECT_LE(worst, 1e-6 * std::max(scale, 1e-3)) << to_string(g) << ": gradient of " << plain.names[i];
    }
    expect_same(r, "recompute with attention dropout");
  }
}

TEST(GptTransformerEngineImpl, FusedAttentionDropoutWithGraphSafeCounters) {
  // With graph-safe dropout each module's offset lives in a device counter: the fused attention
  // reads a copy of it (AttentionOptions::dropout_offset_counter) and draws the host-offset masks.
  GptConfig c = without_dropout(test_configs::small_gpt2());
  c.attention_dropout = 0.3;
  // Two passes: the second draws at a non-zero counter.
  const Step host = training_step(c, TransformerImpl::TransformerEngine, false, 2);
  const Step counted = training_step(c, TransformerImpl::TransformerEngine, true, 2);
  EXPECT_NE(host.loss, training_step(c, TransformerImpl::TransformerEngine).loss)
      << "the second pass drew another mask";
  EXPECT_EQ(counted.loss, host.loss);
  ASSERT_EQ(counted.grads.size(), host.grads.size());
  for (std::size_t i = 0; i < host.grads.size(); ++i)
    EXPECT_EQ(counted.grads[i], host.grads[i]) << "gradient of " << host.names[i];
}

// The TE table's attention with dropout runs te::attention, never the local op: the probs_dropout
// callable (which only the local op calls) must not run, and the result equals the local op's
// with the same nn::Dropout state.
TEST(GptTransformerEngineImpl, AttentionDropoutTakesTheFusedPath) {
  const Tensor q = Tensor::randn({2, 9, 4, 8}, 11), k = Tensor::randn({2, 9, 2, 8}, 12),
               v = Tensor::randn({2, 9, 2, 8}, 13);
  auto run = [&](const CoreOps& ops, bool forbid_callable) {
    auto dropout = std::make_shared<nn::Dropout>(0.25, 77);
    dropout->train();
    CoreAttentionOptions o;
    o.probs_dropout = [dropout, forbid_callable](const Tensor& probs) {
      if (forbid_callable) ADD_FAILURE() << "the TE attention ran the local attention's dropout";
      return dropout->forward(probs);
    };
    o.dropout_p = dropout->p;
    o.reserve_dropout = [dropout](std::int64_t count, Device device) { return dropout->reserve(count, device); };
    const Tensor out = ops.attention(q, k, v, o);
    EXPECT_EQ(dropout->offset, static_cast<std::uint64_t>(2 * 4 * 9 * 9)) << ops.name << ": one [B, H, T, S] draw";
    return out.to_vector<double>();
  };
  const std::vector<double> fused = run(te_core_ops(), true), local = run(local_core_ops(), false);
  ASSERT_EQ(fused.size(), local.size());
  double worst = 0;
  for (std::size_t i = 0; i < fused.size(); ++i) worst = std::max(worst, std::abs(fused[i] - local[i]));
  EXPECT_LE(worst, 1e-5);
}

}  // namespace gpt_te_impl_test
}  // namespace kiln::models
