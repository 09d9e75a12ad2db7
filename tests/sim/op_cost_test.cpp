// The op-level time model of transformer_engine layers (CalibrationTable::ops: each of Kiln's
// non-GEMM ops at a measured fixed cost per call plus a per-element cost), the GELU MLP measured
// whole, the gradient accumulation per parameter tensor, the table's round trip, the fallback of
// older tables, and the FP8 memory items; all on synthetic tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "kiln/sim/calibration.h"
#include "kiln/sim/layer_work.h"
#include "kiln/sim/memory_model.h"
#include "kiln/sim/simulator.h"

namespace kiln::sim {
namespace op_cost_test {

ModelSpec gpt2_te() {
  ModelSpec m;
  m.config.num_layers = 12;
  m.config.hidden_size = 768;
  m.config.num_attention_heads = 12;
  m.config.seq_length = 1024;
  m.config.max_position_embeddings = 1024;
  m.config.vocab_size = 257;
  m.config.transformer_impl = models::TransformerImpl::TransformerEngine;
  m.config.attention_dropout = 0;
  m.config.hidden_dropout = 0;
  m.config.validate();
  return m;
}

ModelSpec llama_te() {
  ModelSpec m = gpt2_te();
  m.config.num_layers = 4;
  m.config.hidden_size = 2048;
  m.config.num_attention_heads = 32;
  m.config.num_query_groups = 8;
  m.config.seq_length = m.config.max_position_embeddings = 2048;
  m.config.position_embedding_type = models::PositionEmbedding::Rope;
  m.config.normalization = models::Normalization::RMSNorm;
  m.config.swiglu = true;
  m.config.add_bias_linear = false;
  m.config.untie_embeddings_and_output_weights = true;
  m.config.validate();
  return m;
}

Layout bf16_layout(std::int64_t micro_batch) {
  Layout l;
  l.micro_batch_size = micro_batch;
  l.global_batch_size = 4 * micro_batch;
  l.bf16 = true;
  return l;
}

CalibrationTable base_table() {
  CalibrationTable t;
  t.device = "cuda:0";
  t.format = 2;
  t.memory_bandwidth = 3e12;
  t.elementwise_elements = 1 << 24;
  for (std::int64_t s : {256, 1024, 4096, 8192})
    t.gemms.push_back({s, s, s, Precision::BF16, 2.0 * s * s * s / 700e12});
  t.attention.push_back({2, 16, 2048, 64, Precision::BF16, 100e-6, 250e-6});
  return t;
}

// Every op kind at `fixed` seconds a call (forward and backward) and `per_element` seconds.
CalibrationTable with_ops(CalibrationTable t, double fixed, double per_element) {
  for (int k = 0; k < kOpKinds; ++k)
    t.ops.push_back({static_cast<OpKind>(k), Precision::BF16, {fixed, per_element}, {fixed, per_element}, {}});
  return t;
}

double calls(const std::vector<OpCall>& v) {
  double n = 0;
  for (const auto& c : v) n += c.calls;
  return n;
}

double calls_of(const std::vector<OpCall>& v, OpKind kind) {
  double n = 0;
  for (const auto& c : v)
    if (c.kind == kind) n += c.calls;
  return n;
}

TEST(OpCost, FitRecoversTheFixedAndPerElementCosts) {
  std::vector<std::pair<double, double>> points;
  for (double x : {2.6e5, 1e6, 4e6, 1.6e7}) points.emplace_back(x, 5e-6 + 2e-12 * x);
  const OpCost c = fit_op_cost(points);
  EXPECT_NEAR(c.fixed, 5e-6, 1e-9);
  EXPECT_NEAR(c.per_element, 2e-12, 1e-16);
  EXPECT_NEAR(c.seconds(1e6), 7e-6, 1e-10);
  EXPECT_EQ(c.seconds(0), 0.0) << "no elements, no call";
  // One size: all of it per element; a falling line: flat; a negative intercept: through the origin.
  EXPECT_DOUBLE_EQ(fit_op_cost({{1e6, 2e-6}}).per_element, 2e-12);
  const OpCost flat = fit_op_cost({{1e6, 3e-6}, {4e6, 2e-6}});
  EXPECT_EQ(flat.per_element, 0.0);
  EXPECT_GT(flat.fixed, 2e-6);
  const OpCost origin = fit_op_cost({{1e6, 1e-6}, {4e6, 8e-6}});
  EXPECT_EQ(origin.fixed, 0.0);
  EXPECT_GT(origin.per_element, 0.0);
}

TEST(OpCost, GptLayerCallsAsTheCodeMakesThem) {
  const LayerWork w = layer_work(gpt2_te(), bf16_layout(8), false);
  const double n = 8.0 * 1024, h = 768;
  // Forward: the two norms (te::add_layer_norm without and with the residual), the final residual add.
  EXPECT_EQ(calls(w.calls_forward), 3);
  EXPECT_EQ(calls_of(w.calls_forward, OpKind::LayerNorm), 1);
  EXPECT_EQ(calls_of(w.calls_forward, OpKind::LayerNormResidual), 1);
  EXPECT_EQ(calls_of(w.calls_forward, OpKind::Add), 1);
  // Backward: the norms', the engine's sum of the layer input's two gradients, the qkv and proj bias
  // gradients (their forward bias is in the GEMM's epilogue); bf16 without RoPE reads q, k, v in place.
  EXPECT_EQ(calls(w.calls_backward), 5);
  EXPECT_EQ(calls_of(w.calls_backward, OpKind::BiasGrad), 2);
  EXPECT_EQ(calls_of(w.calls_backward, OpKind::Copy), 0);
  // The GELU MLP (te::linear_gelu_linear): fc2's bias added out of place; its gradient and the GELU
  // derivative pass.
  EXPECT_TRUE(w.gelu_mlp);
  ASSERT_EQ(w.mlp_calls_forward.size(), 1u);
  EXPECT_EQ(w.mlp_calls_forward[0].kind, OpKind::BiasAdd);
  EXPECT_DOUBLE_EQ(w.mlp_calls_forward[0].elements, n * h);
  EXPECT_EQ(calls_of(w.mlp_calls_backward, OpKind::Gelu), 1);
  EXPECT_EQ(calls_of(w.mlp_calls_backward, OpKind::BiasGrad), 1);
  // 12 parameter tensors (two norms' weight and bias, four linear weights and biases); under
  // gradient-accumulation fusion the 4 linear weights' GEMMs add into the fp32 buffers themselves,
  // so 8 tensors accumulate in a pass of their own, adding up to accumulated_parameters.
  ASSERT_EQ(w.parameter_sizes.size(), 8u);
  double total = 0;
  for (double s : w.parameter_sizes) total += s;
  EXPECT_DOUBLE_EQ(total, w.accumulated_parameters);
  Layout unfused = bf16_layout(8);
  unfused.gradient_accumulation_fusion = false;
  const LayerWork all = layer_work(gpt2_te(), unfused, false);
  ASSERT_EQ(all.parameter_sizes.size(), 12u);
  total = 0;
  for (double s : all.parameter_sizes) total += s;
  EXPECT_DOUBLE_EQ(total, all.parameters);
  EXPECT_DOUBLE_EQ(all.accumulated_parameters, all.parameters);
  // Hidden dropout: two calls each way.
  ModelSpec dropout = gpt2_te();
  dropout.config.hidden_dropout = 0.1;
  EXPECT_EQ(calls_of(layer_work(dropout, bf16_layout(8), false).calls_forward, OpKind::Dropout), 2);
  // Attention dropout runs in Kiln's kernels (Auto's choice), which take q, k and v dense: copied
  // out of the packed projection, and their gradients copied back (cuDNN reads and writes them in
  // place).
  ModelSpec attention_dropout = gpt2_te();
  attention_dropout.config.attention_dropout = 0.1;
  const LayerWork dense = layer_work(attention_dropout, bf16_layout(8), false);
  EXPECT_EQ(calls_of(dense.calls_forward, OpKind::Copy), 3);
  EXPECT_EQ(calls_of(dense.calls_backward, OpKind::Copy), 3);
}

TEST(OpCost, LlamaLayerCallsAsTheCodeMakesThem) {
  const LayerWork w = layer_work(llama_te(), bf16_layout(2), false);
  // RMSNorm; q, k and v out of the projection by te::split_qkv_rope (q and k rotated, one pass each
  // way, no copies around it); SwiGLU; no biases.
  EXPECT_EQ(calls_of(w.calls_forward, OpKind::RmsNorm), 1);
  EXPECT_EQ(calls_of(w.calls_forward, OpKind::RmsNormResidual), 1);
  EXPECT_EQ(calls_of(w.calls_forward, OpKind::Rope), 1);
  EXPECT_EQ(calls_of(w.calls_backward, OpKind::Rope), 1);
  EXPECT_EQ(calls_of(w.calls_forward, OpKind::Copy), 0);
  EXPECT_EQ(calls_of(w.calls_backward, OpKind::Copy), 0);
  EXPECT_EQ(calls_of(w.calls_forward, OpKind::Swiglu), 1);
  EXPECT_EQ(calls_of(w.calls_backward, OpKind::BiasGrad), 0);
  EXPECT_FALSE(w.gelu_mlp);
  EXPECT_EQ(w.parameter_sizes.size(), 2u);  // the norms; the 4 linear weights fuse their accumulation
  // Local layers keep the byte model.
  ModelSpec local = llama_te();
  local.config.transformer_impl = models::TransformerImpl::Local;
  EXPECT_TRUE(layer_work(local, bf16_layout(2), false).calls_forward.empty());
}

TEST(OpCost, OpSamplesPriceEachCallAndOlderTablesFallBack) {
  const SystemSpec h200 = builtin_system("h200");
  const ModelSpec m = gpt2_te();
  const CalibrationTable old_table = base_table();
  EXPECT_FALSE(old_table.has_ops(Precision::BF16));
  const CalibrationTable fixed_only = with_ops(base_table(), 10e-6, 0);
  EXPECT_TRUE(fixed_only.has_ops(Precision::BF16));
  EXPECT_FALSE(fixed_only.has_ops(Precision::FP32));
  const Prediction before = predict(m, bf16_layout(8), h200, &old_table);
  const Prediction after = predict(m, bf16_layout(8), h200, &fixed_only);
  // A fixed cost only: 3 + 1 forward calls (fc2's bias add: no GELU MLP sample), 5 + 2 backward,
  // 8 accumulations (the 4 linear weights' fused into their GEMMs; 12 without the fusion).
  EXPECT_NEAR(after.layer.memory_bound_forward, 4 * 10e-6, 1e-12);
  EXPECT_NEAR(after.layer.memory_bound_backward, 7 * 10e-6, 1e-12);
  EXPECT_NEAR(after.layer.gradient_accumulation, 8 * 10e-6, 1e-12);
  Layout unfused = bf16_layout(8);
  unfused.gradient_accumulation_fusion = false;
  EXPECT_NEAR(predict(m, unfused, h200, &fixed_only).layer.gradient_accumulation, 12 * 10e-6, 1e-12);
  EXPECT_NE(before.layer.memory_bound_forward, after.layer.memory_bound_forward);
  // The per-element cost scales with the tokens; the fixed cost does not.
  const CalibrationTable per_element = with_ops(base_table(), 0, 1e-12);
  const Prediction b8 = predict(m, bf16_layout(8), h200, &per_element);
  const Prediction b16 = predict(m, bf16_layout(16), h200, &per_element);
  EXPECT_NEAR(b16.layer.memory_bound_forward / b8.layer.memory_bound_forward, 2.0, 1e-9);
  const Prediction f16 = predict(m, bf16_layout(16), h200, &fixed_only);
  EXPECT_NEAR(f16.layer.memory_bound_forward, after.layer.memory_bound_forward, 1e-12);
  // An fp32 run against a bf16-only op set: the byte model.
  Layout fp32 = bf16_layout(8);
  fp32.bf16 = false;
  EXPECT_EQ(predict(m, fp32, h200, &fixed_only).layer.memory_bound_forward,
            predict(m, fp32, h200, &old_table).layer.memory_bound_forward);
}

TEST(OpCost, GeluMlpSampleReplacesFc1Fc2AndTheirPasses) {
  const SystemSpec h200 = builtin_system("h200");
  const ModelSpec m = gpt2_te();
  CalibrationTable t = with_ops(base_table(), 10e-6, 0);
  const Prediction without = predict(m, bf16_layout(8), h200, &t);
  t.gelu_mlp.push_back({8192, 3072, 768, Precision::BF16, 200e-6, 500e-6});
  const Prediction with = predict(m, bf16_layout(8), h200, &t);
  // fc2's bias add and the MLP's backward passes are inside the sample now.
  EXPECT_NEAR(with.layer.memory_bound_forward, 3 * 10e-6, 1e-12);
  EXPECT_NEAR(with.layer.memory_bound_backward, 5 * 10e-6, 1e-12);
  // The qkv and proj GEMMs are unchanged: the difference is the MLP's.
  const auto mlp = t.gelu_mlp_seconds(8192, 3072, 768, Precision::BF16);
  ASSERT_TRUE(mlp.has_value());
  EXPECT_DOUBLE_EQ(mlp->first, 200e-6);
  EXPECT_GT(with.layer.gemm_forward, 200e-6);
  EXPECT_LT(with.layer.gemm_forward, without.layer.gemm_forward + 200e-6);
  // Twice the tokens: twice the sample (scaled by FLOPs from the nearest shape).
  EXPECT_NEAR(t.gelu_mlp_seconds(16384, 3072, 768, Precision::BF16)->second, 1000e-6, 1e-12);
  EXPECT_FALSE(t.gelu_mlp_seconds(8192, 3072, 768, Precision::FP32).has_value());
}

TEST(OpCost, TableRoundTripsTheOpsGeluMlpAndFp8Memory) {
  CalibrationTable t = with_ops(base_table(), 4e-6, 3e-12);
  t.ops[0].points = {{{1e6, 7e-6, 9e-6}}};
  t.gelu_mlp.push_back({8192, 3072, 768, Precision::BF16, 200e-6, 500e-6});
  t.fp8_memory.push_back({te::Fp8ScalingRecipe::Blockwise, 1.03, 2.01});
  const auto path = std::filesystem::temp_directory_path() / "kiln_sim_op_cost_table.json";
  save_calibration(t, path);
  const CalibrationTable back = load_calibration(path);
  std::filesystem::remove(path);
  ASSERT_EQ(back.ops.size(), static_cast<std::size_t>(kOpKinds));
  EXPECT_TRUE(back.has_ops(Precision::BF16));
  const OpSample* norm = back.op(OpKind::LayerNorm, Precision::BF16);
  ASSERT_NE(norm, nullptr);
  EXPECT_DOUBLE_EQ(norm->forward.fixed, 4e-6);
  EXPECT_DOUBLE_EQ(norm->backward.per_element, 3e-12);
  ASSERT_EQ(norm->points.size(), 1u);
  EXPECT_DOUBLE_EQ(norm->points[0][2], 9e-6);
  ASSERT_EQ(back.gelu_mlp.size(), 1u);
  EXPECT_DOUBLE_EQ(back.gelu_mlp[0].backward_seconds, 500e-6);
  ASSERT_NE(back.fp8_memory_of(te::Fp8ScalingRecipe::Blockwise), nullptr);
  EXPECT_DOUBLE_EQ(back.fp8_memory_of(te::Fp8ScalingRecipe::Blockwise)->saved_bytes_per_input, 1.03);
  EXPECT_EQ(back.fp8_memory_of(te::Fp8ScalingRecipe::Delayed), nullptr);
}

TEST(OpCost, Fp8LayersKeepTheAttentionOutputAndItsCast) {
  const ModelSpec m = llama_te();
  Layout bf16 = bf16_layout(2);
  Layout fp8 = bf16;
  fp8.fp8 = true;
  const double n = 2.0 * 2048, attention_out = n * 2048;
  // FP8 keeps the GEMM inputs in one byte, except the attention output, which te::attention keeps in
  // bf16 for its backward while the projection keeps its FP8 cast too. Each cast keeps its scale_inv
  // (one 512 B block); the projection's, cast_both's columnwise one, its amax besides (QKV's, fc1's
  // and fc2's are the fused casts' transposed copies, sharing their producers' scales).
  const double saved_per_layer = layer_activation_bytes(m, bf16, false) - layer_activation_bytes(m, fp8, false);
  const double h = 2048, f = static_cast<double>(m.config.ffn_hidden());
  EXPECT_DOUBLE_EQ(saved_per_layer, n * h * 2 + n * f - attention_out - 5 * 512.0);
}

}  // namespace op_cost_test
}  // namespace kiln::sim
