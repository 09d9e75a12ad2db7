// What the simulator assumes Kiln runs on a device: the attention path (fused, or the unfused
// scores with attention dropout), the memory-bound kernels' traffic, the calibration table's
// formats (latency removed from one-call samples, per-element costs trusted or not), the unfused
// attention and FP8 linear samples, and the memory items of those paths.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kiln/sim/calibration.h"
#include "kiln/sim/layer_work.h"
#include "kiln/sim/memory_model.h"
#include "kiln/sim/simulator.h"

namespace kiln::sim {
namespace kernel_model_test {

ModelSpec gpt2_124m(models::TransformerImpl impl, double attention_dropout) {
  ModelSpec m;
  m.config.num_layers = 12;
  m.config.hidden_size = 768;
  m.config.num_attention_heads = 12;
  m.config.seq_length = 1024;
  m.config.max_position_embeddings = 1024;
  m.config.vocab_size = 50257;
  m.config.transformer_impl = impl;
  m.config.attention_dropout = attention_dropout;
  m.config.hidden_dropout = 0;
  m.config.validate();
  return m;
}

Layout one_gpu(std::int64_t micro_batch) {
  Layout l;
  l.micro_batch_size = micro_batch;
  l.global_batch_size = 4 * micro_batch;
  return l;
}

TEST(LayerWork, OnlyTheLocalLayersRunTheUnfusedAttention) {
  // transformer_engine applies attention dropout inside te::attention (te/attention_dropout.h).
  using models::TransformerImpl;
  EXPECT_TRUE(runs_unfused_attention(gpt2_124m(TransformerImpl::Local, 0).config));
  EXPECT_TRUE(runs_unfused_attention(gpt2_124m(TransformerImpl::Local, 0.1).config));
  EXPECT_FALSE(runs_unfused_attention(gpt2_124m(TransformerImpl::TransformerEngine, 0).config));
  EXPECT_FALSE(runs_unfused_attention(gpt2_124m(TransformerImpl::TransformerEngine, 0.1).config));
}

TEST(LayerWork, UnfusedTrafficGrowsWithTheScoresAndDropoutAddsItsKernels) {
  const ModelSpec m = gpt2_124m(models::TransformerImpl::Local, 0.1);
  const LayerWork w = layer_work(m, one_gpu(8), false);
  ASSERT_TRUE(w.unfused_attention);
  const double dropout = w.attention.forward.bytes[static_cast<std::size_t>(KernelKind::Dropout)];
  const double scores = 8.0 * 12 * 1024 * 1024;
  EXPECT_DOUBLE_EQ(dropout, 6 * scores * 2) << "mask, product and scale over bf16 scores";
  // Doubling the micro-batch doubles the scores' traffic; doubling the sequence quadruples it.
  const LayerWork w16 = layer_work(m, one_gpu(16), false);
  EXPECT_NEAR(w16.attention.forward.total() / w.attention.forward.total(), 2.0, 1e-9);
  ModelSpec longer = m;
  longer.config.seq_length = longer.config.max_position_embeddings = 2048;
  const double ratio = layer_work(longer, one_gpu(8), false).attention.forward.total() / w.attention.forward.total();
  EXPECT_GT(ratio, 3.9);
  EXPECT_LT(ratio, 4.0);
  // Without attention dropout: no dropout kernels on the scores, and the fused path for TE.
  ModelSpec no_dropout = gpt2_124m(models::TransformerImpl::Local, 0);
  const LayerWork nd = layer_work(no_dropout, one_gpu(8), false);
  EXPECT_EQ(nd.attention.forward.bytes[static_cast<std::size_t>(KernelKind::Dropout)], 0);
  EXPECT_FALSE(
      layer_work(gpt2_124m(models::TransformerImpl::TransformerEngine, 0), one_gpu(8), false).unfused_attention);
}

CalibrationTable h200_like_table() {
  CalibrationTable t;
  t.device = "cuda:0";
  t.format = 2;
  t.memory_bandwidth = 3e12;
  t.op_overhead = 5e-6;
  for (std::int64_t s : {256, 1024, 4096, 8192})
    t.gemms.push_back({s, s, s, Precision::BF16, 2.0 * s * s * s / 700e12});
  t.attention.push_back({2, 16, 2048, 64, Precision::BF16, 100e-6, 250e-6});
  return t;
}

TEST(Simulator, LocalLayersRunTheUnfusedPathFromItsSamples) {
  const CalibrationTable t = h200_like_table();
  const SystemSpec h200 = builtin_system("h200");
  const Prediction fused = predict(gpt2_124m(models::TransformerImpl::TransformerEngine, 0), one_gpu(8), h200, &t);
  const Prediction unfused = predict(gpt2_124m(models::TransformerImpl::Local, 0.1), one_gpu(8), h200, &t);
  EXPECT_FALSE(fused.layer.unfused_attention);
  EXPECT_TRUE(unfused.layer.unfused_attention);
  // The scores' traffic (~100 bytes per score) far exceeds flash attention's time here.
  EXPECT_GT(unfused.layer.attention_forward, 5 * fused.layer.attention_forward);
  // A measured sample of the unfused path replaces the traffic model, scaled by the scores.
  CalibrationTable measured = t;
  measured.unfused_attention.push_back({8, 12, 1024, 64, Precision::BF16, true, 4e-3, 6e-3});
  const Prediction from_sample = predict(gpt2_124m(models::TransformerImpl::Local, 0.1), one_gpu(8), h200, &measured);
  EXPECT_DOUBLE_EQ(from_sample.layer.attention_forward, 4e-3);
  EXPECT_DOUBLE_EQ(from_sample.layer.attention_backward, 6e-3);
  const Prediction twice = predict(gpt2_124m(models::TransformerImpl::Local, 0.1), one_gpu(16), h200, &measured);
  EXPECT_DOUBLE_EQ(twice.layer.attention_forward, 8e-3);
  // The sample without dropout is not used for a run with dropout (and the other way round).
  const Prediction other = predict(gpt2_124m(models::TransformerImpl::Local, 0), one_gpu(8), h200, &measured);
  EXPECT_NE(other.layer.attention_forward, 4e-3);
}

TEST(Calibration, UnfusedAttentionScalesFromTheSampleOfTheSameSequence) {
  // Two samples with as many score elements (8 x 16 x 1024^2 = 2 x 16 x 2048^2): a layer at T 1024
  // scales from the T 1024 one, whose rows are as long as its own, whichever comes first.
  CalibrationTable t;
  t.unfused_attention.push_back({2, 16, 2048, 64, Precision::BF16, false, 2e-3, 2e-3});
  t.unfused_attention.push_back({8, 16, 1024, 64, Precision::BF16, false, 3e-3, 3e-3});
  const auto at_1024 = t.unfused_attention_seconds(8, 12, 1024, 1024, 64, Precision::BF16, false);
  ASSERT_TRUE(at_1024.has_value());
  EXPECT_DOUBLE_EQ(at_1024->first, 3e-3 * 12 / 16);
  const auto at_2048 = t.unfused_attention_seconds(4, 16, 2048, 2048, 64, Precision::BF16, false);
  ASSERT_TRUE(at_2048.has_value());
  EXPECT_DOUBLE_EQ(at_2048->first, 2 * 2e-3);
}

TEST(Calibration, StridedTrafficTakesTheStridedCopySampleRate) {
  // Without a Copy op sample, strided traffic is priced as Copy's; with one, at its per-element rate
  // (a bf16 element read and written: 4 bytes).
  CalibrationTable t;
  t.device = "cuda:0";
  t.memory_bandwidth = 3e12;
  EXPECT_DOUBLE_EQ(t.kernel_bandwidth(KernelKind::Strided), t.kernel_bandwidth(KernelKind::Copy));
  OpSample copy;
  copy.kind = OpKind::Copy;
  copy.precision = Precision::BF16;
  copy.forward = {3e-6, 5e-12};
  t.ops.push_back(copy);
  EXPECT_DOUBLE_EQ(t.kernel_bandwidth(KernelKind::Strided), 4.0 / 5e-12);
  // The local Llama layer's RoPE and SwiGLU run on narrowed halves: strided; GPT-2's local layer has
  // neither.
  ModelSpec llama = gpt2_124m(models::TransformerImpl::Local, 0);
  llama.config.position_embedding_type = models::PositionEmbedding::Rope;
  llama.config.swiglu = true;
  llama.config.validate();
  const auto strided = [](const Traffic& t) { return t.bytes[static_cast<std::size_t>(KernelKind::Strided)]; };
  EXPECT_GT(strided(layer_work(llama, one_gpu(2), false).forward), 0.0);
  EXPECT_GT(strided(layer_work(llama, one_gpu(2), false).backward), 0.0);
  EXPECT_EQ(strided(layer_work(gpt2_124m(models::TransformerImpl::Local, 0), one_gpu(2), false).forward), 0.0);
}

TEST(Calibration, Fp8LinearFixedCostIsTheInterceptOfSamplesThatDifferInRows) {
  CalibrationTable t;
  const auto d = te::Fp8ScalingRecipe::Delayed;
  t.fp8_linear.push_back({8192, 1024, 1024, d, 100e-6});
  t.fp8_linear.push_back({4096, 1024, 1024, d, 70e-6});
  t.fp8_linear_call.push_back({16, 128, 128, d, 60e-6});
  // 40 us fixed + 30 us per 4096 rows: the line through the two, not the idle-GPU call sample.
  EXPECT_NEAR(t.fp8_linear_fixed_seconds(d, 1.0), 40e-6, 1e-12);
  // 2048 rows from the 4096-row sample: the fixed part kept, the rest halved.
  EXPECT_NEAR(*t.fp8_linear_seconds(2048, 1024, 1024, d), 40e-6 + 15e-6, 1e-12);
  // Without such a pair the call sample stands in; without either nothing is fixed.
  t.fp8_linear.pop_back();
  EXPECT_NEAR(t.fp8_linear_fixed_seconds(d, 1.0), 60e-6, 1e-12);
  EXPECT_NEAR(t.fp8_linear_fixed_seconds(d, 50e-6), 50e-6, 1e-12);  // never more than the sample
  t.fp8_linear_call.clear();
  EXPECT_EQ(t.fp8_linear_fixed_seconds(d, 1.0), 0.0);
}

TEST(Simulator, TransformerEngineAttentionDropoutTakesTheFusedDropoutSamples) {
  // te::attention applies dropout in Kiln's fused kernels: the fused path stays, timed from the
  // samples measured with dropout when the table has them, else from those without.
  CalibrationTable t = h200_like_table();
  const SystemSpec h200 = builtin_system("h200");
  const ModelSpec m = gpt2_124m(models::TransformerImpl::TransformerEngine, 0.1);
  const Prediction old_table = predict(m, one_gpu(8), h200, &t);
  EXPECT_FALSE(old_table.layer.unfused_attention);
  const Prediction no_dropout = predict(gpt2_124m(models::TransformerImpl::TransformerEngine, 0), one_gpu(8), h200, &t);
  EXPECT_DOUBLE_EQ(old_table.layer.attention_forward, no_dropout.layer.attention_forward);
  for (AttentionSample s : std::vector<AttentionSample>(t.attention)) {
    s.forward_seconds *= 2;
    s.backward_seconds *= 2;
    s.dropout = true;
    t.attention.push_back(s);
  }
  const Prediction with_samples = predict(m, one_gpu(8), h200, &t);
  EXPECT_NEAR(with_samples.layer.attention_forward, 2 * no_dropout.layer.attention_forward, 1e-15);
  EXPECT_NEAR(with_samples.layer.attention_backward, 2 * no_dropout.layer.attention_backward, 1e-15);
  // A run without dropout keeps the samples without.
  const Prediction still = predict(gpt2_124m(models::TransformerImpl::TransformerEngine, 0), one_gpu(8), h200, &t);
  EXPECT_DOUBLE_EQ(still.layer.attention_forward, no_dropout.layer.attention_forward);
}

TEST(Simulator, MeasuredLinearLayersReplaceTheGemmSamples) {
  CalibrationTable t = h200_like_table();
  const SystemSpec h200 = builtin_system("h200");
  const ModelSpec m = gpt2_124m(models::TransformerImpl::TransformerEngine, 0);
  const Prediction from_gemms = predict(m, one_gpu(8), h200, &t);
  // One sample, 1 ms forward and 2 ms backward at the QKV shape: every linear layer scales from it.
  t.linear.push_back({8192, 2304, 768, Precision::BF16, 1e-3, 2e-3});
  const Prediction from_linear = predict(m, one_gpu(8), h200, &t);
  const double flops = 8192.0 * 768 * (2304 + 768 + 3072 + 3072), sample = 8192.0 * 2304 * 768;
  EXPECT_NEAR(from_linear.layer.gemm_forward, 1e-3 * flops / sample, 1e-12);
  EXPECT_NEAR(from_linear.layer.gemm_backward, 2e-3 * flops / sample, 1e-12);
  EXPECT_NE(from_linear.layer.gemm_forward, from_gemms.layer.gemm_forward);
}

TEST(Calibration, OneCallTablesLoseTheirLatencyAndLaunchBoundKernelCosts) {
  const auto path = std::filesystem::temp_directory_path() / "kiln_sim_calibration_v1.json";
  {
    std::ofstream out(path);
    out << R"({"device": "cuda:0", "memory_bandwidth": 3e12, "op_overhead": 5e-6,
      "elementwise_seconds_per_element": {"norm": 1e-10, "activation": 1e-10, "dropout": 1e-10, "softmax": 1e-10, "add": 1e-10},
      "gemm": [{"m": 256, "n": 256, "k": 256, "precision": "bf16", "seconds": 15e-6},
               {"m": 4096, "n": 4096, "k": 4096, "precision": "bf16", "seconds": 200e-6}],
      "attention": [{"batch": 1, "heads": 4, "seq": 4096, "head_dim": 64, "precision": "bf16",
                     "forward_seconds": 55e-6, "backward_seconds": 135e-6}]})";
  }
  const CalibrationTable t = load_calibration(path);
  EXPECT_EQ(t.format, 1);
  EXPECT_DOUBLE_EQ(t.call_latency, 15e-6);
  EXPECT_DOUBLE_EQ(t.gemms[1].seconds, 185e-6);
  EXPECT_DOUBLE_EQ(t.gemms[0].seconds, 1.5e-6) << "a tenth kept";
  EXPECT_DOUBLE_EQ(t.attention[0].forward_seconds, 40e-6);
  // Per-element costs measured on too few elements on a GPU: the measured bandwidth stands in.
  EXPECT_DOUBLE_EQ(t.kernel_bandwidth(KernelKind::Softmax), 3e12);

  // What calibrate() writes now: amortized, with the new items, read back as written.
  CalibrationTable v2 = h200_like_table();
  v2.elementwise_elements = 1 << 24;
  v2.elementwise.softmax = 2e-11;
  v2.unfused_attention.push_back({2, 16, 1024, 64, Precision::BF16, true, 1e-3, 2e-3});
  v2.fp8_linear.push_back({8192, 2048, 2048, te::Fp8ScalingRecipe::Blockwise, 3e-4});
  v2.linear.push_back({8192, 2048, 2048, Precision::BF16, 1e-4, 2e-4});
  v2.linear_backward_direct = true;  // as calibrate() writes it now: the GEMMs timed directly
  v2.fp8_weight_cached = true;
  save_calibration(v2, path);
  const CalibrationTable back = load_calibration(path);
  std::filesystem::remove(path);
  EXPECT_EQ(back.format, 2);
  EXPECT_DOUBLE_EQ(back.gemms[1].seconds, v2.gemms[1].seconds) << "no latency removed";
  EXPECT_DOUBLE_EQ(back.kernel_bandwidth(KernelKind::Softmax),
                   reference_bytes_per_element(KernelKind::Softmax) / 2e-11);
  ASSERT_EQ(back.unfused_attention.size(), 1u);
  EXPECT_TRUE(back.unfused_attention[0].dropout);
  ASSERT_EQ(back.linear.size(), 1u);
  EXPECT_DOUBLE_EQ(back.linear[0].backward_seconds, 2e-4);
  ASSERT_EQ(back.fp8_linear.size(), 1u);
  EXPECT_EQ(back.fp8_linear[0].recipe, te::Fp8ScalingRecipe::Blockwise);
  // The FP8 layer is timed through autograd: its harness (the sum, the fill, x's and W's gradients
  // accumulated) comes off.
  const double harness = (2.0 * 8192 * 2048 + 3.0 * 8192 * 2048 + 3.0 * 2048 * 2048) * 2 / v2.memory_bandwidth;
  EXPECT_NEAR(*back.fp8_linear_seconds(16384, 2048, 2048, te::Fp8ScalingRecipe::Blockwise), 2 * (3e-4 - harness),
              1e-12);
  EXPECT_FALSE(back.fp8_linear_seconds(8192, 2048, 2048, te::Fp8ScalingRecipe::Delayed).has_value());

  // Tables since 2026-12-07: the FP8 layer timed as training runs it (nothing taken off), and its
  // calls' fixed cost, kept whole when a sample is scaled to another product.
  CalibrationTable v3 = v2;
  v3.fp8_linear_direct = true;
  v3.fp8_linear_call.push_back({16, 128, 128, te::Fp8ScalingRecipe::Blockwise, 5e-5});
  save_calibration(v3, path);
  const CalibrationTable back3 = load_calibration(path);
  std::filesystem::remove(path);
  EXPECT_TRUE(back3.fp8_linear_direct);
  ASSERT_EQ(back3.fp8_linear_call.size(), 1u);
  EXPECT_DOUBLE_EQ(back3.fp8_linear_call[0].seconds, 5e-5);
  EXPECT_DOUBLE_EQ(*back3.fp8_linear_seconds(8192, 2048, 2048, te::Fp8ScalingRecipe::Blockwise), 3e-4);
  EXPECT_NEAR(*back3.fp8_linear_seconds(4096, 2048, 2048, te::Fp8ScalingRecipe::Blockwise), 5e-5 + 0.5 * 2.5e-4, 1e-15);
  EXPECT_NEAR(*back3.fp8_linear_seconds(16384, 2048, 2048, te::Fp8ScalingRecipe::Blockwise), 5e-5 + 2 * 2.5e-4, 1e-15);
}

TEST(Calibration, LinearRatesAreInterpolatedBetweenSamples) {
  CalibrationTable t;
  // A small layer at 100 TFLOP/s and a large one at 400 (forward; backward twice the FLOPs at the
  // same rates), as GEMM efficiency rises with the shape.
  const auto secs = [](double m, double n, double k, double tflops) { return 2 * m * n * k / (tflops * 1e12); };
  t.linear.push_back({8192, 768, 768, Precision::BF16, secs(8192, 768, 768, 100), 2 * secs(8192, 768, 768, 100)});
  t.linear.push_back({8192, 4096, 4096, Precision::BF16, secs(8192, 4096, 4096, 400), 2 * secs(8192, 4096, 4096, 400)});
  // An exact match is the sample.
  EXPECT_DOUBLE_EQ(t.linear_seconds(8192, 768, 768, Precision::BF16)->first, secs(8192, 768, 768, 100));
  // A shape between them runs between the two rates (the nearest sample's rate alone gave 100).
  const auto mid = t.linear_seconds(8192, 1024, 1024, Precision::BF16);
  ASSERT_TRUE(mid.has_value());
  const double rate = 2.0 * 8192 * 1024 * 1024 / mid->first / 1e12;
  EXPECT_GT(rate, 100);
  EXPECT_LT(rate, 400);
  EXPECT_NEAR(2.0 * 2 * 8192 * 1024 * 1024 / mid->second / 1e12, rate, 1e-9) << "backward at the same rates";
  // The nearer sample weighs more.
  EXPECT_LT(rate, 250);
  EXPECT_FALSE(t.linear_seconds(8192, 1024, 1024, Precision::FP32).has_value());
}

TEST(Calibration, QuickCpuCalibrationMeasuresTheUnfusedPathAndTheHarness) {
  CalibrateOptions o;
  o.quick = true;
  o.precisions = {Precision::FP32};
  const CalibrationTable t = calibrate(o);
  EXPECT_EQ(t.format, 2);
  ASSERT_EQ(t.unfused_attention.size(), 2u);  // one shape, without and with attention dropout
  EXPECT_FALSE(t.unfused_attention[0].dropout);
  EXPECT_TRUE(t.unfused_attention[1].dropout);
  for (const auto& u : t.unfused_attention) {
    EXPECT_GT(u.forward_seconds, 0);
    EXPECT_GT(u.backward_seconds, 0);
  }
  EXPECT_GT(t.elementwise.harness, 0);
  EXPECT_EQ(t.elementwise_elements, 256 * 256);
  EXPECT_GT(t.kernel_bandwidth(KernelKind::Dropout), 0);
  EXPECT_TRUE(t.fp8_linear.empty()) << "FP8 linear layers are measured on GPUs only";
}

TEST(MemoryModel, AttentionDropoutKeepsTheScoresOnlyOnTheUnfusedPath) {
  Layout l = one_gpu(8);
  const double fused = layer_activation_bytes(gpt2_124m(models::TransformerImpl::TransformerEngine, 0), l, false);
  const double fused_dropout =
      layer_activation_bytes(gpt2_124m(models::TransformerImpl::TransformerEngine, 0.1), l, false);
  EXPECT_DOUBLE_EQ(fused_dropout, fused) << "te::attention regenerates its mask in backward";
  const double local_dropout = layer_activation_bytes(gpt2_124m(models::TransformerImpl::Local, 0.1), l, false);
  const double scores = 8.0 * 12 * 1024 * 1024;
  // f32 probabilities, the bf16 dropout mask and output: 8 bytes per score on the local path.
  EXPECT_GT(local_dropout - fused, 0.99 * 8 * scores);
}

TEST(MemoryModel, Fp8KeepsEachWeightsTwoCastsOncePerStep) {
  ModelSpec m = gpt2_124m(models::TransformerImpl::TransformerEngine, 0);
  Layout l = one_gpu(8);
  l.fp8 = true;
  const MemoryBreakdown one = stage_memory(m, l, 0, 1, 0);
  const MemoryBreakdown three = stage_memory(m, l, 0, 3, 0);
  // The four linear layers' weights (qkv 3h x h, projection h x h, fc1 4h x h, fc2 h x 4h), their
  // rowwise and columnwise casts, one byte each, held in the weight cache whatever is in flight;
  // each cast an allocation of its own (rounded to the allocator's block) with its scale_inv, the
  // columnwise one with its amax too (the delayed recipe's casts take the scale of the layer's
  // state, the rowwise one its amax history as well). Besides, each linear's delayed scaling state:
  // amax history (length 1), scale and scale_inv for its input, weight and output gradient.
  const double h = 768;
  const double layer =
      2 * (allocator_block_bytes(3 * h * h) + allocator_block_bytes(h * h) + 2 * allocator_block_bytes(4 * h * h)) +
      4 * 3 * allocator_block_bytes(4) + 4 * 9 * allocator_block_bytes(4);
  EXPECT_DOUBLE_EQ(one.fp8_copies, 12 * layer);
  EXPECT_DOUBLE_EQ(three.fp8_copies, 12 * layer);
  l.recompute = models::RecomputeGranularity::Full;
  EXPECT_DOUBLE_EQ(stage_memory(m, l, 0, 3, 0).fp8_copies, 12 * layer)
      << "the cache fills during the recomputed forwards";
}

// --fp8-param-gather: the FP8 linears' weights are one byte each in a buffer of their own (no copy
// in the model's dtype), the cache keeps only their columnwise casts (per tensor: the transposed
// bytes, sharing the weight's scales; each linear keeps its delayed scaling state, nine 512 B
// blocks, as without it), an fp32 model gains their fp32 masters, and the distributed optimizer's
// all-gather moves one byte per such weight.
TEST(MemoryModel, Fp8ParamGatherKeepsOneByteWeightsAndTheirColumnwiseCasts) {
  ModelSpec m = gpt2_124m(models::TransformerImpl::TransformerEngine, 0);
  Layout l = one_gpu(8);
  l.fp8 = true;
  const double h = 768, weights = 12 * 12 * h * h;  // 12 layers of qkv 3h x h, proj h x h, fc1 / fc2 4h x h
  const double columnwise =
      12 * (allocator_block_bytes(3 * h * h) + allocator_block_bytes(h * h) + 2 * allocator_block_bytes(4 * h * h));
  const double scaling_states = 12 * 4 * 9 * allocator_block_bytes(4);
  for (const bool bf16 : {true, false}) {
    l.bf16 = bf16;
    m.config.fp8_param_gather = false;
    const MemoryBreakdown plain = stage_memory(m, l, 0, 1, 0);
    m.config.fp8_param_gather = true;
    const MemoryBreakdown pg = stage_memory(m, l, 0, 1, 0);
    EXPECT_DOUBLE_EQ(pg.fp8_copies, columnwise + scaling_states);
    EXPECT_NEAR(plain.parameters - pg.parameters, weights * ((bf16 ? 2 : 4) - 1), 2048) << bf16;
    EXPECT_NEAR(pg.optimizer - plain.optimizer, bf16 ? 0 : 4 * weights, 2048) << bf16;
    EXPECT_DOUBLE_EQ(pg.gradients, plain.gradients);
  }
}

TEST(MemoryModel, UnfusedAttentionBackwardTemporariesAndSelectiveRecompute) {
  ModelSpec m = gpt2_124m(models::TransformerImpl::Local, 0.1);
  m.config.vocab_size = 256;  // the loss's [N, V] temporaries smaller than the attention's
  Layout l = one_gpu(8);
  const double scores = 8.0 * 12 * 1024 * 1024;
  // At the softmax's backward: probabilities, input and output gradients (f32: 12 bytes per score),
  // less what the layer kept (f32 probabilities, bf16 dropout mask and output: 8) and what its
  // backward has freed by then (the MLP's and the residuals' tensors, ~150 MB here).
  const double transient = stage_memory(m, l, 0, 1, 0).transient;
  EXPECT_LT(transient, 4 * scores);
  EXPECT_GT(transient, 2 * scores);
  l.recompute = models::RecomputeGranularity::Selective;
  EXPECT_GT(stage_memory(m, l, 0, 1, 0).transient, 10 * scores) << "the rebuilt attention on top";
}

// A table whose linear layers were timed through autograd (before 2026-12-04) loses the harness's
// traffic from their backward; one timed as GEMMs keeps it. Attention samples lose theirs always.
TEST(Calibration, AutogradHarnessComesOffTheBackwardSamples) {
  CalibrationTable t = h200_like_table();
  t.linear = {{8192, 1024, 1024, Precision::BF16, 50e-6, 200e-6}};
  t.attention.push_back({2, 16, 1024, 64, Precision::BF16, 40e-6, 120e-6, false});
  const auto path = std::filesystem::temp_directory_path() / "kiln_sim_calibration_harness.json";
  save_calibration(t, path);
  const CalibrationTable old = load_calibration(path);
  t.linear_backward_direct = true;
  save_calibration(t, path);
  const CalibrationTable direct = load_calibration(path);
  std::filesystem::remove(path);
  const double bw = t.memory_bandwidth;
  const double linear_harness = (2.0 * 8192 * 1024 + 3.0 * 8192 * 1024 + 3.0 * 1024 * 1024) * 2 / bw;
  EXPECT_NEAR(old.linear[0].backward_seconds, 200e-6 - linear_harness, 1e-12);
  EXPECT_DOUBLE_EQ(direct.linear[0].backward_seconds, 200e-6);
  EXPECT_DOUBLE_EQ(old.linear[0].forward_seconds, 50e-6) << "the forward has no harness";
  const double attention_harness = 11.0 * 2 * 16 * 1024 * 64 * 2 / bw;
  EXPECT_NEAR(direct.attention.back().backward_seconds, 120e-6 - attention_harness, 1e-12);
}

// Between two fused-attention samples the rate follows the work continuously (no jump at the
// midpoint between samples); beyond them the end sample's rate stands.
TEST(Calibration, AttentionRateIsInterpolatedInTheWork) {
  CalibrationTable t;
  t.gemms.push_back({1024, 1024, 1024, Precision::BF16, 1e-5});
  t.attention.push_back({2, 16, 1024, 64, Precision::BF16, 40e-6, 100e-6, false});   // 4.3 GFLOP
  t.attention.push_back({2, 16, 4096, 64, Precision::BF16, 200e-6, 500e-6, false});  // 68.7 GFLOP
  auto rate = [&](std::int64_t b, std::int64_t s) {
    const double causal = 4.0 * b * 16 * (double(s) * s - double(s) * (s - 1) / 2) * 64;
    return causal / t.attention_seconds(b, 16, s, s, 64, Precision::BF16, 1e15).first;
  };
  const double low = rate(2, 1024), high = rate(2, 4096);
  EXPECT_NEAR(rate(1, 1024), low, 1e-6 * low) << "below the smallest sample: its rate";
  EXPECT_NEAR(rate(4, 4096), high, 1e-6 * high) << "above the largest: its rate";
  double last = low;
  for (std::int64_t b : {3, 4, 6, 8, 12, 16, 24, 31}) {  // work between the samples, T 1024
    const double r = rate(b, 1024);
    EXPECT_GT(r, last) << b;
    EXPECT_LT(r, high) << b;
    last = r;
  }
  EXPECT_NEAR(rate(8, 1024), std::sqrt(low * high), 1e-3 * low) << "halfway in log(work)";
}

// A linear layer's rate between samples is no lower than a sample it contains in every dimension.
TEST(Calibration, LinearRateDoesNotFallBelowASmallerSample) {
  CalibrationTable t;
  t.gemms.push_back({1024, 1024, 1024, Precision::BF16, 1e-5});
  t.linear = {
      {8192, 768, 768, Precision::BF16, 2 * 8192.0 * 768 * 768 / 180e12, 4 * 8192.0 * 768 * 768 / 160e12},
      {4096, 1024, 1024, Precision::BF16, 2 * 4096.0 * 1024 * 1024 / 290e12, 4 * 4096.0 * 1024 * 1024 / 300e12},
      {8192, 2048, 2048, Precision::BF16, 2 * 8192.0 * 2048 * 2048 / 600e12, 4 * 8192.0 * 2048 * 2048 / 570e12}};
  const auto s = t.linear_seconds(8192, 1024, 1024, Precision::BF16);
  ASSERT_TRUE(s.has_value());
  const double flops = 2 * 8192.0 * 1024 * 1024;
  EXPECT_GE(flops / s->first, 290e12 * (1 - 1e-9));
  EXPECT_LE(flops / s->first, 600e12 * (1 + 1e-9));
  EXPECT_GE(2 * flops / s->second, 300e12 * (1 - 1e-9));
}

}  // namespace kernel_model_test
}  // namespace kiln::sim
