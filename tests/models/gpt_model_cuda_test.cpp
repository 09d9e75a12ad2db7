// GptModel on a CUDA device against the same model on the CPU (f32): logits, loss and gradients,
// KV-cache generation, recompute, bf16. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../te/te_test_util.h"
#include "kiln/autograd/functions.h"
#include "kiln/models/gpt_model.h"
#include "kiln/runtime/backend.h"

namespace kiln::models {
namespace gpt_model_cuda_test {

GptConfig cuda_llama() {
  GptConfig c = GptConfig::llama3_8b(300);
  c.num_layers = 3;
  c.hidden_size = 128;
  c.ffn_hidden_size = 256;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = 64;  // a head size the fused attention kernels take
  c.seq_length = 64;
  c.max_position_embeddings = 128;
  c.rope_llama3_scaling = true;
  return c;
}

GptConfig cuda_gpt2() {
  GptConfig c;
  c.num_layers = 3;
  c.hidden_size = 128;
  c.num_attention_heads = 2;
  c.seq_length = 64;
  c.vocab_size = 300;
  return c;
}

Tensor ids(std::int64_t b, std::int64_t t, std::int64_t vocab, std::int64_t salt) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(b * t));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int64_t>((i * 31 + 7 + salt * 17) % vocab);
  return Tensor::from_vector(v, {b, t});
}

double normwise_error(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double d2 = 0, r2 = 0;
  for (std::size_t i = 0; i < x.size(); ++i) d2 += (x[i] - y[i]) * (x[i] - y[i]), r2 += y[i] * y[i];
  return std::sqrt(d2 / std::max(r2, 1e-300));
}

class GptModelCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count(DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(GptModelCuda, MatchesTheCpuInF32) {
  for (const GptConfig& c : {cuda_gpt2(), cuda_llama()}) {
    GptModel cpu(c, 21), gpu(c, 21);
    cpu.eval();
    gpu.eval();
    gpu.to(Device::cuda());
    Tensor tokens = ids(2, c.seq_length, c.vocab_size, 1), labels = ids(2, c.seq_length, c.vocab_size, 2);
    Tensor cpu_loss = cpu.loss(tokens, labels, Tensor());
    Tensor gpu_loss = gpu.loss(tokens.to(Device::cuda()), labels.to(Device::cuda()), Tensor());
    cpu_loss.backward();
    gpu_loss.backward();
    EXPECT_LE(normwise_error(gpu_loss, cpu_loss), 1e-5);
    EXPECT_LE(normwise_error(gpu.forward(tokens.to(Device::cuda())), cpu.forward(tokens)), 1e-5);
    const TensorDict gp = gpu.named_parameters(), cp = cpu.named_parameters();
    for (std::size_t i = 0; i < cp.size(); ++i)
      EXPECT_LE(normwise_error(gp[i].second.grad(), cp[i].second.grad()), 1e-4) << cp[i].first;
  }
}

TEST_F(GptModelCuda, KvCacheAndRecomputeOnTheDevice) {
  GptConfig c = cuda_llama();
  GptModel m(c, 4);
  m.to(Device::cuda());
  m.eval();
  Tensor tokens = ids(2, 20, c.vocab_size, 3).to(Device::cuda());
  Tensor full = m.forward(tokens);
  KvCache cache = m.make_kv_cache(2, 32);
  std::vector<Tensor> pieces = {m.forward(tokens.narrow(1, 0, 12).contiguous(), cache)};
  for (std::int64_t i = 12; i < 20; ++i) pieces.push_back(m.forward(tokens.narrow(1, i, 1).contiguous(), cache));
  EXPECT_LE(normwise_error(cat(pieces, 1), full), 1e-5);

  // Full recompute on the device: the same loss and gradients as none (to rounding: CUDA's
  // reductions need not repeat bit for bit).
  GptConfig r = c;
  r.recompute_granularity = RecomputeGranularity::Full;
  GptModel plain(c, 4), recomputed(r, 4);
  plain.to(Device::cuda());
  recomputed.to(Device::cuda());
  Tensor labels = ids(2, 20, c.vocab_size, 9).to(Device::cuda());
  plain.loss(tokens, labels, Tensor()).backward();
  recomputed.loss(tokens, labels, Tensor()).backward();
  const TensorDict a = plain.named_parameters(), b = recomputed.named_parameters();
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_LE(normwise_error(b[i].second.grad(), a[i].second.grad()), 1e-5) << a[i].first;
}

TEST_F(GptModelCuda, Bf16TrainingStepIsCloseToF32) {
  const GptConfig c = cuda_gpt2();
  GptModel f32(c, 6), bf16(c, 6);
  f32.to(Device::cuda());
  bf16.to(Device::cuda(), DType::BF16);
  f32.eval();
  bf16.eval();
  Tensor tokens = ids(4, c.seq_length, c.vocab_size, 5).to(Device::cuda());
  Tensor labels = ids(4, c.seq_length, c.vocab_size, 6).to(Device::cuda());
  Tensor loss = bf16.loss(tokens, labels, Tensor());
  EXPECT_EQ(loss.dtype(), DType::F32);
  const double reference = f32.loss(tokens, labels, Tensor()).item();
  EXPECT_NEAR(loss.item(), reference, 1e-2 * reference);
  loss.backward();
  for (const auto& [name, p] : bf16.named_parameters()) EXPECT_TRUE(p.grad().defined()) << name;
}

// transformer_engine layers on the GPU with attention dropout at bf16, through Kiln's kernels
// (Auto) and cuDNN's fused dropout (KILN_ATTENTION_IMPL=cudnn: its own generator): a full
// recompute draws the first forward's masks again, so loss and gradients are those of the run
// without recompute; and the dropout drops (the loss is not the dropout-free one).
void expect_recompute_replays_the_dropout() {
  GptConfig c = cuda_gpt2();
  c.transformer_impl = TransformerImpl::TransformerEngine;
  c.attention_dropout = 0.2;
  c.hidden_dropout = 0;
  GptConfig r = c, undropped = c;
  r.recompute_granularity = RecomputeGranularity::Full;
  undropped.attention_dropout = 0;
  GptModel plain(c, 8), recomputed(r, 8), without(undropped, 8);
  for (GptModel* m : {&plain, &recomputed, &without}) m->to(Device::cuda(), DType::BF16);
  Tensor tokens = ids(4, c.seq_length, c.vocab_size, 11).to(Device::cuda());
  Tensor labels = ids(4, c.seq_length, c.vocab_size, 12).to(Device::cuda());
  Tensor lp = plain.loss(tokens, labels, Tensor()), lr = recomputed.loss(tokens, labels, Tensor());
  lp.backward();
  lr.backward();
  EXPECT_NEAR(lr.item(), lp.item(), 1e-6 * std::abs(lp.item()));
  const TensorDict a = plain.named_parameters(), b = recomputed.named_parameters();
  for (std::size_t i = 0; i < a.size(); ++i)  // cuDNN's backward may sum dQ in another order
    EXPECT_LE(normwise_error(b[i].second.grad(), a[i].second.grad()), 1e-2) << a[i].first;
  EXPECT_GT(std::abs(without.loss(tokens, labels, Tensor()).item() - lp.item()), 1e-4);
}

TEST_F(GptModelCuda, FusedAttentionDropoutUnderRecompute) {
  {
    SCOPED_TRACE("Kiln's kernels (Auto)");
    expect_recompute_replays_the_dropout();
  }
  {
    const te_test::ScopedEnv cudnn("KILN_ATTENTION_IMPL", "cudnn");
    SCOPED_TRACE("cuDNN's fused dropout (KILN_ATTENTION_IMPL=cudnn)");
    expect_recompute_replays_the_dropout();
  }
}

}  // namespace gpt_model_cuda_test
}  // namespace kiln::models
