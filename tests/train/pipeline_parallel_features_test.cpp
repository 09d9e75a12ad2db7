// Features composed with pipeline parallelism in `pretrain-gpt`'s loop, under `mpirun -np 2` and
// `-np 4` (ctest train_pp_features_mpirun_2/4; alone, a world of one, the tests skip). As in
// pipeline_parallel_training_test.cpp every rank also trains the one-process reference, and each
// layout must give its losses, gradient norms, evaluation losses and final weights within
// kTolerance:
//   MoE (aux and z losses, capacity dropping; a dense first layer, so the uneven split's first stage
//     holds no MoE layer): PP2 1F1B, interleaved and uneven (2 ranks); PP2 x DP2 with the
//     distributed optimizer and PP2 x EP2 (4 ranks). The logged MoE statistics (each layer's tokens
//     per expert, the mean aux and z losses) are the one-process run's: gathered over the stages.
//   --recompute-granularity full: PP2 uniform 1F1B, block interleaved, uniform zero-bubble (2 ranks).
//   --rewind with an injected NaN and a loss spike: PP2 rolls back at the same steps to the same
//     snapshots and skips the same batches as the one-process run, and ends with its losses (2 ranks).
//   --overlap-grad-reduce (bucket reductions started as each model chunk's last backward produces
//     them): PP2 x DP2 1F1B, interleaved with the distributed optimizer, zero-bubble (4 ranks).
//   MTP (two depths on the last stage with its copy of the embedding; GPT-2 shape with RoPE, tied
//     output layer, dropout): PP2 1F1B, interleaved and zero-bubble, a PP2 checkpoint continued by
//     one process and a one-process checkpoint continued under PP2 (2 ranks); PP4 and PP2 x DP2 with
//     the distributed optimizer, without dropout (4 ranks). The depths' logged losses too.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "kiln/dist/process_groups.h"
#include "kiln/train/fault_injection.h"
#include "kiln/train/gpt_pretrain.h"
#include "parallel_training_util.h"

namespace kiln::train {
namespace pipeline_parallel_features_test {

namespace fs = std::filesystem;
using namespace parallel_testing;  // NOLINT(google-build-using-namespace): the shared helpers

models::GptConfig dense_shape(bool dropout) {
  models::GptConfig c;
  c.num_layers = 4;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 16;
  c.vocab_size = testing::kVocab;
  c.make_vocab_size_divisible_by = 1;
  c.attention_dropout = dropout ? 0.1 : 0.0;
  c.hidden_dropout = dropout ? 0.1 : 0.0;
  return c;
}

// Top-2 of 4 experts in layers 1 to 3 (layer 0 dense), softmax router with the aux and z losses and
// capacity dropping; RoPE, RMSNorm, SwiGLU, untied.
models::GptConfig moe_shape() {
  models::GptConfig c = dense_shape(false);
  c.position_embedding_type = models::PositionEmbedding::Rope;
  c.normalization = models::Normalization::RMSNorm;
  c.swiglu = true;
  c.ffn_hidden_size = 48;
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true;
  c.num_experts = 4;
  c.moe_ffn_hidden_size = 16;
  c.moe_router_topk = 2;
  c.moe_grouped_gemm = true;
  c.moe_permute_fusion = true;
  c.moe_layer_pattern = {0, 1, 1, 1};
  c.moe_aux_loss_coeff = 1e-2;
  c.moe_z_loss_coeff = 1e-3;
  c.moe_expert_capacity_factor = 1.0;
  c.moe_expert_capacity_factor_set = true;
  return c;
}

struct Layout {
  int pp = 2;
  int ep = 1;
  std::int64_t layers_per_chunk = 0;  // interleaved when > 0
  std::int64_t first_layers = 0, last_layers = 0;
  bool distributed_optimizer = false;
  bool zero_bubble = false;
  bool overlap_grad_reduce = false;
  std::string name;
};

// The run's groups on every rank of the world (collective).
void join(GptTrainOptions& o, models::GptConfig& c, const Layout& l) {
  auto groups = std::make_shared<const dist::ProcessGroups>(dist::Communicator::world(),
                                                            dist::ParallelSizes{.pp = l.pp, .ep = l.ep, .etp = 1});
  o.data_parallel = groups->dp_cp();
  o.pipeline_parallel = groups->pp();
  o.process_groups = groups;
  c.expert_model_parallel_size = l.ep;
  o.use_distributed_optimizer = l.distributed_optimizer;
  o.num_layers_per_virtual_pipeline_stage = l.layers_per_chunk;
  o.decoder_first_pipeline_num_layers = l.first_layers;
  o.decoder_last_pipeline_num_layers = l.last_layers;
  o.zero_bubble_schedule = l.zero_bubble;
  o.overlap_grad_reduce = l.overlap_grad_reduce;
  if (l.overlap_grad_reduce) o.ddp_bucket_size = 2000;  // several buckets per stage
}

// The lines of a run's log.jsonl that log an iteration's training (not evaluations or events).
std::vector<nlohmann::json> training_lines(const fs::path& save) {
  std::vector<nlohmann::json> out;
  std::ifstream in(save / "log.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("lm_loss")) out.push_back(std::move(j));
  }
  return out;
}

// Runs each layout of `shape` and compares it with the one-process run `reference` saved in
// `reference_save`. `moe`: also the logged MoE statistics.
void expect_layouts_match(const std::vector<Layout>& layouts, const models::GptConfig& shape,
                          const GptTrainOptions& base, const GptTrainSummary& reference, const fs::path& reference_save,
                          const fs::path& dir, bool moe = false) {
  dist::Communicator world = dist::Communicator::world();
  for (const Layout& l : layouts) {
    GptTrainOptions o = base;
    models::GptConfig c = shape;
    join(o, c, l);
    o.save = dir / l.name;
    const GptTrainSummary s = pretrain_gpt(c, o, {}, quiet());
    expect_same_logs(reference.logs, s.logs, l.name);
    ASSERT_EQ(s.evals.size(), reference.evals.size()) << l.name;
    for (std::size_t i = 0; i < s.evals.size(); ++i)
      EXPECT_NEAR(s.evals[i].loss, reference.evals[i].loss, kTolerance * reference.evals[i].loss) << l.name;
    if (world.rank() == 0) {
      expect_same_checkpoint_weights(reference_save, o.save, l.name);
      if (moe) {
        const auto want = training_lines(reference_save), got = training_lines(o.save);
        ASSERT_EQ(want.size(), got.size()) << l.name;
        for (std::size_t i = 0; i < want.size(); ++i) {
          for (const char* key : {"load_balancing_loss", "z_loss"}) {
            const double w = want[i][key].get<double>(), g = got[i][key].get<double>();
            EXPECT_GT(w, 0) << key;
            EXPECT_NEAR(g, w, kTolerance * w) << l.name << ": " << key << " at iteration " << want[i]["iteration"];
          }
          EXPECT_EQ(got[i]["moe_layers"], want[i]["moe_layers"]) << l.name << " at iteration " << want[i]["iteration"];
        }
      }
    }
    world.barrier();
  }
}

TEST(PipelineParallelFeatures, MoeMatchesOneProcess) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: train_pp_features_mpirun_2/4)";
  const fs::path dir = shared_scratch(world);
  GptTrainOptions single = options(dir);
  single.save = dir / ("single_rank" + std::to_string(world.rank()));
  const GptTrainSummary reference = pretrain_gpt(moe_shape(), single, {}, quiet());
  ASSERT_EQ(reference.logs.size(), 10u);
  std::vector<Layout> layouts;
  if (world.size() == 2)
    layouts = {{.name = "pp2"},
               {.layers_per_chunk = 1, .name = "pp2+interleaved"},
               {.first_layers = 1, .last_layers = 3, .name = "pp2+first1+last3"}};
  else
    layouts = {{.distributed_optimizer = true, .name = "pp2xdp2+zero1"}, {.ep = 2, .name = "pp2xep2"}};
  expect_layouts_match(layouts, moe_shape(), options(dir), reference, single.save, dir, /*moe=*/true);
}

TEST(PipelineParallelFeatures, FullRecomputeMatchesOneProcess) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() != 2) GTEST_SKIP() << "runs under mpirun -np 2 (ctest: train_pp_features_mpirun_2)";
  const fs::path dir = shared_scratch(world);
  models::GptConfig shape = dense_shape(/*dropout=*/true);  // the recompute replays the masks
  shape.recompute_granularity = models::RecomputeGranularity::Full;
  shape.recompute_num_layers = 1;
  GptTrainOptions single = options(dir);
  single.save = dir / ("single_rank" + std::to_string(world.rank()));
  const GptTrainSummary reference = pretrain_gpt(shape, single, {}, quiet());
  expect_layouts_match({{.name = "pp2+uniform"}, {.zero_bubble = true, .name = "pp2+uniform+zb"}}, shape, options(dir),
                       reference, single.save, dir);
  models::GptConfig block = shape;
  block.recompute_method = models::RecomputeMethod::Block;
  expect_layouts_match({{.layers_per_chunk = 1, .name = "pp2+block+interleaved"}}, block, options(dir), reference,
                       single.save, dir);
}

TEST(PipelineParallelFeatures, RewindRollsBackAsOneProcess) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() != 2) GTEST_SKIP() << "runs under mpirun -np 2 (ctest: train_pp_features_mpirun_2)";
  const fs::path dir = shared_scratch(world);
  const models::GptConfig shape = dense_shape(/*dropout=*/true);  // the snapshots restore the masks' streams
  GptTrainOptions base = options(dir);
  base.train_iters = 20;
  base.eval_iters = 0;
  base.log_interval = 5;
  base.rewind.enabled = true;
  base.rewind.snapshot_interval = 3;
  base.rewind.thresholds.min_history = 4;
  auto run = [&](GptTrainOptions o, const models::GptConfig& c) {
    set_fault_plan_for_testing("nan_loss@7,spike@14");
    GptTrainSummary s;
    try {
      s = pretrain_gpt(c, o, {}, quiet());
    } catch (...) {
      set_fault_plan_for_testing("");
      throw;
    }
    set_fault_plan_for_testing("");
    return s;
  };
  GptTrainOptions single = base;
  single.save = dir / ("single_rank" + std::to_string(world.rank()));
  const GptTrainSummary reference = run(single, shape);
  ASSERT_EQ(reference.rewinds.size(), 2u);

  GptTrainOptions o = base;
  models::GptConfig c = shape;
  join(o, c, Layout{});
  o.save = dir / "pp2";
  const GptTrainSummary s = run(o, c);
  ASSERT_EQ(s.rewinds.size(), reference.rewinds.size());
  for (std::size_t i = 0; i < s.rewinds.size(); ++i) {
    EXPECT_EQ(s.rewinds[i].step, reference.rewinds[i].step);
    EXPECT_EQ(s.rewinds[i].anomaly.kind, reference.rewinds[i].anomaly.kind);
    EXPECT_EQ(s.rewinds[i].restored_to, reference.rewinds[i].restored_to);
  }
  EXPECT_EQ(s.rewinds[0].anomaly.kind, "nonfinite_loss");
  EXPECT_EQ(s.rewinds[1].anomaly.kind, "loss_spike");
  EXPECT_EQ(s.skipped_batches, (std::set<std::int64_t>{7, 14}));
  expect_same_logs(reference.logs, s.logs, "pp2 with --rewind");
  EXPECT_NEAR(s.final_loss, reference.final_loss, kTolerance * reference.final_loss);
  if (world.rank() == 0) expect_same_checkpoint_weights(single.save, o.save, "pp2 with --rewind");
}

TEST(PipelineParallelFeatures, MtpMatchesOneProcess) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() != 2 && world.size() != 4)
    GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: train_pp_features_mpirun_2/4)";
  const fs::path dir = shared_scratch(world);
  // Dropout on 2 ranks: the copy of the embedding on the last stage draws the one-process masks.
  models::GptConfig shape = dense_shape(/*dropout=*/world.size() == 2);
  shape.position_embedding_type = models::PositionEmbedding::Rope;  // MTP takes no learned positions
  shape.mtp_num_layers = 2;
  shape.mtp_loss_scaling_factor = 0.3;
  GptTrainOptions single = options(dir);
  single.save = dir / ("single_rank" + std::to_string(world.rank()));
  single.save_interval = 5;
  const GptTrainSummary reference = pretrain_gpt(shape, single, {}, quiet());
  ASSERT_EQ(reference.logs.back().auxiliary_losses.size(), 2u);
  if (world.size() == 4) {
    expect_layouts_match({{.pp = 4, .name = "pp4+mtp"}, {.distributed_optimizer = true, .name = "pp2xdp2+zero1+mtp"}},
                         shape, options(dir), reference, single.save, dir);
    return;
  }
  expect_layouts_match({{.name = "pp2+mtp"},
                        {.layers_per_chunk = 1, .name = "pp2+interleaved+mtp"},
                        {.zero_bubble = true, .name = "pp2+zb+mtp"}},
                       shape, options(dir), reference, single.save, dir);
  // A PP2 checkpoint at 5 (the embedding's copy left out) continued by one process ...
  GptTrainOptions first = options(dir);
  models::GptConfig fc = shape;
  join(first, fc, Layout{});
  first.save = dir / "pp2_first";
  first.exit_interval = 5;
  ASSERT_EQ(pretrain_gpt(fc, first, {}, quiet()).iterations, 5);
  const GptTrainSummary continued = continue_by_one_process(
      first.save, dir / ("pp2_first_continued_rank" + std::to_string(world.rank())), dir, shape);
  expect_same_logs(reference.logs, continued.logs, "an MTP PP2 checkpoint continued by one process");
  // ... and the one-process checkpoint at 5 continued under PP2 (the copy loads the first stage's tensors).
  GptTrainOptions resumed = options(dir);
  models::GptConfig rc = shape;
  join(resumed, rc, Layout{});
  resumed.load = single_checkpoint_at5(world, single.save, dir);
  resumed.save = dir / "pp2_resumed";
  const GptTrainSummary under_pp = pretrain_gpt(rc, resumed, {}, quiet());
  EXPECT_EQ(under_pp.start_iteration, 5);
  expect_same_logs(reference.logs, under_pp.logs, "a one-process MTP checkpoint continued under PP2");
}

TEST(PipelineParallelFeatures, OverlappedGradReduceMatchesOneProcess) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() != 4) GTEST_SKIP() << "runs under mpirun -np 4 (ctest: train_pp_features_mpirun_4)";
  const fs::path dir = shared_scratch(world);
  const models::GptConfig shape = dense_shape(/*dropout=*/false);  // the data-parallel ranks draw their own masks
  GptTrainOptions single = options(dir);
  single.save = dir / ("single_rank" + std::to_string(world.rank()));
  const GptTrainSummary reference = pretrain_gpt(shape, single, {}, quiet());
  expect_layouts_match({{.overlap_grad_reduce = true, .name = "pp2xdp2+overlap"},
                        {.layers_per_chunk = 1,
                         .distributed_optimizer = true,
                         .overlap_grad_reduce = true,
                         .name = "pp2xdp2+interleaved+zero1+overlap"},
                        {.zero_bubble = true, .overlap_grad_reduce = true, .name = "pp2xdp2+zb+overlap"}},
                       shape, options(dir), reference, single.save, dir);
}

}  // namespace pipeline_parallel_features_test
}  // namespace kiln::train
