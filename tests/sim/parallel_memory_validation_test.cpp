// The simulator's per-rank memory against Kiln's allocator for the parallel layouts CI trains, under
// `mpirun -np 2` and `-np 4` (ctest sim_memory_mpirun_2/4; alone, a world of one, the test skips):
// DP, TP (+SP), PP (1F1B, interleaved, zero-bubble, DualPipe, MTP), CP (p2p, a2a), MoE under DP,
// EP and TP x EP (with and without SP), MoE with expert tensor parallelism (ETP 2 under DP, DP
// with the distributed optimizer, TP, TP + SP with local and transformer_engine layers; at 4 ranks
// TP2 x EP2 with and without SP, EP2 with the allgather dispatcher, DP4 with the distributed
// optimizer), transformer_engine layers under TP + SP and CP, FP8 (local layers in fp32 with FP8
// GEMMs: delayed under TP + SP, CP and PP, tensorwise under TP + SP), and their 4-rank mixes.
// Each rank runs train::pretrain_gpt in-process (2 iterations, 2 micro-batches, fp32,
// GPT-2-shaped, from an emptied allocator cache) and reports its allocator peaks; the largest over
// the ranks is compared with the prediction for the layout's worst stage, two ways
// (docs/simulate.md, measured 2026-12-07): against the allocator's peak
// (MemoryStats::peak_allocated, what the trainer logs) and against the peak of what the live
// blocks were asked for (MemoryStats::peak_requested, each request rounded to the allocator's
// 512 B): what the model counts, tensor by tensor. The allocator splits its blocks to the rounded
// request, so the two peaks are the same and every layout is within 3% of both (measured: -2.7% to
// +1.2%). Before it split blocks (2026-12-06) it handed a request a cached block of up to twice its
// size and counted the whole block: TP2 -4.5%, TP2 + SP -7.0%, CP2 -5.8% against its peak, which
// were asserted within 8%.
// The runs after the first find the local attention's causal mask (16 KiB, cached per thread by
// models/transformer_core_ops.cpp) alive before them, so their measurements leave it out while the
// prediction, for a fresh process, counts it: +0.2 to +0.3% of theirs.
// PP2 with an MTP depth on the last stage (its copy of the embedding, the depth's layer and loss).
// FP8 delayed under TP2 + SP was 3.3% under (asserted 4%) until the model counted the delayed
// recipe's scaling state (nine 512 B buffers per FP8 linear) and the columnwise casts' own amaxes.
// The ETP rows were 3.0% to 9.4% under until the model counted the MoE layer's forward at the
// exchange's scatter (three [rows, H] tensors at once) and the exchange's kept row orders. The MoE
// rows stay 0.7% to 2.7% under: the router's and dispatcher's small tensors are not counted, and
// under EP the rank with the most routed rows peaks (the model assumes a balanced load).
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <string>

#include "kiln/dist/process_groups.h"
#include "kiln/runtime/backend.h"
#include "kiln/sim/simulator.h"
#include "kiln/train/gpt_pretrain.h"
#include "tiny_token_dataset.h"

namespace kiln::sim {
namespace parallel_memory_validation_test {

struct ParallelRun {
  std::string name;
  int tp = 1, pp = 1, cp = 1, ep = 1;
  int etp = 1;  // --expert-tensor-parallel-size: each expert's F split over this many ranks
  bool sequence_parallel = false, distributed_optimizer = false;
  std::int64_t mtp = 0;      // MTP depths (with RoPE: MTP takes no learned positions)
  std::int64_t experts = 0;  // MoE: routed experts (top-2) in every layer
  models::MoeTokenDispatcher dispatcher = models::MoeTokenDispatcher::AllToAll;
  std::int64_t layers_per_virtual_stage = 0;  // interleaved 1F1B
  ScheduleKind schedule = ScheduleKind::OneF1B;
  models::CpCommType cp_comm_type = models::CpCommType::P2P;
  models::TransformerImpl impl = models::TransformerImpl::Local;
  std::optional<te::Fp8ScalingRecipe> fp8 = std::nullopt;  // --fp8-format hybrid with this recipe
};

// Every layout, against both peaks.
constexpr double kTolerance = 0.03;

models::GptConfig tiny_gpt2(const ParallelRun& run) {
  models::GptConfig c;
  if (run.mtp > 0) {
    c.position_embedding_type = models::PositionEmbedding::Rope;
    c.mtp_num_layers = run.mtp;
  }
  if (run.experts > 0) {
    c.num_experts = run.experts;
    c.moe_ffn_hidden_size = 96;
    c.moe_router_topk = 2;
    c.moe_aux_loss_coeff = 1e-2;
    c.moe_grouped_gemm = true;
    c.moe_permute_fusion = true;
    c.add_bias_linear = false;  // grouped experts have no biases (Megatron's GroupedMLP)
    c.expert_model_parallel_size = run.ep;
    c.expert_tensor_parallel_size = run.etp;
    c.moe_token_dispatcher_type = run.dispatcher;
  }
  c.transformer_impl = run.impl;
  if (run.fp8) {
    c.fp8 = true;
    c.fp8_recipe.format = te::Fp8Format::Hybrid;
    c.fp8_recipe.recipe = *run.fp8;
    c.fp8_recipe.amax_history_len = 4;
  }
  c.cp_comm_type = run.cp_comm_type;
  c.num_layers = 4;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.seq_length = 64;
  c.vocab_size = 100;
  c.make_vocab_size_divisible_by = 4;
  c.attention_dropout = 0;  // context parallelism refuses attention dropout
  c.hidden_dropout = 0;
  return c;
}

struct MeasuredPeak {
  double allocated = 0, requested = 0;  // MemoryStats::peak_allocated, peak_requested
};

// This rank's allocator peaks for the run, less what was alive before it.
MeasuredPeak measured_peaks(const ParallelRun& run, const dist::Communicator& world, const std::string& data) {
  auto groups = std::make_shared<const dist::ProcessGroups>(
      world, dist::ParallelSizes{.tp = run.tp, .pp = run.pp, .cp = run.cp, .ep = run.ep, .etp = run.etp});
  models::GptConfig c = tiny_gpt2(run);
  c.tensor_model_parallel_size = run.tp;
  c.sequence_parallel = run.sequence_parallel;
  c.context_parallel_size = run.cp;
  train::GptTrainOptions o;
  o.micro_batch_size = 4;
  o.global_batch_size = 8 * (world.size() / (run.tp * run.pp * run.cp));  // 2 micro-batches per rank
  o.train_iters = 2;
  o.lr = 1e-3;
  o.data_path = {{1.0, data}};
  o.split = "100,0,0";
  o.eval_iters = 0;
  o.log_interval = 2;
  o.progress = false;
  o.process_groups = groups;
  o.data_parallel = run.cp > 1 ? groups->dp() : groups->dp_cp();
  if (run.tp > 1) o.tensor_parallel = groups->tp();
  if (run.pp > 1) o.pipeline_parallel = groups->pp();
  if (run.cp > 1) {
    o.context_parallel = groups->cp();
    o.data_context_parallel = groups->dp_cp();
  }
  o.use_distributed_optimizer = run.distributed_optimizer;
  o.num_layers_per_virtual_pipeline_stage = run.layers_per_virtual_stage;
  o.zero_bubble_schedule = run.schedule == ScheduleKind::ZeroBubble;
  o.dualpipe_schedule = run.schedule == ScheduleKind::DualPipe;
  Backend& backend = backend_for(Device::cpu());
  backend.empty_cache(0);
  const MemoryStats before = backend.memory_stats(0);
  backend.reset_peak_memory(0);
  train::GptTrainCallbacks callbacks;
  callbacks.message = [](const std::string&) {};
  (void)train::pretrain_gpt(c, o, {}, callbacks);
  const MemoryStats after = backend.memory_stats(0);
  return {static_cast<double>(after.peak_allocated) - static_cast<double>(before.allocated),
          static_cast<double>(after.peak_requested) - static_cast<double>(before.requested)};
}

double predicted_peak(const ParallelRun& run, int world) {
  ModelSpec model;
  model.config = tiny_gpt2(run);
  model.moe = MoeSpec::of(model.config);
  Layout l;
  l.tp = run.tp;
  l.pp = run.pp;
  l.cp = run.cp;
  l.ep = run.ep;
  l.etp = run.etp;
  l.moe_token_dispatcher = run.dispatcher;
  l.cp_comm_type = run.cp_comm_type;
  l.fp8 = run.fp8.has_value();
  l.vpp = run.layers_per_virtual_stage > 0
              ? static_cast<int>(model.config.num_layers / (run.pp * run.layers_per_virtual_stage))
              : 1;
  l.schedule = run.layers_per_virtual_stage > 0 ? ScheduleKind::Interleaved : run.schedule;
  l.dp = world / (run.tp * run.pp * run.cp);
  l.sequence_parallel = run.sequence_parallel;
  l.distributed_optimizer = run.distributed_optimizer;
  l.bf16 = false;
  l.micro_batch_size = 4;
  l.global_batch_size = 8 * l.dp;
  PredictOptions po;
  po.fragmentation = 0;
  // The CPU emulates the FP8 GEMMs and allocates what a GPU would: its system gets FP8 "units".
  SystemSpec system = builtin_system("cpu");
  if (l.fp8) system.peak_flops_fp8 = system.peak_flops_bf16 > 0 ? system.peak_flops_bf16 : system.peak_flops_fp32;
  const Prediction p = predict(model, l, system, nullptr, po);
  EXPECT_TRUE(p.invalid.empty()) << run.name << ": " << (p.invalid.empty() ? "" : p.invalid.front());
  return p.memory.peak();
}

// The layouts CI trains (tests/cli/*_flow.sh, tests/train), on 2 and 4 ranks.
std::vector<ParallelRun> layouts_on(int world) {
  using models::CpCommType;
  using models::MoeTokenDispatcher;
  using models::TransformerImpl;
  using te::Fp8ScalingRecipe;
  if (world == 2)
    return {{.name = "dp2"},
            {.name = "dp2+zero1", .distributed_optimizer = true},
            {.name = "tp2", .tp = 2},
            {.name = "tp2+sp", .tp = 2, .sequence_parallel = true},
            {.name = "tp2+sp te", .tp = 2, .sequence_parallel = true, .impl = TransformerImpl::TransformerEngine},
            {.name = "pp2", .pp = 2},
            {.name = "pp2 interleaved", .pp = 2, .layers_per_virtual_stage = 1},
            {.name = "pp2 zero-bubble", .pp = 2, .schedule = ScheduleKind::ZeroBubble},
            {.name = "pp2 dualpipe", .pp = 2, .schedule = ScheduleKind::DualPipe},
            {.name = "cp2", .cp = 2},
            {.name = "cp2 a2a", .cp = 2, .cp_comm_type = CpCommType::A2A},
            {.name = "cp2 te", .cp = 2, .impl = TransformerImpl::TransformerEngine},
            {.name = "pp2+mtp", .pp = 2, .mtp = 1},
            {.name = "fp8 tp2+sp", .tp = 2, .sequence_parallel = true, .fp8 = Fp8ScalingRecipe::Delayed},
            {.name = "fp8 tp2+sp tensorwise", .tp = 2, .sequence_parallel = true, .fp8 = Fp8ScalingRecipe::Tensorwise},
            {.name = "fp8 cp2", .cp = 2, .fp8 = Fp8ScalingRecipe::Delayed},
            {.name = "fp8 pp2", .pp = 2, .fp8 = Fp8ScalingRecipe::Delayed},
            {.name = "moe dp2", .experts = 4},
            {.name = "moe ep2 alltoall", .ep = 2, .experts = 4},
            {.name = "moe ep2 allgather", .ep = 2, .experts = 4, .dispatcher = MoeTokenDispatcher::AllGather},
            {.name = "moe tp2+ep2", .tp = 2, .ep = 2, .experts = 4},
            {.name = "moe etp2", .etp = 2, .experts = 4},
            {.name = "moe etp2+zero1", .etp = 2, .distributed_optimizer = true, .experts = 4},
            {.name = "moe tp2 etp2", .tp = 2, .etp = 2, .experts = 4},
            {.name = "moe tp2+sp etp2", .tp = 2, .etp = 2, .sequence_parallel = true, .experts = 4},
            {.name = "moe tp2+sp etp2 te",
             .tp = 2,
             .etp = 2,
             .sequence_parallel = true,
             .experts = 4,
             .impl = TransformerImpl::TransformerEngine}};
  return {
      {.name = "tp2xdp2", .tp = 2},
      {.name = "pp2xdp2+zero1", .pp = 2, .distributed_optimizer = true},
      {.name = "moe ep2xdp2", .ep = 2, .experts = 4},
      {.name = "moe tp2xep2xdp2+sp", .tp = 2, .ep = 2, .sequence_parallel = true, .experts = 4},
      {.name = "moe tp2xep2xdp2", .tp = 2, .ep = 2, .experts = 4},
      {.name = "moe tp2xep2xdp2 etp2+sp", .tp = 2, .ep = 2, .etp = 2, .sequence_parallel = true, .experts = 4},
      {.name = "moe tp2xep2xdp2 etp2", .tp = 2, .ep = 2, .etp = 2, .experts = 4},
      {.name = "moe ep2xetp2 allgather", .ep = 2, .etp = 2, .experts = 4, .dispatcher = MoeTokenDispatcher::AllGather},
      {.name = "moe etp2xdp4+zero1", .etp = 2, .distributed_optimizer = true, .experts = 4}};
}

TEST(ParallelMemoryValidation, EveryRanksPeakAgainstThePrediction) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() != 2 && world.size() != 4) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: sim_memory_mpirun_2/4)";
  const std::string data = testing::tiny_token_dataset("sim_parallel/" + std::to_string(world.rank()));
  for (const ParallelRun& run : layouts_on(world.size())) {
    const MeasuredPeak mine = measured_peaks(run, world, data);
    const double allocated = world.all_reduce_value(mine.allocated, dist::ReduceOp::Max);
    const double requested = world.all_reduce_value(mine.requested, dist::ReduceOp::Max);
    const double predicted = predicted_peak(run, world.size());
    if (world.rank() == 0)
      std::printf(
          "%s: predicted %.3f MiB; largest over the ranks: requested peak %.3f MiB (%+.1f%%), allocator peak "
          "%.3f MiB (%+.1f%%)\n",
          run.name.c_str(), predicted / 1048576.0, requested / 1048576.0, 100 * (predicted / requested - 1),
          allocated / 1048576.0, 100 * (predicted / allocated - 1));
    EXPECT_NEAR(predicted / requested, 1.0, kTolerance) << run.name << ": against the requested peak";
    EXPECT_NEAR(predicted / allocated, 1.0, kTolerance) << run.name << ": against the allocator's peak";
    world.barrier();
  }
}

}  // namespace parallel_memory_validation_test
}  // namespace kiln::sim
