// The simulator's memory prediction against what Kiln's caching allocator reports for the same
// tiny single-device runs on the CPU: train::pretrain_gpt in-process (the peak of its log line, "mem
// alloc/reserved/peak") for GPT-2-shaped layers in fp32 without recompute, with selective and with
// full recompute, and a Llama-shaped model stepped as the trainer steps it; each within 3%, from an
// emptied allocator cache. The transformer_engine layers in bf16 and FP8 (each recipe, with and
// without full recompute) are asserted against both the allocator's peak and the peak of what the
// live blocks were asked for (MemoryStats::peak_requested), the same since the allocator splits its
// blocks to the rounded request (2026-12-07); before, it handed a request a cached block of up to
// twice its size and counted the whole block, which added 5-8% on these shapes (FP8's one-byte casts
// took the blocks of the bf16 tensors freed before them) and up to 17% inside the trainer for SwiGLU
// and bf16 local attention (docs/simulate.md).
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <vector>

#include "kiln/build_info.h"
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

struct MeasuredPeak {
  double allocated = 0, requested = 0;  // MemoryStats::peak_allocated, peak_requested
};

MeasuredPeak measured_peaks(const TinyRun& run, const std::string& data);

double measured_peak(const TinyRun& run, const std::string& data) { return measured_peaks(run, data).allocated; }

MeasuredPeak measured_peaks(const TinyRun& run, const std::string& data) {
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
  const MemoryStats start = backend.memory_stats(0);
  train::GptTrainCallbacks callbacks;
  callbacks.message = [](const std::string&) {};
  const train::GptTrainSummary s = train::pretrain_gpt(run.config, o, {}, callbacks);
  EXPECT_FALSE(s.logs.empty());
  if (s.logs.empty()) return {};
  // The trainer resets the peaks at its start and logs the allocated one; the requested one is the
  // run's too (nothing allocates between its last iteration and here that outgrows the step).
  const MemoryStats end = backend.memory_stats(0);
  return {static_cast<double>(s.logs.back().memory_peak) - static_cast<double>(start.allocated),
          static_cast<double>(end.peak_requested) - static_cast<double>(start.requested)};
}

double predicted_peak(const TinyRun& run) {
  ModelSpec model;
  model.config = run.config;
  Layout l;
  l.bf16 = run.bf16;
  l.fp8 = run.config.fp8;
  l.micro_batch_size = run.micro;
  l.global_batch_size = run.global;
  l.recompute = run.config.recompute_granularity;
  PredictOptions po;
  po.fragmentation = 0;
  // The CPU emulates the FP8 GEMMs (te/fp8_linear.h: the float64 reference) and allocates the same
  // tensors as a GPU; the simulator refuses FP8 on a system without FP8 units, so this one has them.
  SystemSpec system = builtin_system("cpu");
  if (l.fp8) system.peak_flops_fp8 = system.peak_flops_bf16 > 0 ? system.peak_flops_bf16 : system.peak_flops_fp32;
  const Prediction p = predict(model, l, system, nullptr, po);
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

// transformer_engine layers on a Llama shape in bf16 and with each FP8 recipe, without and (for the
// recipes that allow it) with full recompute: what the layers keep (FP8: the GEMM inputs' one-byte
// columnwise casts and their scales), the weight cache's casts, and the tensors the last layer's
// forward (at fc2) and backward (at its MLP's activation) hold besides, against the peak of the
// requests and the allocator's peak (see above): within 3%. [N, H] is 2 MiB (4096 tokens x 256 x
// bf16), so the activations and the GEMM inputs' casts come from the allocator's large pool, as on a
// GPU.
TEST(MemoryValidation, TransformerEngineFp8AndFullRecompute) {
  models::GptConfig c = gpt2_tiny();
  c.num_layers = 2;
  c.hidden_size = 256;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 640;
  c.seq_length = 256;
  c.position_embedding_type = models::PositionEmbedding::Rope;
  c.normalization = models::Normalization::RMSNorm;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true;
  c.attention_dropout = 0;
  c.hidden_dropout = 0;
  c.transformer_impl = models::TransformerImpl::TransformerEngine;
  static const std::string data = testing::tiny_token_dataset("sim/data");
  struct Case {
    const char* name;
    std::optional<te::Fp8ScalingRecipe> recipe;
    bool full;
    bool param_gather = false;  // --fp8-param-gather: FP8 weights of one byte, no bf16 copy
  };
  const std::vector<Case> cases = {{"bf16", std::nullopt, false},
                                   {"bf16 full recompute", std::nullopt, true},
                                   {"fp8 delayed", te::Fp8ScalingRecipe::Delayed, false},
                                   {"fp8 tensorwise", te::Fp8ScalingRecipe::Tensorwise, false},
                                   {"fp8 blockwise", te::Fp8ScalingRecipe::Blockwise, false},
                                   {"fp8 blockwise full recompute", te::Fp8ScalingRecipe::Blockwise, true},
                                   {"fp8 delayed param gather", te::Fp8ScalingRecipe::Delayed, false, true},
                                   {"fp8 blockwise param gather", te::Fp8ScalingRecipe::Blockwise, false, true}};
  for (const Case& k : cases) {
    // The CPU runs FP8 GEMMs as the float64 reference: seconds each, minutes unoptimised under
    // ASan. There one recipe shows the FP8 path is clean; the Release suite asserts them all.
    if (build_info::sanitizers && k.recipe && !(*k.recipe == te::Fp8ScalingRecipe::Tensorwise && !k.full)) {
      std::printf("%s: left to the Release suite under the sanitizers\n", k.name);
      continue;
    }
    TinyRun run{c};
    run.micro = 16;
    run.global = 16;

    run.bf16 = true;
    run.config.fp8 = k.recipe.has_value();
    if (k.recipe) run.config.fp8_recipe.recipe = *k.recipe;
    run.config.fp8_param_gather = k.param_gather;
    run.config.recompute_granularity = k.full ? models::RecomputeGranularity::Full : models::RecomputeGranularity::None;
    run.config.validate();
    const MeasuredPeak measured = measured_peaks(run, data);
    const double predicted = predicted_peak(run);
    std::printf("%s: predicted %.3f MiB, requested peak %.3f MiB (%+.2f%%), allocator peak %.3f MiB (%+.2f%%)\n",
                k.name, predicted / 1048576.0, measured.requested / 1048576.0,
                100.0 * (predicted / measured.requested - 1.0), measured.allocated / 1048576.0,
                100.0 * (predicted / measured.allocated - 1.0));
    EXPECT_NEAR(predicted / measured.requested, 1.0, 0.03)
        << k.name << ": predicted " << predicted / 1048576.0 << " MiB, the requests' peak "
        << measured.requested / 1048576.0 << " MiB";
    EXPECT_NEAR(predicted / measured.allocated, 1.0, 0.03)
        << k.name << ": predicted " << predicted / 1048576.0 << " MiB, the allocator's peak "
        << measured.allocated / 1048576.0 << " MiB";
  }
}

}  // namespace memory_validation_test
}  // namespace kiln::sim
