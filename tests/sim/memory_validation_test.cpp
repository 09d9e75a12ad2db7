// The simulator's memory prediction against what Kiln's caching allocator reports for the same
// tiny single-device runs on the CPU: train::pretrain_gpt in-process (the peak of its log line, "mem
// alloc/reserved/peak") for GPT-2-shaped layers in fp32 without recompute, with selective and with
// full recompute, and a Llama-shaped model stepped as the trainer steps it; each within 3%, from an
// emptied allocator cache. Known gaps (docs/simulate.md, measured): the allocator hands a request a
// cached block of up to twice its size and counts the whole block, which the simulator does not
// replay; inside the trainer that adds up to 17% for SwiGLU (fc1's output twice the product's size)
// and for bf16 local attention, which are therefore asserted from an empty cache or not at all.
#include <gtest/gtest.h>

#include <cstdio>

#include "kiln/models/gpt_model.h"
#include "kiln/optim/flat_optimizer.h"
#include "kiln/optim/grad_buffers.h"
#include "kiln/runtime/backend.h"
#include "kiln/sim/simulator.h"
#include "kiln/train/gpt_pretrain.h"
#include "tiny_token_dataset.h"

namespace kiln::sim {
namespace memory_validation_test {

struct TinyRun {
  models::GptConfig config;
  std::int64_t micro = 4, global = 8;
  bool bf16 = false;
};

double measured_peak(const TinyRun& run, const std::string& data) {
  train::GptTrainOptions o;
  o.micro_batch_size = run.micro;
  o.global_batch_size = run.global;
  o.train_iters = 2;
  o.lr = 1e-3;
  o.bf16 = run.bf16;
  o.data_path = {{1.0, data}};
  o.split = "100,0,0";
  o.eval_iters = 0;
  o.log_interval = 2;
  o.progress = false;
  // From an emptied cache, less what earlier tests left alive (a cached causal mask): the run's own
  // peak, as a fresh `kiln pretrain-gpt` process reports it.
  Backend& backend = backend_for(Device::cpu());
  backend.empty_cache(0);
  const double before = static_cast<double>(backend.memory_stats(0).allocated);
  train::GptTrainCallbacks callbacks;
  callbacks.message = [](const std::string&) {};
  const train::GptTrainSummary s = train::pretrain_gpt(run.config, o, {}, callbacks);
  EXPECT_FALSE(s.logs.empty());
  return s.logs.empty() ? 0.0 : static_cast<double>(s.logs.back().memory_peak) - before;
}

double predicted_peak(const TinyRun& run) {
  ModelSpec model;
  model.config = run.config;
  Layout l;
  l.bf16 = run.bf16;
  l.micro_batch_size = run.micro;
  l.global_batch_size = run.global;
  l.recompute = run.config.recompute_granularity;
  PredictOptions po;
  po.fragmentation = 0;
  const Prediction p = predict(model, l, builtin_system("cpu"), nullptr, po);
  EXPECT_TRUE(p.invalid.empty()) << (p.invalid.empty() ? "" : p.invalid.front());
  return p.memory.peak();
}

models::GptConfig gpt2_tiny() {
  models::GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.seq_length = 64;
  c.vocab_size = 100;
  return c;
}

void expect_within_3_percent(const TinyRun& run, const char* what) {
  static const std::string data = testing::tiny_token_dataset("sim/data");
  const double measured = measured_peak(run, data), predicted = predicted_peak(run);
  std::printf("%s: predicted %.3f MiB, Kiln's allocator peak %.3f MiB (%+.2f%%)\n", what, predicted / 1048576.0,
              measured / 1048576.0, 100.0 * (predicted / measured - 1.0));
  EXPECT_NEAR(predicted / measured, 1.0, 0.03) << what << ": predicted " << predicted / 1048576.0
                                               << " MiB, Kiln's allocator peak " << measured / 1048576.0 << " MiB";
}

TEST(MemoryValidation, Gpt2ShapeFp32) { expect_within_3_percent(TinyRun{gpt2_tiny()}, "GPT-2 tiny fp32"); }

TEST(MemoryValidation, SelectiveAndFullRecompute) {
  TinyRun r{gpt2_tiny()};
  r.config.num_layers = 4;
  r.config.recompute_granularity = models::RecomputeGranularity::Selective;
  expect_within_3_percent(r, "selective recompute");
  r.config.recompute_granularity = models::RecomputeGranularity::Full;
  expect_within_3_percent(r, "full recompute");
}

// MTP (one and two depths on a RoPE GPT-2 shape): the depths' layers, projections, norms and losses.
TEST(MemoryValidation, MultiTokenPrediction) {
  TinyRun r{gpt2_tiny()};
  r.config.position_embedding_type = models::PositionEmbedding::Rope;  // MTP takes no learned positions
  for (std::int64_t depths : {1, 2}) {
    r.config.mtp_num_layers = depths;
    expect_within_3_percent(r, depths == 1 ? "one MTP depth" : "two MTP depths");
  }
}

// The same accounting for a Llama-shaped model (RoPE, RMSNorm, SwiGLU, GQA, untied output), run as
// the trainer runs a step (flat gradient buffers, FlatAdamW) from an emptied allocator cache, so no
// earlier block is handed out at up to twice a request's size: the peak within 3%.
double model_step_peak(const models::GptConfig& config, std::int64_t batch) {
  const Device cpu = Device::cpu();
  Backend& backend = backend_for(cpu);
  backend.empty_cache(0);
  // What other tests left alive (the cached causal mask) is not this step's.
  const double before = static_cast<double>(backend.memory_stats(0).allocated);
  double peak = 0;
  {
    auto model = std::make_shared<models::GptModel>(config, 1);
    model->train();
    optim::GradBuffers buffers(model->parameters(), {.grad_dtype = DType::F32});
    optim::FlatAdamW optimizer(buffers, optim::AdamOptions{.lr = 1e-3});
    Tensor tokens = Tensor::zeros({batch, config.seq_length}, DType::I64, cpu);
    Tensor mask = Tensor::ones({batch, config.seq_length}, DType::F32, cpu);
    backend.reset_peak_memory(0);
    for (int step = 0; step < 2; ++step) {
      optimizer.zero_grad();
      model->loss(tokens, tokens, mask).backward();
      buffers.finish_backward();
      optimizer.step();
    }
    peak = static_cast<double>(backend.memory_stats(0).peak_allocated) - before;
  }
  return peak;
}

TEST(MemoryValidation, LlamaShapeModelStep) {
  models::GptConfig c = gpt2_tiny();
  c.num_query_groups = 2;
  c.position_embedding_type = models::PositionEmbedding::Rope;
  c.normalization = models::Normalization::RMSNorm;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true;
  c.attention_dropout = 0;
  c.hidden_dropout = 0;
  for (std::int64_t layers : {2, 4}) {
    c.num_layers = layers;
    c.validate();
    const double measured = model_step_peak(c, 4);
    TinyRun run{c};
    run.micro = 4;
    run.global = 4;
    const double predicted = predicted_peak(run);
    EXPECT_NEAR(predicted / measured, 1.0, 0.03) << layers << " layers: predicted " << predicted / 1048576.0
                                                 << " MiB, allocator peak " << measured / 1048576.0 << " MiB";
  }
}

}  // namespace memory_validation_test
}  // namespace kiln::sim
