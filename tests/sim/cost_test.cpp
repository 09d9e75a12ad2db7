// Collective costs against the ring and tree formulas, the layout checks' reasons, and the
// parameter and optimizer accounting against GptConfig's parameter count.
#include <gtest/gtest.h>

#include "kiln/sim/collective_cost.h"
#include "kiln/sim/layer_work.h"
#include "kiln/sim/layout.h"
#include "kiln/sim/memory_model.h"
#include "kiln/sim/simulator.h"

namespace kiln::sim {
namespace cost_test {

TEST(CollectiveCost, RingAllReduceMovesTwiceTheShareOfEachRank) {
  const Link link{100e9, 5e-6};
  const double n = 1e9;
  EXPECT_DOUBLE_EQ(ring_all_reduce_seconds(n, 8, link), 2 * 7 * 5e-6 + 2.0 * 7 / 8 * n / 100e9);
  EXPECT_DOUBLE_EQ(all_gather_seconds(n, 8, link), 7 * 5e-6 + 7.0 / 8 * n / 100e9);
  EXPECT_DOUBLE_EQ(reduce_scatter_seconds(n, 8, link) + all_gather_seconds(n, 8, link),
                   ring_all_reduce_seconds(n, 8, link));
  EXPECT_EQ(ring_all_reduce_seconds(n, 1, link), 0.0);
  // Small messages over many ranks: the tree's log-depth latency wins; large ones over a node: the
  // ring's (p-1)/p share of the bandwidth term.
  EXPECT_LT(tree_all_reduce_seconds(1024, 512, link), ring_all_reduce_seconds(1024, 512, link));
  EXPECT_LT(ring_all_reduce_seconds(n, 8, link), tree_all_reduce_seconds(n, 8, link));
  EXPECT_DOUBLE_EQ(all_reduce_seconds(1024, 512, link), tree_all_reduce_seconds(1024, 512, link));
}

TEST(CollectiveCost, GroupsBeyondANodeUseTheNetwork) {
  const SystemSpec h200 = builtin_system("h200");
  EXPECT_EQ(group_link(h200, 8, 1).bandwidth, h200.intra_node_bandwidth);
  EXPECT_EQ(group_link(h200, 4, 2).bandwidth, h200.intra_node_bandwidth);
  EXPECT_EQ(group_link(h200, 4, 8).bandwidth, h200.inter_node_bandwidth);
}

ModelSpec llama8b() {
  ModelSpec m;
  m.config = models::GptConfig::llama3_8b(128256);
  m.config.validate();
  return m;
}

TEST(LayoutCheck, NamesWhatDoesNotDivide) {
  const ModelSpec m = llama8b();
  Layout l;
  l.tp = 8;
  l.dp = 1;
  l.global_batch_size = 8;
  EXPECT_TRUE(check_layout(m, l, 8, true).empty());
  l.tp = 3;
  const auto why = check_layout(m, l, 3, true);
  ASSERT_FALSE(why.empty());
  EXPECT_NE(why.front().find("--num-attention-heads 32 is not a multiple of --tensor-model-parallel-size 3"),
            std::string::npos)
      << why.front();
  l.tp = 1;
  l.pp = 5;
  EXPECT_FALSE(check_layout(m, l, 5, true).empty()) << "32 layers over 5 stages";
  l.pp = 1;
  l.dp = 8;
  l.global_batch_size = 12;
  EXPECT_FALSE(check_layout(m, l, 8, true).empty()) << "12 sequences over 8 ranks";
  l.global_batch_size = 16;
  l.fp8 = true;
  EXPECT_FALSE(check_layout(m, l, 8, false).empty()) << "no FP8 units";
  l.fp8 = false;
  l.ep = 2;
  EXPECT_FALSE(check_layout(m, l, 8, true).empty()) << "EP without experts";
}

// FP8 with experts is a valid layout (pretrain-gpt runs the experts' grouped GEMMs in FP8); each
// local expert's weight is cast on its own, the routed rows and their gradients once per GEMM.
TEST(LayoutCheck, Fp8MoeIsAcceptedAndEveryExpertsWeightCastIsCounted) {
  ModelSpec m = llama8b();
  m.moe.num_experts = 8;
  m.moe.router_topk = 2;
  Layout l;
  l.dp = 8;
  l.global_batch_size = 16;
  l.bf16 = true;
  l.fp8 = true;
  EXPECT_TRUE(check_layout(m, l, 8, true).empty());
  const LayerWork eight = layer_work(m, l, /*moe=*/true);
  m.moe.num_experts = 16;
  const LayerWork sixteen = layer_work(m, l, /*moe=*/true);
  const double h = 4096, fe = 14336, e = 2;  // delayed: one read (bf16) and one write (fp8) per element
  EXPECT_DOUBLE_EQ(sixteen.fp8_casts_forward.total() - eight.fp8_casts_forward.total(),
                   8 * (2 * fe + fe) * h * (e + 1));
  EXPECT_DOUBLE_EQ(sixteen.fp8_casts_backward.total(), eight.fp8_casts_backward.total());
  // The FP8 experts' wgrad GEMMs add into the fp32 buffers (gradient-accumulation fusion): no pass
  // of their own (the two RMSNorm weights are all that is accumulated); the bf16 experts' gradients
  // are, one call per stacked weight, while their experts are small (4096 tokens x top-2 over 16
  // experts: 512 rows each, below te::kAutoChunkedRows: one grouped launch in bf16).
  EXPECT_DOUBLE_EQ(sixteen.accumulated_parameters, 2 * h);
  l.fp8 = false;
  m.config.seq_length = 4096;
  const LayerWork bf16 = layer_work(m, l, /*moe=*/true);
  ASSERT_EQ(bf16.parameter_sizes.size(), sixteen.parameter_sizes.size() + 2);
  EXPECT_DOUBLE_EQ(bf16.accumulated_parameters - sixteen.accumulated_parameters, 16 * (2 * fe + fe) * h);
  // Two experts a rank (EP 8): 4096 rows each, their weight gradient a loop of GEMMs that add into
  // the fp32 buffers; without fusion both stacked weights accumulate, and the attention's linears.
  l.ep = 8;
  EXPECT_DOUBLE_EQ(layer_work(m, l, /*moe=*/true).accumulated_parameters, 2 * h);
  l.gradient_accumulation_fusion = false;
  const double attention_linears = static_cast<double>(m.config.qkv_size()) * h + h * h;
  EXPECT_DOUBLE_EQ(layer_work(m, l, /*moe=*/true).accumulated_parameters,
                   2 * h + attention_linears + 2 * (2 * fe + fe) * h);
}

TEST(MemoryModel, StagesSplitTheParametersAndTheDistributedOptimizerShardsTheState) {
  ModelSpec m = llama8b();
  Layout l;
  l.global_batch_size = 8;
  const double total = stage_parameters(m, l, 0).total();
  EXPECT_NEAR(total, static_cast<double>(m.config.num_parameters()), 1e-6 * total);
  l.pp = 4;
  double sum = 0;
  for (int s = 0; s < 4; ++s) sum += stage_parameters(m, l, s).total();
  EXPECT_NEAR(sum, total, 1e-6 * total);
  l.pp = 1;
  l.dp = 8;
  const MemoryBreakdown plain = stage_memory(m, l, 0, 1, 0);
  l.distributed_optimizer = true;
  const MemoryBreakdown sharded = stage_memory(m, l, 0, 1, 0);
  // Each of the three f32 state tensors (masters, two moments) is rounded to the allocator's 512 B.
  EXPECT_NEAR(sharded.optimizer * 8, plain.optimizer, 8 * 3 * 512.0);
  EXPECT_EQ(sharded.gradients, plain.gradients);
}

TEST(Simulator, OverTheMemoryCapIsReportedNotRanked) {
  ModelSpec m = llama8b();
  Layout l;
  l.global_batch_size = 8;
  l.micro_batch_size = 8;
  const Prediction p = predict(m, l, builtin_system("a100-80gb"), nullptr);
  ASSERT_FALSE(p.invalid.empty());
  EXPECT_NE(p.invalid.back().find("the cap is"), std::string::npos) << p.invalid.back();
  EXPECT_GT(p.step_seconds, 0);
}

// transformer_engine's GELU MLP (te/gelu_mlp.cpp) runs fc1's bias and GELU in the GEMM's epilogue
// and the bias gradient in the GELU-derivative pass: the layer counts no bias pass for fc1, where
// the local layers' linear() adds none forward either (ops::gemm_bias) but reduces its gradient.
TEST(LayerWork, FusedGeluMlpCountsFc1sBiasOnce) {
  ModelSpec m = llama8b();
  m.config.swiglu = false;
  m.config.add_bias_linear = true;
  m.config.position_embedding_type = models::PositionEmbedding::LearnedAbsolute;
  Layout l;
  l.bf16 = true;
  l.global_batch_size = 1;
  m.config.transformer_impl = models::TransformerImpl::TransformerEngine;
  const LayerWork te = layer_work(m, l, false);
  m.config.add_bias_linear = false;
  const LayerWork te_nobias = layer_work(m, l, false);
  const double n = static_cast<double>(m.config.seq_length), h = static_cast<double>(m.config.hidden_size);
  const double qkv = static_cast<double>(m.config.qkv_size()), e = 2;
  // Biases: qkv's and proj's gradients reduced; fc2's added out of place after its GEMM and reduced;
  // nothing for fc1.
  EXPECT_DOUBLE_EQ(te.forward.total() - te_nobias.forward.total(), 2 * n * h * e);
  EXPECT_DOUBLE_EQ(te.backward.total() - te_nobias.backward.total(), (qkv + h + h) * n * e);
}

// Full recompute runs each layer's forward once more in the backward: the backward pass grows by
// exactly the forward; selective recompute by the attention's forward.
TEST(Recompute, FullAddsExactlyOneForwardSelectiveTheAttentions) {
  ModelSpec m = llama8b();
  m.config.num_layers = 4;
  Layout l;
  l.bf16 = true;
  l.global_batch_size = 4;
  const SystemSpec sys = builtin_system("h200");
  const Prediction none = predict(m, l, sys, nullptr);
  l.recompute = models::RecomputeGranularity::Full;
  const Prediction full = predict(m, l, sys, nullptr);
  l.recompute = models::RecomputeGranularity::Selective;
  const Prediction selective = predict(m, l, sys, nullptr);
  EXPECT_NEAR(full.stage.forward, none.stage.forward, 1e-12);
  const double layer_forward = none.layer.gemm_forward + none.layer.attention_forward + none.layer.memory_bound_forward;
  EXPECT_NEAR(full.stage.backward - none.stage.backward, 4 * layer_forward, 1e-9 * layer_forward);
  EXPECT_NEAR(selective.stage.backward - none.stage.backward, 4 * none.layer.attention_forward, 1e-9 * layer_forward);
  // With FP8 the first forward runs without gradients (the backward reruns it recording): it makes
  // no columnwise casts of the linears' inputs, so it is shorter than the rerun one.
  l.fp8 = true;
  l.recompute = models::RecomputeGranularity::None;
  const Prediction fp8 = predict(m, l, sys, nullptr);
  l.recompute = models::RecomputeGranularity::Full;
  const Prediction fp8_full = predict(m, l, sys, nullptr);
  EXPECT_LT(fp8_full.stage.forward, fp8.stage.forward);
  const double fp8_layer_forward =
      fp8.layer.gemm_forward + fp8.layer.attention_forward + fp8.layer.memory_bound_forward;
  EXPECT_NEAR(fp8_full.stage.backward - fp8.stage.backward, 4 * fp8_layer_forward, 1e-9 * fp8_layer_forward);
}

// --tp-comm-overlap: the sequence-parallel collectives run beside the linears' GEMMs, so what stays
// on the path is at most the plain SP layout's and at least nothing; refused without SP and with
// FP8, as pretrain-gpt refuses them; its flag is printed with the layout's.
TEST(TpCommOverlap, HidesTheSequenceParallelCollectivesBehindTheGemms) {
  ModelSpec m = llama8b();
  m.config.num_layers = 4;
  Layout l;
  l.tp = 8;
  l.sequence_parallel = true;
  l.global_batch_size = 4;
  l.micro_batch_size = 1;
  const SystemSpec sys = builtin_system("h200");
  const Prediction plain = predict(m, l, sys, nullptr);
  ASSERT_TRUE(plain.invalid.empty());
  l.tp_comm_overlap = true;
  const Prediction overlapped = predict(m, l, sys, nullptr);
  ASSERT_TRUE(overlapped.invalid.empty());
  EXPECT_GT(plain.tp_seconds_per_chunk, 0.0);
  EXPECT_GE(overlapped.tp_seconds_per_chunk, 0.0);
  EXPECT_LT(overlapped.tp_seconds_per_chunk, plain.tp_seconds_per_chunk);
  EXPECT_LT(overlapped.step_seconds, plain.step_seconds);
  EXPECT_NE(megatron_flags(m, l).find("--sequence-parallel --tp-comm-overlap"), std::string::npos)
      << megatron_flags(m, l);
  l.sequence_parallel = false;
  const auto why = check_layout(m, l, 8, true);
  ASSERT_FALSE(why.empty());
  EXPECT_NE(why.front().find("--tp-comm-overlap needs --sequence-parallel"), std::string::npos) << why.front();
  l.sequence_parallel = true;
  l.fp8 = true;
  EXPECT_FALSE(check_layout(m, l, 8, true).empty()) << "FP8 with the overlap";
}

// --cp-comm-type a2a (Ulysses: four all-to-alls per pass, nothing beside them) and the allgather
// token dispatcher are simulated as pretrain-gpt runs them: both valid where pretrain-gpt takes
// them, their communication on the path, their flags printed; a2a needs heads and query groups
// per tensor-parallel rank that the context-parallel size divides.
TEST(CommunicationChoices, UlyssesAndTheAllGatherDispatcherAreSimulated) {
  ModelSpec m = llama8b();
  m.config.num_layers = 4;
  Layout l;
  l.cp = 2;
  l.global_batch_size = 4;
  const SystemSpec sys = builtin_system("h200");
  const Prediction ring = predict(m, l, sys, nullptr);
  l.cp_comm_type = models::CpCommType::A2A;
  const Prediction ulysses = predict(m, l, sys, nullptr);
  ASSERT_TRUE(ulysses.invalid.empty());
  EXPECT_GT(ulysses.cp_exposed_per_chunk, 0.0);
  EXPECT_NE(ulysses.cp_exposed_per_chunk, ring.cp_exposed_per_chunk);
  EXPECT_NE(megatron_flags(m, l).find("--cp-comm-type a2a"), std::string::npos) << megatron_flags(m, l);
  l.tp = 8;
  l.cp = 4;  // 32 / 8 = 4 heads, but 8 / 8 = 1 query group per tensor-parallel rank
  const auto why = check_layout(m, l, 32, true);
  ASSERT_FALSE(why.empty());
  EXPECT_NE(why.front().find("--cp-comm-type a2a"), std::string::npos) << why.front();

  ModelSpec moe = m;
  moe.moe.num_experts = 8;
  moe.moe.router_topk = 4;  // all-to-all moves 4 copies of a token, the gather every rank's token once
  moe.moe.ffn_hidden_size = 1024;
  Layout e;
  e.dp = 2;
  e.ep = 2;
  e.global_batch_size = 4;
  const Prediction alltoall = predict(moe, e, sys, nullptr);
  e.moe_token_dispatcher = models::MoeTokenDispatcher::AllGather;
  const Prediction allgather = predict(moe, e, sys, nullptr);
  ASSERT_TRUE(allgather.invalid.empty());
  EXPECT_GT(allgather.ep_seconds_per_chunk, 0.0);
  EXPECT_LT(allgather.ep_seconds_per_chunk, alltoall.ep_seconds_per_chunk);
  EXPECT_NE(megatron_flags(moe, e).find("--moe-token-dispatcher-type allgather"), std::string::npos);
}

// An uneven pipeline split (--decoder-first/last-pipeline-num-layers) as pretrain-gpt makes it: 1 +
// 3 layers on 2 stages runs the last stage three times as long per pass, so the step is longer than
// the even 2 + 2; the last stage holds the extra layer's parameters and activations and is the worst;
// the refusals are pretrain-gpt's, naming the flags.
TEST(UnevenPipelineSplit, TheLargerStagePacesTheStepAndHoldsTheMemory) {
  ModelSpec m = llama8b();
  m.config.num_layers = 4;
  Layout even;
  even.pp = 2;
  even.global_batch_size = 8;
  Layout uneven = even;
  uneven.first_stage_layers = 1;
  uneven.last_stage_layers = 3;
  const SystemSpec sys = builtin_system("h200");
  const Prediction a = predict(m, even, sys, nullptr), b = predict(m, uneven, sys, nullptr);
  ASSERT_TRUE(b.invalid.empty()) << b.invalid.front();
  EXPECT_GT(b.step_seconds, a.step_seconds);
  EXPECT_GT(b.stage.forward, a.stage.forward) << "the reported chunk is the larger stage's";
  // The worst stage is the last, with its three layers (the even split's was the first, holding two
  // micro-batches of two layers); its memory is that stage's own.
  EXPECT_EQ(b.worst_stage, 1);
  EXPECT_DOUBLE_EQ(b.memory.peak(), stage_memory(m, uneven, 1, b.schedule.peak_in_flight[1], 0).peak());
  EXPECT_GT(b.memory.peak(), stage_memory(m, even, 1, a.schedule.peak_in_flight[1], 0).peak());
  // One layer moves from the first stage to the last.
  const double moved = stage_parameters(m, even, 0).total() - stage_parameters(m, uneven, 0).total();
  EXPECT_GT(moved, 0.0);
  EXPECT_DOUBLE_EQ(stage_parameters(m, uneven, 1).total() - stage_parameters(m, even, 1).total(), moved);
  EXPECT_GT(stage_memory(m, uneven, 1, 1, 0).activations, stage_memory(m, even, 1, 1, 0).activations);
  EXPECT_NE(
      megatron_flags(m, uneven).find("--decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 3"),
      std::string::npos);
  EXPECT_NE(uneven.describe().find("first1 last3"), std::string::npos) << uneven.describe();
  // A split the other stages do not share evenly; interleaving, which needs equal chunks.
  Layout odd = even;
  odd.pp = 3;
  odd.first_stage_layers = 1;  // 3 layers left for 2 stages
  auto why = check_layout(m, odd, 3, true);
  ASSERT_FALSE(why.empty());
  EXPECT_NE(why.front().find("--decoder-first-pipeline-num-layers"), std::string::npos) << why.front();
  Layout chunks = uneven;
  chunks.vpp = 2;
  chunks.schedule = ScheduleKind::Interleaved;
  why = check_layout(m, chunks, 2, true);
  ASSERT_FALSE(why.empty());
  EXPECT_NE(why.front().find("--num-layers-per-virtual-pipeline-stage does not combine"), std::string::npos)
      << why.front();
}

// --expert-tensor-parallel-size as pretrain-gpt runs it: each rank holds F / R of every expert
// (half the experts' parameters, gradients and optimizer state at R = 2), runs it on the R ranks'
// gathered rows (the same FLOPs, so about the same compute), and adds the rows' gather and the
// partial outputs' reduce-scatter to the experts' communication; pretrain-gpt's refusals, naming the flag.
TEST(ExpertTensorParallel, SplitsTheExpertsMemoryAndAddsItsExchanges) {
  ModelSpec m = llama8b();
  m.config.num_layers = 4;
  m.moe.num_experts = 8;
  m.moe.router_topk = 2;
  m.moe.ffn_hidden_size = 1024;
  Layout l;
  l.dp = 2;
  l.global_batch_size = 4;
  l.distributed_optimizer = true;
  const SystemSpec sys = builtin_system("h200");
  const Prediction whole = predict(m, l, sys, nullptr);
  Layout s = l;
  s.etp = 2;
  const Prediction split = predict(m, s, sys, nullptr);
  ASSERT_TRUE(split.invalid.empty()) << split.invalid.front();
  const StageParameters pw = stage_parameters(m, l, 0), ps = stage_parameters(m, s, 0);
  EXPECT_DOUBLE_EQ(ps.expert * 2, pw.expert);
  EXPECT_DOUBLE_EQ(ps.dense, pw.dense);
  const MemoryBreakdown mw = stage_memory(m, l, 0, 1, 0), ms = stage_memory(m, s, 0, 1, 0);
  EXPECT_DOUBLE_EQ(mw.parameters - ms.parameters, pw.expert / 2 * 2);  // bf16
  EXPECT_DOUBLE_EQ(mw.gradients - ms.gradients, pw.expert / 2 * 4);
  // The distributed optimizer shards the experts' state over edp = 2 / (etp x ep): 2 ranks whole, 1 split.
  EXPECT_DOUBLE_EQ(mw.optimizer - ms.optimizer, pw.expert * 12 / 2 - ps.expert * 12);
  EXPECT_EQ(whole.ep_seconds_per_chunk, 0.0);  // EP 1: no dispatch between ranks
  EXPECT_GT(split.ep_seconds_per_chunk, 0.0);
  const double compute_whole = whole.stage.forward - whole.ep_seconds_per_chunk / 3;
  const double compute_split = split.stage.forward - split.ep_seconds_per_chunk / 3;
  EXPECT_NEAR(compute_split / compute_whole, 1.0, 0.1);
  EXPECT_NE(megatron_flags(m, s).find("--expert-tensor-parallel-size 2"), std::string::npos);
  EXPECT_NE(s.describe().find("EP1 ETP2"), std::string::npos) << s.describe();

  auto refused = [&](const ModelSpec& model, const Layout& layout, const std::string& text) {
    const auto why = check_layout(model, layout, layout.devices(), true);
    ASSERT_FALSE(why.empty()) << text;
    EXPECT_NE(why.back().find(text), std::string::npos) << why.back();
  };
  Layout three = l;
  three.dp = 3;
  three.global_batch_size = 3;
  three.etp = 3;  // 1024 is not a multiple of 3
  refused(m, three, "--expert-tensor-parallel-size 3");
  Layout four = s;
  four.etp = 4;  // 4 x 1 does not divide the 2 devices
  refused(m, four, "--expert-tensor-parallel-size 4 x --expert-model-parallel-size 1 does not divide");
  Layout fp8 = s;
  fp8.fp8 = true;
  refused(m, fp8, "--fp8-format with --expert-tensor-parallel-size 2");
  refused(llama8b(), s, "--expert-tensor-parallel-size > 1 needs --num-experts");
}

}  // namespace cost_test
}  // namespace kiln::sim
